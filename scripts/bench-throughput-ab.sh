#!/usr/bin/env bash
# In-process throughput of two builds of example-sagas, `happy` sagas at 1, 16 and 64 in
# flight on SQLite, the builds alternating within each round so that the machine's drift hits
# both alike (the in-process half of scripts/bench-ab.sh, without the HTTP runs).
#
# Usage: scripts/bench-throughput-ab.sh OLD_BINARY NEW_BINARY [ROUNDS]
# Prints one line per measurement: `ab build=B round=R inflight=N rate=X`.
set -euo pipefail
old="$1"; new="$2"; rounds="${3:-3}"
for round in $(seq 1 "$rounds"); do
    order="old new"; [ $((round % 2)) = 0 ] && order="new old"
    for build in $order; do
        bin="$old"; [ "$build" = new ] && bin="$new"
        for n in 1 16 64; do
            sagas=$(( n == 1 ? 3000 : 20000 ))
            rate="$("$bin" bench --scenario happy --sagas "$sagas" --concurrency "$n" --json \
                | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["sagas_per_s"]))')"
            echo "ab build=$build round=$round inflight=$n rate=$rate"
        done
    done
done
