#!/usr/bin/env bash
# Flow control's figures (SPEC §14) with one build of example-sagas, on SQLite and on
# PostgreSQL: sagas under a max running of 64 and a per-key limit of 8 over 16 keys (throughput
# and how long sagas waited to start), and a rate limiter's accuracy at 20/s and 2000/s (the
# rate the participant saw, and its busiest second).
#
# Usage: scripts/bench-flow.sh BINARY [PG_URL]
# BACKENDS (default `sqlite postgres`) picks the stores; the binary needs the `postgres` feature
# for PostgreSQL. PG_URL (default postgres://postgres@127.0.0.1:5432) names a server where a database
# `flow_bench` is made afresh for each run.
set -euo pipefail
bin="$1"; pg="${2:-postgres://postgres@127.0.0.1:5432}"
dir="$(mktemp -d)"; trap 'rm -rf "$dir"' EXIT
fresh_pg() {
    psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS flow_bench WITH (FORCE)" >/dev/null
    psql "$pg/postgres" -qc "CREATE DATABASE flow_bench" >/dev/null
    echo "$pg/flow_bench"
}
for backend in ${BACKENDS:-sqlite postgres}; do
    for args in "--scenario limited --sagas 5000 --concurrency 128" \
                "--scenario rated --rate 20/s --sagas 300 --concurrency 64" \
                "--scenario rated --rate 2000/s --sagas 20000 --concurrency 128"; do
        if [ "$backend" = sqlite ]; then
            url="sqlite://$dir/$RANDOM.db"
        else
            url="$(fresh_pg)"
        fi
        # shellcheck disable=SC2086
        "$bin" bench $args --database-url "$url"
    done
done
