//! The batch statements on PostgreSQL: each call is one statement (one round trip) of
//! data-modifying CTEs reading the batch's column arrays with `unnest` ([`super::cols`]). The
//! `UPDATE sagas` is the fence; every dependent write joins its `RETURNING` list, and the
//! notifications of sagas that ended or were given back are sent from the same statement, so
//! they are delivered exactly when the transaction commits.
//!
//! The texts are built once, numbering their parameters in binding order, and never change:
//! each is prepared once per connection.

use crate::store::fence::lease_fence;
use std::sync::LazyLock;

use sqlx::{Executor, PgConnection, Postgres};

use super::cols::{
    ApplyCols, CreateCols, NewBranchCols, Params, EVENTS, FINISHES, NEW_ATTRS, NEW_BRANCHES,
    NEW_SAGAS, NEW_STEPS, SAGAS, STARTS, STEPS,
};
use crate::model::Millis;
use crate::store::idempotency::KeyedItem;
use crate::store::rows::LogRow;
use crate::store::write_queue::batch::{self, unreadable, Item, NewItem};
use crate::store::write_queue::{BatchWriter, Whole};
use crate::store::SqlxResultExt;
use crate::store::{Applied, LeaseRequest, NewSaga, Result, StoreError};
use uuid::Uuid;

/// The row sources of a batch of transitions, over the next parameters.
struct ApplySources {
    sagas: String,
    /// The sagas' ids, as one array: `= ANY` of it lets the fence find its rows by one index
    /// scan, where a join to `unnest` (estimated at 100 rows) alone could make the planner
    /// scan a table that is still small, or was when the plan was cached, in full.
    ids: String,
    steps: String,
    finishes: String,
    starts: String,
    events: String,
}

impl ApplySources {
    /// In the order [`ApplyCols::bind`] binds them.
    fn new(p: &mut Params) -> Self {
        let (sagas, ids) = p.unnest(SAGAS, "x", false);
        Self {
            sagas,
            ids,
            steps: p.unnest(STEPS, "x", false).0,
            finishes: p.unnest(FINISHES, "x", false).0,
            starts: p.unnest(STARTS, "x", false).0,
            events: p.unnest(EVENTS, "x", true).0,
        }
    }
}

/// A phase column of a step row: the new value if the phase changed, else the stored one.
fn phase_col(phase: &str, col: &str, field: &str) -> String {
    let stored = match phase {
        "a" => col.to_owned(),
        _ => format!("comp_{col}"),
    };
    format!("{stored} = CASE WHEN x.has_{phase} THEN x.{phase}_{field} ELSE steps.{stored} END")
}

