//! One vocabulary on every surface (SPEC §12): for the same sagas — completed, compensated
//! after a failure and after a failed pivot, aborted, failed past the pivot, parked on a
//! signal, a sleep, a retry timer and a child — the saga JSON of the HTTP API, `show --json`,
//! `show`, `list` and `list --json` use the same words: `NOT_NEEDED` for a compensation that
//! will never run, `PENDING` for one that will, `pivot_reached` once the pivot succeeded, and
//! what a parked saga waits for.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use orchestrator::cli::{run_admin, AdminCommand};
use orchestrator::http::HttpConfig;
use orchestrator::Store;
use saga_dsl::StepKind::{Compensatable, Pivot, Retriable};
use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
use saga_suite::api::{Api, Harness};
use saga_suite::Outcome::Permanent;
use saga_suite::{registry_of, scripted_saga, Journal, ScriptedStep as S};
use serde_json::{json, Value};

/// Runs one command given as words and returns what it printed.
async fn cli(store: &Arc<dyn Store>, words: &[&str]) -> String {
    let cmd = AdminCommand::parse_words(words).unwrap();
    let mut out = Vec::new();
    run_admin(&cmd, store.as_ref(), &mut out).await.unwrap();
    String::from_utf8(out).unwrap()
}

/// A step that asks to be retried in an hour: its saga waits on a retry timer.
fn busy() -> SagaDefinition {
    async fn later(_ctx: StepContext) -> Result<Value, StepError> {
        Err(StepError::retry_after(
            Duration::from_secs(3600),
            "busy, try in an hour",
        ))
    }
    async fn undo(_ctx: StepContext) -> Result<(), StepError> {
        Ok(())
    }
    async fn ok(_ctx: StepContext) -> Result<Value, StepError> {
        Ok(json!({"ok": true}))
    }
    SagaDefinition::builder("busy", 1)
        .step(Step::compensatable("reserve", ok, undo))
        .step(Step::compensatable("call", later, undo))
        .step(Step::pivot("ship", ok))
        .build()
        .unwrap()
}

fn definitions() -> Vec<SagaDefinition> {
    let j = Journal::default();
    let reserve = || S::new("reserve", Compensatable);
    let ship = || S::new("ship", Pivot);
    vec![
        scripted_saga(
            "done",
            1,
            &[reserve(), S::new("charge", Compensatable), ship()],
            &j,
        ),
        scripted_saga(
            "refund",
            1,
            &[
                reserve(),
                S::new("charge", Compensatable).action(&[Permanent]),
            ],
            &j,
        ),
        scripted_saga(
            "pivot_fails",
            1,
            &[reserve(), ship().action(&[Permanent])],
            &j,
        ),
        scripted_saga(
            "late",
            1,
            &[
                reserve(),
                ship(),
                S::new("notify", Retriable).action(&[Permanent]),
            ],
            &j,
        ),
        scripted_saga(
            "approval",
            1,
            &[reserve(), S::signal("await", "approval"), ship()],
            &j,
        ),
        scripted_saga(
            "nap",
            1,
            &[
                reserve(),
                S::sleep("nap", Duration::from_secs(3600)),
                ship(),
            ],
            &j,
        ),
        // A child saga has no pivot, so that compensating its parent can undo it.
        scripted_saga("hold", 1, &[reserve(), S::signal("await", "go")], &j),
        scripted_saga("parent", 1, &[reserve(), S::child("sub", "hold")], &j),
        busy(),
    ]
}

/// What a saga must show: its id, status, `pivot_reached`, `waiting_for`, and the
/// compensation status of each named row.
type Expected<'a> = (
    &'a str,
    &'a str,
    bool,
    Option<String>,
    Vec<(&'a str, &'a str)>,
);

