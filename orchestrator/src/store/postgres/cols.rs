//! A batch as PostgreSQL reads it: one typed array per column, bound in PostgreSQL's binary
//! format and read back as rows by `unnest(a, b, …)`.
//!
//! The arrays replace JSON documents that the server had to parse, field by field, for every
//! row (and, for a JSON object, once per field read): under load the writer's backend is the
//! limit, and parsing took much of its time (see BENCHMARKS.md). Each table's columns are listed once, as
//! [`Cols`], so the statement's `unnest` and the binding code cannot disagree on their order.

use std::collections::HashMap;

use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::Postgres;
use uuid::Uuid;

use crate::model::{definition_key, Millis, PhaseRecord};
use crate::store::rows::comp_status_for;
use crate::store::write_queue::batch::{Item, NewItem};
use crate::store::{AttemptChange, LeaseRequest, NewSaga};
use saga_dsl::Phase;

/// A statement being bound.
pub(crate) type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// The columns of one batch table, in binding order: name and element type.
pub(crate) type Cols = &'static [(&'static str, &'static str)];

/// The fence: one row per transition.
pub(crate) const SAGAS: Cols = &[
    ("saga_id", "uuid"),
    ("owner", "text"),
    ("epoch", "bigint"),
    ("guard", "boolean"),
    ("status", "text"),
    ("next_run_at", "bigint"),
    ("error", "text"),
    ("output", "text"),
    ("attention", "boolean"),
    ("pivot", "boolean"),
    ("rel", "boolean"),
    ("hold", "boolean"),
    ("paused_from", "text"),
];

/// One row per touched (saga, step); `has_a` / `has_c` say which phases changed.
pub(crate) const STEPS: Cols = &[
    ("saga_id", "uuid"),
    ("epoch", "bigint"),
    ("idx", "bigint"),
    ("has_a", "boolean"),
    ("a_status", "text"),
    ("a_attempts", "bigint"),
    ("a_error", "text"),
    ("a_unknown", "boolean"),
    ("a_started", "bigint"),
    ("a_ended", "bigint"),
    ("a_wake", "bigint"),
    ("a_waiting_for", "text"),
    ("a_timeout", "bigint"),
    ("output", "text"),
    ("retry", "bigint"),
    ("has_c", "boolean"),
    ("c_status", "text"),
    ("c_attempts", "bigint"),
    ("c_error", "text"),
    ("c_unknown", "boolean"),
    ("c_started", "bigint"),
    ("c_ended", "bigint"),
];

/// Attempts that ended.
pub(crate) const FINISHES: Cols = &[
    ("saga_id", "uuid"),
    ("epoch", "bigint"),
    ("idx", "bigint"),
    ("phase", "text"),
    ("attempt", "bigint"),
    ("outcome", "text"),
    ("error", "text"),
];

/// Attempts about to start (the write-ahead).
pub(crate) const STARTS: Cols = &[
    ("saga_id", "uuid"),
    ("owner", "text"),
    ("epoch", "bigint"),
    ("idx", "bigint"),
    ("phase", "text"),
    ("attempt", "bigint"),
    ("seq", "bigint"),
];

/// Events, in batch order.
pub(crate) const EVENTS: Cols = &[
    ("saga_id", "uuid"),
    ("epoch", "bigint"),
    ("kind", "text"),
    ("step", "text"),
    ("data", "text"),
];

/// New sagas, in batch order.
pub(crate) const NEW_SAGAS: Cols = &[
    ("id", "uuid"),
    ("name", "text"),
    ("version", "bigint"),
    ("hash", "text"),
    ("key", "text"),
    ("input", "text"),
    ("owner", "text"),
    ("epoch", "bigint"),
    ("ttl", "bigint"),
    ("ahead", "boolean"),
    ("pivot", "boolean"),
    ("start_at", "bigint"),
    ("traceparent", "text"),
    ("priority", "bigint"),
    ("gate", "bigint"),
    ("flow", "text"),
    ("flow_key", "text"),
];