/// The CTEs applying transitions at `now` (an expression). A dependent row is written only
/// if its lease `(saga, epoch)` passed the fence: by lease, not by saga, since a stale
/// driver's write may share a batch with the write of the driver that took its saga over.
fn apply_ctes(src: &ApplySources, now: &str) -> String {
    let step_cols: Vec<String> = ["a", "c"]
        .iter()
        .flat_map(|phase| {
            [
                ("status", "status"),
                ("attempts", "attempts"),
                ("last_error", "error"),
                ("outcome_unknown", "unknown"),
                ("started_at", "started"),
                ("ended_at", "ended"),
            ]
            .map(|(col, field)| phase_col(phase, col, field))
        })
        .chain([
            phase_col("a", "wake_at", "wake"),
            phase_col("a", "waiting_for", "waiting_for"),
            phase_col("a", "timeout_at", "timeout"),
            // Either phase may set when a branch is tried again (it retries either).
            "retry_at = CASE WHEN x.has_a OR x.has_c THEN x.retry ELSE steps.retry_at END"
                .to_owned(),
            "output = COALESCE(x.output::jsonb, steps.output)".to_owned(),
        ])
        .collect();
    let fenced = "(x.saga_id, x.epoch) IN (SELECT id, epoch FROM fenced)";
    let fence = lease_fence!(table "sagas", "v.owner", "v.epoch", guard "v.guard", hold "v.hold");
    format!(
        "v AS (SELECT * FROM {sagas}), \
         fenced AS (UPDATE sagas SET status = v.status, \
         next_run_at = CASE WHEN v.rel AND v.status = 'RUNNING' AND NOT v.pivot \
             AND sagas.cancel_requested AND (v.next_run_at IS NULL OR v.next_run_at > {now}) \
             THEN {now} \
             ELSE v.next_run_at END, \
         error = v.error, output = COALESCE(v.output::jsonb, sagas.output), \
         needs_attention = v.attention, pivot_reached = v.pivot, updated_at = {now}, \
         lease_owner = CASE WHEN v.rel THEN NULL ELSE sagas.lease_owner END, \
         lease_expires_at = CASE WHEN v.rel THEN NULL ELSE sagas.lease_expires_at END, \
         pause_requested = CASE WHEN v.rel THEN NULL ELSE sagas.pause_requested END, \
         paused_from = v.paused_from \
         FROM v WHERE sagas.id = ANY({ids}) AND sagas.id = v.saga_id AND {fence} \
         RETURNING sagas.id, sagas.lease_epoch AS epoch, \
         v.status, v.status IN ('COMPLETED', 'COMPENSATED', 'FAILED', 'ABORTED') AS ended, \
         v.rel AND sagas.next_run_at IS NOT NULL AS due), \
         st AS (UPDATE steps SET {step_cols} FROM {steps} \
         WHERE steps.saga_id = x.saga_id AND steps.idx = x.idx AND {fenced}), \
         af AS (UPDATE attempts SET ended_at = {now}, outcome = x.outcome, error = x.error \
         FROM {finishes} WHERE attempts.saga_id = x.saga_id AND attempts.step_idx = x.idx \
         AND attempts.phase = x.phase AND attempts.attempt = x.attempt AND {fenced}), \
         ast AS (INSERT INTO attempts (saga_id, step_idx, phase, attempt, worker, lease_epoch, \
         started_at, seq) SELECT x.saga_id, x.idx, x.phase, x.attempt, x.owner, x.epoch, {now}, x.seq \
         FROM {starts} WHERE {fenced}), \
         ev AS (INSERT INTO events (saga_id, at, type, step, data) \
         SELECT x.saga_id, {now}, x.kind, x.step, x.data::jsonb \
         FROM {events} WHERE {fenced} ORDER BY x.ord)",
        sagas = src.sagas,
        ids = src.ids,
        step_cols = step_cols.join(", "),
        steps = src.steps,
        finishes = src.finishes,
        starts = src.starts,
        events = src.events,
    )
}

/// Each fenced lease with its notification: `saga_done` for an ended saga, `saga_due` for one
/// given back while still runnable (shutdown, a long backoff).
const FENCED_ROWS: &str = "SELECT f.id::text AS id, f.epoch, \
     CASE WHEN f.ended THEN pg_notify('saga_done', f.id::text || ' ' || f.status)::text \
     WHEN f.due THEN pg_notify('saga_due', '')::text END AS notified FROM fenced f";

