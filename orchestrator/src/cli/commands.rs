//! What each operator command does, against any [`Store`].
//!
//! Each command checks its arguments, makes one store call that changes something (or none),
//! and writes a table, a JSON document or one line saying what happened. Refusals (cancel after
//! the pivot, abort of a finished saga) are errors, so scripts see a non-zero exit.
//!
//! `start` is the exception: it goes through a server's HTTP API with the typed
//! [`SagaClient`](crate::client::SagaClient), which reuses one idempotency key across its
//! retries.

use std::io::Write;
use std::time::Duration;

use uuid::Uuid;

use super::address::Target;
use super::args::{
    AbortArgs, AdminCommand, CancelArgs, CompleteStepArgs, EventsArgs, ForkArgs, ListArgs,
    MarkCompensatedArgs, PauseArgs, PurgeArgs, RetryArgs, ShowArgs, SignalArgs, StartArgs,
};
use super::error::CliError;
use super::render;
use super::table::Layout;
use crate::model::{IdPrefix, ListFilter, Saga, SagaDetail, SagaPage};
use crate::operations::{Cancelled, ForkRequest, Operations, Reason, Retried};
use crate::store::{match_prefix, OutboxStore, PrefixMatch, Store};

/// Runs one operator command against `store`, writing what it shows or did to `out`, with
/// tables in full and without colour ([`Layout::plain`]).
///
/// Commands that change a saga (`abort`, `retry`, `mark-compensated`) are recorded in its events
/// with the operator as actor: `$USER@cli`.
pub async fn run_admin(
    cmd: &AdminCommand,
    store: &dyn Store,
    out: &mut impl Write,
) -> Result<(), CliError> {
    run_admin_with(cmd, store, out, &Layout::plain()).await
}

/// [`run_admin`] with tables laid out for `layout` (a terminal's width and colours).
pub async fn run_admin_with(
    cmd: &AdminCommand,
    store: &dyn Store,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    match cmd {
        AdminCommand::List(a) => list(a, store, out, layout).await,
        AdminCommand::Show(a) => show(a, store, out, layout).await,
        AdminCommand::Events(a) => events(a, store, out, layout).await,
        AdminCommand::Cancel(a) => cancel(a, store, out).await,
        AdminCommand::Abort(a) => abort(a, store, out).await,
        AdminCommand::Pause(a) => pause(a, store, out).await,
        AdminCommand::Resume(a) => resume(a, store, out).await,
        AdminCommand::Retry(a) => retry(a, store, out).await,
        AdminCommand::MarkCompensated(a) => mark_compensated(a, store, out).await,
        AdminCommand::CompleteStep(a) => complete_step(a, store, out).await,
        AdminCommand::Fork(a) => fork(a, store).await,
        AdminCommand::Workers(a) => {
            let workers = store.workers().await?;
            if a.output.json {
                render::json(out, &serde_json::json!({ "workers": workers }))?;
            } else {
                render::workers(out, &workers, store.now().await?, layout)?;
            }
            Ok(())
        }
        AdminCommand::Purge(a) => purge(a, store, out).await,
        AdminCommand::Outbox(a) => {
            let relays = store.relays().await?;
            let now = store.now().await?;
            if a.output.json {
                let relays: Vec<_> = relays
                    .iter()
                    .map(|r| {
                        let mut v = serde_json::to_value(r).unwrap_or_default();
                        v["lag_seconds"] = serde_json::json!(r.lag_seconds(now));
                        v
                    })
                    .collect();
                let log_id = store.log_id().await?;
                render::json(
                    out,
                    &serde_json::json!({ "log_id": log_id, "relays": relays }),
                )?;
            } else {
                render::relays(out, &relays, now, layout)?;
            }
            Ok(())
        }
        AdminCommand::Migrate => {
            store.migrate().await?;
            writeln!(out, "migrations applied; the database is up to date")?;
            Ok(())
        }
        // Needs no store; one given is simply not used (nor is a database to find the server
        // by: `--server`, `SAGA_SERVER` or the default).
        AdminCommand::Start(a) => run_start(a, None, out).await,
        AdminCommand::Definitions(a) => super::definitions::run_definitions(a, None, out).await,
        AdminCommand::Signal(a) => run_signal(a, None, out).await,
        AdminCommand::Bulk(a) => super::bulk::run_bulk(a, None, out).await,
        AdminCommand::BulkJob(a) => super::bulk::run_bulk_job(a, None, out).await,
        AdminCommand::Limits(a) => {
            super::limits::run_limits(a, Some(store), &actor(), out, layout).await
        }
        AdminCommand::Schedule(a) => {
            super::schedules::run_schedule(a, Some(store), None, out, layout).await
        }
        AdminCommand::Triggers(a) => {
            super::triggers::run_triggers(a, Some(store), out, layout).await
        }
    }
}

