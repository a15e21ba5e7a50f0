//! `triggers`: the NATS triggers of a server (`--server`: subject, saga, stream, consumer,
//! lag, counts, as `GET /v1/triggers` shows them) and the refusals recorded in the log; on the
//! database alone, only the refusals (a trigger's lag lives in the process that runs it).

use std::io::Write;

use super::address::Target;
use super::args::TriggersArgs;
use super::error::CliError;
use super::render;
use super::table::{one_line, Fit, Grid, Layout};
use crate::store::Store;
use crate::triggers::{TriggerList, TriggerView};

/// Runs `triggers`: through the server `--server` names, else on `store`.
pub(crate) async fn run_triggers(
    a: &TriggersArgs,
    store: Option<&dyn Store>,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let list = match (&a.via.server, store) {
        (Some(server), _) => {
            let target = Target::find(Some(server), None);
            let client = target.client(a.via.auth.token.clone())?;
            client
                .triggers(a.limit)
                .await
                .map_err(|e| target.error(e))?
        }
        (None, Some(store)) => TriggerList {
            triggers: Vec::new(),
            refused: store.trigger_refusal_counts().await?,
            refusals: store.trigger_refusals(None, a.limit).await?,
        },
        (None, None) => {
            return Err(CliError::BadArgument(
                "triggers needs a database or a --server".to_owned(),
            ))
        }
    };
    if a.output.json {
        render::json(out, &list)?;
        return Ok(());
    }
    if a.via.server.is_some() {
        if list.triggers.is_empty() {
            writeln!(
                out,
                "no triggers: the server runs none (serve --nats-trigger SUBJECT=SAGA)"
            )?;
        } else {
            writeln!(out, "{}", triggers_table(&list.triggers, layout))?;
        }
    } else {
        writeln!(
            out,
            "(the triggers themselves and their lag: saga triggers --server URL)"
        )?;
    }
    let total: i64 = list.refused.iter().map(|c| c.refused).sum();
    if total == 0 {
        writeln!(out, "no refused messages")?;
        return Ok(());
    }
    let counts: Vec<String> = list
        .refused
        .iter()
        .map(|c| format!("{} ({})", c.trigger, c.refused))
        .collect();
    writeln!(out, "refused messages: {total}: {}", counts.join(", "))?;
    writeln!(out, "{}", refusals_table(&list, layout))?;
    Ok(())
}

/// The triggers of a server, one row each.
fn triggers_table(triggers: &[TriggerView], layout: &Layout) -> comfy_table::Table {
    let mut g = Grid::new();
    g.column(
        "subject",
        triggers.iter().map(|t| t.subject.clone()).collect(),
    );
    g.column("saga", triggers.iter().map(|t| t.saga.clone()).collect());
    let stream = g.column(
        "stream",
        triggers
            .iter()
            .map(|t| t.stream.clone().unwrap_or_else(|| "-".to_owned()))
            .collect(),
    );
    let consumer = g.column(
        "consumer",
        triggers
            .iter()
            .map(|t| t.consumer.clone().unwrap_or_else(|| "-".to_owned()))
            .collect(),
    );
    let lag = g.column(
        "lag",
        triggers
            .iter()
            .map(|t| t.lag.map_or_else(|| "-".to_owned(), |l| l.to_string()))
            .collect(),
    );
    let started = g.column(
        "started",
        triggers.iter().map(|t| t.started.to_string()).collect(),
    );
    let refused = g.column(
        "refused",
        triggers.iter().map(|t| t.refused.to_string()).collect(),
    );
    let error = g.column(
        "error",
        triggers
            .iter()
            .map(|t| t.error.as_deref().map(one_line).unwrap_or_default())
            .collect(),
    );
    g.right(lag).right(started).right(refused);
    g.flex(consumer, 12).flex(error, 20).hide_if_empty(error);
    g.render(
        layout,
        &[Fit::Drop(error), Fit::Drop(consumer), Fit::Drop(stream)],
    )
}

/// The latest refusals, newest first.
fn refusals_table(list: &TriggerList, layout: &Layout) -> comfy_table::Table {
    let r = &list.refusals;
    let mut g = Grid::new();
    g.column(
        "refused at",
        r.iter().map(|x| x.refused_at.clone()).collect(),
    );
    let trigger = g.column("trigger", r.iter().map(|x| x.trigger.clone()).collect());
    let seq = g.column(
        "message",
        r.iter()
            .map(|x| format!("{}:{}", x.stream, x.stream_seq))
            .collect(),
    );
    let error = g.column("error", r.iter().map(|x| one_line(&x.error)).collect());
    let body = g.column(
        "body",
        r.iter().map(|x| one_line(&x.body_excerpt)).collect(),
    );
    g.flex(error, 24).flex(body, 12);
    g.render(
        layout,
        &[Fit::Drop(body), Fit::Drop(trigger), Fit::Drop(seq)],
    )
}
