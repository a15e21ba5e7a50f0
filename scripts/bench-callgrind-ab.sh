#!/usr/bin/env bash
# Instructions per saga of two builds of example-sagas, counted by callgrind (the steadiest
# witness on a machine whose speed drifts): each scenario run with N = 500 and 1000 sagas in a
# fresh SQLite directory, per saga = (Ir(1000) - Ir(500)) / 500, rounds alternating the builds.
#
# Usage: scripts/bench-callgrind-ab.sh OLD_BINARY NEW_BINARY [ROUNDS]
# SCENARIOS (default `happy compensate`) lists the scenarios.
# Prints one line per measurement: `cg build=B round=R scenario=S per_saga=I`.
set -euo pipefail
old="$1"; new="$2"; rounds="${3:-2}"; scenarios="${SCENARIOS:-happy compensate}"
ir() {
    local bin="$1" scenario="$2" n="$3" dir
    dir="$(mktemp -d)"
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" bench --scenario "$scenario" \
        --database-url "sqlite://$dir/saga.db" --shop-database-url "sqlite://$dir/shop.db" \
        --sagas "$n" --concurrency 1 --json 2>&1 >/dev/null \
        | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
    rm -rf "$dir"
}
for round in $(seq 1 "$rounds"); do
    order="old new"; [ $((round % 2)) = 0 ] && order="new old"
    for build in $order; do
        bin="$old"; [ "$build" = new ] && bin="$new"
        for scenario in $scenarios; do
            small="$(ir "$bin" "$scenario" 500)"; large="$(ir "$bin" "$scenario" 1000)"
            echo "cg build=$build round=$round scenario=$scenario per_saga=$(( (large - small) / 500 ))"
        done
    done
done
