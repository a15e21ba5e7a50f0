#!/usr/bin/env bash
# Two builds of example-sagas side by side, alternating within each run so that the machine's
# drift hits both alike: in-process sagas (happy, start to end) and HTTP starts through a real
# `serve` (wrk over loopback, without and with an Idempotency-Key per request), each at 1, 16
# and 64 in flight.
#
# Usage: scripts/bench-ab.sh OLD_BINARY NEW_BINARY [RUNS] [SECONDS]
# SCENARIOS (default `happy`) lists the in-process scenarios, e.g. `SCENARIOS="happy compensate"`.
# Prints one line per measurement: `ab build=B run=R path=P inflight=N rate=X`.
set -euo pipefail
cd "$(dirname "$0")/.."
old="$1"; new="$2"; runs="${3:-3}"; secs="${4:-8}"; scenarios="${SCENARIOS:-happy}"
pid=""
# A server left running by a failed step would skew every later figure on this machine.
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT
for run in $(seq 1 "$runs"); do
    # Odd runs old first, even runs new first: drift within a run favours neither build.
    order="old new"; [ $((run % 2)) = 0 ] && order="new old"
    for build in $order; do
        bin="$old"; [ "$build" = new ] && bin="$new"
        for scenario in $scenarios; do
            path=in-process; [ "$scenario" = happy ] || path="in-process-$scenario"
            for n in 1 16 64; do
                sagas=$(( n == 1 ? 3000 : 20000 ))
                rate="$($bin bench --scenario "$scenario" --sagas "$sagas" --concurrency "$n" --json \
                    | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["sagas_per_s"]))')"
                echo "ab build=$build run=$run path=$path inflight=$n rate=$rate"
            done
        done
        for keys in 0 1; do
            dir="$(mktemp -d)"
            $bin serve --with-bench-saga --listen 127.0.0.1:0 --workers 64 \
                --database-url "sqlite://$dir/saga.db" --shop-database-url "sqlite://$dir/shop.db" \
                >"$dir/out" 2>"$dir/err" &
            pid=$!
            for _ in $(seq 1 100); do grep -q "listening on" "$dir/out" 2>/dev/null && break; sleep 0.1; done
            url="$(sed -n 's/^listening on //p' "$dir/out")"
            for n in 1 16 64; do
                threads=$(( n == 1 ? 1 : 2 ))
                rate="$(WRK_KEYS=$keys wrk -t"$threads" -c"$n" -d"${secs}s" -s scripts/wrk/start.lua "$url" \
                    | sed -n 's/^Requests\/sec: *//p')"
                path=http; [ "$keys" = 1 ] && path=http-keyed
                echo "ab build=$build run=$run path=$path inflight=$n rate=$rate"
            done
            kill -TERM "$pid"; wait "$pid" || true
            pid=""
            rm -rf "$dir"
        done
    done
done