/// Runs `signal`: sends a signal through the HTTP API of the server (`--server`, else the one
/// running on `database_url`, see [`open_and_run`](super::open_and_run)) and prints how it was
/// taken. The saga may be named by a prefix of its id, which the server resolves. Opens no
/// database.
pub async fn run_signal(
    a: &SignalArgs,
    database_url: Option<&str>,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let id = id_for_server(&a.id)?;
    let payload: serde_json::Value = serde_json::from_str(&a.payload)
        .map_err(|e| CliError::BadArgument(format!("--payload is not valid JSON: {e}")))?;
    let server = Target::find(a.server.url.as_deref(), database_url);
    let client = server.client(a.auth.token.clone())?;
    let answer = client
        .signal(&id, &a.name, &payload, a.idempotency_key.clone())
        .await
        .map_err(|e| server.error(e))?;
    let id = answer.id;
    if a.output.json {
        render::json(out, &answer)?;
    } else if answer.outcome == "received" {
        writeln!(
            out,
            "signal {} delivered to saga {id} ({}): its signal step takes it",
            answer.signal, answer.status
        )?;
    } else {
        writeln!(
            out,
            "signal {} had already reached saga {id} ({}) with this payload; nothing changed",
            answer.signal, answer.status
        )?;
    }
    Ok(())
}

/// Runs `start`: starts a saga through the HTTP API of the server (`--server`, else the one
/// running on `database_url`, see [`open_and_run`](super::open_and_run)) and prints its id and
/// status (and, with `--wait`, how it ended). Opens no database.
pub async fn run_start(
    a: &StartArgs,
    database_url: Option<&str>,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let input: serde_json::Value = serde_json::from_str(&a.input)
        .map_err(|e| CliError::BadArgument(format!("--input is not valid JSON: {e}")))?;
    let at =
        a.at.as_deref()
            .map(|t| {
                chrono::DateTime::parse_from_rfc3339(t)
                    .map(|t| t.timestamp_millis())
                    .map_err(|e| {
                        CliError::BadArgument(format!(
                            "--at {t:?} is not an RFC 3339 time such as 2026-12-24T18:00:00Z: {e}"
                        ))
                    })
            })
            .transpose()?;
    let server = Target::find(a.server.url.as_deref(), database_url);
    let client = server.client(a.auth.token.clone())?;
    let options = crate::client::StartOptions {
        idempotency_key: a.idempotency_key.clone(),
        at,
        priority: a.priority,
    };
    let started = client
        .start_with(&a.name, &input, &options)
        .await
        .map_err(|e| server.error(e))?;
    let Some(secs) = a.wait else {
        if a.output.json {
            render::json(out, &started)?;
        } else {
            render::started(out, &started)?;
        }
        return Ok(());
    };
    let saga = client
        .wait(started.id, Duration::from_secs(secs))
        .await
        .map_err(|e| server.error(e))?;
    if a.output.json {
        render::json(out, &saga)?;
    } else {
        render::started(out, &started)?;
        render::waited(out, &saga, secs)?;
    }
    Ok(())
}

/// A saga id or prefix for a command that asks a server, checked here (a malformed one is
/// refused before anything is sent, as on the database), written as the API takes it (the start
/// of the hyphenated id, whatever dashes and case were typed) and resolved by the server.
pub(super) fn id_for_server(text: &str) -> Result<String, CliError> {
    Ok(match parse_id(text)? {
        IdArg::Full(id) => id.to_string(),
        IdArg::Prefix(prefix) => prefix.hyphenated(),
    })
}

