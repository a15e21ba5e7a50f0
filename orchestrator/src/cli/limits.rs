//! `limits` and `limits set` (SPEC §14): the concurrency limits and rate limiters, listed and
//! changed through a server's HTTP API (`--server`, audited with the token's name) or straight
//! on the database (audited as `$USER@cli`), through the same use case
//! ([`Operations::set_limit`]).

use std::io::Write;

use super::address::Target;
use super::args::{LimitsArgs, LimitsCommand, SetLimitArgs};
use super::error::CliError;
use super::render::{self, ago};
use super::table::{Fit, Grid, Layout};
use crate::client::SagaClient;
use crate::model::{LimitChange, LimitInfo, LimitKind, Millis};
use crate::operations::{Operations, Reason};
use crate::store::Store;

/// Runs `limits` or `limits set`: through the server its `--server` names, else on `store`
/// (`None` only when a server is named), where a change is audited as `actor`.
pub(crate) async fn run_limits(
    a: &LimitsArgs,
    store: Option<&dyn Store>,
    actor: &str,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let via = a.via();
    let remote = match &via.server {
        Some(server) => {
            let target = Target::find(Some(server), None);
            let client = target.client(via.auth.token.clone())?;
            Some((target, client))
        }
        None => None,
    };
    let on = match (&remote, store) {
        (Some((target, client)), _) => On::Server { target, client },
        (None, Some(store)) => On::Database(store),
        (None, None) => {
            return Err(CliError::BadArgument(
                "limits needs a database or a --server".to_owned(),
            ))
        }
    };
    match &a.command {
        None => list(&on, a.output.json, out, layout).await,
        Some(LimitsCommand::Set(set)) => change(&on, set, actor, out).await,
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

impl On<'_> {
    /// Every limit, and the time to say how long ago each was changed by.
    async fn limits(&self) -> Result<(Vec<LimitInfo>, Millis), CliError> {
        match self {
            Self::Server { target, client } => {
                let limits = client.limits().await.map_err(|e| target.error(e))?;
                Ok((limits, chrono::Utc::now().timestamp_millis()))
            }
            Self::Database(store) => Ok((store.limits().await?, store.now().await?)),
        }
    }
}

async fn list(
    on: &On<'_>,
    json: bool,
    out: &mut impl Write,
    layout: &Layout,
) -> Result<(), CliError> {
    let (limits, now) = on.limits().await?;
    if json {
        render::json(out, &serde_json::json!({ "limits": limits }))?;
    } else if limits.is_empty() {
        writeln!(
            out,
            "no limits: no definition run on this database declares one (max running, per key \
             or a rate limiter)"
        )?;
    } else {
        writeln!(out, "{}", table(&limits, now, layout))?;
    }
    Ok(())
}

async fn change(
    on: &On<'_>,
    a: &SetLimitArgs,
    actor: &str,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let reason = a.reason.as_deref().map(Reason::parse).transpose()?;
    let change = match (a.limit, a.rate) {
        (Some(limit), _) => LimitChange::Limit(limit),
        (None, Some(rate)) => {
            let burst = match a.burst {
                Some(burst) => burst,
                // Left out: the limiter keeps its burst. An unknown name is reported by the
                // change itself.
                None => {
                    let (limits, _) = on.limits().await?;
                    limits
                        .iter()
                        .find(|l| l.name == a.name)
                        .and_then(|l| l.burst)
                        .unwrap_or(1)
                }
            };
            LimitChange::Rate { rate, burst }
        }
        // clap requires one of them.
        (None, None) => {
            return Err(CliError::BadArgument(
                "give --limit N, or --rate R (and --burst B)".to_owned(),
            ))
        }
    };
    let (info, by) = match on {
        On::Server { target, client } => {
            let info = client
                .set_limit(&a.name, &change, reason.as_ref().map(Reason::as_str))
                .await
                .map_err(|e| target.error(e))?;
            (info, format!("through {}", target.url))
        }
        On::Database(store) => {
            let info = Operations::new(*store)
                .set_limit(&a.name, change, reason.as_ref(), actor)
                .await?;
            (info, format!("by {actor}"))
        }
    };
    if a.output.json {
        render::json(out, &info)?;
        return Ok(());
    }
    let why = reason.map(|r| format!(": {r}")).unwrap_or_default();
    let declared = match declared_text(&info) {
        Some(d) if d != value_text(&info) => format!(" (declared: {d})"),
        _ => String::new(),
    };
    writeln!(
        out,
        "{} {} is now {}{declared}, set {by}{why}; every process applies it within a second",
        kind_word(info.kind),
        info.name,
        value_text(&info),
    )?;
    Ok(())
}

/// How a kind reads in a sentence.
fn kind_word(kind: LimitKind) -> &'static str {
    match kind {
        LimitKind::MaxRunning => "limit",
        LimitKind::PerKey => "per-key limit",
        LimitKind::Rate => "rate limiter",
    }
}

/// A limit's value as it stands: `50`, or `20/s, burst 5`.
fn value_text(l: &LimitInfo) -> String {
    match (l.kind, l.limit, &l.rate, l.burst) {
        (LimitKind::Rate, _, Some(rate), Some(burst)) => format!("{rate}, burst {burst}"),
        (LimitKind::Rate, _, Some(rate), None) => rate.clone(),
        (_, Some(limit), _, _) => limit.to_string(),
        _ => "-".to_owned(),
    }
}