/// The CTEs creating new sagas (`n`) with their steps and `saga.started` events at `now`
/// (an expression), over the next parameters in the order [`CreateCols::bind`] binds them;
/// a saga created `ahead` has its first action written ahead (running, attempt 1 started).
fn create_ctes(p: &mut Params, now: &str) -> String {
    let (sagas, _) = p.unnest(NEW_SAGAS, "x", true);
    // One batch may create several sagas of a key: they take consecutive turns.
    let fair = crate::store::shared::admission::fair_seq(
        "GREATEST",
        "n.gate = 1",
        "n.flow",
        "n.flow_key",
        "(row_number() OVER (PARTITION BY n.flow, n.flow_key ORDER BY n.ord) - 1)",
    );
    let (steps, _) = p.unnest(NEW_STEPS, "x", false);
    // In the same statement: a batch without attributes binds three empty arrays.
    let (attrs, _) = p.unnest(NEW_ATTRS, "x", false);
    format!(
        "n AS (SELECT * FROM {sagas}), \
         cs AS (INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
         input, next_run_at, created_at, updated_at, lease_owner, lease_epoch, lease_expires_at, \
         pivot_reached, scheduled_at, traceparent, priority, gate, flow, flow_key, fair_seq) \
         SELECT id, name, version, hash, key, \
         CASE WHEN ahead THEN 'RUNNING' ELSE 'QUEUED' END, input::jsonb, \
         COALESCE(start_at, {now}), {now}, {now}, owner, epoch, {now} + ttl, pivot, start_at, traceparent, \
         priority, gate, flow, flow_key, {fair} \
         FROM n), \
         cst AS (INSERT INTO steps (saga_id, idx, name, kind, status, comp_status, attempts, \
         outcome_unknown, started_at) \
         SELECT saga_id, idx, name, kind, CASE WHEN ahead THEN 'RUNNING' ELSE 'PENDING' END, \
         comp_status, CASE WHEN ahead THEN 1 ELSE 0 END, ahead, \
         CASE WHEN ahead THEN {now} END FROM {steps}), \
         cattr AS (INSERT INTO saga_attrs (saga_id, attr, value) \
         SELECT saga_id, attr, value FROM {attrs}), \
         cat AS (INSERT INTO attempts (saga_id, step_idx, phase, attempt, worker, lease_epoch, \
         started_at, seq) SELECT id, 0, 'action', 1, owner, epoch, {now}, 1 FROM n WHERE ahead), \
         cev AS (INSERT INTO events (saga_id, at, type, step, data) \
         SELECT id, {now}, 'saga.started', NULL, \
         jsonb_build_object('name', name, 'version', version) FROM n ORDER BY ord)"
    )
}

/// A saga created without a lease wakes the workers on commit.
const WAKE_FOR_UNLEASED: &str =
    "(SELECT pg_notify('saga_due', '')::text FROM n WHERE owner IS NULL LIMIT 1)";

/// Applies transitions: the batch time, then the [`ApplyCols`].
static APPLY: LazyLock<String> = LazyLock::new(|| {
    let mut p = Params::default();
    let now = p.next("bigint");
    let src = ApplySources::new(&mut p);
    format!("WITH {} {FENCED_ROWS}", apply_ctes(&src, &now))
});

/// Inserts the rows of branches whose group starts, each only if its saga carries the lease
/// (and, for a guarded transition, no cancel is pending), as the batch's fence will check; a
/// row already there (inserted by a transition whose fence then refused it) is kept.
static INSERT_BRANCHES: LazyLock<String> = LazyLock::new(|| {
    let mut p = Params::default();
    let (rows, _) = p.unnest(NEW_BRANCHES, "x", false);
    let fence = lease_fence!(table "sagas", "x.owner", "x.epoch", guard "x.guard", hold "x.hold");
    format!(
        "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status, stage_index, \
         branch) SELECT x.saga_id, x.idx, x.name, x.kind, 'PENDING', x.comp_status, \
         x.stage_index, x.branch FROM {rows} \
         WHERE EXISTS (SELECT 1 FROM sagas WHERE sagas.id = x.saga_id AND {fence}) \
         ON CONFLICT (saga_id, idx) DO NOTHING"
    )
});

/// Makes the sagas $2 (parents of child sagas that end in this batch) due at $1 unless they
/// ended or are due already, and wakes the engines if one was. A transition its fence refuses
/// may wake its parent for nothing: the parent looks at its child and parks again.
const WAKE_PARENTS: &str = "WITH w AS (UPDATE sagas SET next_run_at = $1 \
     WHERE id = ANY($2::uuid[]) AND status IN ('QUEUED', 'RUNNING', 'COMPENSATING') \
     AND (next_run_at IS NULL OR next_run_at > $1) RETURNING id) \
     SELECT pg_notify('saga_due', '') FROM w LIMIT 1";

