#!/usr/bin/env bash
# Our saga orchestrator against the peer systems of shared/peers (Restate, DBOS, underway, ...),
# measured in ONE run on this machine, so that the figures can be compared as ratios.
#
#   scripts/compare-peers.sh                                  # full comparison (see knobs below)
#   REPEATS=1 SCALE=0.25 CONCURRENCY="1 16" SCENARIOS=happy OUT=/tmp/smoke.jsonl \
#       scripts/compare-peers.sh                              # quick smoke run, outside the repo
#
# What it does:
#  1. copies the (read-only) peer harness to a writable work dir (PEERS_DIR, default
#     ~/.cache/saga-peers; only files that are missing or changed are copied; the peers' code is
#     never copied into this repository) and runs its setup.sh there once (apt/Postgres, pip,
#     npm, cargo: needs root and the package registries; re-run when the setup inputs change or
#     with FORCE_SETUP=1);
#  2. builds our release binary;
#  3. for every repeat, runs each selected peer (the same commands and sizes as the harness'
#     run_all.sh) and our `example-sagas bench` on SQLite (a fresh file with the default,
#     durable settings) and on PostgreSQL (the peers' Postgres, a fresh database per run) at
#     every concurrency, each scenario in turn; systems are interleaved within a repeat so that
#     machine drift spreads over all of them, and a system's scenarios run back to back;
#  4. appends one JSON line per run to OUT (default bench-results/<timestamp>.jsonl; the peers'
#     lines as their harness writes them, ours as `bench --json` prints them, a {"meta": ...}
#     first line, and a {"failed": true, ...} line for every run that failed or timed out);
#  5. runs scripts/summarize_bench.py on it, which prints the table of medians and ratios and
#     writes it next to OUT as <timestamp>.md.
# The chart: cargo run -p bench-chart -- OUT docs/throughput.svg
#
# Knobs (environment):
#   SCENARIOS    "happy compensate"
#   CONCURRENCY  "1 16 64"
#   REPEATS      3
#   PEERS        "restate dbos underway"   (also: temporal temporal-wal dbos-sqlite; "" = none)
#   OURS         "sqlite postgres"         (which of our backends to run; "" = none)
#   SCALE        1      multiplies every system's default saga count (min 20), like run_all.sh
#   SAGAS        unset  one saga count for every system and concurrency (overrides SCALE)
#   OURS_ARGS    ""     extra arguments for our bench (e.g. "--processes 2", PostgreSQL only)
#   RUN_TIMEOUT  240    seconds before one benchmark process is killed (as in run_all.sh)
#   PEERS_SRC    <repo>/../shared/peers, else /work/shared/peers
#   PEERS_DIR    ~/.cache/saga-peers
#   PG_URL       postgresql://postgres:postgres@127.0.0.1:5432 (server URL without database)
#   OUT          bench-results/<timestamp>.jsonl
#   FORCE_SETUP  1 = run the peers' setup.sh even if it already ran for these inputs
#   SKIP_SETUP   1 = never run setup.sh (the work dir must be ready)
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

SCENARIOS=${SCENARIOS:-"happy compensate"}
CONCURRENCY=${CONCURRENCY:-"1 16 64"}
REPEATS=${REPEATS:-3}
PEERS=${PEERS-"restate dbos underway"}
OURS=${OURS-"sqlite postgres"}
SCALE=${SCALE:-1}
SAGAS=${SAGAS:-}
OURS_ARGS=${OURS_ARGS:-}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
PG_URL=${PG_URL:-postgresql://postgres:postgres@127.0.0.1:5432}
PEERS_DIR=${PEERS_DIR:-$HOME/.cache/saga-peers}
if [ -z "${PEERS_SRC:-}" ]; then
    PEERS_SRC=/work/shared/peers
    [ -d "$REPO/../shared/peers" ] && PEERS_SRC=$(cd "$REPO/../shared/peers" && pwd)
fi
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=${OUT:-$REPO/bench-results/$STAMP.jsonl}
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac

die() { echo "compare-peers: $*" >&2; exit 1; }
log() { echo "compare-peers: $*" >&2; }

for p in $PEERS; do
    case $p in dbos|dbos-sqlite|underway|restate|temporal|temporal-wal) ;;
    *) die "unknown peer '$p' (known: restate dbos underway temporal temporal-wal dbos-sqlite)" ;;
    esac
