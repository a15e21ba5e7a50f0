//! Tables for people, JSON for scripts.
//!
//! The JSON forms are the serde form of the model types, byte for byte what the HTTP API
//! answers, so a script can switch between `saga … --json` and `curl` freely. The tables are for
//! reading at a glance: flags beside the status, and times in RFC 3339 UTC like everywhere else,
//! with how long ago beside them where that is what a reader wants to know. Tables fit the
//! [`Layout`]'s width (see [`super::table`]), cutting long cells only to fit it (never in a
//! pipe), and colour statuses only when it says so. `show` then prints every error the tables
//! cut whole, under them.

use std::io::Write;

use comfy_table::{Color, Table};
use serde::Serialize;
use unicode_width::UnicodeWidthStr;

use super::table::{one_line, truncate, Fit, Grid, Layout};

use crate::client::StartedSaga;
use crate::model::{
    needs_compensation, rfc3339, Attempt, Event, Millis, PhaseRecord, Saga, SagaPage, SagaStatus,
    StepKind, StepRecord, StepStatus,
};
use crate::store::DEFAULT_PRIORITY;

/// The columns a whole saga id takes in a table, with its borders and padding.
const ID_COLUMNS: usize = 36 + 3;
/// Longest input shown in the header of `show`.
const INPUT_WIDTH: usize = 100;

/// Writes a value as pretty JSON followed by a newline.
pub(crate) fn json(out: &mut impl Write, value: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)
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

/// A time of day (`22:11:13.631`) when `ms` falls on the same UTC day as `day_of`, else the full
/// RFC 3339 time: the compact form of times in a table whose date is said elsewhere.
fn clock_time(ms: Millis, day_of: Millis) -> String {
    let full = rfc3339(ms);
    if full.get(..10) == rfc3339(day_of).get(..10) {
        full.get(11..23).map(str::to_owned).unwrap_or(full)
    } else {
        full
    }
}

fn opt_clock_time(ms: Option<Millis>, day_of: Millis) -> String {
    ms.map(|m| clock_time(m, day_of))
        .unwrap_or_else(|| "-".to_owned())
}

/// How long ago, for people: `just now`, `42s ago`, `12 min ago`, `5 h ago`, `3 days ago`.
pub(crate) fn ago(then: Millis, now: Millis) -> String {
    match span(now - then) {
        None => "just now".to_owned(),
        Some(span) => format!("{span} ago"),
    }
}

/// A length of time for people (`42s`, `12 min`, `5 h`, `3 days`); `None` under a second.
fn span(ms: Millis) -> Option<String> {
    let s = ms.max(0) / 1000;
    match s {
        0 => None,
        1..=59 => Some(format!("{s}s")),
        60..=3_599 => Some(format!("{} min", s / 60)),
        3_600..=172_799 => Some(format!("{} h", s / 3600)),
        _ => Some(format!("{} days", s / 86_400)),
    }
}

/// An absolute time with how long ago it was: `2026-11-30T10:00:00.000Z (12 min ago)`.
fn time_and_ago(ms: Millis, now: Millis) -> String {
    format!("{} ({})", rfc3339(ms), ago(ms, now))
}

/// A time to come with how long until it: `2026-11-30T10:00:00.000Z (in 12 min)`; a time
/// already past reads as [`time_and_ago`].
fn time_and_in(ms: Millis, now: Millis) -> String {
    if ms <= now {
        return time_and_ago(ms, now);
    }
    let until = span(ms - now).unwrap_or_else(|| "a moment".to_owned());
    format!("{} (in {until})", rfc3339(ms))
}

/// The colour of a status (of a saga, a phase or a flag) on a terminal.
fn status_colour(text: &str) -> Option<Color> {
    let word = text.split([' ', ',']).next().unwrap_or("");
    match word {
        "COMPLETED" | "SUCCEEDED" | "delivered" => Some(Color::Green),
        "FAILED" | "UNKNOWN" | "NEEDS" => Some(Color::Red),
        "COMPENSATED" | "MANUAL" | "BLOCKED" => Some(Color::Yellow),
        "ABORTED" => Some(Color::Magenta),
        "RUNNING" | "COMPENSATING" | "RETRYING" | "WAITING" => Some(Color::Cyan),
        _ => None,
    }
}

