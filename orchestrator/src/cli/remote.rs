//! The commands that change a saga (`cancel`, `abort`, `retry`, `mark-compensated`, `pause`,
//! `resume`, `complete-step`, `fork`) sent
//! through a server's HTTP API (`--server`): the same rules as the direct ones, checked by the
//! server, and audited with the token's name. A saga may be named by a prefix of its id: the
//! server resolves it as the database would, and what is printed names the whole id.

use std::io::Write;

use super::address::Target;
use super::args::{AdminCommand, ViaServer};
use super::commands::{id_for_server, json_arg};
use super::error::CliError;
use super::render;
use crate::operations::Reason;

/// Runs `cmd` through the server of `via`. Only for commands that change a saga.
pub async fn run_via_server(
    cmd: &AdminCommand,
    via: &ViaServer,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let target = Target::find(via.server.as_deref(), None);
    let server = target.url.as_str();
    let client = target.client(via.auth.token.clone())?;
    let failed = |e| target.error(e);
    match cmd {
        AdminCommand::Cancel(a) => {
            let answer = client.cancel(id_for_server(&a.id)?).await.map_err(failed)?;
            let id = answer.id;
            if answer.cancel == "already_compensating" {
                writeln!(out, "saga {id} is already compensating; nothing to do")?;
            } else {
                writeln!(
                    out,
                    "cancel requested for saga {id}: the step in flight finishes, then the \
                     saga compensates"
                )?;
            }
        }
        AdminCommand::Abort(a) => {
            let given = id_for_server(&a.id)?;
            let reason = Reason::parse(&a.reason)?;
            let saga = client.abort(given, reason.as_str()).await.map_err(failed)?;
            let id = saga.id;
            writeln!(
                out,
                "saga {id} aborted through {server} without compensating: {reason}"
            )?;
            render::now_status(out, &saga)?;
        }
        AdminCommand::Retry(a) => {
            let saga = client.retry(id_for_server(&a.id)?).await.map_err(failed)?;
            let id = saga.id;
            writeln!(out, "saga {id}: retry requested through {server}")?;
            render::now_status(out, &saga)?;
        }
        AdminCommand::MarkCompensated(a) => {
            let given = id_for_server(&a.id)?;
            let reason = Reason::parse(&a.reason)?;
            let saga = client
                .mark_compensated(given, &a.step, reason.as_str())
                .await
                .map_err(failed)?;
            let id = saga.id;
            writeln!(
                out,
                "step {} of saga {id} marked compensated through {server}: {reason}",
                a.step
            )?;
            render::now_status(out, &saga)?;
        }
        AdminCommand::Pause(a) => {
            let given = id_for_server(&a.id)?;
            let reason = Reason::parse(&a.reason)?;
            let saga = client.pause(given, reason.as_str()).await.map_err(failed)?;
            let by = format!("a request through {server}");
            writeln!(out, "{}", render::paused_sentence(&saga, &by, &reason))?;
            render::now_status(out, &saga)?;
        }
        AdminCommand::Resume(a) => {
            let given = id_for_server(&a.id)?;
            let reason = Reason::parse(&a.reason)?;
            let saga = client
                .resume(given, reason.as_str())
                .await
                .map_err(failed)?;
            let id = saga.id;
            writeln!(out, "saga {id} resumed through {server}: {reason}")?;
            render::now_status(out, &saga)?;
        }
        AdminCommand::CompleteStep(a) => {
            let given = id_for_server(&a.id)?;
            let output = json_arg("--output", &a.output)?;
            let reason = Reason::parse(&a.reason)?;
            let saga = client
                .complete_step(given, &a.step, &output, reason.as_str())
                .await
                .map_err(failed)?;
            let id = saga.id;
            writeln!(
                out,
                "step {} of saga {id} completed by hand through {server}: {reason}",
                a.step
            )?;
            render::now_status(out, &saga)?;
        }
        AdminCommand::Fork(a) => {
            let given = id_for_server(&a.id)?;
            let input = a
                .input
                .as_deref()
                .map(|i| json_arg("--input", i))
                .transpose()?;
            let reason = Reason::parse(&a.reason)?;
            let saga = client
                .fork(
                    given,
                    input.as_ref(),
                    a.from_stage.as_deref(),
                    reason.as_str(),
                )
                .await
                .map_err(failed)?;
            // The new id alone, so that a script can take it: `NEW=$(saga fork …)`.
            writeln!(out, "{}", saga.id)?;
        }
        _ => {
            return Err(CliError::BadArgument(
                "only cancel, abort, retry, mark-compensated, pause, resume, complete-step \
                 and fork go through --server"
                    .to_owned(),
            ))
        }
    }
    Ok(())
}
