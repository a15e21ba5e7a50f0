//! Schedules (SPEC §17) against real `example-sagas serve` processes: made, read, paused,
//! resumed, fired and deleted over HTTP; bad input refused with nothing written; each tick one
//! saga whose id derives from the schedule and the instant; the four overlap policies with
//! sagas that outlast the interval (`fulfil_order` waiting for its approval); the catch-up
//! after every process was down; and, on PostgreSQL, three processes firing one schedule
//! through a `kill -9` of the one that fired last, exactly one saga per tick. The time-zone
//! arithmetic across daylight-saving changes is tested beside it (`schedules::cadence`).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use orchestrator::model::ScheduleDetail;
use reqwest::StatusCode;
use saga_suite::{Server, TempDb};
use serde_json::{json, Value};
use uuid::Uuid;

const LONG: Duration = Duration::from_secs(30);

async fn post(server: &Server, path: &str, body: Value) -> (StatusCode, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", server.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn get(server: &Server, path: &str) -> (StatusCode, Value) {
    let r = reqwest::Client::new()
        .get(format!("{}{path}", server.base))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn schedule(server: &Server, id: &str) -> ScheduleDetail {
    let (status, body) = get(server, &format!("/v1/schedules/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_value(body).unwrap()
}

/// Waits until the schedule's history satisfies `until`.
async fn wait_runs(
    server: &Server,
    id: &str,
    timeout: Duration,
    until: impl Fn(&ScheduleDetail) -> bool,
) -> ScheduleDetail {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let s = schedule(server, id).await;
        if until(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "schedule {id} did not get there: {:#?}",
            s.runs
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn outcomes(s: &ScheduleDetail) -> Vec<&'static str> {
    // Oldest first.
    s.runs.iter().rev().map(|r| r.outcome.as_str()).collect()
}

fn order(extra: Value) -> Value {
    let mut input = json!({
        "order_id": "scheduled", "user": "ada", "amount": 4200,
        "items": [{"sku": "sku-1", "qty": 1}],
    });
    for (k, v) in extra.as_object().unwrap() {
        input[k] = v.clone();
    }
    input
}

#[tokio::test]
async fn a_schedule_is_made_read_paused_resumed_fired_and_deleted_over_http() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let (status, made) = post(
        &server,
        "/v1/schedules",
        json!({
            "id": "nightly", "saga": "place_order", "cron": "0 2 * * *",
            "timezone": "Europe/Paris", "overlap": "buffer_one", "catchup_window": "10m",
            "input": {"order_id": "n-1", "user": "ada", "amount": 100},
        }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["cron"], "0 2 * * *");
    assert_eq!(made["timezone"], "Europe/Paris");
    assert_eq!(made["overlap"], "buffer_one");
    assert_eq!(made["catchup_window"], "10m");
    assert_eq!(made["paused"], false);
    let next: Vec<&str> = made["next_runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(next.len(), 5, "{made}");
    for t in &next {
        // 02:00 in Paris is 00:00 or 01:00 UTC.
        assert!(
            t.ends_with("T01:00:00.000Z") || t.ends_with("T00:00:00.000Z"),
            "{t}"
        );
    }

    let (status, list) = get(&server, "/v1/schedules").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["schedules"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["schedules"][0]["id"], "nightly");

    let (status, run) = post(&server, "/v1/schedules/nightly/trigger", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["outcome"], "started", "{run}");
    assert_eq!(run["triggered"], true);
    let saga: Uuid = run["saga_id"].as_str().unwrap().parse().unwrap();
    let done = server
        .wait_for(saga, LONG, |s| s["status"] == "COMPLETED")
        .await;
    assert_eq!(done["name"], "place_order");
    assert_eq!(done["input"]["order_id"], "n-1");
    let shown = schedule(&server, "nightly").await;
    assert_eq!(shown.runs.len(), 1);
    assert_eq!(shown.runs[0].saga_id, Some(saga));
    assert_eq!(
        saga,
        orchestrator::schedules::run_saga_id(&shown.schedule, shown.runs[0].scheduled_at),
        "the saga's id derives from the schedule and the instant"
    );
    assert_eq!(shown.schedule.last_saga_id, Some(saga));

    let (status, paused) = post(&server, "/v1/schedules/nightly/pause", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{paused}");
    assert_eq!(paused["paused"], true);
    assert_eq!(paused["next_runs"], json!([]));
    let (status, resumed) = post(&server, "/v1/schedules/nightly/resume", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["paused"], false);
    assert_eq!(resumed["next_runs"].as_array().unwrap().len(), 5);
    // Resuming a schedule that is not paused changes nothing (a due tick stays due).
    let (status, again) = post(&server, "/v1/schedules/nightly/resume", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, resumed);

    let r = reqwest::Client::new()
        .delete(format!("{}/v1/schedules/nightly", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (status, body) = get(&server, "/v1/schedules/nightly").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "unknown_schedule");
    // Its saga is left alone.
    assert_eq!(server.saga(saga).await["status"], "COMPLETED");
    server.kill9();
}

#[tokio::test]
async fn bad_schedules_are_refused_with_a_clear_error_and_nothing_is_written() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let input = json!({"order_id": "b", "user": "ada", "amount": 1});
    let ok = json!({"id": "taken", "saga": "place_order", "every": "1h", "input": input, "paused": true});
    let (status, body) = post(&server, "/v1/schedules", ok.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let with = |changes: Value| {
        let mut body = json!({"id": "bad", "saga": "place_order", "every": "1h", "input": input});
        for (k, v) in changes.as_object().unwrap() {
            if v.is_null() {
                body.as_object_mut().unwrap().remove(k);
            } else {
                body[k] = v.clone();
            }
        }
        body
    };
    for (body, want_status, want_code, says) in [
        (
            with(json!({"saga": "no_such_saga"})),
            422,
            "unknown_saga",
            "no_such_saga",
        ),
        (
            with(json!({"every": null, "cron": "61 * * * *"})),
            422,
            "invalid_cron",
            "cron",
        ),
        (
            with(json!({"every": null, "cron": "0 0 9 * * * 2026"})),
            422,
            "invalid_cron",
            "not a cron expression",
        ),
        (
            with(json!({"every": null, "cron": "0 * * * *", "timezone": "Mars/Olympus"})),
            422,
            "invalid_timezone",
            "IANA",
        ),
        (
            with(json!({"cron": "0 * * * *"})),
            422,
            "invalid_schedule",
            "not both",
        ),
        (
            with(json!({"every": null})),
            422,
            "invalid_schedule",
            "\"every\"",
        ),
        (
            with(json!({"every": "500ms"})),
            422,
            "invalid_interval",
            "once a second",
        ),
        (
            with(json!({"every": "soon"})),
            422,
            "invalid_duration",
            "duration",
        ),
        (
            with(json!({"catchup_window": "0s"})),
            422,
            "invalid_duration",
            "from 15s",
        ),
        (
            with(json!({"catchup_window": "14s"})),
            422,
            "invalid_duration",
            "out of bounds",
        ),
        (
            with(json!({"catchup_window": "8days"})),
            422,
            "invalid_duration",
            "to 7days",
        ),
        (with(json!({"saga": null})), 400, "bad_request", "saga"),
        (
            with(json!({"input": {"order_id": "b"}})),
            422,
            "invalid_input",
            "user",
        ),
        (
            with(json!({"overlap": "sometimes"})),
            400,
            "bad_request",
            "overlap",
        ),
        (
            with(json!({"id": "no spaces"})),
            400,
            "bad_request",
            "schedule id",
        ),
        (with(json!({"extra": 1})), 400, "bad_request", "extra"),
        (ok.clone(), 409, "conflict", "already exists"),
    ] {
        let (status, answer) = post(&server, "/v1/schedules", body.clone()).await;
        assert_eq!(status.as_u16(), want_status, "{body} → {answer}");
        assert_eq!(answer["error"]["code"], want_code, "{body} → {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body} → {message}");
    }
    let (_, list) = get(&server, "/v1/schedules").await;
    let ids: Vec<&str> = list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["taken"], "nothing else was written");
    let taken = schedule(&server, "taken").await;
    assert_eq!(taken.schedule.input, input, "the first one is untouched");
    server.kill9();
}

#[tokio::test]
async fn each_tick_of_an_interval_starts_one_saga_whose_id_derives_from_its_instant() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let (status, body) = post(
        &server,
        "/v1/schedules",
        json!({"id": "every-second", "saga": "place_order", "every": "1s",
               "input": {"order_id": "e", "user": "ada", "amount": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let s = wait_runs(&server, "every-second", LONG, |s| s.runs.len() >= 4).await;
    post(&server, "/v1/schedules/every-second/pause", json!({})).await;
    let mut instants = Vec::new();
    for run in s.runs.iter().rev() {
        assert_eq!(run.outcome.as_str(), "started", "{run:?}");
        assert_eq!(run.scheduled_at % 1000, 0, "ticks fall on whole seconds");
        let saga = run.saga_id.unwrap();
        assert_eq!(
            saga,
            orchestrator::schedules::run_saga_id(&s.schedule, run.scheduled_at)
        );
        // A UUIDv7 like every saga id, stamped with its tick, so lists sort it by time.
        assert_eq!(saga.get_version_num(), 7, "{saga}");
        let (secs, nanos) = saga.get_timestamp().expect("a v7 timestamp").to_unix();
        assert_eq!(
            i64::try_from(secs * 1000 + u64::from(nanos) / 1_000_000).unwrap(),
            run.scheduled_at
        );
        let shown = server
            .wait_for(saga, LONG, |s| s["status"] == "COMPLETED")
            .await;
        assert_eq!(shown["name"], "place_order");
        instants.push(run.scheduled_at);
    }
    for w in instants.windows(2) {
        assert_eq!(
            w[1] - w[0],
            1000,
            "no tick skipped or repeated: {instants:?}"
        );
    }
    server.kill9();
}

/// A schedule of `fulfil_order` waiting for its approval, every second, under `overlap`.
async fn outlasting(server: &Server, id: &str, overlap: &str) {
    let (status, body) = post(
        server,
        "/v1/schedules",
        json!({"id": id, "saga": "fulfil_order", "every": "1s", "overlap": overlap,
               "input": order(json!({"needs_approval": true}))}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn overlap_skip_and_buffer_one_hold_ticks_back_while_the_previous_run_waits() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    outlasting(&server, "skip", "skip").await;
    outlasting(&server, "buffer", "buffer_one").await;

    let skip = wait_runs(&server, "skip", LONG, |s| s.runs.len() >= 4).await;
    let o = outcomes(&skip);
    assert_eq!(o[0], "started", "{o:?}");
    assert!(o[1..].iter().all(|o| *o == "skipped"), "{o:?}");
    let first = skip.runs.last().unwrap().saga_id.unwrap();
    assert!(
        skip.runs[0]
            .detail
            .as_deref()
            .unwrap()
            .contains(&first.to_string()),
        "{:?}",
        skip.runs[0]
    );

    let buffer = wait_runs(&server, "buffer", LONG, |s| s.runs.len() >= 4).await;
    let o = outcomes(&buffer);
    assert_eq!(&o[..2], ["started", "buffered"], "{o:?}");
    assert!(o[2..].iter().all(|o| *o == "skipped"), "{o:?}");
    let running = buffer.runs.last().unwrap().saga_id.unwrap();
    let buffered_at = buffer.runs[buffer.runs.len() - 2].scheduled_at;
    assert_eq!(buffer.schedule.buffered_at, Some(buffered_at));
    // The running one ends: the buffered tick starts.
    server
        .wait_for(running, LONG, |s| {
            s["steps"]
                .as_array()
                .unwrap()
                .iter()
                .any(|st| st["name"] == "await_approval" && st["status"] == "WAITING")
        })
        .await;
    let (status, _) = post(
        &server,
        &format!("/v1/sagas/{running}/signals/approval"),
        json!({"approved": true, "by": "grace"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let after = wait_runs(&server, "buffer", LONG, |s| {
        s.runs
            .iter()
            .any(|r| r.scheduled_at == buffered_at && r.outcome.as_str() == "started")
    })
    .await;
    let run = after
        .runs
        .iter()
        .find(|r| r.scheduled_at == buffered_at)
        .unwrap();
    let second = run.saga_id.unwrap();
    assert_eq!(server.saga(running).await["status"], "COMPLETED");
    assert_eq!(server.saga(second).await["name"], "fulfil_order");
    // That tick waits no more; a later one may, behind the saga it started. Read again: a
    // schedule and its runs are read one after the other, so the read that saw the run may
    // hold the schedule from just before its advance.
    let now_shown = schedule(&server, "buffer").await;
    assert!(
        now_shown
            .schedule
            .buffered_at
            .is_none_or(|at| at > buffered_at),
        "{:?}",
        now_shown.schedule.buffered_at
    );
    post(&server, "/v1/schedules/skip/pause", json!({})).await;
    post(&server, "/v1/schedules/buffer/pause", json!({})).await;
    server.kill9();
}

#[tokio::test]
async fn overlap_cancel_other_cancels_the_previous_run_and_allow_all_runs_them_together() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    outlasting(&server, "cancel", "cancel_other").await;
    outlasting(&server, "all", "allow_all").await;

    let cancel = wait_runs(&server, "cancel", LONG, |s| s.runs.len() >= 3).await;
    post(&server, "/v1/schedules/cancel/pause", json!({})).await;
    let all = wait_runs(&server, "all", LONG, |s| s.runs.len() >= 3).await;
    post(&server, "/v1/schedules/all/pause", json!({})).await;

    let o = outcomes(&cancel);
    assert_eq!(o[0], "started", "{o:?}");
    assert!(o[1..].iter().all(|o| *o == "cancelled_other"), "{o:?}");
    let sagas: Vec<Uuid> = cancel
        .runs
        .iter()
        .rev()
        .map(|r| r.saga_id.unwrap())
        .collect();
    // Each run but the latest was cancelled by the next, and compensated.
    for (i, saga) in sagas[..sagas.len() - 1].iter().enumerate() {
        let shown = server
            .wait_for(*saga, LONG, |s| s["status"] == "COMPENSATED")
            .await;
        assert_eq!(shown["status"], "COMPENSATED");
        let events: Value = reqwest::get(format!("{}/v1/sagas/{saga}/events", server.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let text = events.to_string();
        assert!(
            text.contains("schedule cancel started its run of"),
            "the cancel names the schedule: {text}"
        );
        let next = &cancel.runs[cancel.runs.len() - 2 - i];
        assert!(
            next.detail.as_deref().unwrap().contains(&saga.to_string()),
            "{next:?}"
        );
    }

    let o = outcomes(&all);
    assert!(o.iter().all(|o| *o == "started"), "{o:?}");
    let sagas: BTreeSet<Uuid> = all.runs.iter().map(|r| r.saga_id.unwrap()).collect();
    assert_eq!(sagas.len(), all.runs.len(), "one saga per tick");
    for saga in sagas {
        let shown = server.saga(saga).await;
        assert!(
            ["RUNNING", "QUEUED"].contains(&shown["status"].as_str().unwrap()),
            "each waits for its approval, all at once: {shown:#}"
        );
    }
    server.kill9();
}

#[tokio::test]
async fn ticks_missed_while_no_process_ran_start_within_the_catch_up_window_and_older_ones_are_missed(
) {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let (status, body) = post(
        &server,
        "/v1/schedules",
        json!({"id": "catch-up", "saga": "place_order", "every": "1s", "overlap": "allow_all",
               "catchup_window": "15s", "input": {"order_id": "c", "user": "ada", "amount": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    wait_runs(&server, "catch-up", LONG, |s| s.runs.len() >= 2).await;
    server.kill9();
    let down = chrono::Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_secs(21)).await;
    let back = chrono::Utc::now().timestamp_millis();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let s = wait_runs(&server, "catch-up", LONG, |s| {
        s.runs.first().is_some_and(|r| r.scheduled_at > back + 1000)
    })
    .await;
    post(&server, "/v1/schedules/catch-up/pause", json!({})).await;
    let runs: Vec<_> = s.runs.iter().rev().collect();
    // Every tick is there once, in order, with no gap.
    for w in runs.windows(2) {
        assert_eq!(w[1].scheduled_at - w[0].scheduled_at, 1000, "{runs:#?}");
    }
    let missed: Vec<_> = runs
        .iter()
        .filter(|r| r.outcome.as_str() == "missed")
        .collect();
    assert!(missed.len() >= 4, "{runs:#?}");
    for r in &missed {
        assert!(r.saga_id.is_none());
        assert!(r.scheduled_at > down - 1000, "{r:?}");
        assert!(
            r.scheduled_at < chrono::Utc::now().timestamp_millis() - 15_000,
            "{r:?}"
        );
    }
    let first_missed = missed.first().unwrap().scheduled_at;
    let last_missed = missed.last().unwrap().scheduled_at;
    for r in &runs {
        if r.scheduled_at < first_missed || r.scheduled_at > last_missed {
            assert_eq!(r.outcome.as_str(), "started", "{r:?}");
        } else {
            assert_eq!(r.outcome.as_str(), "missed", "{r:?}");
        }
    }
    // Ticks of the downtime within the window ran once the process was back.
    let caught_up: Vec<_> = runs
        .iter()
        .filter(|r| r.scheduled_at > last_missed && r.scheduled_at <= back)
        .collect();
    assert!(caught_up.len() >= 2, "{runs:#?}");
    for r in runs.iter().filter(|r| r.outcome.as_str() == "started") {
        let saga = server
            .wait_for(r.saga_id.unwrap(), LONG, |s| s["status"] == "COMPLETED")
            .await;
        assert_eq!(saga["name"], "place_order");
    }
    server.kill9();
}

/// The pid in a worker id (`host:pid:random`).
fn pid_of(worker: &str) -> u32 {
    worker.split(':').nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn three_postgres_processes_start_one_saga_per_tick_through_a_kill_of_the_one_firing() {
    let db = TempDb::postgres();
    let store = db.store().await;
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(Server::spawn(&db.url, db.dir.path(), &[], &[]).await);
    }
    let (status, body) = post(
        &servers[0],
        "/v1/schedules",
        json!({"id": "cluster", "saga": "place_order", "every": "1s", "overlap": "allow_all",
               "catchup_window": "1m", "input": {"order_id": "k", "user": "ada", "amount": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Half a minute in all: half of it before the kill, half after (longer than the 10 s
    // lease a dead process holds the schedule by).
    tokio::time::sleep(Duration::from_secs(15)).await;
    // The process that started the latest tick's saga made its first attempt.
    let latest = schedule(&servers[0], "cluster").await;
    let saga = latest.runs[0].saga_id.unwrap();
    let attempts = store.attempts(saga).await.unwrap();
    let firing = pid_of(&attempts[0].worker);
    let at = servers.iter().position(|s| s.pid() == firing).unwrap();
    servers.remove(at).kill9();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let stop = chrono::Utc::now().timestamp_millis();
    let s = wait_runs(&servers[0], "cluster", LONG, |s| {
        s.runs.first().is_some_and(|r| r.scheduled_at > stop)
    })
    .await;
    post(&servers[0], "/v1/schedules/cluster/pause", json!({})).await;
    let runs: Vec<_> = s.runs.iter().rev().collect();
    assert!(runs.len() >= 28, "{}", runs.len());
    let mut sagas = BTreeSet::new();
    for w in runs.windows(2) {
        assert_eq!(
            w[1].scheduled_at - w[0].scheduled_at,
            1000,
            "none lost: {runs:#?}"
        );
    }
    for r in &runs {
        assert_eq!(r.outcome.as_str(), "started", "{r:?}");
        let saga = r.saga_id.unwrap();
        assert_eq!(
            saga,
            orchestrator::schedules::run_saga_id(&s.schedule, r.scheduled_at)
        );
        assert!(sagas.insert(saga), "one saga per tick");
    }
    // Exactly one saga per tick in the log, and each completes.
    let page = store
        .list_sagas(&orchestrator::model::ListFilter {
            name: Some("place_order".to_owned()),
            limit: 500,
            ..Default::default()
        })
        .await
        .unwrap();
    let logged: BTreeSet<Uuid> = page.sagas.iter().map(|s| s.id).collect();
    assert!(
        sagas.is_subset(&logged) && logged.len() <= sagas.len() + 2,
        "{} logged, {} ticks",
        logged.len(),
        sagas.len()
    );
    for saga in &sagas {
        saga_suite::wait_for(&store, *saga, LONG, |s| {
            s.status == orchestrator::SagaStatus::Completed
        })
        .await;
    }
    for server in servers {
        server.kill9();
    }
}

#[tokio::test]
async fn the_cli_makes_lists_shows_pauses_resumes_fires_and_deletes_schedules() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let dir = db.dir.path();
    let text = |out: &[u8]| String::from_utf8_lossy(out).into_owned();
    let saga = |args: &[&str]| {
        let mut all = vec!["--database-url", db.url.as_str()];
        all.extend_from_slice(args);
        all.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        saga_suite::run_bin("saga", &args, dir).await
    };
    // Made through the server (which checks the saga and its input).
    let out = run(saga(&[
        "schedule",
        "create",
        "nightly",
        "--saga",
        "place_order",
        "--cron",
        "0 2 * * *",
        "--timezone",
        "Europe/Paris",
        "--overlap",
        "skip",
        "--input",
        r#"{"order_id": "cli", "user": "ada", "amount": 7}"#,
        "--server",
        &server.base,
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("schedule nightly made"), "{said}");
    assert!(
        said.contains("cron \"0 2 * * *\" in Europe/Paris"),
        "{said}"
    );

    // A bad one is refused with the server's message, and nothing is made.
    let out = run(saga(&[
        "schedule",
        "create",
        "bad",
        "--saga",
        "place_order",
        "--every",
        "100ms",
        "--server",
        &server.base,
    ]))
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("once a second"),
        "{}",
        text(&out.stderr)
    );

    // Listed and shown on the database, as through the server.
    let out = run(saga(&["schedule", "list"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains("nightly") && table.contains("place_order"),
        "{table}"
    );
    assert!(!table.contains("bad"), "{table}");
    let out = run(saga(&[
        "schedule",
        "list",
        "--json",
        "--server",
        &server.base,
    ]))
    .await;
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["schedules"][0]["id"], "nightly");

    // Fired now: its saga runs.
    let out = run(saga(&[
        "schedule",
        "trigger",
        "nightly",
        "--json",
        "--server",
        &server.base,
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let fired: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fired["outcome"], "started");
    let id: Uuid = fired["saga_id"].as_str().unwrap().parse().unwrap();
    server
        .wait_for(id, LONG, |s| s["status"] == "COMPLETED")
        .await;
    let out = run(saga(&["schedule", "show", "nightly"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains(&id.to_string()), "{shown}");
    assert!(shown.contains("started (trigger)"), "{shown}");
    assert!(shown.contains("next runs:"), "{shown}");

    // Paused and resumed on the database, then deleted through the server.
    let out = run(saga(&["schedule", "pause", "nightly"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("paused"));
    assert!(schedule(&server, "nightly").await.schedule.paused);
    let out = run(saga(&["schedule", "resume", "nightly"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!schedule(&server, "nightly").await.schedule.paused);
    let out = run(saga(&[
        "schedule",
        "delete",
        "nightly",
        "--server",
        &server.base,
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(saga(&["schedule", "show", "nightly"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no schedule with id \"nightly\""),
        "{}",
        text(&out.stderr)
    );
    server.kill9();
}

/// The engine's clock for [`a_paris_cron_fires_across_the_spring_forward_change_on_a_virtual_clock`]:
/// from `start_ms`, 10 000 times as fast as real time.
#[derive(Debug)]
struct FastClock {
    start_ms: i64,
    real: std::time::Instant,
}

impl orchestrator::clock::Clock for FastClock {
    fn now_ms(&self) -> i64 {
        self.start_ms + i64::try_from(self.real.elapsed().as_millis()).unwrap() * 10_000
    }
}

#[tokio::test]
async fn a_paris_cron_fires_across_the_spring_forward_change_on_a_virtual_clock() {
    use saga_suite::{registry_of, scripted_saga, test_config, Journal, ScriptedStep};
    let db = TempDb::new();
    let store = db.store().await;
    let journal = Journal::default();
    let def = scripted_saga(
        "nightly",
        1,
        &[ScriptedStep::new("a", saga_dsl::StepKind::Compensatable)],
        &journal,
    );
    let at = |text: &str| {
        chrono::DateTime::parse_from_rfc3339(text)
            .unwrap()
            .timestamp_millis()
    };
    // 21:00 in Paris the evening before the clocks go from 02:00 to 03:00 (01:00 UTC).
    let clock = std::sync::Arc::new(FastClock {
        start_ms: at("2026-03-28T20:00:00Z"),
        real: std::time::Instant::now(),
    });
    let engine = orchestrator::Engine::with_clock(
        store.clone(),
        std::sync::Arc::new(registry_of([def])),
        test_config(),
        clock,
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await.unwrap() }
    });
    let scheduler = tokio::spawn(orchestrator::schedules::scheduler::run(
        engine.clone(),
        shutdown.clone(),
    ));
    let made = orchestrator::schedules::create(
        &engine,
        serde_json::from_value(json!({
            "id": "half-past-two", "saga": "nightly", "cron": "30 2 * * *",
            "timezone": "Europe/Paris", "catchup_window": "12h",
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let shown = orchestrator::schedules::detail(made, Vec::new(), engine.clock().now_ms());
    // 02:30 does not exist that night: the tick is the first instant after the gap, 03:00
    // summer time; from then on 02:30 is 00:30 UTC.
    assert_eq!(
        shown.next_runs[..3],
        [
            "2026-03-29T01:00:00.000Z",
            "2026-03-30T00:30:00.000Z",
            "2026-03-31T00:30:00.000Z"
        ]
    );
    // Two ticks on the virtual clock (a little over a day, some 11 s of real time).
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let runs = loop {
        let runs = store.schedule_runs("half-past-two", 10).await.unwrap();
        if runs.len() >= 2 {
            break runs;
        }
        assert!(std::time::Instant::now() < deadline, "{runs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    shutdown.cancel();
    scheduler.await.unwrap();
    running.await.unwrap();
    let ticks: Vec<(String, &str)> = runs
        .iter()
        .rev()
        .map(|r| {
            (
                orchestrator::model::rfc3339(r.scheduled_at),
                r.outcome.as_str(),
            )
        })
        .collect();
    assert_eq!(
        ticks[..2],
        [
            ("2026-03-29T01:00:00.000Z".to_owned(), "started"),
            ("2026-03-30T00:30:00.000Z".to_owned(), "started"),
        ]
    );
    for r in &runs {
        let saga = store.get_saga(r.saga_id.unwrap()).await.unwrap().unwrap();
        assert_eq!(saga.name, "nightly");
    }
}
