//! The claim's admission of waiting sagas (SPEC §14), one text per dialect: the sagas a claim
//! may take beside the due ones it always takes. A saga waiting to start (`gate = 1`) is
//! admitted by the claim that leases it, in the same statement:
//! - one started with a priority but no limits, at once, in priority order;
//! - one of a definition with limits, only while its key's running count (per-key limit) and
//!   its definition's (max running) stay within them, counting the sagas admitted by this
//!   very claim: each waiting saga is ranked within its key, then within its definition by
//!   its turn (`fair_seq`, given at its start: one past its key's last waiting saga, never
//!   before the turn the queue has reached), so that keys take turns whatever their queues'
//!   lengths (fairness across keys), and admitted if its rank fits in the room left. A saga with a cancel pending
//!   is admitted regardless: it only goes back.
//!
//! The counts are read in the claim's snapshot, so two claims must not admit at once: on
//! PostgreSQL the claim takes a transaction-level advisory lock first (only an engine with
//! limited definitions, and only for its claims); SQLite has one writer.

/// Every status in which an admitted saga holds its running slot: all but the ends.
macro_rules! holding {
    () => {
        "('QUEUED', 'RUNNING', 'COMPENSATING', 'PAUSED')"
    };
}

/// The lock PostgreSQL claims with limits take, so that their counts are never stale.
#[cfg(feature = "postgres")]
pub(crate) const ADMISSION_LOCK: i64 = 0x5A6A_F10C;

/// Before a claim with limits: the sagas of those definitions that ended give their place in
/// `sagas_flow_running` up (`flow` cleared), so that the running counts walk only what
/// runs; `{flows}` the limited definitions' condition. Each ended saga is cleared once.
pub(crate) fn sweep(flows: &str) -> String {
    format!(
        "UPDATE sagas SET flow = NULL WHERE flow IS NOT NULL AND flow {flows} AND gate = 0 \
         AND status NOT IN {holding}",
        holding = holding!(),
    )
}

/// The sagas a claim admits from the definitions with limits, as `(id, priority, rnk,
/// next_run_at)`; `{now}` the claim's time, `{defs}` its definitions' condition, `{flows}`
/// its limited definitions' condition (each a complete SQL expression).
pub(crate) fn limited(now: &str, defs: &str, flows: &str) -> String {
    format!(
        "SELECT w.id, w.priority, w.fair_seq AS rnk, w.next_run_at FROM ( \
           SELECT k.id, k.flow, k.priority, k.next_run_at, k.fair_seq, k.cancel_requested, \
             row_number() OVER (PARTITION BY k.flow \
               ORDER BY k.priority DESC, k.fair_seq, k.next_run_at, k.id) AS frank \
           FROM ( \
             SELECT s.id, s.flow, s.flow_key, s.priority, s.next_run_at, s.cancel_requested, \
               s.fair_seq, \
               row_number() OVER (PARTITION BY s.flow, s.flow_key \
                 ORDER BY s.priority DESC, s.next_run_at, s.id) AS krank \
             FROM sagas s WHERE s.gate = 1 AND s.next_run_at IS NOT NULL \
               AND s.next_run_at <= {now} AND s.flow {flows} AND s.definition_key {defs} \
           ) k \
           LEFT JOIN flow_limits pk ON pk.kind = 'per_key' AND pk.saga = k.flow \
           LEFT JOIN (SELECT flow, flow_key, COUNT(*) AS n FROM sagas \
               WHERE flow IS NOT NULL AND flow {flows} AND gate = 0 AND status IN {holding} \
               GROUP BY flow, flow_key) rk ON rk.flow = k.flow AND rk.flow_key = k.flow_key \
           WHERE k.cancel_requested OR pk.name IS NULL \
             OR k.krank + COALESCE(rk.n, 0) <= pk.limit_value \
         ) w \
         LEFT JOIN flow_limits mr ON mr.kind = 'max_running' AND mr.saga = w.flow \
         LEFT JOIN (SELECT flow, COUNT(*) AS n FROM sagas \
             WHERE flow IS NOT NULL AND flow {flows} AND gate = 0 AND status IN {holding} \
             GROUP BY flow) rf ON rf.flow = w.flow \
         WHERE w.cancel_requested OR mr.name IS NULL \
           OR w.frank + COALESCE(rf.n, 0) <= mr.limit_value",
        holding = holding!(),
    )
}

/// A new saga's turn among its definition's waiting sagas (see the module), from its `flow`
/// and `flow_key` expressions; 0 for a saga that does not wait for limits.
/// `greatest` is the dialect's function of the larger of two values; `then` what to add for
/// the sagas of one key created before this one by the same statement (which do not see each
/// other: `0` for a statement that creates one saga).
pub(crate) fn fair_seq(greatest: &str, gated: &str, flow: &str, key: &str, then: &str) -> String {
    format!(
        "CASE WHEN {gated} AND {flow} IS NOT NULL THEN {greatest}( \
           COALESCE((SELECT MAX(q.fair_seq) FROM sagas q WHERE q.flow = {flow} \
             AND q.flow_key = {key} AND q.gate = 1 AND q.next_run_at IS NOT NULL), 0) + 1, \
           COALESCE((SELECT MIN(q.fair_seq) FROM sagas q WHERE q.flow = {flow} AND q.gate = 1 \
             AND q.next_run_at IS NOT NULL), 1)) + {then} ELSE 0 END"
    )
}

/// The sagas a claim admits at once by priority alone (started with a priority other than
/// the default, no limits), as `(id, priority, rnk, next_run_at)`, at most `{limit}`.
pub(crate) fn by_priority(now: &str, defs: &str, limit: &str, lock: &str) -> String {
    format!(
        "SELECT id, priority, 0 AS rnk, next_run_at FROM sagas \
         WHERE gate = 1 AND flow IS NULL AND next_run_at IS NOT NULL \
           AND next_run_at <= {now} AND definition_key {defs} \
         ORDER BY priority DESC, next_run_at LIMIT {limit}{lock}"
    )
}