/// The steps of the new sagas.
pub(crate) const NEW_STEPS: Cols = &[
    ("saga_id", "uuid"),
    ("idx", "bigint"),
    ("name", "text"),
    ("kind", "text"),
    ("comp_status", "text"),
    ("ahead", "boolean"),
];

/// The search attributes of the new sagas.
pub(crate) const NEW_ATTRS: Cols = &[("saga_id", "uuid"), ("attr", "text"), ("value", "text")];

/// Rows of branches of parallel groups that start (inserted by a statement of their own,
/// before the batch's, so that the batch may write them ahead).
pub(crate) const NEW_BRANCHES: Cols = &[
    ("saga_id", "uuid"),
    ("owner", "text"),
    ("epoch", "bigint"),
    ("guard", "boolean"),
    ("hold", "boolean"),
    ("idx", "bigint"),
    ("name", "text"),
    ("kind", "text"),
    ("comp_status", "text"),
    ("stage_index", "bigint"),
    ("branch", "text"),
];

/// The new branch rows of a batch of transitions, as the column arrays of [`NEW_BRANCHES`].
#[derive(Default)]
pub(crate) struct NewBranchCols<'a> {
    saga_id: Vec<Uuid>,
    owner: Vec<&'a str>,
    epoch: Vec<i64>,
    guard: Vec<bool>,
    hold: Vec<bool>,
    idx: Vec<i64>,
    name: Vec<&'a str>,
    kind: Vec<&'static str>,
    comp_status: Vec<&'static str>,
    stage_index: Vec<i64>,
    branch: Vec<&'a str>,
}

impl<'a> NewBranchCols<'a> {
    /// The new rows of `items`; `None` when they have none (the usual batch).
    pub(crate) fn of(items: &'a [Item]) -> Option<Self> {
        let mut c = Self::default();
        for (lease, t) in items {
            for n in &t.new_steps {
                c.saga_id.push(lease.saga_id);
                c.owner.push(&lease.owner);
                c.epoch.push(lease.epoch);
                c.guard.push(t.unless_cancelled);
                c.hold.push(t.unless_paused);
                c.idx.push(i64::from(n.index));
                c.name.push(&n.name);
                c.kind.push(n.kind.as_str());
                c.comp_status.push(comp_status_for(n.kind).as_str());
                c.stage_index.push(i64::from(n.stage_index));
                c.branch.push(&n.branch);
            }
        }
        (!c.saga_id.is_empty()).then_some(c)
    }

    /// Binds the columns in the order of [`NEW_BRANCHES`].
    pub(crate) fn bind<'q>(&'q self, q: PgQuery<'q>) -> PgQuery<'q> {
        q.bind(&self.saga_id)
            .bind(&self.owner)
            .bind(&self.epoch)
            .bind(&self.guard)
            .bind(&self.hold)
            .bind(&self.idx)
            .bind(&self.name)
            .bind(&self.kind)
            .bind(&self.comp_status)
            .bind(&self.stage_index)
            .bind(&self.branch)
    }
}

/// Numbers a statement's parameters in the order they are bound.
#[derive(Debug, Default)]
pub(crate) struct Params(usize);

impl Params {
    /// The next parameter, cast to `ty`.
    pub(crate) fn next(&mut self, ty: &str) -> String {
        self.0 += 1;
        format!("${}::{ty}", self.0)
    }

    /// `unnest($a::t[], $b::u[], …) [WITH ORDINALITY] AS alias(c, d, …[, ord])` over the
    /// next parameters, one array per column of `cols`; also returns the first column's
    /// parameter (the table's saga ids).
    pub(crate) fn unnest(&mut self, cols: Cols, alias: &str, ordinality: bool) -> (String, String) {
        let args: Vec<String> = cols
            .iter()
            .map(|(_, ty)| self.next(&format!("{ty}[]")))
            .collect();
        let mut names: Vec<&str> = cols.iter().map(|(name, _)| *name).collect();
        if ordinality {
            names.push("ord");
        }
        let text = format!(
            "unnest({}){} AS {alias}({})",
            args.join(", "),
            if ordinality { " WITH ORDINALITY" } else { "" },
            names.join(", ")
        );
        (text, args[0].clone())
    }
}