/// Who runs operator commands, for the audit trail: `$USER@cli`, or `unknown@cli`.
pub fn actor() -> String {
    let user = ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .map(|u| u.trim().to_owned())
        .find(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    format!("{user}@cli")
}

/// A saga id as given on the command line: a whole id, or the start of one.
#[derive(Debug)]
enum IdArg {
    Full(Uuid),
    Prefix(IdPrefix),
}

/// Reads a saga id given on the command line: a UUID, or its first 8 or more characters.
fn parse_id(text: &str) -> Result<IdArg, CliError> {
    if let Ok(id) = Uuid::parse_str(text.trim()) {
        return Ok(IdArg::Full(id));
    }
    IdPrefix::parse(text)
        .map(IdArg::Prefix)
        .map_err(|e| CliError::BadArgument(e.to_string()))
}

/// The saga a command-line id names: a whole id as it is (an unknown one is reported by the
/// command), a prefix as the one saga whose id starts with it.
async fn resolve_id(store: &dyn Store, text: &str) -> Result<Uuid, CliError> {
    let prefix = match parse_id(text)? {
        IdArg::Full(id) => return Ok(id),
        IdArg::Prefix(p) => p,
    };
    match match_prefix(store, &prefix).await? {
        PrefixMatch::One(id) => Ok(id),
        PrefixMatch::None => Err(CliError::NoMatch(text.trim().to_owned())),
        many => Err(CliError::Ambiguous {
            prefix: text.trim().to_owned(),
            candidates: many.candidates(),
        }),
    }
}

async fn load(store: &dyn Store, id: Uuid) -> Result<Saga, CliError> {
    store.get_saga(id).await?.ok_or(CliError::NotFound(id))
}

/// The filter and page `list` asks for.
pub(crate) fn list_filter(a: &ListArgs) -> Result<ListFilter, CliError> {
    let cursor = a
        .cursor
        .as_deref()
        .map(|c| {
            Uuid::parse_str(c.trim()).map_err(|_| {
                CliError::BadArgument(format!(
                    "invalid cursor {c:?}: pass the saga id printed at the end of the previous page"
                ))
            })
        })
        .transpose()?;
    Ok(ListFilter {
        status: a.status,
        name: a.name.clone(),
        needs_attention: a.needs_attention,
        attrs: attr_pairs(&a.attr)?,
        limit: a.limit,
        cursor,
        ..ListFilter::default()
    })
}

/// `--attr NAME=VALUE` options as (name, value) pairs: each name valid and given once.
pub(crate) fn attr_pairs(given: &[String]) -> Result<Vec<(String, String)>, CliError> {
    let mut pairs: Vec<(String, String)> = Vec::with_capacity(given.len());
    for pair in given {
        let (name, value) = pair.split_once('=').ok_or_else(|| {
            CliError::BadArgument(format!("--attr {pair:?}: write it NAME=VALUE"))
        })?;
        if !saga_dsl::attrs::valid_attr_name(name) {
            return Err(CliError::BadArgument(format!(
                "--attr {pair:?}: {name:?} is not a search attribute's name (a lower-case \
                 letter, then lower-case letters, digits or '_', at most {} bytes)",
                saga_dsl::MAX_ATTR_NAME
            )));
        }
        if pairs.iter().any(|(seen, _)| seen == name) {
            return Err(CliError::BadArgument(format!(
                "--attr {name}=… is given twice: filter by each attribute once"
            )));
        }
        pairs.push((name.to_owned(), value.to_owned()));
    }
    Ok(pairs)
}

async fn list(
    a: &ListArgs,
    store: &dyn Store,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let filter = list_filter(a)?;
    let page = store.list_sagas(&filter).await?;
    if a.output.json {
        render::json(out, &page)?;
    } else {
        // Only a table fitted to a width may need them.
        let short = match layout.width {
            Some(_) => Some(short_ids(store, &page).await?),
            None => None,
        };
        render::saga_page(out, &page, short.as_deref(), store.now().await?, layout)?;
    }
    Ok(())
}

/// `list --server URL`: the page through the server's API, shown as on the database (ids
/// whole: the server is not asked which prefixes are unique).
pub(crate) async fn list_via_server(
    a: &ListArgs,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let filter = list_filter(a)?;
    let target = super::address::Target::find(a.via.server.as_deref(), None);
    let client = target.client(a.via.auth.token.clone())?;
    let page = client.list(&filter).await.map_err(|e| target.error(e))?;
    if a.output.json {
        render::json(out, &page)?;
    } else {
        let now = chrono::Utc::now().timestamp_millis();
        render::saga_page(out, &page, None, now, layout)?;
    }
    Ok(())
}

/// The shortest prefix of each id on the page (8 characters or more, as `show` takes them)
/// that no other saga in the log shares, as git shortens hashes: what a narrow table shows
/// instead of the whole id. Ids of one page share their first characters when they were made
/// in the same minute, so most need a few more than 8.
async fn short_ids(store: &dyn Store, page: &SagaPage) -> Result<Vec<String>, CliError> {
    let mut short = Vec::with_capacity(page.sagas.len());
    for saga in &page.sagas {
        let whole = saga.id.to_string();
        let mut len = IdPrefix::MIN_LEN;
        while len < whole.len() {
            let candidate = &whole[..len];
            let unique_here = page
                .sagas
                .iter()
                .all(|other| other.id == saga.id || !other.id.to_string().starts_with(candidate));
            // A prefix ending at a dash reads as unfinished: take the next digit with it.
            if unique_here && !candidate.ends_with('-') {
                let prefix =
                    IdPrefix::parse(candidate).map_err(|e| CliError::BadArgument(e.to_string()))?;
                if store.saga_ids_with_prefix(&prefix, 2).await?.len() <= 1 {
                    break;
                }
            }
            len += 1;
        }
        short.push(whole[..len].to_owned());
    }
    Ok(short)
}

async fn show(
    a: &ShowArgs,
    store: &dyn Store,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    // In the words of every surface: the same object as `GET /v1/sagas/{id}`, the attempts
    // read after the saga, as there.
    let saga = load(store, id).await?.shown();
    let attempts = store.attempts(id).await?;
    if a.output.json {
        render::json(out, &SagaDetail { saga, attempts })?;
        return Ok(());
    }
    let now = store.now().await?;
    render::saga(out, &saga, &attempts, now, layout)?;
    Ok(())
}

/// `show` with the saga's webhook deliveries after the attempt log (in the table view; `--json`
/// prints the saga object with its attempts, the same as `GET /v1/sagas/{id}`; its deliveries
/// are `GET /v1/sagas/{id}/deliveries`).
pub async fn show_with_deliveries(
    a: &ShowArgs,
    store: &dyn Store,
    outbox: &dyn OutboxStore,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    // Resolve a prefix once, then show exactly that saga.
    let id = resolve_id(store, &a.id).await?;
    let a = &ShowArgs {
        id: id.to_string(),
        output: a.output,
    };
    show(a, store, out, layout).await?;
    if !a.output.json {
        let deliveries = outbox.deliveries(id).await?;
        render::deliveries(out, &deliveries, store.now().await?, layout)?;
    }
    Ok(())
}

async fn events(
    a: &EventsArgs,
    store: &dyn Store,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    // An empty history and an unknown saga look alike to `events`; tell them apart.
    load(store, id).await?;
    let events = store.events(id).await?;
    if a.output.json {
        render::json(out, &serde_json::json!({ "events": events }))?;
    } else {
        render::events(out, &events, layout)?;
    }
    Ok(())
}

async fn purge(a: &PurgeArgs, store: &dyn Store, out: &mut impl Write) -> Result<(), CliError> {
    let text = a.finished_before.trim();
    let before = match chrono::DateTime::parse_from_rfc3339(text) {
        Ok(at) => at.timestamp_millis(),
        Err(_) => {
            let age = crate::retention::parse_duration(text).map_err(|e| {
                CliError::BadArgument(format!(
                    "--finished-before: {e} (or an RFC 3339 time such as 2026-11-01T00:00:00Z)"
                ))
            })?;
            crate::retention::finished_before(store, age).await?
        }
    };
    let options = crate::retention::PurgeOptions {
        page: a.batch,
        dry_run: a.dry_run,
        attrs: attr_pairs(&a.attr)?,
        ..crate::retention::PurgeOptions::default()
    };
    let report = crate::retention::purge_finished_before(store, before, &options, |_| {}).await?;
    let when = crate::model::rfc3339(before);
    if a.dry_run {
        writeln!(
            out,
            "would purge {} sagas finished and {} trigger refusals recorded before {when} \
             (dry run: nothing deleted)",
            report.purged, report.refusals
        )?;
    } else {
        writeln!(
            out,
            "purged {} sagas finished and {} trigger refusals recorded before {when} in {} \
             batches, {:.1} s",
            report.purged,
            report.refusals,
            report.pages,
            report.took.as_secs_f64()
        )?;
    }
    Ok(())
}

async fn cancel(a: &CancelArgs, store: &dyn Store, out: &mut impl Write) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    match Operations::new(store).cancel(id).await? {
        Cancelled::Accepted => writeln!(
            out,
            "cancel requested for saga {id}: the step in flight finishes, then the saga compensates"
        )?,
        Cancelled::AlreadyCompensating => {
            writeln!(out, "saga {id} is already compensating; nothing to do")?
        }
    }
    Ok(())
}

