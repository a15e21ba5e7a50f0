//! Schedules (SPEC §17): a saga started on a cron expression in a time zone or at a fixed
//! interval, by every serving process's [`scheduler`], exactly once per tick.
//!
//! The use cases here are what the HTTP API and the CLI call: [`create`] (every field checked,
//! nothing written on a refusal), [`pause`], [`resume`], [`delete`] and [`trigger`]. A tick's
//! saga has an id derived from the schedule and the tick's instant ([`run_saga_id`]) and is
//! started through [`Engine::start`] with an idempotency key of the schedule's own
//! ([`tick_key`]): a tick fired twice — by two processes, or again after a crash before its
//! advance was recorded — finds the same saga.

pub mod cadence;
pub mod scheduler;

use std::sync::LazyLock;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::engine::{Engine, StartError, StartKey};
use crate::model::{Millis, Overlap, Schedule, ScheduleDetail, ScheduleRun, RUNS_KEPT};
use crate::store::{Store, StoreError};
pub use cadence::Cadence;

/// The catch-up window of a schedule made without one.
pub const DEFAULT_CATCHUP_WINDOW: Duration = Duration::from_secs(60);

/// The shortest catch-up window: longer than a scheduler's lease plus its poll, so that a tick
/// held by a process that died is still fired by another one before it counts as missed.
pub const MIN_CATCHUP_WINDOW: Duration = Duration::from_secs(15);

/// The longest catch-up window; a tick's idempotency key is kept a little beyond it.
pub const MAX_CATCHUP_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest schedule id.
pub const MAX_ID_LEN: usize = 128;

/// The body of `POST /v1/schedules`, and what `saga schedule create` sends.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewSchedule {
    /// Its id: 1 to 128 letters, digits, `.`, `_` or `-`.
    #[cfg_attr(
        feature = "server",
        schema(example = "nightly-settlement", pattern = "^[A-Za-z0-9._-]{1,128}$")
    )]
    pub id: String,
    /// The definition each tick starts.
    #[cfg_attr(feature = "server", schema(example = "fulfil_order"))]
    pub saga: String,
    /// A cron expression (5 fields, or 6 with seconds first); exactly one of `cron` and
    /// `every`.
    #[serde(default)]
    #[cfg_attr(feature = "server", schema(example = "0 2 * * *"))]
    pub cron: Option<String>,
    /// A fixed interval, at least `1s` (`15m`, `1h 30m`); exactly one of `cron` and `every`.
    #[serde(default)]
    #[cfg_attr(feature = "server", schema(example = "15m"))]
    pub every: Option<String>,
    /// The IANA time zone `cron` is read in; `UTC` if left out.
    #[serde(default)]
    #[cfg_attr(feature = "server", schema(example = "Europe/Paris"))]
    pub timezone: Option<String>,
    /// The input of every saga it starts, checked against the definition now; `{}` if left
    /// out.
    #[serde(default)]
    pub input: Option<Value>,
    /// What a tick does while the previous run has not ended; `skip` if left out.
    #[serde(default)]
    pub overlap: Option<Overlap>,
    /// How late a tick may still start after every process was down at its time (`1m` if
    /// left out; from `15s` to `7d`); older ticks are recorded as missed.
    #[serde(default)]
    #[cfg_attr(feature = "server", schema(example = "1m"))]
    pub catchup_window: Option<String>,
    /// Made paused: no tick fires until it is resumed.
    #[serde(default)]
    pub paused: Option<bool>,
}