/// The fence's columns.
#[derive(Default)]
struct SagaCols<'a> {
    saga_id: Vec<Uuid>,
    owner: Vec<&'a str>,
    epoch: Vec<i64>,
    guard: Vec<bool>,
    status: Vec<&'static str>,
    next_run_at: Vec<Option<Millis>>,
    error: Vec<Option<&'a str>>,
    output: Vec<Option<String>>,
    attention: Vec<bool>,
    pivot: Vec<bool>,
    rel: Vec<bool>,
    hold: Vec<bool>,
    paused_from: Vec<Option<&'static str>>,
}

/// One phase's columns.
#[derive(Default)]
struct PhaseCols<'a> {
    changed: Vec<bool>,
    status: Vec<Option<&'static str>>,
    attempts: Vec<Option<i64>>,
    error: Vec<Option<&'a str>>,
    unknown: Vec<Option<bool>>,
    started: Vec<Option<Millis>>,
    ended: Vec<Option<Millis>>,
}

impl<'a> PhaseCols<'a> {
    fn push(&mut self, r: Option<&'a PhaseRecord>) {
        self.changed.push(r.is_some());
        self.status.push(r.map(|r| r.status.as_str()));
        self.attempts.push(r.map(|r| i64::from(r.attempts)));
        self.error.push(r.and_then(|r| r.last_error.as_deref()));
        self.unknown.push(r.map(|r| r.outcome_unknown));
        self.started.push(r.and_then(|r| r.started_at));
        self.ended.push(r.and_then(|r| r.ended_at));
    }

    fn bind<'q>(&'q self, q: PgQuery<'q>) -> PgQuery<'q> {
        q.bind(&self.status)
            .bind(&self.attempts)
            .bind(&self.error)
            .bind(&self.unknown)
            .bind(&self.started)
            .bind(&self.ended)
    }
}

/// The step rows' columns.
#[derive(Default)]
struct StepCols<'a> {
    saga_id: Vec<Uuid>,
    epoch: Vec<i64>,
    idx: Vec<i64>,
    a: PhaseCols<'a>,
    wake: Vec<Option<Millis>>,
    waiting_for: Vec<Option<&'a str>>,
    timeout: Vec<Option<Millis>>,
    output: Vec<Option<String>>,
    retry: Vec<Option<Millis>>,
    c: PhaseCols<'a>,
}

/// An attempt table's columns (`owner` only for starts, `outcome` and `error` only for
/// finishes).
#[derive(Default)]
struct AttemptCols<'a> {
    saga_id: Vec<Uuid>,
    owner: Vec<&'a str>,
    epoch: Vec<i64>,
    idx: Vec<i64>,
    phase: Vec<&'static str>,
    attempt: Vec<i64>,
    seq: Vec<i64>,
    outcome: Vec<&'static str>,
    error: Vec<Option<&'a str>>,
}

/// The events' columns.
#[derive(Default)]
struct EventCols<'a> {
    saga_id: Vec<Uuid>,
    epoch: Vec<i64>,
    kind: Vec<&'static str>,
    step: Vec<Option<&'a str>>,
    data: Vec<String>,
}

/// A batch of transitions as the column arrays its statement reads, in batch order.
#[derive(Default)]
pub(crate) struct ApplyCols<'a> {
    sagas: SagaCols<'a>,
    steps: StepCols<'a>,
    finishes: AttemptCols<'a>,
    starts: AttemptCols<'a>,
    events: EventCols<'a>,
}

