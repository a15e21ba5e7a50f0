//! The CLI binaries as a person's terminal and a shell pipeline see them: tables that fit the
//! width (`COLUMNS`, or a real pseudo-terminal's), colour on a terminal only, plain logs when
//! stderr is not a terminal, and a quiet exit when the reader of a pipe goes away.
//!
//! The pseudo-terminal is util-linux's `script`, which runs a command on a fresh one.
//! The tests need the built binaries: run `cargo build --workspace --bins` first.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use orchestrator::model::SagaStatus;
use saga_dsl::StepKind::{Compensatable, Pivot};
use saga_suite::Outcome::Permanent;
use saga_suite::{
    bin_path, registry_of, scripted_saga, test_config, wait_terminal, Journal, RunningEngine,
    ScriptedStep as S, TempDb,
};
use serde_json::json;
use unicode_width::UnicodeWidthStr;
use uuid::Uuid;

const ESC: char = '\u{1b}';

/// An error long enough to break any table, over several lines and with wide characters.
fn long_error(what: &str) -> String {
    format!(
        "{what}: the payment provider answered 502 Bad Gateway after 30s\nwhile refunding order \
         o-1234567890 for customer ada@example.com; 支払いプロバイダーが応答しません; \
         retry scheduled with the same idempotency key {}",
        "x".repeat(120)
    )
}

/// A database whose sagas were run by a real engine (one completed, one compensated), then
/// given long errors, as a failing participant would leave them.
struct Log {
    db: TempDb,
    compensated: Uuid,
}

impl Log {
    async fn new() -> Self {
        let db = TempDb::new();
        let store = db.store().await;
        let j = Journal::default();
        let defs = vec![
            scripted_saga(
                "order",
                1,
                &[S::new("reserve", Compensatable), S::new("ship", Pivot)],
                &j,
            ),
            scripted_saga(
                "refund_with_a_rather_long_definition_name",
                1,
                &[
                    S::new("reserve_inventory_in_the_warehouse", Compensatable),
                    S::new("charge", Compensatable).action(&[Permanent]),
                ],
                &j,
            ),
        ];
        let engine = RunningEngine::start(store.clone(), registry_of(defs), test_config());
        let done = engine
            .engine
            .start_saga("order", json!({"n": 1}))
            .await
            .unwrap()
            .id;
        let compensated = engine
            .engine
            .start_saga(
                "refund_with_a_rather_long_definition_name",
                json!({"note": "y".repeat(300)}),
            )
            .await
            .unwrap()
            .id;
        assert_eq!(
            wait_terminal(&store, done).await.status,
            SagaStatus::Completed
        );
        assert_eq!(
            wait_terminal(&store, compensated).await.status,
            SagaStatus::Compensated
        );
        engine.stop().await;
        let saga_error = long_error("charge").replace('\'', "''");
        db.execute(&format!(
            "UPDATE sagas SET error = '{saga_error}' WHERE id = '{compensated}'"
        ))
        .await;
        db.execute(&format!(
            "UPDATE steps SET last_error = '{saga_error}', comp_last_error = '{}' \
             WHERE saga_id = '{compensated}'",
            long_error("release")
        ))
        .await;
        Self { db, compensated }
    }
}

/// Runs a binary with stdout and stderr to pipes.
fn piped(bin: &str, url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin_path(bin));
    cmd.args(args)
        .env("DATABASE_URL", url)
        .env_remove("COLUMNS")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Runs a binary on a real pseudo-terminal `cols` columns wide (util-linux `script`), and
/// returns what the terminal showed, stdout and stderr together, line ends as `\n`.
fn on_terminal(bin: &str, url: &str, args: &[&str], cols: u16, env: &[(&str, &str)]) -> String {
    let script = std::path::Path::new("/usr/bin/script");
    assert!(
        script.exists(),
        "util-linux `script` is needed to run commands on a pseudo-terminal"
    );
    let words: Vec<String> = std::iter::once(bin_path(bin).display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|w| format!("'{w}'"))
        .collect();
    // The variables are set by `env` right before the binary: a shell may reset `COLUMNS`
    // to the terminal's width after `stty`.
    let vars: Vec<String> = env.iter().map(|(k, v)| format!("'{k}={v}'")).collect();
    let line = format!(
        "stty cols {cols} rows 50; exec env {} {}",
        vars.join(" "),
        words.join(" ")
    );
    let mut cmd = Command::new(script);
    cmd.args(["-qec", &line, "/dev/null"])
        .env("DATABASE_URL", url)
        .env_remove("COLUMNS")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().replace("\r\n", "\n")
}

