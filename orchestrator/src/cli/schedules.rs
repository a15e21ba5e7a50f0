//! `schedule create|list|show|pause|resume|trigger|delete` (SPEC §17): through a server's HTTP
//! API (`--server`, or the server found beside the database), or on the database for what
//! needs no definitions (reading, pausing, resuming, deleting). Making a schedule checks its
//! saga and input against the server's definitions, and firing one starts a saga, so those two
//! always go through a server.

use std::io::Write;

use super::address::Target;
use super::args::{CreateScheduleArgs, ScheduleArgs, ScheduleCommand, ScheduleIdArgs};
use super::error::CliError;
use super::render::{self, ago};
use super::table::{Fit, Grid, Layout};
use crate::client::SagaClient;
use crate::model::{Millis, Overlap, ScheduleDetail, ScheduleRun};
use crate::schedules::{self, NewSchedule, ScheduleError};
use crate::store::Store;

/// Runs a `schedule` command: through the server `--server` names (or, for `create` and
/// `trigger`, the one found beside `database_url`), else on `store`.
pub(crate) async fn run_schedule(
    a: &ScheduleArgs,
    store: Option<&dyn Store>,
    database_url: Option<&str>,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let via = a.via();
    let remote = if via.server.is_some() || store.is_none() {
        let target = Target::find(via.server.as_deref(), database_url);
        let client = target.client(via.auth.token.clone())?;
        Some((target, client))
    } else {
        None
    };
    let on = match (&remote, store) {
        (Some((target, client)), _) => On::Server { target, client },
        (None, Some(store)) => On::Database(store),
        (None, None) => unreachable!("a server is found when there is no store"),
    };
    match &a.command {
        ScheduleCommand::Create(c) => create(&on, c, out).await,
        ScheduleCommand::List(l) => list(&on, l.output.json, out, layout).await,
        ScheduleCommand::Show(s) => show(&on, s, out, layout).await,
        ScheduleCommand::Pause(s) => set_paused(&on, s, true, out).await,
        ScheduleCommand::Resume(s) => set_paused(&on, s, false, out).await,
        ScheduleCommand::Trigger(s) => trigger(&on, s, out).await,
        ScheduleCommand::Delete(s) => delete(&on, s, out).await,
    }
}

/// Where the command goes.
enum On<'a> {
    Server {
        target: &'a Target,
        client: &'a SagaClient,
    },
    Database(&'a dyn Store),
}

impl From<ScheduleError> for CliError {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::Store(e) => e.into(),
            ScheduleError::Exists(_) => CliError::Conflict(e.to_string()),
            e => CliError::BadArgument(e.to_string()),
        }
    }
}

impl On<'_> {
    fn now() -> Millis {
        chrono::Utc::now().timestamp_millis()
    }

    /// Needs a server (a definition check, a start).
    fn server(&self, what: &str) -> Result<(&Target, &SagaClient), CliError> {
        match self {
            Self::Server { target, client } => Ok((target, client)),
            Self::Database(_) => Err(CliError::BadArgument(format!(
                "schedule {what} goes through a server: give --server URL or SAGA_SERVER"
            ))),
        }
    }
}

async fn create(on: &On<'_>, a: &CreateScheduleArgs, out: &mut impl Write) -> Result<(), CliError> {
    let input = a
        .input
        .as_deref()
        .map(|text| {
            serde_json::from_str(text)
                .map_err(|e| CliError::BadArgument(format!("--input is not JSON: {e}")))
        })
        .transpose()?;
    let overlap = a
        .overlap
        .as_deref()
        .map(|text| {
            Overlap::parse(text).ok_or_else(|| {
                CliError::BadArgument(format!(
                    "--overlap {text:?}: give skip, buffer_one, allow_all or cancel_other"
                ))
            })
        })
        .transpose()?;
    let new = NewSchedule {
        id: a.id.clone(),
        saga: a.saga.clone(),
        cron: a.cron.clone(),
        every: a.every.clone(),
        timezone: a.timezone.clone(),
        input,
        overlap,
        catchup_window: a.catchup_window.clone(),
        paused: a.paused.then_some(true),
    };
    let (target, client) = on.server("create")?;
    let made = client
        .create_schedule(&new)
        .await
        .map_err(|e| target.error(e))?;
    if a.output.json {
        render::json(out, &made)?;
        return Ok(());
    }
    let s = &made.schedule;
    let next = made
        .next_runs
        .first()
        .cloned()
        .unwrap_or_else(|| "-".to_owned());
    writeln!(
        out,
        "schedule {} made: {} {}; next run {next}{}",
        s.id,
        s.saga,
        cadence_text(&made),
        if s.paused { " (paused)" } else { "" }
    )?;
    Ok(())
}