impl<'a> ApplyCols<'a> {
    /// Flattens `items`.
    pub(crate) fn of(items: &'a [Item]) -> Self {
        let mut c = Self::default();
        for (lease, t) in items {
            let s = &mut c.sagas;
            s.saga_id.push(lease.saga_id);
            s.owner.push(&lease.owner);
            s.epoch.push(lease.epoch);
            s.guard.push(t.unless_cancelled);
            s.status.push(t.saga.status.as_str());
            s.next_run_at.push(t.saga.next_run_at);
            s.error.push(t.saga.error.as_deref());
            s.output
                .push(t.saga.output.as_ref().map(ToString::to_string));
            s.attention.push(t.saga.needs_attention);
            s.pivot.push(t.saga.pivot_started);
            s.rel.push(t.release);
            s.hold.push(t.unless_paused);
            s.paused_from.push(t.saga.paused_from.map(|p| p.as_str()));
            for change in &t.attempts {
                let (table, idx, phase, attempt) = match change {
                    AttemptChange::Start {
                        step_index,
                        phase,
                        attempt,
                        seq,
                    } => {
                        c.starts.owner.push(&lease.owner);
                        c.starts.seq.push(i64::from(*seq));
                        (&mut c.starts, step_index, phase, attempt)
                    }
                    AttemptChange::Finish {
                        step_index,
                        phase,
                        attempt,
                        outcome,
                        error,
                    } => {
                        c.finishes.outcome.push(outcome);
                        c.finishes.error.push(error.as_deref());
                        (&mut c.finishes, step_index, phase, attempt)
                    }
                };
                table.saga_id.push(lease.saga_id);
                table.epoch.push(lease.epoch);
                table.idx.push(i64::from(*idx));
                table.phase.push(phase.as_str());
                table.attempt.push(i64::from(*attempt));
            }
            for e in &t.events {
                let ev = &mut c.events;
                ev.saga_id.push(lease.saga_id);
                ev.epoch.push(lease.epoch);
                ev.kind.push(e.kind);
                ev.step.push(e.step.as_deref());
                ev.data.push(e.data.to_string());
            }
        }
        c.push_steps(items);
        c
    }