/// $1 the refused ids.
const REFUSED: &str = "SELECT id::text AS id, lease_owner, lease_epoch, cancel_requested, \
     pause_requested \
     FROM sagas WHERE id IN (SELECT value::uuid FROM json_array_elements_text($1::json))";

/// Creates sagas: the batch time, then the [`CreateCols`].
static CREATE: LazyLock<String> = LazyLock::new(|| {
    let mut p = Params::default();
    let now = p.next("bigint");
    let ctes = create_ctes(&mut p, &now);
    format!("WITH {ctes} SELECT {WAKE_FOR_UNLEASED} AS notified")
});

/// Creates sagas and applies transitions in one statement outside any transaction block (one
/// round trip, its own transaction), on the database clock, which every row returns as `now`;
/// the last row has no lease, only the time. The [`CreateCols`], then the [`ApplyCols`].
static WHOLE: LazyLock<String> = LazyLock::new(|| {
    let mut p = Params::default();
    let now = "(SELECT now FROM t)";
    let create = create_ctes(&mut p, now);
    let src = ApplySources::new(&mut p);
    format!(
        "WITH t AS (SELECT saga_now_ms() AS now), {create}, {apply} \
         SELECT fr.*, {now} AS now FROM ({FENCED_ROWS}) AS fr \
         UNION ALL SELECT NULL, NULL, {WAKE_FOR_UNLEASED}, {now}",
        apply = apply_ctes(&src, now),
    )
});

/// Opens the savepoint that makes a call atomic, unless the call is alone in its transaction
/// (whose rollback then undoes it).
async fn open(conn: &mut PgConnection, guarded: bool) -> Result<()> {
    if guarded {
        conn.execute("SAVEPOINT batch").await.db()?;
    }
    Ok(())
}

/// Closes what [`open`] opened: kept if `result` is `Ok`, undone if not.
async fn close<T>(conn: &mut PgConnection, guarded: bool, result: Result<T>) -> Result<T> {
    if guarded {
        let sql = match result {
            Ok(_) => "RELEASE SAVEPOINT batch",
            Err(_) => "ROLLBACK TO SAVEPOINT batch; RELEASE SAVEPOINT batch",
        };
        conn.execute(sql).await.db()?;
    }
    result
}

/// Applies `items` inside the caller's transaction, atomically; one result per item, in order.
async fn apply_batch(
    conn: &mut PgConnection,
    now: Millis,
    items: &[Item],
    guarded: bool,
) -> Result<Vec<Result<Applied>>> {
    let cols = ApplyCols::of(items);
    open(conn, guarded).await?;
    let fenced = async {
        if let Some(branches) = NewBranchCols::of(items) {
            branches
                .bind(sqlx::query(&INSERT_BRANCHES))
                .execute(&mut *conn)
                .await
                .db()?;
        }
        let fenced = cols
            .bind(sqlx::query(&APPLY).bind(now))
            .fetch_all(&mut *conn)
            .await
            .db()?;
        let parents: Vec<Uuid> = items.iter().filter_map(|(_, t)| t.wake).collect();
        if !parents.is_empty() {
            sqlx::query(WAKE_PARENTS)
                .bind(now)
                .bind(&parents)
                .execute(&mut *conn)
                .await
                .db()?;
        }
        Ok(fenced)
    }
    .await;
    let fenced = close(conn, guarded, fenced).await?;
    results(conn, items, &fenced).await
}

/// Each item's result from the rows the fence returned.
async fn results(
    conn: &mut PgConnection,
    items: &[Item],
    fenced: &[sqlx::postgres::PgRow],
) -> Result<Vec<Result<Applied>>> {
    batch::results::<sqlx::Postgres>(conn, REFUSED, items, fenced).await
}

