#!/usr/bin/env bash
# HTTP start throughput: wrk drives POST /v1/sagas/bench_order on a real `example-sagas serve`
# (SQLite, durable default) over loopback, with and without an Idempotency-Key per request,
# beside the in-process start rate. Usage: scripts/bench-http.sh [CONNECTIONS] [SECONDS] [RUNS]
# SAGA_BENCH_BINS="old/example-sagas new/example-sagas" compares builds run by run instead.
set -euo pipefail
cd "$(dirname "$0")/.."
conns="${1:-64}"; secs="${2:-10}"; runs="${3:-3}"
bins="${SAGA_BENCH_BINS:-}"
if [ -z "$bins" ]; then
    cargo build --release -q -p example-sagas
    bins=./target/release/example-sagas
fi
pid=""
# A server left running by a failed step would skew every later figure on this machine.
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT
for run in $(seq 1 "$runs"); do
    for bin in $bins; do
        echo "== $bin"
        echo "== in-process starts (run $run)"
        $bin bench --scenario starts --sagas 20000 --concurrency "$conns"
        for keys in 0 1; do
            dir="$(mktemp -d)"
            $bin serve --with-bench-saga --listen 127.0.0.1:0 --workers 64 \
                --database-url "sqlite://$dir/saga.db" --shop-database-url "sqlite://$dir/shop.db" \
                >"$dir/out" 2>"$dir/err" &
            pid=$!
            for _ in $(seq 1 100); do grep -q "listening on" "$dir/out" 2>/dev/null && break; sleep 0.1; done
            url="$(sed -n 's/^listening on //p' "$dir/out")"
            echo "== HTTP starts, idempotency keys: $keys (run $run)"
            WRK_KEYS=$keys wrk -t2 -c"$conns" -d"${secs}s" -s scripts/wrk/start.lua "$url" \
                | grep -E "Requests/sec|wrk_summary|Non-2xx"
            kill -TERM "$pid"; wait "$pid" || true
            pid=""
            rm -rf "$dir"
        done
    done
done
