#!/usr/bin/env bash
# The outbox relay to NATS JetStream against no relay at all, alternating, ROUNDS rounds, on
# SQLite then on PostgreSQL (a fresh database each run), with a scratch `nats-server -js` of its
# own (its stream is deleted by each run). Prints the figure lines of both commands.
# Usage: scripts/bench-broker.sh [ROUNDS] [SAGAS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"; sagas="${2:-5000}"
admin="${SAGA_BENCH_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
base="${admin%/*}"
port="${SAGA_BENCH_NATS_PORT:-14333}"
cargo build --release -q -p example-sagas
bin=target/release/example-sagas
store="$(mktemp -d)"
nats-server -a 127.0.0.1 -p "$port" -js -sd "$store" >/dev/null 2>&1 &
nats=$!
trap 'kill $nats; rm -rf "$store"' EXIT
sleep 1
export RUST_LOG="${RUST_LOG:-error}"
for round in $(seq 1 "$rounds"); do
    "$bin" bench-broker --nats-url "nats://127.0.0.1:$port" --sagas "$sagas" --concurrency 64 \
        --backlog "$sagas"
    "$bin" bench --sagas "$sagas" --concurrency 64
    for kind in broker plain; do
        db="saga_bench_broker_$$_${round}_$kind"
        psql -q "$admin" -c "CREATE DATABASE $db" >/dev/null
        if [ "$kind" = broker ]; then
            "$bin" --database-url "$base/$db" bench-broker --nats-url "nats://127.0.0.1:$port" \
                --sagas "$sagas" --concurrency 64 --backlog "$sagas"
        else
            "$bin" bench --database-url "$base/$db" --sagas "$sagas" --concurrency 64
        fi
        psql -q "$admin" -c "DROP DATABASE $db WITH (FORCE)" >/dev/null
    done
done
