//! Tables for people, JSON for scripts.
//!
//! The JSON forms are the serde form of the model types, byte for byte what the HTTP API
//! answers, so a script can switch between `saga … --json` and `curl` freely. The tables are for
//! reading at a glance: flags beside the status, long errors truncated (the full text is in
//! `--json`), and times in RFC 3339 UTC like everywhere else.

use std::io::Write;

use comfy_table::{presets, CellAlignment, ContentArrangement, Table};
use serde::Serialize;

use crate::client::StartedSaga;
use crate::model::{
    needs_compensation, rfc3339, Attempt, Event, Millis, PhaseRecord, Saga, SagaPage, SagaStatus,
    SagaSummary, StepRecord, StepStatus,
};

/// Longest error text shown in a table cell.
const ERROR_WIDTH: usize = 60;
/// Longest event detail shown in a table cell.
const DETAIL_WIDTH: usize = 80;
/// Longest input shown in the header of `show`.
const INPUT_WIDTH: usize = 100;

/// Writes a value as pretty JSON followed by a newline.
pub(crate) fn json(out: &mut impl Write, value: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)
}

/// A table in the house style: light borders, no wrapping when the width is unknown.
fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    t
}

fn align_right(t: &mut Table, columns: &[usize]) {
    for &i in columns {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// Cuts text to `max` characters (on a character boundary), marking the cut with `…`, and
/// folds line breaks so that a cell stays one line.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

fn opt_time(ms: Option<Millis>) -> String {
    ms.map(rfc3339).unwrap_or_else(|| "-".to_owned())
}

/// A duration for people: `850ms`, `1.52s`, `2m03s`, `3h04m`, `2d05h`.
pub(crate) fn duration(ms: Millis) -> String {
    let ms = ms.max(0);
    let s = ms / 1000;
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{}.{:02}s", s, (ms % 1000) / 10),
        60_000..=3_599_999 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..=86_399_999 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// The flags shown beside a status.
fn flags(needs_attention: bool, blocked: bool, cancel_requested: bool) -> Vec<&'static str> {
    let mut f = Vec::new();
    if needs_attention {
        f.push("NEEDS ATTENTION");
    }
    if blocked {
        f.push("BLOCKED");
    }
    if cancel_requested {
        f.push("cancel requested");
    }
    f
}

/// The `list` table, then a hint for the next page.
pub(crate) fn saga_page(out: &mut impl Write, page: &SagaPage) -> std::io::Result<()> {
    if page.sagas.is_empty() {
        writeln!(out, "no sagas found")?;
    } else {
        let mut t = table(&[
            "id", "name", "version", "status", "flags", "created", "updated", "error",
        ]);
        align_right(&mut t, &[2]);
        for s in &page.sagas {
            t.add_row(summary_row(s));
        }
        writeln!(out, "{t}")?;
    }
    if let Some(next) = page.next_cursor {
        writeln!(
            out,
            "more sagas: repeat the command with --cursor {next} for the next page"
        )?;
    }
    Ok(())
}

fn summary_row(s: &SagaSummary) -> Vec<String> {
    vec![
        s.id.to_string(),
        s.name.clone(),
        s.version.to_string(),
        s.status.to_string(),
        flags(s.needs_attention, s.blocked, false).join(", "),
        rfc3339(s.created_at),
        rfc3339(s.updated_at),
        s.error
            .as_deref()
            .map(|e| truncate(e, ERROR_WIDTH))
            .unwrap_or_default(),
    ]
}

/// The `show` view: a header, the steps table and the attempt log. `now` is the database clock,
/// used to say how far off the next retry is.
pub(crate) fn saga(
    out: &mut impl Write,
    saga: &Saga,
    attempts: &[Attempt],
    now: Millis,
) -> std::io::Result<()> {
    header(out, saga, now)?;
    writeln!(out)?;
    writeln!(out, "Steps")?;
    writeln!(out, "{}", steps_table(saga, now))?;
    writeln!(out)?;
    if attempts.is_empty() {
        writeln!(out, "Attempts: none yet")?;
    } else {
        writeln!(out, "Attempts")?;
        writeln!(
            out,
            "{}",
            attempts_table(attempts, lease_is_live(saga, now))
        )?;
    }
    Ok(())
}

fn header(out: &mut impl Write, s: &Saga, now: Millis) -> std::io::Result<()> {
    let mut status = s.status.to_string();
    for f in flags(s.needs_attention, s.blocked, s.cancel_requested) {
        status.push_str("  ");
        status.push_str(f);
    }
    let hash: String = s.definition_hash.chars().take(12).collect();
    let mut lines: Vec<(&str, String)> = vec![
        ("Saga", s.id.to_string()),
        (
            "Name",
            format!("{}@{} (definition {hash})", s.name, s.version),
        ),
        ("Status", status),
    ];
    if s.blocked {
        lines.push((
            "Blocked",
            format!(
                "no running process has definition {}; start one that registers it",
                s.definition_key()
            ),
        ));
    }
    if let Some(e) = &s.error {
        lines.push(("Error", truncate(e, 200)));
    }
    lines.push(("Created", rfc3339(s.created_at)));
    lines.push(("Updated", rfc3339(s.updated_at)));
    let live = lease_is_live(s, now);
    if let Some(at) = s.next_run_at.filter(|_| !s.status.is_terminal()) {
        if at > now {
            lines.push((
                "Next run",
                format!("{} (in {})", rfc3339(at), duration(at - now)),
            ));
        } else if !live {
            // Due and nobody holds it: no process has picked it up yet.
            let when = if now - at < 1000 {
                "due now".to_owned()
            } else {
                format!("due now, waiting for a process for {}", duration(now - at))
            };
            lines.push(("Next run", format!("{} ({when})", rfc3339(at))));
        }
        // Due under a live lease: the process holding it is running it now.
    }
    lines.push(("Lease", lease_line(s, now)));
    lines.push((
        "Pivot",
        if s.pivot_reached {
            "reached: the saga can no longer be cancelled".to_owned()
        } else {
            "not reached".to_owned()
        },
    ));
    lines.push(("Input", truncate(&s.input.to_string(), INPUT_WIDTH)));
    if let Some(hint) = hint(s) {
        lines.push(("Hint", hint));
    }
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in lines {
        writeln!(out, "{k:<width$}  {v}")?;
    }
    Ok(())
}

/// Whether a process holds the saga's lease now: its calls in flight are running, not lost.
fn lease_is_live(s: &Saga, now: Millis) -> bool {
    s.lease_owner.is_some() && s.lease_expires_at.is_none_or(|at| at > now)
}

/// The lease: who holds it and for how long, or that nobody does.
fn lease_line(s: &Saga, now: Millis) -> String {
    let epoch = s.lease_epoch;
    match (&s.lease_owner, s.lease_expires_at) {
        (None, _) => format!("none (epoch {epoch})"),
        (Some(owner), Some(at)) if at > now => {
            format!(
                "{owner} (epoch {epoch}, expires in {} unless renewed)",
                duration(at - now)
            )
        }
        (Some(owner), Some(at)) => format!(
            "{owner} (epoch {epoch}, expired {} ago: another process may take the saga over)",
            duration(now - at)
        ),
        (Some(owner), None) => format!("{owner} (epoch {epoch})"),
    }
}

/// What an operator can do about a saga that waits for a person.
fn hint(s: &Saga) -> Option<String> {
    let id = s.id;
    if s.status == SagaStatus::Failed {
        let step = s
            .steps
            .iter()
            .find(|x| matches!(x.action.status, StepStatus::Failed | StepStatus::Unknown))
            .map(|x| x.name.as_str())
            .unwrap_or("the failed step");
        return Some(format!(
            "past the pivot, it can go neither forward nor back: `retry {id}` runs {step} again, \
             `abort {id} --reason TEXT` stops it"
        ));
    }
    if s.status == SagaStatus::Compensating && s.needs_attention {
        let stuck: Vec<&str> = s
            .steps
            .iter()
            .filter(|x| x.compensation.last_error.is_some() && needs_compensation(x))
            .map(|x| x.name.as_str())
            .collect();
        let step = stuck.first().copied().unwrap_or("STEP");
        return Some(format!(
            "a compensation keeps failing and is still retried; once it is done by hand: \
             `mark-compensated {id} {step} --reason TEXT`"
        ));
    }
    None
}

/// A phase status for the table: `-` where there is no compensation, and a mark when the
/// latest attempt's outcome is unknown. An attempt in flight under a live lease is simply
/// `RUNNING`; without one (its process died, or lost the lease) nobody knows what it did.
fn phase_status(p: &PhaseRecord, live: bool) -> String {
    match p.status {
        StepStatus::None => "-".to_owned(),
        StepStatus::Unknown => p.status.to_string(),
        StepStatus::Running if live => p.status.to_string(),
        s if p.outcome_unknown => format!("{s} (outcome unknown)"),
        s => s.to_string(),
    }
}

/// The compensation's status for the table. A compensation that has not run says whether it
/// will: `PENDING` only while the saga is going back and the step's action may have had an
/// effect; otherwise it is not needed (or, on an aborted saga, deliberately not run).
fn compensation_status(saga: &Saga, step: &StepRecord, live: bool) -> String {
    if step.compensation.status != StepStatus::Pending {
        return phase_status(&step.compensation, live);
    }
    let pending = needs_compensation(step);
    match saga.status {
        SagaStatus::Compensating if pending => "PENDING".to_owned(),
        SagaStatus::Aborted if pending => "not run (aborted)".to_owned(),
        // Before the point of no return a later failure would still call for it.
        SagaStatus::Queued | SagaStatus::Running if !saga.pivot_reached => {
            "not needed yet".to_owned()
        }
        _ => "not needed".to_owned(),
    }
}

fn steps_table(saga: &Saga, now: Millis) -> Table {
    let live = lease_is_live(saga, now);
    let mut t = table(&[
        "#",
        "step",
        "kind",
        "action",
        "attempts",
        "compensation",
        "comp attempts",
        "last error",
        "started",
        "ended",
    ]);
    align_right(&mut t, &[0, 4, 6]);
    for s in &saga.steps {
        let no_comp = s.compensation.status == StepStatus::None;
        // The compensation runs after the action, so its error is the more recent one.
        let last_error = match (&s.compensation.last_error, &s.action.last_error) {
            (Some(c), _) => format!("compensation: {}", truncate(c, ERROR_WIDTH)),
            (None, Some(a)) => truncate(a, ERROR_WIDTH),
            (None, None) => String::new(),
        };
        t.add_row(vec![
            s.index.to_string(),
            s.name.clone(),
            s.kind.to_string(),
            phase_status(&s.action, live),
            s.action.attempts.to_string(),
            compensation_status(saga, s, live),
            if no_comp {
                "-".to_owned()
            } else {
                s.compensation.attempts.to_string()
            },
            last_error,
            opt_time(s.action.started_at),
            opt_time(s.action.ended_at),
        ]);
    }
    t
}

fn attempts_table(attempts: &[Attempt], live: bool) -> Table {
    let mut t = table(&[
        "step", "phase", "#", "worker", "started", "duration", "outcome", "error",
    ]);
    align_right(&mut t, &[2, 5]);
    for a in attempts {
        t.add_row(vec![
            format!("{} {}", a.step_index, a.step),
            a.phase.clone(),
            a.attempt.to_string(),
            a.worker.clone(),
            rfc3339(a.started_at),
            a.ended_at
                .map(|e| duration(e - a.started_at))
                .unwrap_or_else(|| "-".to_owned()),
            match &a.outcome {
                Some(o) => o.clone(),
                None if live => "running".to_owned(),
                None => "outcome unknown".to_owned(),
            },
            a.error
                .as_deref()
                .map(|e| truncate(e, ERROR_WIDTH))
                .unwrap_or_default(),
        ]);
    }
    t
}

/// The webhook deliveries section of `show` (nothing when the saga has none). `now` is the
/// database clock, used to say how far off the next attempt is.
pub(crate) fn deliveries(
    out: &mut impl Write,
    deliveries: &[crate::store::Delivery],
    now: Millis,
) -> std::io::Result<()> {
    if deliveries.is_empty() {
        return Ok(());
    }
    let mut t = table(&[
        "event",
        "type",
        "target",
        "state",
        "attempts",
        "next / done",
        "last",
        "error",
    ]);
    align_right(&mut t, &[0, 4]);
    // Deliveries go out in order per target: a later pending one waits for the first.
    let mut first_pending: std::collections::HashMap<&str, i64> = Default::default();
    for d in deliveries {
        let blocked_by = match d.state {
            crate::store::DeliveryState::Pending => {
                let first = *first_pending.entry(d.target.as_str()).or_insert(d.event_id);
                (first != d.event_id).then_some(first)
            }
            _ => None,
        };
        let when = match (d.delivered_at, d.next_attempt_at) {
            (Some(at), _) => rfc3339(at),
            (None, Some(_)) if blocked_by.is_some() => {
                format!("after {}", blocked_by.unwrap_or_default())
            }
            (None, Some(next)) if next > now => format!("in {}", duration(next - now)),
            (None, Some(_)) => "due".to_owned(),
            (None, None) => "-".to_owned(),
        };
        let state = match d.state {
            crate::store::DeliveryState::Pending => "pending",
            crate::store::DeliveryState::Delivered => "delivered",
            crate::store::DeliveryState::Failed => "FAILED",
        };
        t.add_row(vec![
            d.event_id.to_string(),
            d.kind.clone(),
            truncate(&d.target, DETAIL_WIDTH),
            state.to_owned(),
            d.attempts.to_string(),
            when,
            d.last_status.map(|s| s.to_string()).unwrap_or_default(),
            d.last_error
                .as_deref()
                .map(|e| truncate(e, ERROR_WIDTH))
                .unwrap_or_default(),
        ]);
    }
    writeln!(out)?;
    writeln!(out, "Webhook deliveries")?;
    writeln!(out, "{t}")
}

/// The `events` table.
pub(crate) fn events(out: &mut impl Write, events: &[Event]) -> std::io::Result<()> {
    if events.is_empty() {
        return writeln!(out, "no events");
    }
    let mut t = table(&["seq", "at", "type", "step", "details"]);
    align_right(&mut t, &[0]);
    for e in events {
        let details = match &e.data {
            serde_json::Value::Null => String::new(),
            serde_json::Value::Object(m) if m.is_empty() => String::new(),
            v => truncate(&v.to_string(), DETAIL_WIDTH),
        };
        t.add_row(vec![
            e.seq.to_string(),
            rfc3339(e.at),
            e.kind.clone(),
            e.step.clone().unwrap_or_default(),
            details,
        ]);
    }
    writeln!(out, "{t}")
}

/// The `workers` table: one row per orchestrator process, newest first.
pub(crate) fn workers(
    out: &mut impl Write,
    workers: &[crate::model::Worker],
    now: Millis,
) -> std::io::Result<()> {
    if workers.is_empty() {
        return writeln!(out, "no orchestrator process has run on this database");
    }
    let mut t = table(&[
        "worker",
        "host",
        "pid",
        "started",
        "last heartbeat",
        "state",
        "leases",
    ]);
    align_right(&mut t, &[2, 6]);
    for w in workers {
        let state = match w.stopped_at {
            Some(_) => "stopped".to_owned(),
            None => format!("alive ({} ago)", duration(now - w.heartbeat_at)),
        };
        t.add_row(vec![
            w.id.clone(),
            w.host.clone(),
            w.pid.to_string(),
            rfc3339(w.started_at),
            rfc3339(w.heartbeat_at),
            state,
            w.leases.to_string(),
        ]);
    }
    writeln!(out, "{t}")
}

/// What `start` prints: the new saga and the key that started it.
pub(crate) fn started(out: &mut impl Write, s: &StartedSaga) -> std::io::Result<()> {
    writeln!(out, "saga {} started: {} ({})", s.id, s.status, s.name)?;
    writeln!(
        out,
        "idempotency key {} (pass it as --idempotency-key to retry this same start)",
        s.idempotency_key
    )
}

/// What `start --wait` prints once the wait is over: how the saga ended, or that it has not.
pub(crate) fn waited(out: &mut impl Write, saga: &Saga, secs: u64) -> std::io::Result<()> {
    let mut line = if saga.status.is_terminal() {
        format!("saga {} ended: {}", saga.id, saga.status)
    } else {
        format!(
            "saga {} is still {} after {secs}s; it goes on in the background",
            saga.id, saga.status
        )
    };
    let f = flags(saga.needs_attention, saga.blocked, saga.cancel_requested);
    if !f.is_empty() {
        line.push_str(&format!(" ({})", f.join(", ")));
    }
    writeln!(out, "{line}")?;
    if let Some(error) = &saga.error {
        writeln!(out, "error: {}", truncate(error, 200))?;
    }
    Ok(())
}

/// One line after a command that changed a saga: where it is now.
pub(crate) fn now_status(out: &mut impl Write, saga: &Saga) -> std::io::Result<()> {
    let mut line = format!("saga {} is now {}", saga.id, saga.status);
    let f = flags(saga.needs_attention, saga.blocked, saga.cancel_requested);
    if !f.is_empty() {
        line.push_str(&format!(" ({})", f.join(", ")));
    }
    if saga.status == SagaStatus::Running || saga.status == SagaStatus::Compensating {
        line.push_str("; a worker will pick it up");
    }
    writeln!(out, "{line}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_character_boundaries() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("äöüäöüäöü", 4), "äöü…");
        assert_eq!(truncate("two\nlines", 20), "two lines");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(12), "12ms");
        assert_eq!(duration(1520), "1.52s");
        assert_eq!(duration(123_000), "2m03s");
        assert_eq!(duration(3_840_000), "1h04m");
        assert_eq!(duration(2 * 86_400_000 + 5 * 3_600_000), "2d05h");
        assert_eq!(duration(-5), "0ms");
    }
}