    /// One row per touched (saga, step): the last update of each phase (a transition may
    /// carry a recovery and a new write-ahead of the same phase), and the action's output if
    /// any update of it carried one.
    fn push_steps(&mut self, items: &'a [Item]) {
        struct Row<'a> {
            saga_id: Uuid,
            epoch: i64,
            idx: u32,
            a: Option<&'a PhaseRecord>,
            c: Option<&'a PhaseRecord>,
            wake: Option<Millis>,
            waiting_for: Option<&'a str>,
            timeout: Option<Millis>,
            output: Option<String>,
            retry: Option<Millis>,
        }
        let mut rows: Vec<Row<'a>> = Vec::new();
        let mut at: HashMap<(Uuid, u32), usize> = HashMap::new();
        for (lease, t) in items {
            for u in &t.steps {
                let i = *at.entry((lease.saga_id, u.index)).or_insert_with(|| {
                    rows.push(Row {
                        saga_id: lease.saga_id,
                        epoch: lease.epoch,
                        idx: u.index,
                        a: None,
                        c: None,
                        wake: None,
                        waiting_for: None,
                        timeout: None,
                        output: None,
                        retry: None,
                    });
                    rows.len() - 1
                });
                let row = &mut rows[i];
                match u.phase {
                    Phase::Action => {
                        row.a = Some(&u.record);
                        row.wake = u.wake_at;
                        row.waiting_for = u.waiting_for.as_deref();
                        row.timeout = u.timeout_at;
                        if let Some(out) = &u.output {
                            row.output = Some(out.to_string());
                        }
                    }
                    Phase::Compensation => row.c = Some(&u.record),
                }
                // A branch retries its action or its compensation on the one timer.
                row.retry = u.retry_at;
            }
        }
        let s = &mut self.steps;
        for row in rows {
            s.saga_id.push(row.saga_id);
            s.epoch.push(row.epoch);
            s.idx.push(i64::from(row.idx));
            s.a.push(row.a);
            s.wake.push(row.wake);
            s.waiting_for.push(row.waiting_for);
            s.timeout.push(row.timeout);
            s.output.push(row.output);
            s.retry.push(row.retry);
            s.c.push(row.c);
        }
    }

    /// Binds the columns in the order of [`SAGAS`], [`STEPS`], [`FINISHES`], [`STARTS`],
    /// [`EVENTS`].
    pub(crate) fn bind<'q>(&'q self, q: PgQuery<'q>) -> PgQuery<'q> {
        let s = &self.sagas;
        let q = q
            .bind(&s.saga_id)
            .bind(&s.owner)
            .bind(&s.epoch)
            .bind(&s.guard)
            .bind(&s.status)
            .bind(&s.next_run_at)
            .bind(&s.error)
            .bind(&s.output)
            .bind(&s.attention)
            .bind(&s.pivot)
            .bind(&s.rel)
            .bind(&s.hold)
            .bind(&s.paused_from);
        let st = &self.steps;
        let q = q.bind(&st.saga_id).bind(&st.epoch).bind(&st.idx);
        let q =
            st.a.bind(q.bind(&st.a.changed))
                .bind(&st.wake)
                .bind(&st.waiting_for)
                .bind(&st.timeout)
                .bind(&st.output)
                .bind(&st.retry);
        let q = st.c.bind(q.bind(&st.c.changed));
        let f = &self.finishes;
        let q = q
            .bind(&f.saga_id)
            .bind(&f.epoch)
            .bind(&f.idx)
            .bind(&f.phase)
            .bind(&f.attempt)
            .bind(&f.outcome)
            .bind(&f.error);
        let a = &self.starts;
        let q = q
            .bind(&a.saga_id)
            .bind(&a.owner)
            .bind(&a.epoch)
            .bind(&a.idx)
            .bind(&a.phase)
            .bind(&a.attempt)
            .bind(&a.seq);
        let e = &self.events;
        q.bind(&e.saga_id)
            .bind(&e.epoch)
            .bind(&e.kind)
            .bind(&e.step)
            .bind(&e.data)
    }
}

/// New sagas and their steps as the column arrays their statement reads.
#[derive(Default)]
pub(crate) struct CreateCols<'a> {
    id: Vec<Uuid>,
    name: Vec<&'a str>,
    version: Vec<i64>,
    hash: Vec<&'a str>,
    key: Vec<String>,
    input: Vec<String>,
    owner: Vec<Option<&'a str>>,
    epoch: Vec<i64>,
    ttl: Vec<Option<Millis>>,
    ahead: Vec<bool>,
    pivot: Vec<bool>,
    start_at: Vec<Option<Millis>>,
    traceparent: Vec<Option<&'a str>>,
    priority: Vec<i64>,
    gate: Vec<i64>,
    flow: Vec<Option<&'a str>>,
    flow_key: Vec<Option<&'a str>>,
    step_saga: Vec<Uuid>,
    step_idx: Vec<i64>,
    step_name: Vec<&'a str>,
    step_kind: Vec<&'static str>,
    step_comp: Vec<&'static str>,
    step_ahead: Vec<bool>,
    attr_saga: Vec<Uuid>,
    attr_name: Vec<&'a str>,
    attr_value: Vec<&'a str>,
}

impl<'a> CreateCols<'a> {
    /// Flattens `items`.
    pub(crate) fn of(items: &'a [NewItem]) -> Self {
        Self::of_sagas(items.iter().map(|item| (&item.new, item.lease.as_ref())))
    }