/// Text without its ANSI escape sequences (`ESC [ … letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == ESC {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn assert_fits(text: &str, width: usize, what: &str) {
    for line in strip_ansi(text).lines() {
        assert!(
            line.width() <= width,
            "{what}: a line of {} columns, wider than {width}:\n{line}\n\nin:\n{text}",
            line.width()
        );
    }
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[tokio::test]
async fn tables_fit_columns_100_and_keep_the_id_whole() {
    let log = Log::new().await;
    let id = log.compensated.to_string();
    for args in [
        vec!["list"],
        vec!["show", id.as_str()],
        vec!["events", id.as_str()],
        vec!["workers"],
    ] {
        for bin in ["saga", "example-sagas"] {
            let text = stdout(&piped(bin, &log.db.url, &args, &[("COLUMNS", "100")]));
            assert_fits(&text, 100, &format!("{bin} {args:?}"));
            assert!(!text.contains(ESC), "no colour into a pipe:\n{text}");
            if matches!(args[0], "list" | "show") {
                assert!(text.contains(&id), "the id is whole:\n{text}");
            }
        }
    }
    // Narrower still: columns go, cells are cut, `show`'s id stays whole and `list`'s is cut
    // only to its shortest unique prefix, which names the saga.
    for cols in [80usize, 60] {
        for args in [
            vec!["list"],
            vec!["show", id.as_str()],
            vec!["events", id.as_str()],
        ] {
            let env = [("COLUMNS", cols.to_string())];
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let text = stdout(&piped("saga", &log.db.url, &args, &env));
            assert_fits(&text, cols, &format!("{args:?} at {cols}"));
            if args[0] == "show" {
                assert!(text.contains(&id), "the id is whole at {cols}:\n{text}");
            }
            if args[0] == "list" {
                let short = short_id_in(&text, &id);
                let named = stdout(&piped(
                    "saga",
                    &log.db.url,
                    &["show", &short, "--json"],
                    &[],
                ));
                assert!(named.contains(&id), "{short} names the saga");
            }
        }
    }
    // Long cells are cut with an ellipsis, not wrapped onto more lines.
    let text = stdout(&piped(
        "saga",
        &log.db.url,
        &["list"],
        &[("COLUMNS", "100")],
    ));
    assert_eq!(text.lines().count(), 6, "one line per saga:\n{text}");
    assert!(text.contains('…'), "{text}");
    assert!(
        text.contains("just now") || text.contains(" ago"),
        "relative times:\n{text}"
    );
    // A flagged saga: the flag is shown whole, and the table still fits.
    log.db
        .execute(&format!(
            "UPDATE sagas SET needs_attention = TRUE WHERE id = '{id}'"
        ))
        .await;
    // At 100 columns the id is whole; under that it would take more than two fifths of the
    // width, and is its shortest unique prefix instead.
    for cols in ["100", "90"] {
        let text = stdout(&piped("saga", &log.db.url, &["list"], &[("COLUMNS", cols)]));
        assert_fits(&text, cols.parse().unwrap(), "a flagged saga");
        assert!(text.contains("NEEDS ATTENTION"), "{text}");
        if cols == "100" {
            assert!(text.contains(&id), "{text}");
        } else {
            short_id_in(&text, &id);
        }
    }
}

/// The id cell of `id`'s row in a `list` table: a prefix of it, of 8 characters or more and
/// shorter than the whole id, on exactly one row.
fn short_id_in(text: &str, id: &str) -> String {
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&id[..8]))
        .filter(|l| {
            let cell = l
                .trim_start_matches(['│', '┆', ' '])
                .split(' ')
                .next()
                .unwrap_or("");
            cell.len() >= 8 && id.starts_with(cell)
        })
        .collect();
    assert_eq!(rows.len(), 1, "one row of {id}:\n{text}");
    let cell = rows[0]
        .trim_start_matches(['│', '┆', ' '])
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    assert!(cell.len() < id.len(), "the whole id at 80 columns:\n{text}");
    cell
}