/// Why a schedule command was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// A malformed request: a bad id.
    #[error("{0}")]
    BadRequest(String),
    /// Both or neither of `cron` and `every`.
    #[error("{0}")]
    InvalidSchedule(String),
    /// A duration that does not parse.
    #[error("{0}")]
    InvalidDuration(String),
    /// The definition to start is unknown here.
    #[error("no saga definition named {0:?} is registered on this server")]
    UnknownSaga(String),
    /// A cron expression that does not parse.
    #[error("{0}")]
    InvalidCron(String),
    /// A time zone that is not an IANA name.
    #[error("{0}")]
    InvalidTimezone(String),
    /// An interval below one second.
    #[error("{0}")]
    InvalidInterval(String),
    /// The input does not fit the definition.
    #[error("invalid input for saga {name:?}: {message}")]
    InvalidInput {
        /// The definition.
        name: String,
        /// What is wrong, with the field's path.
        message: String,
    },
    /// A schedule with this id exists.
    #[error("a schedule with id {0:?} already exists: delete it first, or choose another id")]
    Exists(String),
    /// No schedule has this id.
    #[error("no schedule with id {0:?}")]
    NotFound(String),
    /// A start failed for a reason of its own.
    #[error(transparent)]
    Start(StartError),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ScheduleError {
    /// The stable code of the refusal, as the HTTP API answers it.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::InvalidSchedule(_) => "invalid_schedule",
            Self::InvalidDuration(_) => "invalid_duration",
            Self::UnknownSaga(_) => "unknown_saga",
            Self::InvalidCron(_) => "invalid_cron",
            Self::InvalidTimezone(_) => "invalid_timezone",
            Self::InvalidInterval(_) => "invalid_interval",
            Self::InvalidInput { .. } => "invalid_input",
            Self::Exists(_) => "conflict",
            Self::NotFound(_) => "unknown_schedule",
            Self::Start(_) | Self::Store(_) => "internal",
        }
    }
}

impl From<StartError> for ScheduleError {
    fn from(e: StartError) -> Self {
        match e {
            StartError::UnknownDefinition(name) => Self::UnknownSaga(name),
            StartError::InvalidInput { name, message } => Self::InvalidInput { name, message },
            StartError::Store(e) => Self::Store(e),
            e => Self::Start(e),
        }
    }
}

/// Wakes this process's scheduler: a schedule was made or changed here.
static CHANGED: LazyLock<Notify> = LazyLock::new(Notify::new);

fn changed() {
    CHANGED.notify_one();
}

/// A duration as people write it (`15m`), or a refusal naming the field.
fn duration(field: &str, text: &str) -> Result<Duration, ScheduleError> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        ScheduleError::InvalidDuration(format!(
            "{field}: {text:?} is not a duration such as 30s, 15m or 1h 30m: {e}"
        ))
    })
}

/// A catch-up window, from [`MIN_CATCHUP_WINDOW`] to [`MAX_CATCHUP_WINDOW`].
fn catchup_window(text: &str) -> Result<Duration, ScheduleError> {
    let window = duration("catchup_window", text)?;
    if !(MIN_CATCHUP_WINDOW..=MAX_CATCHUP_WINDOW).contains(&window) {
        return Err(ScheduleError::InvalidDuration(format!(
            "catchup_window: {text:?} is out of bounds: give from {} (a tick held by a process \
             that died is fired by another within that time) to {}",
            human(MIN_CATCHUP_WINDOW),
            human(MAX_CATCHUP_WINDOW)
        )));
    }
    Ok(window)
}

/// A duration as people read it (`1m`).
pub(crate) fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Checks a schedule id.
fn check_id(id: &str) -> Result<(), ScheduleError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ScheduleError::BadRequest(format!(
            "id: {} is not a schedule id: 1 to {MAX_ID_LEN} letters, digits, '.', '_' or '-'",
            crate::operations::quote(id)
        )))
    }
}

/// The cadence of a stored schedule.
pub fn cadence_of(s: &Schedule) -> Result<Cadence, String> {
    match (&s.cron, s.every) {
        (Some(cron), _) => Cadence::cron(cron, &s.timezone),
        (None, Some(every)) => Cadence::every(every),
        (None, None) => Err(format!("schedule {:?} has neither cron nor every", s.id)),
    }
}