    /// Flattens sagas, each with the lease it is created under, if any.
    pub(crate) fn of_sagas(
        sagas: impl IntoIterator<Item = (&'a NewSaga, Option<&'a LeaseRequest>)>,
    ) -> Self {
        let mut c = Self::default();
        for (n, lease) in sagas {
            c.id.push(n.id);
            c.name.push(&n.name);
            c.version.push(i64::from(n.version));
            c.hash.push(&n.definition_hash);
            c.key
                .push(definition_key(&n.name, n.version, &n.definition_hash));
            c.input.push(n.input.to_string());
            c.owner.push(lease.map(|l| l.owner.as_str()));
            c.epoch.push(i64::from(lease.is_some()));
            c.ttl.push(lease.map(|l| l.ttl_ms));
            let ahead = n.starts_first_action(lease.is_some());
            c.ahead.push(ahead);
            c.pivot.push(ahead && n.first_is_point_of_no_return());
            c.start_at.push(n.start_at);
            c.traceparent.push(n.traceparent.as_deref());
            c.priority.push(i64::from(n.flow.priority));
            // A saga created leased is driven at once: it waits for nothing.
            c.gate.push(i64::from(n.flow.gated && lease.is_none()));
            c.flow.push(n.flow.flow.as_deref());
            c.flow_key.push(n.flow.key.as_deref());
            for (idx, (name, kind)) in n.steps.iter().enumerate() {
                c.step_saga.push(n.id);
                c.step_idx.push(i64::try_from(idx).unwrap_or(i64::MAX));
                c.step_name.push(name);
                c.step_kind.push(kind.as_str());
                c.step_comp.push(comp_status_for(*kind).as_str());
                c.step_ahead.push(ahead && idx == 0);
            }
            for (name, value) in &n.attrs {
                c.attr_saga.push(n.id);
                c.attr_name.push(name);
                c.attr_value.push(value);
            }
        }
        c
    }

    /// Binds the columns in the order of [`NEW_SAGAS`], then [`NEW_STEPS`], then
    /// [`NEW_ATTRS`].
    pub(crate) fn bind<'q>(&'q self, q: PgQuery<'q>) -> PgQuery<'q> {
        q.bind(&self.id)
            .bind(&self.name)
            .bind(&self.version)
            .bind(&self.hash)
            .bind(&self.key)
            .bind(&self.input)
            .bind(&self.owner)
            .bind(&self.epoch)
            .bind(&self.ttl)
            .bind(&self.ahead)
            .bind(&self.pivot)
            .bind(&self.start_at)
            .bind(&self.traceparent)
            .bind(&self.priority)
            .bind(&self.gate)
            .bind(&self.flow)
            .bind(&self.flow_key)
            .bind(&self.step_saga)
            .bind(&self.step_idx)
            .bind(&self.step_name)
            .bind(&self.step_kind)
            .bind(&self.step_comp)
            .bind(&self.step_ahead)
            .bind(&self.attr_saga)
            .bind(&self.attr_name)
            .bind(&self.attr_value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_in_binding_order_across_tables() {
        let mut p = Params::default();
        let (sagas, ids) = p.unnest(&[("id", "uuid"), ("n", "bigint")], "v", false);
        assert_eq!(sagas, "unnest($1::uuid[], $2::bigint[]) AS v(id, n)");
        assert_eq!(ids, "$1::uuid[]");
        assert_eq!(p.next("bigint"), "$3::bigint");
        let (events, _) = p.unnest(&[("kind", "text")], "x", true);
        assert_eq!(events, "unnest($4::text[]) WITH ORDINALITY AS x(kind, ord)");
    }

    #[test]
    fn every_table_binds_one_array_per_listed_column() {
        // The bind methods must push exactly as many parameters as the statement's unnests
        // name; count them on an empty batch.
        fn count(mut q: PgQuery<'_>) -> usize {
            use sqlx::{Arguments, Execute};
            q.take_arguments().ok().flatten().map_or(0, |a| a.len())
        }
        let apply = ApplyCols::default();
        assert_eq!(
            count(apply.bind(sqlx::query(""))),
            SAGAS.len() + STEPS.len() + FINISHES.len() + STARTS.len() + EVENTS.len()
        );
        let create = CreateCols::default();
        assert_eq!(
            count(create.bind(sqlx::query(""))),
            NEW_SAGAS.len() + NEW_STEPS.len() + NEW_ATTRS.len()
        );
    }
}