async fn list(
    on: &On<'_>,
    json: bool,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let all = match on {
        On::Server { target, client } => client.schedules().await.map_err(|e| target.error(e))?,
        On::Database(store) => schedules::list(*store, On::now()).await?,
    };
    if json {
        render::json(out, &serde_json::json!({ "schedules": all }))?;
    } else if all.is_empty() {
        writeln!(out, "no schedules: make one with `saga schedule create`")?;
    } else {
        writeln!(out, "{}", table(&all, On::now(), layout))?;
    }
    Ok(())
}

async fn show(
    on: &On<'_>,
    a: &ScheduleIdArgs,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let d = match on {
        On::Server { target, client } => {
            client.schedule(&a.id).await.map_err(|e| target.error(e))?
        }
        On::Database(store) => schedules::show(*store, &a.id, On::now()).await?,
    };
    if a.output.json {
        render::json(out, &d)?;
        return Ok(());
    }
    let s = &d.schedule;
    writeln!(out, "schedule {}", s.id)?;
    writeln!(out, "  saga:           {}", s.saga)?;
    writeln!(out, "  when:           {}", cadence_text(&d))?;
    writeln!(out, "  overlap:        {}", s.overlap.as_str())?;
    writeln!(
        out,
        "  catch-up:       {}",
        humantime::format_duration(s.catchup_window)
    )?;
    writeln!(
        out,
        "  paused:         {}",
        if s.paused { "yes" } else { "no" }
    )?;
    writeln!(out, "  input:          {}", s.input)?;
    if let Some(at) = s.buffered_at {
        writeln!(out, "  buffered tick:  {}", crate::model::rfc3339(at))?;
    }
    writeln!(out, "  next runs:")?;
    if d.next_runs.is_empty() {
        writeln!(out, "    none while paused")?;
    }
    for t in &d.next_runs {
        writeln!(out, "    {t}")?;
    }
    if d.runs.is_empty() {
        writeln!(out, "no runs yet")?;
    } else {
        writeln!(out, "{}", runs_table(&d.runs, On::now(), layout))?;
    }
    Ok(())
}

async fn set_paused(
    on: &On<'_>,
    a: &ScheduleIdArgs,
    paused: bool,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let d = match on {
        On::Server { target, client } => client
            .set_schedule_paused(&a.id, paused)
            .await
            .map_err(|e| target.error(e))?,
        On::Database(store) => {
            let now = store.now().await?;
            let s = if paused {
                schedules::pause(*store, &a.id, now).await?
            } else {
                schedules::resume(*store, &a.id, now).await?
            };
            schedules::detail(s, Vec::new(), now)
        }
    };
    if a.output.json {
        render::json(out, &d)?;
    } else if paused {
        writeln!(
            out,
            "schedule {} paused: no tick fires until it is resumed",
            a.id
        )?;
    } else {
        let next = d
            .next_runs
            .first()
            .cloned()
            .unwrap_or_else(|| "-".to_owned());
        writeln!(out, "schedule {} resumed; next run {next}", a.id)?;
    }
    Ok(())
}

