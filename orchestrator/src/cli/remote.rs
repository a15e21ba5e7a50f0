//! The commands that change a saga (`cancel`, `abort`, `retry`, `mark-compensated`) sent
//! through a server's HTTP API (`--server`): the same rules as the direct ones, checked by the
//! server, and audited with the token's name.

use std::io::Write;

use uuid::Uuid;

use super::args::{AdminCommand, ViaServer};
use super::commands::whole_id as whole;
use super::error::{client_error, CliError};
use super::render;
use crate::client::SagaClient;
use crate::operations::Reason;

/// Runs `cmd` through the server of `via`. Only for commands that change a saga.
pub async fn run_via_server(
    cmd: &AdminCommand,
    via: &ViaServer,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let server = via.server.as_deref().unwrap_or_default();
    let client = SagaClient::new(server, via.auth.token.clone()).map_err(client_error)?;
    match cmd {
        AdminCommand::Cancel(a) => {
            let id = whole_id(&a.id)?;
            let answer = client.cancel(id).await.map_err(client_error)?;
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
            let id = whole_id(&a.id)?;
            let reason = Reason::parse(&a.reason)?;
            let saga = client
                .abort(id, reason.as_str())
                .await
                .map_err(client_error)?;
            writeln!(
                out,
                "saga {id} aborted through {server} without compensating: {reason}"
            )?;
            render::now_status(out, &saga)?;
        }
        AdminCommand::Retry(a) => {
            let id = whole_id(&a.id)?;
            let saga = client.retry(id).await.map_err(client_error)?;
            writeln!(out, "saga {id}: retry requested through {server}")?;
            render::now_status(out, &saga)?;
        }
        AdminCommand::MarkCompensated(a) => {
            let id = whole_id(&a.id)?;
            let reason = Reason::parse(&a.reason)?;
            let saga = client
                .mark_compensated(id, &a.step, reason.as_str())
                .await
                .map_err(client_error)?;
            writeln!(
                out,
                "step {} of saga {id} marked compensated through {server}: {reason}",
                a.step
            )?;
            render::now_status(out, &saga)?;
        }
        _ => {
            return Err(CliError::BadArgument(
                "only cancel, abort, retry and mark-compensated go through --server".to_owned(),
            ))
        }
    }
    Ok(())
}

fn whole_id(text: &str) -> Result<Uuid, CliError> {
    whole(text, "with --server the server is asked")
}
