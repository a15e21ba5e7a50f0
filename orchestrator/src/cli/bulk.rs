//! `bulk` and `bulk-job`: bulk actions through a server's HTTP API. The job is recorded and
//! worked by the server (its bulk runner), so these never write the database directly.

use std::io::Write;
use std::time::Duration;

use comfy_table::Table;
use uuid::Uuid;

use super::address::Target;
use super::args::{BulkArgs, BulkJobArgs};
use super::error::CliError;
use super::render;
use crate::client::BulkFilter;
use crate::model::{BulkJob, BulkStatus};
use crate::operations::Reason;

/// How often `--wait` reads the job's progress.
const POLL: Duration = Duration::from_millis(500);

/// Runs `bulk`: records the job through the server (`--server`, else the one running on
/// `database_url`) and prints its id and how many sagas it matched; with `--wait`, its
/// progress until it is done and then the sagas that refused.
pub(crate) async fn run_bulk(
    a: &BulkArgs,
    database_url: Option<&str>,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let reason = Reason::parse(&a.reason)?;
    let mut attr = serde_json::Map::new();
    for pair in &a.attr {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| CliError::BadArgument(format!("--attr {pair:?}: write it KEY=VALUE")))?;
        attr.insert(key.to_owned(), value.into());
    }
    let filter = BulkFilter {
        status: a.status,
        name: a.name.clone(),
        needs_attention: a.needs_attention,
        created_after: a.created_after.clone(),
        created_before: a.created_before.clone(),
        attr,
    };
    let server = Target::find(a.server.url.as_deref(), database_url);
    let client = server.client(a.auth.token.clone())?;
    let created = client
        .bulk(a.action, &filter, reason.as_str(), a.dry_run)
        .await
        .map_err(|e| server.error(e))?;
    let Some(id) = created.id else {
        if a.output.json {
            render::json(out, &created)?;
        } else {
            writeln!(
                out,
                "dry run: {} would act on {} sagas; nothing was recorded",
                a.action, created.matched
            )?;
            for saga in &created.sample {
                writeln!(out, "  {saga}")?;
            }
        }
        return Ok(());
    };
    if !a.wait {
        if a.output.json {
            render::json(out, &created)?;
        } else {
            writeln!(
                out,
                "bulk job {id}: {} of {} sagas recorded; `bulk-job {id}` shows its progress",
                a.action, created.matched
            )?;
        }
        return Ok(());
    }
    if !a.output.json {
        writeln!(
            out,
            "bulk job {id}: {} of {} sagas",
            a.action, created.matched
        )?;
    }
    let mut shown = None;
    let job = loop {
        let job = client.bulk_job(id).await.map_err(|e| server.error(e))?;
        if job.status == BulkStatus::Done {
            break job;
        }
        if !a.output.json && shown != Some(job.done) {
            writeln!(out, "  {} of {} done", job.done, job.matched)?;
            out.flush()?;
            shown = Some(job.done);
        }
        tokio::time::sleep(POLL).await;
    };
    print_job(&job, a.output.json, out)
}

/// Runs `bulk-job ID`.
pub(crate) async fn run_bulk_job(
    a: &BulkJobArgs,
    database_url: Option<&str>,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let id = Uuid::try_parse(a.id.trim()).map_err(|_| {
        CliError::BadArgument(format!(
            "{:?} is not a bulk job id: give the id `bulk` printed",
            a.id
        ))
    })?;
    let server = Target::find(a.server.url.as_deref(), database_url);
    let client = server.client(a.auth.token.clone())?;
    let job = client.bulk_job(id).await.map_err(|e| server.error(e))?;
    print_job(&job, a.output.json, out)
}

/// A job: a line of progress, then its refusals in a table.
fn print_job(job: &BulkJob, json: bool, out: &mut impl Write) -> Result<(), CliError> {
    if json {
        return Ok(render::json(out, job)?);
    }
    writeln!(
        out,
        "bulk job {}: {} {} — {} of {} done, {} refused (by {}: {})",
        job.id,
        job.action,
        job.status,
        job.done,
        job.matched,
        job.refused.len(),
        job.actor,
        job.reason
    )?;
    if !job.refused.is_empty() {
        let mut table = Table::new();
        table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
        table.set_header(["SAGA", "CODE", "MESSAGE"]);
        for r in &job.refused {
            table.add_row([r.saga_id.to_string(), r.code.clone(), r.message.clone()]);
        }
        writeln!(out, "{table}")?;
    }
    Ok(())
}