async fn trigger(on: &On<'_>, a: &ScheduleIdArgs, out: &mut impl Write) -> Result<(), CliError> {
    let (target, client) = on.server("trigger")?;
    let run = client
        .trigger_schedule(&a.id)
        .await
        .map_err(|e| target.error(e))?;
    if a.output.json {
        render::json(out, &run)?;
        return Ok(());
    }
    let saga = run
        .saga_id
        .map(|id| format!(": saga {id}"))
        .unwrap_or_default();
    let detail = run
        .detail
        .as_deref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    writeln!(
        out,
        "schedule {} fired at {}: {}{saga}{detail}",
        a.id,
        crate::model::rfc3339(run.scheduled_at),
        run.outcome.as_str()
    )?;
    Ok(())
}

async fn delete(on: &On<'_>, a: &ScheduleIdArgs, out: &mut impl Write) -> Result<(), CliError> {
    match on {
        On::Server { target, client } => client
            .delete_schedule(&a.id)
            .await
            .map_err(|e| target.error(e))?,
        On::Database(store) => schedules::delete(*store, &a.id).await?,
    }
    if a.output.json {
        render::json(out, &serde_json::json!({"id": a.id, "deleted": true}))?;
    } else {
        writeln!(out, "schedule {} deleted; its sagas keep running", a.id)?;
    }
    Ok(())
}

/// `cron "0 2 * * *" in Europe/Paris`, or `every 15m`.
fn cadence_text(d: &ScheduleDetail) -> String {
    let s = &d.schedule;
    match (&s.cron, s.every) {
        (Some(cron), _) => format!("cron \"{cron}\" in {}", s.timezone),
        (None, Some(every)) => format!("every {}", humantime::format_duration(every)),
        (None, None) => "-".to_owned(),
    }
}

/// The `schedule list` table.
fn table(all: &[ScheduleDetail], now: Millis, layout: &Layout) -> comfy_table::Table {
    let mut g = Grid::new();
    let id = g.column("id", all.iter().map(|d| d.schedule.id.clone()).collect());
    g.column(
        "saga",
        all.iter().map(|d| d.schedule.saga.clone()).collect(),
    );
    let when = g.column("when", all.iter().map(cadence_text).collect());
    g.column(
        "overlap",
        all.iter()
            .map(|d| d.schedule.overlap.as_str().to_owned())
            .collect(),
    );
    g.column(
        "next run",
        all.iter()
            .map(|d| {
                if d.schedule.paused {
                    "paused".to_owned()
                } else {
                    d.next_runs.first().cloned().unwrap_or_default()
                }
            })
            .collect(),
    );
    let last = g.column(
        "last run",
        all.iter()
            .map(|d| {
                d.runs
                    .first()
                    .map(|r| format!("{}, {}", r.outcome.as_str(), ago(r.scheduled_at, now)))
                    .unwrap_or_default()
            })
            .collect(),
    );
    let saga = g.column(
        "last saga",
        all.iter()
            .map(|d| {
                d.schedule
                    .last_saga_id
                    .map(|id| id.to_string())
                    .unwrap_or_default()
            })
            .collect(),
    );
    g.whole(id).flex(when, 12);
    g.render(layout, &[Fit::Drop(saga), Fit::Drop(last)])
}

/// A schedule's runs.
fn runs_table(runs: &[ScheduleRun], now: Millis, layout: &Layout) -> comfy_table::Table {
    let mut g = Grid::new();
    g.column(
        "tick",
        runs.iter()
            .map(|r| crate::model::rfc3339(r.scheduled_at))
            .collect(),
    );
    g.column(
        "outcome",
        runs.iter()
            .map(|r| {
                let by = if r.triggered { " (trigger)" } else { "" };
                format!("{}{by}", r.outcome.as_str())
            })
            .collect(),
    );
    let saga = g.column(
        "saga",
        runs.iter()
            .map(|r| r.saga_id.map(|id| id.to_string()).unwrap_or_default())
            .collect(),
    );
    let when = g.column(
        "recorded",
        runs.iter().map(|r| ago(r.recorded_at, now)).collect(),
    );
    let detail = g.column(
        "detail",
        runs.iter()
            .map(|r| r.detail.clone().unwrap_or_default())
            .collect(),
    );
    g.whole(saga).flex(detail, 10);
    g.render(layout, &[Fit::Drop(when), Fit::Drop(detail)])
}