done
for o in $OURS; do
    case $o in sqlite|postgres) ;; *) die "unknown backend in OURS: '$o'" ;; esac
done
for s in $SCENARIOS; do
    case $s in happy|compensate) ;; *) die "unknown scenario '$s'" ;; esac
done
[ -d "$PEERS_SRC" ] || die "peer harness not found at $PEERS_SRC (set PEERS_SRC)"

# ---------------------------------------------------------------------------------------------
# 1. Writable copy of the peer harness + its one-time setup
# ---------------------------------------------------------------------------------------------
# Build products, data and our logs live only in the copy; they are neither copied nor deleted.
# Files that the setup itself writes in the copy (npm normalises package-lock.json, cargo adds a
# Cargo.lock) are kept: --update leaves a file alone when the copy's is newer, and Cargo.lock
# files are protected from --delete.
EXCLUDES=(.venv node_modules target .data .logs .setup-stamp)
mkdir -p "$PEERS_DIR"
if command -v rsync >/dev/null; then
    ex=(); for e in "${EXCLUDES[@]}"; do ex+=(--exclude "/$e"); done
    changed=$(rsync -a --omit-dir-times --update --delete --filter 'P Cargo.lock' --chmod=u+w \
        --itemize-changes "${ex[@]}" "$PEERS_SRC/" "$PEERS_DIR/") || die "rsync $PEERS_SRC -> $PEERS_DIR failed"
    [ -n "$changed" ] && log "peer harness copied/updated in $PEERS_DIR ($(echo "$changed" | wc -l) changes)"
else  # cp -u copies only files that are missing or newer in the source
    cp -a -u "$PEERS_SRC/." "$PEERS_DIR/" && chmod -R u+w "$PEERS_DIR" || die "copy to $PEERS_DIR failed"
fi
LOGDIR=$PEERS_DIR/.logs
mkdir -p "$LOGDIR"
LOG=$LOGDIR/$(basename "${OUT%.jsonl}").log

# The setup re-runs when its inputs change (or its products are gone), and when Postgres is down.
setup_key() {  # of the pristine inputs (the copy's may be rewritten by the setup itself)
    (cd "$PEERS_SRC" && cat setup.sh requirements.txt package.json package-lock.json \
        underway-bench/Cargo.toml physical/sqlite-bench/Cargo.toml 2>/dev/null) | sha256sum | cut -d' ' -f1
}
setup_ready() {
    [ "$(cat "$PEERS_DIR/.setup-stamp" 2>/dev/null)" = "$(setup_key)" ] &&
        [ -x "$PEERS_DIR/.venv/bin/python" ] &&
        [ -x "$PEERS_DIR/target/release/underway-bench" ] &&
        [ -d "$PEERS_DIR/node_modules/@restatedev" ] &&
        pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null
}
if [ "${SKIP_SETUP:-}" = 1 ]; then
    log "SKIP_SETUP=1: not running the peers' setup.sh"
elif [ "${FORCE_SETUP:-}" = 1 ] || ! setup_ready; then
    [ "$(id -u)" = 0 ] || log "warning: setup.sh needs root (apt, Postgres); running it anyway"
    log "running $PEERS_DIR/setup.sh (pip/npm/cargo installs may take several minutes)"
    t0=$(date +%s)
    if (cd "$PEERS_DIR" && ./setup.sh) 2>&1 | tee -a "$LOG" | sed -u 's/^/  setup: /' >&2; then
        setup_key >"$PEERS_DIR/.setup-stamp"
        log "setup done in $(( $(date +%s) - t0 )) s"
    else
        die "setup.sh failed (see $LOG)"
    fi
fi
for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done

# ---------------------------------------------------------------------------------------------
# 2. Our binary
# ---------------------------------------------------------------------------------------------
log "building example-sagas (release)"
cargo build --release -q -p example-sagas || die "cargo build failed"
OURS_BIN=$REPO/target/release/example-sagas

