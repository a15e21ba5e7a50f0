//! The store's part of schedules (SPEC §17): the schedules, the short lease a process holds on
//! one while it fires its due ticks, and each schedule's recent runs.
//!
//! Firing is not a transaction of the store's: a tick's saga is started through the start use
//! case with an idempotency key of the schedule's own, then the schedule is advanced past the
//! tick together with the tick's record ([`ScheduleLog::advance_schedule`], a compare-and-set
//! on the tick and the lease). A process that dies between the two leaves the tick due; whoever
//! fires it again gets the same saga back from the key.

use async_trait::async_trait;
use uuid::Uuid;

use crate::model::{Millis, NewScheduleRun, Schedule, ScheduleRun};
use crate::store::Result;

/// Where a schedule stands before an advance: the advance applies only if it still does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleCursor {
    /// Its next tick.
    pub next_fire_at: Millis,
    /// Its buffered tick.
    pub buffered_at: Option<Millis>,
}

/// A schedule's new position after firing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleAdvance {
    /// Its next tick.
    pub next_fire_at: Millis,
    /// Its buffered tick.
    pub buffered_at: Option<Millis>,
    /// The saga of its latest run, if this advance started one.
    pub last_saga_id: Option<Uuid>,
}

/// Schedules, kept in the database.
#[async_trait]
pub trait ScheduleLog: Send + Sync {
    /// Records a new schedule; `false` (nothing written) if one has its id.
    async fn create_schedule(&self, schedule: &Schedule) -> Result<bool>;

    /// Every schedule, by id.
    async fn schedules(&self) -> Result<Vec<Schedule>>;

    /// The schedule `id`.
    async fn schedule(&self, id: &str) -> Result<Option<Schedule>>;

    /// Its `limit` latest runs, latest first.
    async fn schedule_runs(&self, id: &str, limit: u32) -> Result<Vec<ScheduleRun>>;

    /// Deletes the schedule and its runs; `false` if there was none. Its sagas keep running.
    async fn delete_schedule(&self, id: &str) -> Result<bool>;

    /// Pauses (`paused`) or resumes it; a resumed schedule's next tick is `next_fire_at` (the
    /// ticks while it was paused are not caught up). The schedule as it now stands.
    async fn set_schedule_paused(
        &self,
        id: &str,
        paused: bool,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<Option<Schedule>>;

    /// Leases to `owner` for `ttl_ms` up to `limit` schedules not paused and not leased by
    /// another live owner that have a tick due at `now`, or a buffered tick whose previous run
    /// has ended; on PostgreSQL rows another process is claiming are skipped.
    async fn claim_due_schedules(
        &self,
        owner: &str,
        now: Millis,
        ttl_ms: i64,
        limit: u32,
    ) -> Result<Vec<Schedule>>;

    /// Moves the schedule from `from` to `to` and records `runs` (keeping the latest
    /// [`RUNS_KEPT`](crate::model::RUNS_KEPT)), in one transaction, only while `owner` holds
    /// its lease and it stands at `from`: `false` (nothing written) otherwise.
    async fn advance_schedule(
        &self,
        id: &str,
        owner: &str,
        from: ScheduleCursor,
        to: &ScheduleAdvance,
        runs: &[NewScheduleRun],
        now: Millis,
    ) -> Result<bool>;

    /// Records the runs of a trigger (`runs`), with its saga as the latest run and, for a
    /// tick buffered, `buffer` as the buffered tick if none is. With `expect`, only while the
    /// schedule stands at that cursor and latest saga and no process holds its lease at `now`;
    /// `false` (nothing written) if it does not, or is gone.
    async fn record_schedule_runs(
        &self,
        id: &str,
        expect: Option<(ScheduleCursor, Option<Uuid>)>,
        runs: &[NewScheduleRun],
        last_saga_id: Option<Uuid>,
        buffer: Option<Millis>,
        now: Millis,
    ) -> Result<bool>;

    /// Gives up `owner`'s lease on the schedule.
    async fn release_schedule(&self, id: &str, owner: &str) -> Result<()>;

    /// The earliest next tick of a schedule not paused, if any.
    async fn earliest_schedule_fire(&self) -> Result<Option<Millis>>;
}
