#!/usr/bin/env bash
# Two builds of example-sagas side by side on PostgreSQL, alternating within each run (odd runs
# old first, even runs new first) so that the machine's drift hits both alike: in-process sagas
# (happy, start to end) at 1, 16 and 64 in flight, each on a fresh database.
#
# Usage: scripts/bench-ab-pg.sh OLD_BINARY NEW_BINARY [RUNS]
# SCENARIOS (default `happy`) lists the scenarios, e.g. `SCENARIOS="happy compensate"`.
# Needs `createdb`/`dropdb` and a server at SAGA_BENCH_PG_HOST:SAGA_BENCH_PG_PORT (default
# 127.0.0.1:5432, user postgres, trust auth).
# Prints one line per measurement: `ab build=B run=R path=pg-in-process inflight=N rate=X`;
# scripts/bench-ab-summary.py turns such lines into a table of medians and ratios.
set -euo pipefail
old="$1"; new="$2"; runs="${3:-3}"; scenarios="${SCENARIOS:-happy}"
host="${SAGA_BENCH_PG_HOST:-127.0.0.1}"; port="${SAGA_BENCH_PG_PORT:-5432}"
for run in $(seq 1 "$runs"); do
    order="old new"; [ $((run % 2)) = 0 ] && order="new old"
    for build in $order; do
        bin="$old"; [ "$build" = new ] && bin="$new"
        for scenario in $scenarios; do
          path=pg-in-process; [ "$scenario" = happy ] || path="pg-in-process-$scenario"
          for n in 1 16 64; do
            sagas=$(( n == 1 ? 2000 : 15000 ))
            db="ab_${build}_${run}_${n}"
            dropdb -h "$host" -p "$port" -U postgres --if-exists "$db"
            createdb -h "$host" -p "$port" -U postgres "$db"
            dir="$(mktemp -d)"
            rate="$($bin bench --scenario "$scenario" --database-url "postgres://postgres@$host:$port/$db" \
                --shop-database-url "sqlite://$dir/shop.db" --sagas "$sagas" --concurrency "$n" --json \
                | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["sagas_per_s"]))')"
            echo "ab build=$build run=$run path=$path inflight=$n rate=$rate"
            dropdb -h "$host" -p "$port" -U postgres "$db"
            rm -rf "$dir"
          done
        done
    done
done