/// The schedule `new` asks for, checked against the definitions of `engine` (the saga exists,
/// the input fits it) and made due at its first tick after now; nothing is written.
pub fn checked(engine: &Engine, new: NewSchedule) -> Result<Schedule, ScheduleError> {
    check_id(&new.id)?;
    let timezone = new.timezone.unwrap_or_else(|| "UTC".to_owned());
    let (cadence, every) = match (&new.cron, &new.every) {
        (Some(_), Some(_)) => {
            return Err(ScheduleError::InvalidSchedule(
                "give either \"cron\" or \"every\", not both".to_owned(),
            ))
        }
        (None, None) => {
            return Err(ScheduleError::InvalidSchedule(
                "give \"cron\" (e.g. \"0 * * * *\") or \"every\" (e.g. \"15m\")".to_owned(),
            ))
        }
        (Some(cron), None) => {
            cadence::parse_zone(&timezone).map_err(ScheduleError::InvalidTimezone)?;
            (
                Cadence::cron(cron, &timezone).map_err(ScheduleError::InvalidCron)?,
                None,
            )
        }
        (None, Some(every)) => {
            cadence::parse_zone(&timezone).map_err(ScheduleError::InvalidTimezone)?;
            let every = duration("every", every)?;
            (
                Cadence::every(every).map_err(ScheduleError::InvalidInterval)?,
                Some(every),
            )
        }
    };
    let catchup_window = match &new.catchup_window {
        Some(text) => catchup_window(text)?,
        None => DEFAULT_CATCHUP_WINDOW,
    };
    let input = new
        .input
        .unwrap_or_else(|| Value::Object(Default::default()));
    // The start's own first rules: the definition exists and the input fits it.
    engine.new_saga(&new.saga, input.clone())?;
    let now = engine.clock().now_ms();
    let next_fire_at = cadence.next_after(now).ok_or_else(|| {
        ScheduleError::InvalidCron(format!(
            "{:?} never fires after now",
            new.cron.clone().unwrap_or_default()
        ))
    })?;
    Ok(Schedule {
        id: new.id,
        saga: new.saga,
        cron: new.cron.map(|c| c.trim().to_owned()),
        every,
        timezone,
        input,
        overlap: new.overlap.unwrap_or_default(),
        catchup_window,
        paused: new.paused.unwrap_or(false),
        next_fire_at,
        buffered_at: None,
        last_saga_id: None,
        created_at: now,
        updated_at: now,
    })
}

/// Makes a schedule (see [`checked`]); [`ScheduleError::Exists`] if one has its id.
pub async fn create(engine: &Engine, new: NewSchedule) -> Result<Schedule, ScheduleError> {
    let schedule = checked(engine, new)?;
    if !engine.store().create_schedule(&schedule).await? {
        return Err(ScheduleError::Exists(schedule.id));
    }
    changed();
    Ok(schedule)
}

/// The schedule `id`, or [`ScheduleError::NotFound`].
pub async fn get(store: &dyn Store, id: &str) -> Result<Schedule, ScheduleError> {
    store
        .schedule(id)
        .await?
        .ok_or_else(|| ScheduleError::NotFound(id.to_owned()))
}

/// Its latest runs, latest first (at most [`RUNS_KEPT`]).
pub async fn runs(store: &dyn Store, id: &str) -> Result<Vec<ScheduleRun>, ScheduleError> {
    Ok(store
        .schedule_runs(id, u32::try_from(RUNS_KEPT).unwrap_or(100))
        .await?)
}

/// Pauses the schedule `id`: no tick fires until it is resumed.
pub async fn pause(store: &dyn Store, id: &str, now: Millis) -> Result<Schedule, ScheduleError> {
    let s = store
        .set_schedule_paused(id, true, None, now)
        .await?
        .ok_or_else(|| ScheduleError::NotFound(id.to_owned()))?;
    changed();
    Ok(s)
}

/// Resumes the schedule `id` at its first tick after `now`: the ticks while it was paused are
/// not caught up. A schedule not paused is left as it is, its due tick with it.
pub async fn resume(store: &dyn Store, id: &str, now: Millis) -> Result<Schedule, ScheduleError> {
    let s = get(store, id).await?;
    if !s.paused {
        return Ok(s);
    }
    let next = cadence_of(&s)
        .ok()
        .and_then(|c| c.next_after(now))
        .unwrap_or(s.next_fire_at);
    let s = store
        .set_schedule_paused(id, false, Some(next), now)
        .await?
        .ok_or_else(|| ScheduleError::NotFound(id.to_owned()))?;
    changed();
    Ok(s)
}

/// Deletes the schedule `id` and its history; its sagas keep running.
pub async fn delete(store: &dyn Store, id: &str) -> Result<(), ScheduleError> {
    if !store.delete_schedule(id).await? {
        return Err(ScheduleError::NotFound(id.to_owned()));
    }
    changed();
    Ok(())
}