# ---------------------------------------------------------------------------------------------
# 3. The runs
# ---------------------------------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
: >>"$OUT"
SCENARIOS=$SCENARIOS CONCURRENCY=$CONCURRENCY REPEATS=$REPEATS PEERS=$PEERS OURS=$OURS SCALE=$SCALE \
    SAGAS=$SAGAS OURS_ARGS=$OURS_ARGS PG_URL=$PG_URL python3 - "$OUT" <<'EOF'
import json, os, subprocess, sys, time
e = os.environ
def sh(*a):
    try: return subprocess.run(a, capture_output=True, text=True).stdout.strip()
    except OSError: return ""
meta = {
    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "host": os.uname().nodename, "kernel": os.uname().release, "nproc": os.cpu_count(),
    "git_rev": sh("git", "rev-parse", "--short", "HEAD"),
    "git_dirty": bool(sh("git", "status", "--porcelain", "--untracked-files=no")),
    "scenarios": e["SCENARIOS"].split(), "concurrency": [int(c) for c in e["CONCURRENCY"].split()],
    "repeats": int(e["REPEATS"]), "peers": e["PEERS"].split(), "ours": e["OURS"].split(),
    "scale": float(e["SCALE"]), "sagas": int(e["SAGAS"]) if e["SAGAS"] else None,
    "ours_args": e["OURS_ARGS"],
    "postgres": sh("psql", e["PG_URL"] + "/postgres", "-Atc", "show server_version"),
}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"meta": meta}) + "\n")
EOF
log "writing $OUT (log: $LOG)"

# Default saga count of one run: the harness' run_all.sh sizes for the peers (each run roughly
# 10-45 s), ours sized to a similar duration; C=1 / C<=16 / C>16 columns.
base_n() {  # base_n <system> <c>
    local i=2
    if [ "$2" -le 1 ]; then i=0; elif [ "$2" -le 16 ]; then i=1; fi
    local -a t
    case $1 in
    dbos) t=(600 1500 1500) ;;
    dbos-sqlite) t=(400 400 400) ;;
    underway) t=(1000 2000 2000) ;;
    restate) t=(2000 4000 4000) ;;
    temporal) t=(100 400 300) ;;
    temporal-wal) t=(800 800 800) ;;
    ours-sqlite) t=(5000 20000 20000) ;;
    ours-postgres) t=(3000 10000 10000) ;;
    esac
    echo "${t[$i]}"
}
warmup() {  # warmup <peer> <c>: run_all.sh's warm-up sizes, at least C
    local w
    case $1 in
    dbos) w=50 ;; dbos-sqlite) w=20 ;; underway) w=50 ;; temporal|temporal-wal) w=32 ;;
    restate) w=$([ "$2" -le 1 ] && echo 50 || echo 100) ;;
    esac
    [ "$1" = temporal ] && [ "$2" -le 1 ] && w=10
    [ "$1" = restate ] && [ "$2" -gt 16 ] && w=$(( 2 * $2 ))
    echo $(( w > $2 ? w : $2 ))
}
sagas_for() {  # sagas_for <system> <c>
    if [ -n "$SAGAS" ]; then echo "$SAGAS"; return; fi
    python3 -c "print(max(20, int($(base_n "$1" "$2") * $SCALE)))"
}

failures=0
fail_line() {  # fail_line <system> <scenario> <c> <n> <why> <stderr-file>
    failures=$((failures + 1))
    log "FAILED $1 $2 c=$3: $5"
    python3 - "$OUT" "$@" <<'EOF'
import json, sys
out, system, sc, c, n, why, errf = sys.argv[1:8]
try:
    tail = [l for l in open(errf, errors="replace").read().splitlines() if l.strip()][-3:]
except OSError:
    tail = []
with open(out, "a") as f:
    f.write(json.dumps({"peer": system, "scenario": sc, "c": int(c), "n": int(n), "failed": True,
                        "error": why, "stderr_tail": tail}) + "\n")
EOF
}

ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
lines() { wc -l <"$OUT"; }