#[tokio::test]
async fn a_list_of_80_columns_gives_the_id_a_short_unique_prefix() {
    let log = Log::new().await;
    let id = log.compensated.to_string();
    let text = stdout(&piped("saga", &log.db.url, &["list"], &[("COLUMNS", "80")]));
    assert_fits(&text, 80, "list at 80");
    let short = short_id_in(&text, &id);
    assert!(
        short.len() <= 16,
        "the id takes {} of 80 columns:\n{text}",
        short.len()
    );
    // Still the room for what the list is for.
    assert!(text.contains("refund_with"), "{text}");
    assert!(text.contains("COMPENSATED"), "{text}");
    // Wide enough, the whole id.
    let wide = stdout(&piped(
        "saga",
        &log.db.url,
        &["list"],
        &[("COLUMNS", "200")],
    ));
    assert!(wide.contains(&id), "{wide}");
}

#[tokio::test]
async fn show_keeps_errors_whole_in_a_pipe_or_with_room_and_prints_them_whole_when_narrow() {
    let log = Log::new().await;
    let id = log.compensated.to_string();
    let error = long_error("charge")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let release = long_error("release")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    // In a pipe, and on a terminal with room: every error whole, on one line of its table.
    for env in [vec![], vec![("COLUMNS", "600")]] {
        let text = stdout(&piped("saga", &log.db.url, &["show", &id], &env));
        assert!(text.contains(&error), "{env:?}:\n{text}");
        assert!(text.contains(&release), "{env:?}:\n{text}");
    }
    // Narrow: the tables fit and cut, then every error follows in full, wrapped.
    for cols in [100usize, 60] {
        let env = [("COLUMNS", cols.to_string())];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let text = stdout(&piped("saga", &log.db.url, &["show", &id], &env));
        assert_fits(&text, cols, &format!("show at {cols}"));
        let full = text
            .split("Errors in full")
            .nth(1)
            .unwrap_or_else(|| panic!("no full errors at {cols}:\n{text}"));
        let squeezed: String = full.split_whitespace().collect();
        for e in [&error, &release] {
            let e: String = e.split_whitespace().collect();
            assert!(squeezed.contains(&e), "{e} at {cols}:\n{text}");
        }
        assert!(full.contains("saga"), "where it came from:\n{full}");
    }
    // `--json` has the saga with its attempts, as the HTTP API's saga object.
    let json: serde_json::Value = serde_json::from_str(&stdout(&piped(
        "saga",
        &log.db.url,
        &["show", &id, "--json"],
        &[],
    )))
    .unwrap();
    assert_eq!(json["id"], id.as_str());
    let attempts = json["attempts"].as_array().unwrap();
    assert!(!attempts.is_empty(), "{json}");
    for field in [
        "step",
        "phase",
        "attempt",
        "worker",
        "started_at",
        "outcome",
    ] {
        assert!(attempts[0].get(field).is_some(), "{field} in {json}");
    }
}

#[tokio::test]
async fn a_pipe_without_columns_gets_every_column_whole() {
    let log = Log::new().await;
    let text = stdout(&piped("saga", &log.db.url, &["list"], &[]));
    assert!(!text.contains(ESC), "{text}");
    for header in [
        "id", "name", "version", "status", "created", "updated", "error",
    ] {
        assert!(
            text.lines().nth(1).unwrap().contains(header),
            "{header} missing:\n{text}"
        );
    }
    assert!(text.contains("refund_with_a_rather_long_definition_name"));
    assert!(text.contains("charge: the payment provider answered 502"));
    // Grep finds a saga by its id.
    let id = log.compensated.to_string();
    assert_eq!(text.lines().filter(|l| l.contains(&id)).count(), 1);
    let shown = stdout(&piped("saga", &log.db.url, &["show", &id], &[]));
    assert!(
        shown.contains("reserve_inventory_in_the_warehouse"),
        "{shown}"
    );
    assert!(!shown.contains(ESC));
}