/// Polls the saga's JSON until `until` holds.
async fn wait_json(api: &Api, id: &str, what: &str, until: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let (_, saga) = api.get(&format!("/v1/sagas/{id}")).await;
        if until(&saga) {
            return saga;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("saga {id} never became {what}");
}

/// The compensation statuses of a saga's rows by name.
fn compensations(saga: &Value) -> BTreeMap<String, String> {
    saga["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["compensation"]["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The cells of the `show` steps table's row for `step`, by column header.
fn step_cells(text: &str, step: &str) -> BTreeMap<String, String> {
    // The rows of the section, the header first (border lines have no `┆`).
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "Steps")
        .take_while(|l| !l.is_empty())
        .filter(|l| l.contains('┆'))
        .collect();
    let cells = |line: &str| -> Vec<String> {
        line.split('┆')
            .map(|c| {
                c.trim_matches(|ch: char| ch == '│' || ch.is_whitespace())
                    .to_owned()
            })
            .collect()
    };
    let header = cells(lines[0]);
    let row = lines
        .iter()
        .find(|l| cells(l).get(1).map(String::as_str) == Some(step))
        .unwrap_or_else(|| panic!("no row for {step}:\n{text}"));
    // The first "tries" is the action's, the second the compensation's.
    let mut named = BTreeMap::new();
    for (h, c) in header.into_iter().zip(cells(row)) {
        let key = if named.contains_key(&h) {
            format!("{h} 2")
        } else {
            h
        };
        named.insert(key, c);
    }
    named
}

/// The value of the `show` header line `key`.
fn header_line<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .take_while(|l| *l != "Steps")
        .find_map(|l| l.strip_prefix(key).filter(|rest| rest.starts_with(' ')))
        .map(str::trim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_surface_uses_the_same_words_for_the_same_sagas() {
    let harness = Harness::new(registry_of(definitions())).await;
    let api = harness.serve(HttpConfig::default()).await;
    let store = harness.stores.log.clone();

    let done = api.start_saga("done", json!({})).await;
    let refund = api.start_saga("refund", json!({})).await;
    let pivot_fails = api.start_saga("pivot_fails", json!({})).await;
    let late = api.start_saga("late", json!({})).await;
    let approval = api.start_saga("approval", json!({})).await;
    let nap = api.start_saga("nap", json!({})).await;
    let parent = api.start_saga("parent", json!({})).await;
    let busy = api.start_saga("busy", json!({})).await;
    let aborted = api.start_saga("approval", json!({})).await;

    wait_json(&api, &done, "COMPLETED", |s| s["status"] == "COMPLETED").await;
    wait_json(&api, &refund, "COMPENSATED", |s| {
        s["status"] == "COMPENSATED"
    })
    .await;
    wait_json(&api, &pivot_fails, "COMPENSATED", |s| {
        s["status"] == "COMPENSATED"
    })
    .await;
    wait_json(&api, &late, "FAILED", |s| s["status"] == "FAILED").await;
    let parked = |s: &Value| !s["waiting_for"].is_null();
    wait_json(&api, &approval, "parked", parked).await;
    wait_json(&api, &nap, "parked", parked).await;
    wait_json(&api, &parent, "parked", parked).await;
    wait_json(&api, &busy, "parked", parked).await;
    wait_json(&api, &aborted, "parked", parked).await;
    let (status, _, body) = api
        .post(
            &format!("/v1/sagas/{aborted}/abort"),
            &json!({"reason": "stopped by hand"}),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let child = saga_dsl::child_saga_id(parent.parse().unwrap(), "sub").to_string();

    // What §12 says each saga shows: status, pivot_reached, waiting_for, and the compensation
    // of each row.
    let nn = "NOT_NEEDED";
    let expected: Vec<Expected> = vec![
        (
            &done,
            "COMPLETED",
            true,
            None,
            vec![("reserve", nn), ("charge", nn), ("ship", nn)],
        ),
        (
            &refund,
            "COMPENSATED",
            false,
            None,
            vec![("reserve", "SUCCEEDED"), ("charge", nn)],
        ),
        (
            &pivot_fails,
            "COMPENSATED",
            false,
            None,
            vec![("reserve", "SUCCEEDED"), ("ship", nn)],
        ),
        (
            &late,
            "FAILED",
            true,
            None,
            vec![("reserve", nn), ("ship", nn), ("notify", nn)],
        ),
        (
            &approval,
            "RUNNING",
            false,
            Some("signal:approval".to_owned()),
            vec![("reserve", "PENDING"), ("await", nn), ("ship", nn)],
        ),
        (
            &nap,
            "RUNNING",
            false,
            Some("sleep".to_owned()),
            vec![("reserve", "PENDING"), ("nap", nn), ("ship", nn)],
        ),
        (
            &parent,
            "RUNNING",
            false,
            Some(format!("child:{child}")),
            vec![("reserve", "PENDING"), ("sub", "PENDING")],
        ),
        (
            &child,
            "RUNNING",
            false,
            Some("signal:go".to_owned()),
            vec![("reserve", "PENDING"), ("await", nn)],
        ),
        (
            &busy,
            "RUNNING",
            false,
            Some("retry".to_owned()),
            // The call failed without effect: nothing to undo there.
            vec![("reserve", "PENDING"), ("call", nn), ("ship", nn)],
        ),
        (
            &aborted,
            "ABORTED",
            false,
            None,
            vec![("reserve", nn), ("ship", nn)],
        ),
    ];

    let list_json: Value =
        serde_json::from_str(&cli(&store, &["list", "--json", "--limit", "100"]).await).unwrap();
    let (_, http_list) = api.get("/v1/sagas?limit=100").await;
    assert_eq!(
        http_list["sagas"], list_json["sagas"],
        "the list, both ways"
    );
    let list_text = cli(&store, &["list", "--limit", "100"]).await;

    for (id, status, pivot, waiting_for, comps) in &expected {
        let (code, saga) = api.get(&format!("/v1/sagas/{id}")).await;
        assert!(code.is_success(), "{saga}");
        let shown: Value =
            serde_json::from_str(&cli(&store, &["show", id, "--json"]).await).unwrap();
        assert_eq!(saga, shown, "GET and show --json are one object");

        assert_eq!(saga["status"], *status, "{saga}");
        assert_eq!(saga["pivot_reached"], *pivot, "{saga}");
        assert_eq!(saga["waiting_for"], json!(waiting_for), "{saga}");
        let wakes = matches!(waiting_for.as_deref(), Some("sleep" | "retry"));
        assert_eq!(
            saga["wake_at"].is_string(),
            wakes,
            "a sleep and a retry wake on their own, a signal without a timeout and a child do \
             not: {saga}"
        );
        let words = compensations(&saga);
        for (step, word) in comps {
            assert_eq!(words[*step], *word, "{step} of {status} {id}: {saga}");
        }
        assert!(
            words.values().all(|w| w != "NONE"),
            "no NONE on the wire: {saga}"
        );
        // The stages say the same as the rows.
        for stage in saga["stages"].as_array().unwrap() {
            let name = stage["name"].as_str().unwrap();
            assert_eq!(stage["compensation"]["status"], words[name], "{saga}");
        }

        // `show`: the same words in the table, the wait and the pivot in the header.
        let text = cli(&store, &["show", id]).await;
        for step in saga["steps"].as_array().unwrap() {
            let cells = step_cells(&text, step["name"].as_str().unwrap());
            assert_eq!(
                cells["compensation"], step["compensation"]["status"],
                "{text}"
            );
            let action = step["status"].as_str().unwrap();
            assert!(cells["action"].starts_with(action), "{action}: {text}");
        }
        // The status, then its flags (NEEDS ATTENTION).
        let status_line = header_line(&text, "Status").unwrap();
        assert_eq!(
            status_line.split_whitespace().next(),
            Some(*status),
            "{text}"
        );
        match waiting_for {
            Some(w) => assert!(
                header_line(&text, "Waiting").is_some_and(|l| l.starts_with(w.as_str())),
                "{text}"
            ),
            None => assert_eq!(header_line(&text, "Waiting"), None, "{text}"),
        }
        assert_eq!(
            header_line(&text, "Pivot").unwrap().starts_with("reached"),
            *pivot,
            "{text}"
        );

        // `list --json` and `list`: the same status and wait.
        let row = list_json["sagas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == **id)
            .unwrap_or_else(|| panic!("{id} not listed: {list_json}"));
        assert_eq!(row["status"], *status);
        assert_eq!(row["waiting_for"], saga["waiting_for"], "{row}");
        assert_eq!(row["wake_at"], saga["wake_at"], "{row}");
        // The saga's own row: its id in the first cell (a parent's row names its child's id in
        // its wait, and a child's id, derived from its parent's, may sort either side of it).
        let line = list_text
            .lines()
            .find(|l| l.split('┆').next().is_some_and(|first| first.contains(*id)))
            .unwrap_or_else(|| panic!("{id} not in the list:\n{list_text}"));
        assert!(line.contains(status), "{line}");
        if let Some(w) = waiting_for {
            assert!(line.contains(w.as_str()), "{line}");
        }
    }
    let (_, child_saga) = api.get(&format!("/v1/sagas/{child}")).await;
    assert_eq!(child_saga["parent_id"], parent.as_str());
    harness.stop().await;
}