/// Creates `news` and applies `items` as one statement outside any transaction block: its own
/// transaction, one round trip, on the database clock. On `Err` nothing was committed and the
/// caller takes the long way, which isolates a write that breaks a statement.
async fn whole_batch(
    conn: &mut PgConnection,
    items: &[Item],
    news: &[NewItem],
) -> Result<(Vec<Result<Applied>>, Millis)> {
    let apply = ApplyCols::of(items);
    let create = CreateCols::of(news);
    let rows = apply
        .bind(create.bind(sqlx::query(&WHOLE)))
        .fetch_all(&mut *conn)
        .await
        .db()?;
    // Committed: from here on an error must not send the caller the long way (it would write
    // the batch twice).
    let now = rows
        .last()
        .map(|row| row.get::<Millis>("now"))
        .transpose()
        .ok()
        .flatten();
    let Some(now) = now else {
        let e = StoreError::io("the batch statement returned no time");
        return Ok((unreadable(items, &e), 0));
    };
    let applied = results(conn, items, &rows)
        .await
        .unwrap_or_else(|e| unreadable(items, &e));
    Ok((applied, now))
}

/// Creates one saga, its steps and its `saga.started` event at `now`, leased as `lease` asks
/// if given, inside the caller's transaction: the statement of
/// [`insert_sagas`], for the starts that record more in the same transaction. An unleased
/// saga wakes the workers on commit.
pub(crate) async fn insert_saga(
    conn: &mut PgConnection,
    now: Millis,
    new: &NewSaga,
    lease: Option<&LeaseRequest>,
) -> Result<()> {
    CreateCols::of_sagas([(new, lease)])
        .bind(sqlx::query(&CREATE).bind(now))
        .execute(&mut *conn)
        .await
        .db()?;
    Ok(())
}

/// Creates sagas, their steps and their `saga.started` events, atomically.
async fn insert_sagas(
    conn: &mut PgConnection,
    now: Millis,
    items: &[NewItem],
    guarded: bool,
) -> Result<()> {
    let cols = CreateCols::of(items);
    open(conn, guarded).await?;
    let done = cols
        .bind(sqlx::query(&CREATE).bind(now))
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .db();
    close(conn, guarded, done).await
}

/// The batch writer of one writer task. It keeps nothing between batches: the driver keeps the
/// prepared statements on each connection.
pub(crate) struct PgWriter;

impl BatchWriter<Postgres> for PgWriter {
    /// `BEGIN`, and the database's time in the same round trip: leases expire on the database
    /// clock.
    async fn begin(&mut self, conn: &mut PgConnection) -> Result<Option<Millis>> {
        let row = conn.fetch_one("BEGIN; SELECT saga_now_ms()").await.db()?;
        Ok(Some(sqlx::Row::try_get(&row, 0).db()?))
    }

    async fn apply(
        &mut self,
        conn: &mut PgConnection,
        now: Millis,
        items: &[Item],
        shared: bool,
    ) -> Result<Vec<Result<Applied>>> {
        apply_batch(conn, now, items, shared).await
    }

    async fn create(
        &mut self,
        conn: &mut PgConnection,
        now: Millis,
        news: &[NewItem],
        shared: bool,
    ) -> Result<()> {
        insert_sagas(conn, now, news, shared).await
    }

    /// A batch without idempotent starts (this store runs those on a connection of their own,
    /// not through the queue), on the database clock: `now` is not used.
    async fn whole(
        &mut self,
        conn: &mut PgConnection,
        _now: Millis,
        items: &[Item],
        news: &[NewItem],
        keyed: &[KeyedItem],
    ) -> Option<Result<Whole>> {
        // Rows that branches' write-aheads update must exist before the batch statement runs:
        // a group that starts takes the long way (once per group).
        // So does a child saga that ends, which wakes its parent by a statement of its own.
        if !keyed.is_empty()
            || items
                .iter()
                .any(|(_, t)| !t.new_steps.is_empty() || t.wake.is_some())
        {
            return None;
        }
        Some(
            whole_batch(conn, items, news)
                .await
                .map(|(applied, now)| (applied, Vec::new(), now)),
        )
    }
}
