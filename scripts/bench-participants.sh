#!/usr/bin/env bash
# HTTP steps and completion by callback (SPEC §16) beside in-process steps, with one release
# build of example-sagas: a 3-step saga at 1, 16 and 64 sagas in flight, in-process and as
# HTTP POSTs to a participant on a loopback port, then the same with its middle step completed
# by callback at 16 and 64 in flight. Each configuration runs a few seconds on a fresh database.
#
# Usage: scripts/bench-participants.sh [SECONDS] [-- MORE BENCH FLAGS]
# BACKENDS (default `sqlite`) picks the stores: `sqlite postgres` adds PostgreSQL, on a database
# `participants_bench` made afresh at SAGA_BENCH_PG_URL (default
# postgres://postgres@127.0.0.1:5432).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-3}"; shift || true
[ "${1:-}" = "--" ] && shift
backends="${BACKENDS:-sqlite}"
pg="${SAGA_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432}"
features=""
case " $backends " in *" postgres "*) features="--features postgres" ;; esac
# shellcheck disable=SC2086
cargo build --release -q -p example-sagas $features
bin="${CARGO_TARGET_DIR:-target}/release/example-sagas"
for backend in $backends; do
    if [ "$backend" = postgres ]; then
        psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS participants_bench WITH (FORCE)" >/dev/null
        psql "$pg/postgres" -qc "CREATE DATABASE participants_bench" >/dev/null
        "$bin" bench-participants --seconds "$secs" --database-url "$pg/participants_bench" "$@"
        psql "$pg/postgres" -qc "DROP DATABASE participants_bench WITH (FORCE)" >/dev/null
    else
        "$bin" bench-participants --seconds "$secs" "$@"
    fi
done