async fn abort(a: &AbortArgs, store: &dyn Store, out: &mut impl Write) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    let reason = Reason::parse(&a.reason)?;
    let actor = actor();
    let saga = Operations::new(store).abort(id, &reason, &actor).await?;
    writeln!(
        out,
        "saga {id} aborted by {actor} without compensating: {reason}"
    )?;
    render::now_status(out, &saga)?;
    Ok(())
}

async fn pause(a: &PauseArgs, store: &dyn Store, out: &mut impl Write) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    let reason = Reason::parse(&a.reason)?;
    let actor = actor();
    let saga = Operations::new(store).pause(id, &reason, &actor).await?;
    writeln!(out, "{}", render::paused_sentence(&saga, &actor, &reason))?;
    render::now_status(out, &saga)?;
    Ok(())
}

async fn resume(a: &PauseArgs, store: &dyn Store, out: &mut impl Write) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    let reason = Reason::parse(&a.reason)?;
    let actor = actor();
    let saga = Operations::new(store).resume(id, &reason, &actor).await?;
    writeln!(out, "saga {id} resumed by {actor}: {reason}")?;
    render::now_status(out, &saga)?;
    Ok(())
}

async fn retry(a: &RetryArgs, store: &dyn Store, out: &mut impl Write) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    let before = load(store, id).await?;
    let saga = Operations::new(store).retry(id, &actor()).await?;
    match Retried::of(&before) {
        Retried::Step(step) => writeln!(out, "saga {id}: {step} will be retried")?,
        Retried::DueNow => writeln!(out, "saga {id}: its waiting retry is due now")?,
        Retried::NotWaiting => writeln!(
            out,
            "saga {id} was not waiting on a retry; nothing to hurry"
        )?,
    }
    render::now_status(out, &saga)?;
    Ok(())
}