/// Fires the schedule `id` now, as a tick at this instant, under its overlap policy (even
/// while paused): what happened to that tick.
pub async fn trigger(engine: &Engine, id: &str) -> Result<ScheduleRun, ScheduleError> {
    let s = get(engine.store().as_ref(), id).await?;
    let now = engine.clock().now_ms();
    scheduler::fire_triggered(engine, &s, now).await
}

/// The id of the saga of the tick at `instant` of schedule `s`: a UUIDv7, like every saga id,
/// so that it sorts with the others by time, whose timestamp is the instant and whose other
/// bits are a hash of the schedule's id, its creation time (so that a schedule deleted and
/// made again under the same id never finds its predecessor's sagas) and the instant. The same
/// tick always has the same id.
pub fn run_saga_id(s: &Schedule, instant: Millis) -> Uuid {
    // A namespace of our own for these names.
    const NAMESPACE: Uuid = Uuid::from_u128(0x8f0c_6a57_1c4e_4b0e_9d4e_5a11_ce5c_4ed1);
    let hash = Uuid::new_v5(
        &NAMESPACE,
        format!("schedule\n{}\n{}\n{}", s.id, s.created_at, instant).as_bytes(),
    );
    let h = hash.as_bytes();
    // The hash's bytes without its own version and variant bits (bytes 6 and 8).
    let bits = [h[0], h[1], h[2], h[3], h[4], h[5], h[7], h[9], h[10], h[11]];
    uuid::Builder::from_unix_timestamp_millis(u64::try_from(instant).unwrap_or(0), &bits)
        .into_uuid()
}

/// The idempotency key of the tick at `instant`: scoped to the schedule (and its creation), the
/// instant as the key, kept well beyond the catch-up window, the longest a tick may be fired
/// again after its first start.
pub fn tick_key(s: &Schedule, instant: Millis) -> StartKey {
    // Bounded, so that a window stored before the bounds were enforced cannot overflow the
    // key's expiry.
    let window = s.catchup_window.min(MAX_CATCHUP_WINDOW);
    let retention = StartKey::DEFAULT_RETENTION.max(window * 2 + Duration::from_secs(3600));
    StartKey::new(
        format!("schedule:{}:{}", s.id, s.created_at),
        instant.to_string(),
    )
    .with_retention(retention)
}

/// The next tick of a schedule that has none: its cadence never fires again, or no longer
/// parses. Far beyond any real instant, and still a valid time on both databases.
pub const PARKED: Millis = 253_402_300_799_000; // 9999-12-31T23:59:59Z

/// How many next ticks a schedule shows.
pub const NEXT_SHOWN: usize = 5;

/// `s` as shown, with its next ticks after `now` and `runs`.
pub fn detail(s: Schedule, runs: Vec<ScheduleRun>, now: Millis) -> ScheduleDetail {
    // A schedule parked at the end of time (its cadence no longer fires) has no next run.
    let next_runs = if s.paused || s.next_fire_at >= PARKED {
        Vec::new()
    } else {
        let mut next = vec![s.next_fire_at];
        if let Ok(c) = cadence_of(&s) {
            next.extend(c.upcoming(s.next_fire_at.max(now), NEXT_SHOWN - 1));
        }
        next.into_iter()
            .filter(|at| *at < PARKED)
            .map(crate::model::rfc3339)
            .collect()
    };
    ScheduleDetail {
        schedule: s,
        next_runs,
        runs,
    }
}

/// Every schedule, each with its latest run.
pub async fn list(store: &dyn Store, now: Millis) -> Result<Vec<ScheduleDetail>, ScheduleError> {
    let mut out = Vec::new();
    for s in store.schedules().await? {
        let runs = store.schedule_runs(&s.id, 1).await?;
        out.push(detail(s, runs, now));
    }
    Ok(out)
}

/// The schedule `id` with its history.
pub async fn show(
    store: &dyn Store,
    id: &str,
    now: Millis,
) -> Result<ScheduleDetail, ScheduleError> {
    let s = get(store, id).await?;
    let runs = runs(store, id).await?;
    Ok(detail(s, runs, now))
}