/// The value its definition declares, written as [`value_text`] writes the current one.
fn declared_text(l: &LimitInfo) -> Option<String> {
    let d = &l.declared;
    match (l.kind, d.limit, &d.rate, d.burst) {
        (LimitKind::Rate, _, Some(rate), Some(burst)) => Some(format!("{rate}, burst {burst}")),
        (LimitKind::Rate, _, Some(rate), None) => Some(rate.clone()),
        (_, Some(limit), _, _) => Some(limit.to_string()),
        _ => None,
    }
}

/// The `limits` table, fitted to the layout's width.
fn table(limits: &[LimitInfo], now: Millis, layout: &Layout) -> comfy_table::Table {
    let mut g = Grid::new();
    let name = g.column("name", limits.iter().map(|l| l.name.clone()).collect());
    let kind = g.column("kind", limits.iter().map(|l| l.kind.to_string()).collect());
    let saga = g.column(
        "saga",
        limits
            .iter()
            .map(|l| l.saga.clone().unwrap_or_default())
            .collect(),
    );
    let key = g.column(
        "key",
        limits
            .iter()
            .map(|l| l.key.clone().unwrap_or_default())
            .collect(),
    );
    g.column(
        "limit/rate",
        limits
            .iter()
            .map(|l| match l.kind {
                LimitKind::Rate => l.rate.clone().unwrap_or_else(|| "-".to_owned()),
                _ => l.limit.map_or_else(|| "-".to_owned(), |n| n.to_string()),
            })
            .collect(),
    );
    let burst = g.column(
        "burst",
        limits
            .iter()
            .map(|l| l.burst.map(|b| b.to_string()).unwrap_or_default())
            .collect(),
    );
    let in_use = g.column(
        "in use",
        limits.iter().map(|l| l.in_use.to_string()).collect(),
    );
    let waiting = g.column(
        "waiting",
        limits.iter().map(|l| l.waiting.to_string()).collect(),
    );
    let declared = g.column(
        "declared",
        limits
            .iter()
            .map(|l| match declared_text(l) {
                Some(d) if d != value_text(l) => d,
                _ => String::new(),
            })
            .collect(),
    );
    let changed: Vec<(String, String)> = limits
        .iter()
        .map(|l| match (l.updated_at, &l.updated_by) {
            (Some(at), by) => {
                let by = by.as_deref().unwrap_or("?");
                (
                    format!("{by}, {}", crate::model::rfc3339(at)),
                    format!("{by}, {}", ago(at, now)),
                )
            }
            (None, _) => (String::new(), String::new()),
        })
        .collect();
    let changed_col = g.column(
        "changed",
        changed.iter().map(|(full, _)| full.clone()).collect(),
    );
    g.compact(
        changed_col,
        changed.into_iter().map(|(_, short)| short).collect(),
    )
    .whole(name)
    .flex(saga, 6)
    .flex(key, 6)
    .flex(changed_col, 10)
    .right(burst)
    .right(in_use)
    .right(waiting)
    .hide_if_empty(saga)
    .hide_if_empty(key)
    .hide_if_empty(burst)
    .hide_if_empty(declared)
    .hide_if_empty(changed_col);
    g.render(
        layout,
        &[
            Fit::Compact(changed_col),
            Fit::Drop(declared),
            Fit::Drop(key),
            Fit::Drop(kind),
            Fit::Drop(saga),
            Fit::Drop(changed_col),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DeclaredValue;

    fn limit(name: &str, kind: LimitKind) -> LimitInfo {
        LimitInfo {
            name: name.to_owned(),
            kind,
            saga: (kind != LimitKind::Rate).then(|| "payout".to_owned()),
            key: (kind == LimitKind::PerKey).then(|| "merchant".to_owned()),
            limit: (kind != LimitKind::Rate).then_some(1),
            rate: (kind == LimitKind::Rate).then(|| "20/s".to_owned()),
            burst: (kind == LimitKind::Rate).then_some(5),
            in_use: 3,
            waiting: 12,
            declared: DeclaredValue {
                limit: (kind != LimitKind::Rate).then_some(1),
                rate: (kind == LimitKind::Rate).then(|| "20/s".to_owned()),
                burst: (kind == LimitKind::Rate).then_some(5),
            },
            updated_at: None,
            updated_by: None,
        }
    }

    #[test]
    fn the_table_shows_each_kind_and_what_an_operator_changed() {
        let mut changed = limit("payout_running", LimitKind::MaxRunning);
        changed.limit = Some(10);
        changed.declared.limit = Some(50);
        changed.updated_at = Some(1_764_496_800_000);
        changed.updated_by = Some("ops".to_owned());
        let limits = [
            limit("bank", LimitKind::Rate),
            limit("payout_per_merchant", LimitKind::PerKey),
            changed,
        ];
        let text = table(&limits, 1_764_497_520_000, &Layout::plain()).to_string();
        for want in [
            "20/s",
            "merchant",
            "payout",
            "10",
            "50",
            "ops, 2025-11-30T10:00:00.000Z",
            "12",
        ] {
            assert!(text.contains(want), "{want}:\n{text}");
        }
        for width in [60u16, 80, 120] {
            let layout = Layout {
                width: Some(width),
                colour: false,
            };
            let text = table(&limits, 1_764_497_520_000, &layout).to_string();
            for line in text.lines() {
                assert!(
                    unicode_width::UnicodeWidthStr::width(line) <= usize::from(width),
                    "{width}:\n{text}"
                );
            }
            assert!(text.contains("payout_per_merchant"), "{width}:\n{text}");
        }
    }

    #[test]
    fn values_read_as_they_are_set() {
        assert_eq!(value_text(&limit("bank", LimitKind::Rate)), "20/s, burst 5");
        assert_eq!(value_text(&limit("x", LimitKind::MaxRunning)), "1");
        assert_eq!(kind_word(LimitKind::PerKey), "per-key limit");
    }
}