#[tokio::test]
async fn a_terminal_of_100_columns_gets_tables_that_fit_and_colour() {
    let log = Log::new().await;
    let id = log.compensated.to_string();
    for bin in ["saga", "example-sagas"] {
        for args in [
            vec!["list"],
            vec!["show", id.as_str()],
            vec!["events", id.as_str()],
        ] {
            let text = on_terminal(bin, &log.db.url, &args, 100, &[]);
            assert_fits(&text, 100, &format!("{bin} {args:?} on a terminal"));
            if args[0] != "events" {
                assert!(strip_ansi(&text).contains(&id), "the id is whole:\n{text}");
            }
        }
        let list = on_terminal(bin, &log.db.url, &["list"], 100, &[]);
        assert!(list.contains(ESC), "statuses are coloured:\n{list}");
        // NO_COLOR is honoured.
        let plain = on_terminal(bin, &log.db.url, &["list"], 100, &[("NO_COLOR", "1")]);
        assert!(!plain.contains(ESC), "{plain}");
        assert_fits(&plain, 100, "NO_COLOR");
    }
    // COLUMNS wins over the terminal's width.
    let narrow = on_terminal("saga", &log.db.url, &["list"], 100, &[("COLUMNS", "80")]);
    assert_fits(&narrow, 80, "COLUMNS=80 on a terminal of 100");
    // The saga is there, by the short id a list of 80 columns gives it.
    short_id_in(&strip_ansi(&narrow), &id);
}

#[tokio::test]
async fn logs_are_plain_unless_stderr_is_a_terminal() {
    let log = Log::new().await;
    // `--json` output has no colour of its own: any escape would come from the logs.
    let out = piped(
        "saga",
        &log.db.url,
        &["list", "--json"],
        &[("RUST_LOG", "debug")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.is_empty(), "debug logs expected");
    assert!(
        !stderr.contains(ESC),
        "escape codes in a log file:\n{stderr}"
    );

    let shown = on_terminal(
        "saga",
        &log.db.url,
        &["list", "--json"],
        100,
        &[("RUST_LOG", "debug")],
    );
    assert!(
        shown.contains(ESC),
        "logs on a terminal are coloured:\n{shown}"
    );
}

/// Starts `bin list` with stdout to a pipe, reads one line and closes the pipe, as
/// `BIN list | head -1` does; returns the exit status and stderr.
fn read_one_line_and_close(
    bin: &str,
    url: &str,
    args: &[&str],
) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(bin_path(bin))
        .args(args)
        .env("DATABASE_URL", url)
        .env_remove("COLUMNS")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(!first.is_empty(), "{bin} {args:?} printed nothing");
    drop(reader);
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_closed_pipe_ends_the_output_quietly() {
    let db = TempDb::new();
    let store = db.store().await;
    let def = scripted_saga(
        "order",
        1,
        &[S::new("reserve", Compensatable)],
        &Journal::default(),
    );
    // Far more output than a pipe buffers, so the writer really meets the closed pipe.
    let mut tasks = Vec::new();
    for n in 0..16 {
        let store = store.clone();
        let def = def.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..60 {
                let new = orchestrator::store::NewSaga::of(&def, json!({"n": n * 100 + i}));
                store.create_saga(new).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for bin in ["saga", "example-sagas"] {
        for args in [
            &["list", "--limit", "1000"][..],
            &["list", "--limit", "1000", "--json"],
        ] {
            let (status, stderr) = read_one_line_and_close(bin, &db.url, args);
            assert_eq!(stderr, "", "{bin} {args:?}: nothing on stderr");
            assert!(status.success(), "{bin} {args:?}: {status}");
        }
    }
}

#[tokio::test]
async fn a_closed_pipe_ends_the_ledger_quietly() {
    use example_sagas::shop::{Effect, Shop};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    let shop = Shop::open(&url).await.unwrap();
    // Far more lines than a pipe buffers.
    for i in 0..2000 {
        let order = format!("order-with-a-long-id-{i:05}");
        shop.apply_once(&format!("k-{i}"), Effect::Reserved, &order, 0, json!({}))
            .await
            .unwrap();
    }
    shop.close().await;
    for args in [&["ledger"][..], &["ledger", "--json"]] {
        let mut words = vec!["--shop-database-url", url.as_str()];
        words.extend_from_slice(args);
        let (status, stderr) =
            read_one_line_and_close("example-sagas", "sqlite://unused.db", &words);
        assert_eq!(stderr, "", "{args:?}: nothing on stderr");
        assert!(status.success(), "{args:?}: {status}");
    }
}
