#!/usr/bin/env bash
# Benchmark on PostgreSQL: a fresh database per run, 1, 2 and 4 orchestrator processes.
# Usage: scripts/bench-pg.sh [RUNS] [SAGAS] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"; sagas="${2:-2000}"; conc="${3:-64}"
admin="${SAGA_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
base="${admin%/*}"
cargo build --release -q -p example-sagas
for processes in 1 2 4; do
    for run in $(seq 1 "$runs"); do
        db="saga_bench_$$_${processes}_${run}"
        psql -q "$admin" -c "CREATE DATABASE $db" >/dev/null
        ./target/release/example-sagas bench --database-url "$base/$db" \
            --sagas "$sagas" --concurrency "$conc" --workers "$(( (conc + processes - 1) / processes ))" \
            --processes "$processes" "${@:4}"
        psql -q "$admin" -c "DROP DATABASE $db WITH (FORCE)" >/dev/null
    done
done
