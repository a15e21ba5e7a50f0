#!/usr/bin/env bash
# The stall a running workload sees while a purge deletes many finished sagas (SQLite).
#
# Fills a log with FILL finished sagas (`bench`, happy path), then runs the same workload
# (`bench --sagas LOAD --concurrency C`) alone BASE times, then again and again while
# `saga purge --finished-before 0s` deletes them all from another process. Each workload run
# prints its latency percentiles; the purge prints how many it deleted and how long it took.
#
# Usage: scripts/bench-purge.sh [FILL] [LOAD] [CONCURRENCY] [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
fill="${1:-1000000}"; load="${2:-20000}"; conc="${3:-16}"; base="${4:-3}"
cargo build --release -q -p example-sagas -p orchestrator
bin=./target/release/example-sagas
saga=./target/release/saga
dir="$(mktemp -d "${TMPDIR:-/tmp}/bench-purge.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
db="sqlite://$dir/saga.db"
run() {
    "$bin" bench --scenario happy --database-url "$db" --shop-database-url "sqlite://$dir/shop.db" \
        --sagas "$1" --concurrency "$2"
}
echo "fill: $fill finished sagas"
run "$fill" 64
du -sh "$dir"
for i in $(seq 1 "$base"); do
    echo "alone $i: $(run "$load" "$conc")"
done
start=$(date +%s.%N)
"$saga" purge --finished-before 0s --database-url "$db" > "$dir/purge.out" 2>&1 &
purge=$!
i=0
while kill -0 "$purge" 2>/dev/null; do
    i=$((i + 1))
    echo "during purge $i: $(run "$load" "$conc")"
done
wait "$purge"
echo "purge: $(cat "$dir/purge.out") (wall $(echo "$(date +%s.%N) - $start" | bc) s)"
du -sh "$dir"