async fn mark_compensated(
    a: &MarkCompensatedArgs,
    store: &dyn Store,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    let reason = Reason::parse(&a.reason)?;
    let actor = actor();
    let saga = Operations::new(store)
        .mark_compensated(id, &a.step, &reason, &actor)
        .await?;
    writeln!(
        out,
        "step {} of saga {id} marked compensated by {actor}: {reason}",
        a.step
    )?;
    render::now_status(out, &saga)?;
    Ok(())
}

/// A JSON argument (`--output`, `--input`), or a clear error naming the flag.
pub(super) fn json_arg(flag: &str, text: &str) -> Result<serde_json::Value, CliError> {
    serde_json::from_str(text)
        .map_err(|e| CliError::BadArgument(format!("{flag} is not valid JSON: {e}")))
}

async fn complete_step(
    a: &CompleteStepArgs,
    store: &dyn Store,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    let output = json_arg("--output", &a.output)?;
    let reason = Reason::parse(&a.reason)?;
    let actor = actor();
    let saga = Operations::new(store)
        .complete_step(id, &a.step, output, &reason, &actor)
        .await?;
    writeln!(
        out,
        "step {} of saga {id} completed by hand by {actor}: {reason}",
        a.step
    )?;
    render::now_status(out, &saga)?;
    Ok(())
}

/// A fork straight on the database: refused by the use case, which says to use a server (the
/// new saga's definition, and its input's check, are the server's). The arguments are checked
/// first, so a typo is reported as such.
async fn fork(a: &ForkArgs, store: &dyn Store) -> Result<(), CliError> {
    let id = resolve_id(store, &a.id).await?;
    let input = a
        .input
        .as_deref()
        .map(|i| json_arg("--input", i))
        .transpose()?;
    let reason = Reason::parse(&a.reason)?;
    let request = ForkRequest {
        input,
        from_stage: a.from_stage.clone(),
    };
    Operations::new(store)
        .fork(id, request, &reason, &actor())
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_reasons_are_checked() {
        assert!(
            matches!(parse_id("nope"), Err(CliError::BadArgument(m)) if m.contains("invalid saga id"))
        );
        assert!(matches!(
            parse_id("01a233a"),
            Err(CliError::BadArgument(m)) if m.contains("too short")
        ));
        assert!(matches!(parse_id(" 01a233a9-76 "), Ok(IdArg::Prefix(_))));
        assert!(matches!(
            parse_id(&Uuid::nil().to_string()),
            Ok(IdArg::Full(_))
        ));
        assert!(Reason::parse("  ").is_err());
        assert_eq!(
            Reason::parse(" done by hand ").ok().map(|r| r.to_string()),
            Some("done by hand".to_owned())
        );
        assert!(actor().ends_with("@cli"));
    }
}