run_peer() {  # run_peer <peer> <scenario> <c>
    local peer=$1 sc=$2 c=$3 n w script extra=() before rc
    n=$(sagas_for "$peer" "$c"); w=$(warmup "$peer" "$c")
    case $peer in
    dbos) script=dbos_bench.py ;;
    dbos-sqlite) script=dbos_bench.py; extra=(--db sqlite) ;;
    underway) script=underway_bench.py ;;
    restate) script=restate_bench.py ;;
    temporal) script=temporal_bench.py ;;
    temporal-wal) script=temporal_bench.py; extra=(--store wal) ;;
    esac
    echo "== $peer $sc c=$c n=$n" >>"$LOG"
    log "$peer $sc c=$c n=$n"
    before=$(lines)
    (cd "$PEERS_DIR" && PG_URL=$PG_URL timeout "$RUN_TIMEOUT" .venv/bin/python "$script" "${extra[@]}" \
        --scenario "$sc" -c "$c" -n "$n" --warmup "$w" --json-out "$OUT") >>"$LOG" 2>"$ERR"
    rc=$?
    cat "$ERR" >>"$LOG"
    if [ "$(lines)" -le "$before" ]; then
        fail_line "$peer" "$sc" "$c" "$n" "$([ $rc = 124 ] && echo "timeout after ${RUN_TIMEOUT}s" || echo "exit $rc, no result")" "$ERR"
    fi
}

run_ours() {  # run_ours <sqlite|postgres> <scenario> <c>
    local backend=$1 sc=$2 c=$3 n db="" url=() out rc
    n=$(sagas_for "ours-$backend" "$c")
    echo "== ours-$backend $sc c=$c n=$n" >>"$LOG"
    log "ours-$backend $sc c=$c n=$n"
    if [ "$backend" = postgres ]; then
        db="saga_cmp_$$_$RANDOM"
        if ! psql -q "$PG_URL/postgres" -c "CREATE DATABASE $db" >>"$LOG" 2>"$ERR"; then
            fail_line "ours-$backend" "$sc" "$c" "$n" "cannot create database $db" "$ERR"
            return
        fi
        url=(--database-url "$PG_URL/$db")
    fi
    # Without --database-url (and without DATABASE_URL) the bench uses a fresh SQLite file in a
    # temporary directory with the store's default (durable) settings.
    # shellcheck disable=SC2086
    out=$(env -u DATABASE_URL timeout "$RUN_TIMEOUT" "$OURS_BIN" bench "${url[@]}" --scenario "$sc" \
        --sagas "$n" --concurrency "$c" $OURS_ARGS --json 2>"$ERR")
    rc=$?
    cat "$ERR" >>"$LOG"
    [ -n "$db" ] && psql -q "$PG_URL/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >>"$LOG" 2>&1
    local json
    json=$(printf '%s\n' "$out" | grep '^{' | tail -n 1)
    if [ $rc = 0 ] && [ -n "$json" ]; then
        echo "$out" >>"$LOG"
        printf '%s\n' "$json" >>"$OUT"
    else
        fail_line "ours-$backend" "$sc" "$c" "$n" "$([ $rc = 124 ] && echo "timeout after ${RUN_TIMEOUT}s" || echo "exit $rc")" "$ERR"
    fi
}

t_start=$(date +%s)
# A system's scenarios run back to back at each concurrency, so that its compensate ÷ happy
# ratio compares runs minutes apart rather than the two halves of the whole run (this
# machine's speed drifts over tens of minutes by more than the ratio's margin).
for r in $(seq 1 "$REPEATS"); do
    log "--- repeat $r/$REPEATS"
    for sys in $(for o in $OURS; do echo "ours-$o"; done) $PEERS; do
        for c in $CONCURRENCY; do
            for sc in $SCENARIOS; do
                case $sys in
                ours-*) run_ours "${sys#ours-}" "$sc" "$c" ;;
                *) run_peer "$sys" "$sc" "$c" ;;
                esac
            done
        done
    done
done
log "runs done in $(( $(date +%s) - t_start )) s, $failures failed; results: $OUT"

# ---------------------------------------------------------------------------------------------
# 4. Summary
# ---------------------------------------------------------------------------------------------
python3 "$REPO/scripts/summarize_bench.py" "$OUT" || die "summarize_bench.py failed"
log "chart: cargo run -p bench-chart -- ${OUT#"$REPO"/} docs/throughput.svg"
[ "$failures" = 0 ]