fn colours_of(cells: &[String]) -> Vec<Option<Color>> {
    cells.iter().map(|c| status_colour(c)).collect()
}

/// `text` in `colour` (an ANSI escape sequence), for the lines that are not tables.
fn paint(text: &str, colour: Option<Color>, layout: &Layout) -> String {
    let code = match colour {
        Some(Color::Red) => 31,
        Some(Color::Green) => 32,
        Some(Color::Yellow) => 33,
        Some(Color::Magenta) => 35,
        Some(Color::Cyan) => 36,
        _ => return text.to_owned(),
    };
    if layout.colour {
        format!("\u{1b}[{code}m{text}\u{1b}[0m")
    } else {
        text.to_owned()
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

/// The `list` table, then a hint for the next page. `now` is the database clock, for the
/// relative times; `short`, each saga's shortest unique id prefix, shown instead of the whole
/// id when the table must be narrow.
pub(crate) fn saga_page(
    out: &mut impl Write,
    page: &SagaPage,
    short: Option<&[String]>,
    now: Millis,
    layout: &Layout,
) -> std::io::Result<()> {
    if page.sagas.is_empty() {
        writeln!(out, "no sagas found")?;
    } else {
        let sagas = &page.sagas;
        let mut g = Grid::new();
        let id = g.column("id", sagas.iter().map(|s| s.id.to_string()).collect());
        let name = g.column("name", sagas.iter().map(|s| s.name.clone()).collect());
        let version = g.column(
            "version",
            sagas.iter().map(|s| s.version.to_string()).collect(),
        );
        let statuses: Vec<String> = sagas.iter().map(|s| s.status.to_string()).collect();
        let status_colours = colours_of(&statuses);
        let status = g.column("status", statuses);
        let flag_cells: Vec<String> = sagas
            .iter()
            .map(|s| flags(s.needs_attention, s.blocked, false).join(", "))
            .collect();
        let flag_colours = colours_of(&flag_cells);
        let flagged = g.column("flags", flag_cells);
        let waiting = g.column(
            "waiting for",
            sagas
                .iter()
                .map(|s| {
                    s.waiting_for
                        .as_deref()
                        .map(|w| match s.wake_at {
                            Some(at) if at > now => format!("{w} (in {})", duration(at - now)),
                            _ => w.to_owned(),
                        })
                        .unwrap_or_default()
                })
                .collect(),
        );
        let attrs = g.column(
            "attrs",
            sagas.iter().map(|s| attrs_text(&s.attrs)).collect(),
        );
        let created = g.column(
            "created",
            sagas.iter().map(|s| rfc3339(s.created_at)).collect(),
        );
        let updated = g.column(
            "updated",
            sagas.iter().map(|s| ago(s.updated_at, now)).collect(),
        );
        let error = g.column(
            "error",
            sagas
                .iter()
                .map(|s| s.error.as_deref().map(one_line).unwrap_or_default())
                .collect(),
        );
        if let Some(short) = short {
            g.compact(id, short.to_vec());
            // Whole, an id (and its borders) takes 39 columns: more than two fifths of a
            // narrow terminal, which then has too little left for what a list is read for.
            if layout
                .width
                .is_some_and(|w| usize::from(w) * 2 < ID_COLUMNS * 5)
            {
                g.use_compact(id);
            }
        }
        g.whole(id)
            .flex(name, 8)
            .flex(error, 12)
            .right(version)
            .colours(status, status_colours)
            .colours(flagged, flag_colours)
            .flex(waiting, 8)
            .hide_if_empty(flagged)
            .flex(attrs, 8)
            .hide_if_empty(waiting)
            .hide_if_empty(attrs)
            .hide_if_empty(error);
        // Flags (NEEDS ATTENTION) are what a narrow list must still show; the id, shortened
        // to a unique prefix (which every command takes), leaves them room.
        let t = g.render(
            layout,
            &[
                Fit::Drop(version),
                Fit::Drop(attrs),
                Fit::Drop(created),
                Fit::Drop(updated),
                Fit::Compact(id),
            ],
        );
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

/// Search attributes as `name=value`, comma-separated, in name order.
fn attrs_text(attrs: &std::collections::BTreeMap<String, String>) -> String {
    attrs
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `show` view: a header, the steps table and the attempt log. `now` is the database clock,
/// used to say how far off the next retry is and whether the lease is live.
pub(crate) fn saga(
    out: &mut impl Write,
    saga: &Saga,
    attempts: &[Attempt],
    now: Millis,
    layout: &Layout,
) -> std::io::Result<()> {
    header(out, saga, now, layout)?;
    writeln!(out)?;
    writeln!(out, "Steps")?;
    writeln!(out, "{}", steps_table(saga, now, layout))?;
    writeln!(out)?;
    if attempts.is_empty() {
        writeln!(out, "Attempts: none yet")?;
    } else {
        writeln!(out, "Attempts")?;
        let live = lease_is_live(saga, now);
        writeln!(
            out,
            "{}",
            attempts_table(attempts, live, saga.created_at, layout)
        )?;
    }
    // Tables fitted to a width may have cut errors; a pipe has them whole already.
    if let Some(width) = layout.width {
        full_errors(out, saga, attempts, usize::from(width))?;
    }
    Ok(())
}

/// Every error of the saga in full, wrapped at `width` and never cut: the saga's, each step's
/// last ones and each failed attempt's, the same text said once with every place it came from
/// (`charge action, attempts 1-3`).
fn full_errors(
    out: &mut impl Write,
    saga: &Saga,
    attempts: &[Attempt],
    width: usize,
) -> std::io::Result<()> {
    // (error, where it came from), in the order a reader meets them.
    let mut errors: Vec<(String, Vec<String>)> = Vec::new();
    let mut note = |text: &str, place: String| {
        let text = one_line(text);
        match errors.iter_mut().find(|(e, _)| *e == text) {
            Some((_, places)) => {
                if !places.contains(&place) {
                    places.push(place);
                }
            }
            None => errors.push((text, vec![place])),
        }
    };
    if let Some(e) = &saga.error {
        note(e, "saga".to_owned());
    }
    for s in &saga.steps {
        if let Some(e) = &s.action.last_error {
            note(e, format!("{} action", s.name));
        }
        if let Some(e) = &s.compensation.last_error {
            note(e, format!("{} compensation", s.name));
        }
    }
    // Runs of attempts of one phase that failed the same way, as one place.
    let mut i = 0;
    while i < attempts.len() {
        let a = &attempts[i];
        let Some(error) = &a.error else {
            i += 1;
            continue;
        };
        let mut last = i;
        while attempts.get(last + 1).is_some_and(|b| {
            b.step_index == a.step_index && b.phase == a.phase && b.error.as_ref() == Some(error)
        }) {
            last += 1;
        }
        let place = if last == i {
            format!("{} {}, attempt {}", a.step, a.phase, a.attempt)
        } else {
            format!(
                "{} {}, attempts {}-{}",
                a.step, a.phase, a.attempt, attempts[last].attempt
            )
        };
        note(error, place);
        i = last + 1;
    }
    if errors.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "Errors in full")?;
    for (text, places) in errors {
        for line in wrap_hard(&format!("{}:", places.join("; ")), width.saturating_sub(2)) {
            writeln!(out, "  {line}")?;
        }
        for line in wrap_hard(&text, width.saturating_sub(4)) {
            writeln!(out, "    {line}")?;
        }
    }
    Ok(())
}

/// [`wrap`], with words longer than `width` broken across lines: nothing is cut, and no line
/// is wider than `width`.
fn wrap_hard(text: &str, width: usize) -> Vec<String> {
    use unicode_width::UnicodeWidthChar;

    let width = width.max(10);
    let mut words = Vec::new();
    for word in text.split_whitespace() {
        let mut piece = String::new();
        let mut used = 0;
        for c in word.chars() {
            let w = c.width().unwrap_or(0);
            if used + w > width {
                words.push(std::mem::take(&mut piece));
                used = 0;
            }
            used += w;
            piece.push(c);
        }
        words.push(piece);
    }
    wrap(&words.join(" "), width)
}

fn header(out: &mut impl Write, s: &Saga, now: Millis, layout: &Layout) -> std::io::Result<()> {
    let status_text = s.status.to_string();
    let mut status = paint(&status_text, status_colour(&status_text), layout);
    for f in flags(s.needs_attention, s.blocked, s.cancel_requested) {
        status.push_str("  ");
        status.push_str(&paint(f, status_colour(f), layout));
    }
    let hash: String = s.definition_hash.chars().take(12).collect();
    // Lines that are cut to the width (the full text is in `--json`), and the rest.
    let mut lines: Vec<(&str, String, bool)> = vec![
        ("Saga", s.id.to_string(), false),
        (
            "Name",
            format!("{}@{} (definition {hash})", s.name, s.version),
            true,
        ),
        ("Status", status, false),
        (
            "Priority",
            if s.priority == DEFAULT_PRIORITY {
                format!("{} (the default)", s.priority)
            } else {
                format!("{} (0 last, 9 first; 5 by default)", s.priority)
            },
            true,
        ),
    ];
    if !s.attrs.is_empty() {
        lines.push(("Attrs", attrs_text(&s.attrs), true));
    }
    if s.blocked {
        lines.push((
            "Blocked",
            format!(
                "no running process has definition {}; start one that registers it",
                s.definition_key()
            ),
            true,
        ));
    }
    if let Some(e) = &s.error {
        lines.push(("Error", one_line(e), true));
    }
    if let (Some(parent), Some(stage)) = (s.parent_id, &s.parent_stage) {
        lines.push((
            "Parent",
            format!("{parent} (its stage {stage} started this saga)"),
            true,
        ));
    }
    if let Some(from) = &s.forked_from {
        let how = match &from.stage {
            Some(stage) => format!("from stage {stage}, taking over the effects before it"),
            None => "afresh".to_owned(),
        };
        lines.push(("Forked from", format!("{} ({how})", from.saga_id), true));
    }
    if let Some(by) = s.superseded_by {
        lines.push((
            "Superseded by",
            format!("{by} (a fork that took this saga's effects over)"),
            true,
        ));
    }
    lines.push(("Created", time_and_ago(s.created_at, now), false));
    if let Some(at) = s.scheduled_at {
        lines.push(("Scheduled", time_and_in(at, now), false));
    }
    lines.push(("Updated", time_and_ago(s.updated_at, now), false));
    let live = lease_is_live(s, now);
    if let Some(at) = s.next_run_at.filter(|_| !s.status.is_terminal()) {
        if at > now {
            lines.push((
                "Next run",
                format!("{} (in {})", rfc3339(at), duration(at - now)),
                true,
            ));
        } else if !live {
            // Due and nobody holds it: no process has picked it up yet.
            let when = if now - at < 1000 {
                "due now".to_owned()
            } else {
                format!("due now, waiting for a process for {}", duration(now - at))
            };
            lines.push(("Next run", format!("{} ({when})", rfc3339(at)), true));
        }
        // Due under a live lease: the process holding it is running it now.
    }
    lines.push(("Lease", lease_line(s, now), true));
    if let Some(wait) = &s.waiting_for {
        lines.push(("Waiting", wait_text(wait, s.wake_at, now), true));
    }
    lines.push(("Pivot", pivot_line(s).to_owned(), true));
    lines.push(("Input", truncate(&s.input.to_string(), INPUT_WIDTH), true));
    let key_width = lines.iter().map(|(k, ..)| k.len()).max().unwrap_or(0);
    let room = layout
        .width
        .map(|w| usize::from(w).saturating_sub(key_width + 2));
    for (k, v, cut) in lines {
        let v = match room {
            Some(room) if cut => truncate(&v, room),
            _ => v,
        };
        writeln!(out, "{k:<key_width$}  {v}")?;
    }
    if let Some(hint) = hint(s) {
        // A hint holds commands to copy: wrapped at the width, never cut.
        let room = room.unwrap_or(usize::MAX).max(20);
        for (i, line) in wrap(&hint, room).iter().enumerate() {
            let k = if i == 0 { "Hint" } else { "" };
            writeln!(out, "{k:<key_width$}  {line}")?;
        }
    }
    Ok(())
}

/// Where the saga stands with its point of no return: succeeded (`pivot_reached`), started
/// (cancels are refused, but a failure still sends the saga back), or ahead.
fn pivot_line(s: &Saga) -> &'static str {
    let started = s
        .steps
        .iter()
        .find(|x| matches!(x.kind, StepKind::Pivot | StepKind::Retriable))
        .is_some_and(|x| x.action.status != StepStatus::Pending);
    if s.pivot_reached {
        "reached: the saga can no longer be cancelled or go back"
    } else if started && !s.status.is_terminal() {
        "started: the saga can no longer be cancelled"
    } else {
        "not reached"
    }
}

/// What a saga waits for, and until when: `signal:approval until 2026-… (in 5m)`.
fn wait_text(waiting_for: &str, wake_at: Option<Millis>, now: Millis) -> String {
    match wake_at {
        Some(at) => format!("{waiting_for} until {}", time_and_in(at, now)),
        None => waiting_for.to_owned(),
    }
}

/// Breaks text into lines of at most `width` columns at spaces (a longer word gets a line of
/// its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.width() + 1 + word.width() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
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
        (Some(owner), Some(at)) if at > now => format!(
            "{owner} (epoch {epoch}, expires in {} unless renewed)",
            duration(at - now)
        ),
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

/// A phase status for the table, in the words of the saga object (the saga is shown:
/// [`Saga::shown`]), with a mark when the latest attempt's outcome is unknown. An attempt in flight under a live lease is simply
/// `RUNNING`; without one (its process died, or lost the lease) nobody knows what it did.
fn phase_status(p: &PhaseRecord, live: bool) -> String {
    match p.status {
        StepStatus::Unknown => p.status.to_string(),
        StepStatus::Running if live => p.status.to_string(),
        s if p.outcome_unknown => format!("{s} (outcome unknown)"),
        s => s.to_string(),
    }
}

/// The rows in the order a person reads them: each stage, and under a group its branches.
fn reading_order(saga: &Saga) -> Vec<&StepRecord> {
    let mut rows = Vec::with_capacity(saga.steps.len());
    for stage in saga.steps.iter().filter(|s| s.branch_of().is_none()) {
        rows.push(stage);
        rows.extend(
            saga.steps
                .iter()
                .filter(|b| b.branch_of().is_some_and(|(group, _)| group == stage.name)),
        );
    }
    rows
}

fn steps_table(saga: &Saga, now: Millis, layout: &Layout) -> Table {
    let live = lease_is_live(saga, now);
    let steps = reading_order(saga);
    let day = saga.created_at;
    let mut g = Grid::new();
    let index = g.column("#", steps.iter().map(|s| s.index.to_string()).collect());
    let names = steps
        .iter()
        .map(|s| match s.branch_of() {
            Some((_, branch)) => format!("  └ {branch}"),
            None => s.name.clone(),
        })
        .collect();
    g.column("step", names);
    let kind = g.column("kind", steps.iter().map(|s| s.kind.to_string()).collect());
    let actions: Vec<String> = steps
        .iter()
        .map(
            |s| match (s.action.status, &s.waiting_for, s.wait_until()) {
                (StepStatus::Waiting, _, _) if s.kind == StepKind::Child => format!(
                    "WAITING for child {}",
                    saga_dsl::child_saga_id(saga.id, &s.name)
                ),
                (StepStatus::Waiting, Some(signal), Some(at)) => {
                    format!("WAITING for signal {signal} until {}", time_and_in(at, now))
                }
                (StepStatus::Waiting, Some(signal), None) => format!("WAITING for signal {signal}"),
                (StepStatus::Waiting, None, Some(at)) => {
                    format!("WAITING until {}", time_and_in(at, now))
                }
                _ => phase_status(&s.action, live),
            },
        )
        .collect();
    let action_colours = colours_of(&actions);
    let action = g.column("action", actions);
    let tries = g.column(
        "tries",
        steps
            .iter()
            .map(|s| s.action.attempts.to_string())
            .collect(),
    );
    let comps: Vec<String> = steps
        .iter()
        .map(|s| phase_status(&s.compensation, live))
        .collect();
    let comp_colours = colours_of(&comps);
    let comp = g.column("compensation", comps);
    let comp_tries = g.column(
        "tries",
        steps
            .iter()
            .map(|s| {
                if s.compensation.status == StepStatus::NotNeeded {
                    "-".to_owned()
                } else {
                    s.compensation.attempts.to_string()
                }
            })
            .collect(),
    );
    let error = g.column(
        "last error",
        steps
            .iter()
            .map(|s| {
                // The compensation runs after the action, so its error is the more recent one.
                match (&s.compensation.last_error, &s.action.last_error) {
                    (Some(c), _) => format!("compensation: {}", one_line(c)),
                    (None, Some(a)) => one_line(a),
                    (None, None) => String::new(),
                }
            })
            .collect(),
    );
    let started = g.column(
        "started",
        steps
            .iter()
            .map(|s| opt_time(s.action.started_at))
            .collect(),
    );
    let ended = g.column(
        "ended",
        steps.iter().map(|s| opt_time(s.action.ended_at)).collect(),
    );
    g.compact(
        started,
        steps
            .iter()
            .map(|s| opt_clock_time(s.action.started_at, day))
            .collect(),
    )
    .compact(
        ended,
        steps
            .iter()
            .map(|s| opt_clock_time(s.action.ended_at, day))
            .collect(),
    )
    .right(index)
    .right(tries)
    .right(comp_tries)
    .flex(error, 16)
    .colours(action, action_colours)
    .colours(comp, comp_colours)
    .hide_if_empty(error);
    g.render(
        layout,
        &[
            Fit::Compact(ended),
            Fit::Compact(started),
            Fit::Drop(kind),
            Fit::Drop(comp_tries),
            Fit::Drop(started),
        ],
    )
}

fn attempts_table(attempts: &[Attempt], live: bool, day: Millis, layout: &Layout) -> Table {
    let mut g = Grid::new();
    g.column(
        "step",
        attempts
            .iter()
            .map(|a| format!("{} {}", a.step_index, a.step))
            .collect(),
    );
    g.column("phase", attempts.iter().map(|a| a.phase.clone()).collect());
    let n = g.column(
        "#",
        attempts.iter().map(|a| a.attempt.to_string()).collect(),
    );
    let worker = g.column(
        "worker",
        attempts.iter().map(|a| a.worker.clone()).collect(),
    );
    let started = g.column(
        "started",
        attempts.iter().map(|a| rfc3339(a.started_at)).collect(),
    );
    let took = g.column(
        "duration",
        attempts
            .iter()
            .map(|a| {
                a.ended_at
                    .map(|e| duration(e - a.started_at))
                    .unwrap_or_else(|| "-".to_owned())
            })
            .collect(),
    );
    g.column(
        "outcome",
        attempts
            .iter()
            .map(|a| match &a.outcome {
                Some(o) => o.clone(),
                None if live => "running".to_owned(),
                None => "outcome unknown".to_owned(),
            })
            .collect(),
    );
    let error = g.column(
        "error",
        attempts
            .iter()
            .map(|a| a.error.as_deref().map(one_line).unwrap_or_default())
            .collect(),
    );
    g.compact(
        started,
        attempts
            .iter()
            .map(|a| clock_time(a.started_at, day))
            .collect(),
    )
    .right(n)
    .right(took)
    .flex(error, 16)
    .hide_if_empty(error);
    g.render(
        layout,
        &[Fit::Compact(started), Fit::Drop(worker), Fit::Drop(started)],
    )
}

/// The webhook deliveries section of `show` (nothing when the saga has none). `now` is the
/// database clock, used to say how far off the next attempt is.
pub(crate) fn deliveries(
    out: &mut impl Write,
    deliveries: &[crate::store::Delivery],
    now: Millis,
    layout: &Layout,
) -> std::io::Result<()> {
    if deliveries.is_empty() {
        return Ok(());
    }
    // Deliveries go out in order per target: a later pending one waits for the first.
    let mut first_pending: std::collections::HashMap<&str, i64> = Default::default();
    let mut whens = Vec::new();
    for d in deliveries {
        let blocked_by = match d.state {
            crate::store::DeliveryState::Pending => {
                let first = *first_pending.entry(d.target.as_str()).or_insert(d.event_id);
                (first != d.event_id).then_some(first)
            }
            _ => None,
        };
        whens.push(match (d.delivered_at, d.next_attempt_at) {
            (Some(at), _) => rfc3339(at),
            (None, Some(_)) if blocked_by.is_some() => {
                format!("after {}", blocked_by.unwrap_or_default())
            }
            (None, Some(next)) if next > now => format!("in {}", duration(next - now)),
            (None, Some(_)) => "due".to_owned(),
            (None, None) => "-".to_owned(),
        });
    }
    let mut g = Grid::new();
    let event = g.column(
        "event",
        deliveries.iter().map(|d| d.event_id.to_string()).collect(),
    );
    g.column("type", deliveries.iter().map(|d| d.kind.clone()).collect());
    let target = g.column(
        "target",
        deliveries.iter().map(|d| one_line(&d.target)).collect(),
    );
    let states: Vec<String> = deliveries
        .iter()
        .map(|d| {
            match d.state {
                crate::store::DeliveryState::Pending => "pending",
                crate::store::DeliveryState::Delivered => "delivered",
                crate::store::DeliveryState::Failed => "FAILED",
            }
            .to_owned()
        })
        .collect();
    let state_colours = colours_of(&states);
    let state = g.column("state", states);
    let attempts = g.column(
        "attempts",
        deliveries.iter().map(|d| d.attempts.to_string()).collect(),
    );
    g.column("next / done", whens);
    g.column(
        "last",
        deliveries
            .iter()
            .map(|d| d.last_status.map(|s| s.to_string()).unwrap_or_default())
            .collect(),
    );
    let error = g.column(
        "error",
        deliveries
            .iter()
            .map(|d| d.last_error.as_deref().map(one_line).unwrap_or_default())
            .collect(),
    );
    g.right(event)
        .right(attempts)
        .flex(target, 16)
        .flex(error, 12)
        .colours(state, state_colours)
        .hide_if_empty(error);
    let t = g.render(layout, &[]);
    writeln!(out)?;
    writeln!(out, "Webhook deliveries")?;
    writeln!(out, "{t}")
}

/// The `events` table.
pub(crate) fn events(
    out: &mut impl Write,
    events: &[Event],
    layout: &Layout,
) -> std::io::Result<()> {
    let Some(first) = events.first() else {
        return writeln!(out, "no events");
    };
    let mut g = Grid::new();
    let seq = g.column("seq", events.iter().map(|e| e.seq.to_string()).collect());
    let at = g.column("at", events.iter().map(|e| rfc3339(e.at)).collect());
    g.column("type", events.iter().map(|e| e.kind.clone()).collect());
    g.column(
        "step",
        events
            .iter()
            .map(|e| e.step.clone().unwrap_or_default())
            .collect(),
    );
    let details = g.column(
        "details",
        events
            .iter()
            .map(|e| match &e.data {
                serde_json::Value::Null => String::new(),
                serde_json::Value::Object(m) if m.is_empty() => String::new(),
                v => one_line(&v.to_string()),
            })
            .collect(),
    );
    g.compact(
        at,
        events.iter().map(|e| clock_time(e.at, first.at)).collect(),
    )
    .right(seq)
    .flex(details, 20);
    writeln!(out, "{}", g.render(layout, &[Fit::Compact(at)]))
}

/// The `workers` table: one row per orchestrator process, newest first.
pub(crate) fn workers(
    out: &mut impl Write,
    workers: &[crate::model::Worker],
    now: Millis,
    layout: &Layout,
) -> std::io::Result<()> {
    if workers.is_empty() {
        return writeln!(out, "no orchestrator process has run on this database");
    }
    let mut g = Grid::new();
    g.column("worker", workers.iter().map(|w| w.id.clone()).collect());
    let host = g.column("host", workers.iter().map(|w| w.host.clone()).collect());
    let pid = g.column("pid", workers.iter().map(|w| w.pid.to_string()).collect());
    let started = g.column(
        "started",
        workers.iter().map(|w| rfc3339(w.started_at)).collect(),
    );
    let beat = g.column(
        "last heartbeat",
        workers.iter().map(|w| rfc3339(w.heartbeat_at)).collect(),
    );
    g.column(
        "state",
        workers
            .iter()
            .map(|w| match w.stopped_at {
                Some(_) => "stopped".to_owned(),
                None => format!("alive ({} ago)", duration(now - w.heartbeat_at)),
            })
            .collect(),
    );
    let leases = g.column(
        "leases",
        workers.iter().map(|w| w.leases.to_string()).collect(),
    );
    g.right(pid).right(leases).flex(host, 8);
    let t = g.render(layout, &[Fit::Drop(beat), Fit::Drop(started)]);
    writeln!(out, "{t}")
}

/// The `outbox` table: one row per relay, by name.
pub(crate) fn relays(
    out: &mut impl Write,
    relays: &[crate::store::outbox::RelayProgress],
    now: Millis,
    layout: &Layout,
) -> std::io::Result<()> {
    if relays.is_empty() {
        return writeln!(out, "no outbox relay has run on this database");
    }
    let mut g = Grid::new();
    g.column("relay", relays.iter().map(|r| r.name.clone()).collect());
    let read = g.column(
        "read up to event",
        relays.iter().map(|r| r.event_id.to_string()).collect(),
    );
    let lag = g.column(
        "lag (events)",
        relays.iter().map(|r| r.lag_events.to_string()).collect(),
    );
    g.column(
        "oldest unread",
        relays
            .iter()
            .map(|r| match r.oldest_unread_at {
                Some(at) => format!("{} ago", duration(now - at)),
                None => "up to date".to_owned(),
            })
            .collect(),
    );
    let recorded = g.column(
        "last recorded",
        relays
            .iter()
            .map(|r| r.updated_at.map(rfc3339).unwrap_or_default())
            .collect(),
    );
    g.right(read).right(lag);
    let t = g.render(layout, &[Fit::Drop(recorded)]);
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
    if saga.pause_requested {
        line.push_str("; pause requested: its call in flight finishes, then it is paused");
    } else if saga.status == SagaStatus::Running || saga.status == SagaStatus::Compensating {
        line.push_str("; a worker will pick it up");
    } else if saga.status == SagaStatus::Paused {
        line.push_str("; nothing runs until it is resumed");
    }
    writeln!(out, "{line}")
}

/// What `pause` did, said for a person: paused by `by`, or (a worker driving the saga) asked.
pub(crate) fn paused_sentence(saga: &Saga, by: &str, reason: &crate::operations::Reason) -> String {
    if saga.status == SagaStatus::Paused {
        format!("saga {} paused by {by}: {reason}", saga.id)
    } else {
        format!(
            "pause of saga {} requested by {by}: {reason}; a worker drives it, so it is paused \
             once its call in flight is recorded",
            saga.id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_compact_times() {
        let t = 1_764_583_200_000;
        assert_eq!(rfc3339(t), "2025-12-01T10:00:00.000Z");
        assert_eq!(ago(t, t + 400), "just now");
        assert_eq!(ago(t, t + 42_000), "42s ago");
        assert_eq!(ago(t, t + 12 * 60_000 + 5), "12 min ago");
        assert_eq!(ago(t, t + 5 * 3_600_000), "5 h ago");
        assert_eq!(ago(t, t + 3 * 86_400_000), "3 days ago");
        assert_eq!(ago(t + 5, t), "just now");
        assert_eq!(clock_time(t + 1_234, t), "10:00:01.234");
        assert_eq!(clock_time(t + 86_400_000, t), "2025-12-02T10:00:00.000Z");
        assert_eq!(wrap("aa bb cc dd", 5), ["aa bb", "cc dd"]);
        assert_eq!(wrap("a verylongword b", 4), ["a", "verylongword", "b"]);
        assert_eq!(
            wrap_hard("a 0123456789abcdef b", 10),
            ["a", "0123456789", "abcdef b"]
        );
        assert_eq!(wrap_hard("漢字漢字漢字", 10), ["漢字漢字漢", "字"]);
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
