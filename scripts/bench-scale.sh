#!/usr/bin/env bash
# Scale: with N sagas already in the SQLite log (default 1,000,000; 1 % of them COMPENSATING,
# waiting on a retry timer; the rest COMPLETED, each with its 3 steps), how fast do
# `saga list --status COMPENSATING` and `saga show ID` answer, and how does throughput compare
# with an empty log?   Usage: scripts/bench-scale.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-1000000}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
db="$dir/scale.db"
cargo build --release -q -p example-sagas -p orchestrator
bin=./target/release/example-sagas
saga=./target/release/saga
$bin migrate --database-url "sqlite://$db" >/dev/null
# The benchmark saga's definition key, so seeded rows look like real ones.
key_row="bench_order"
echo "seeding $n sagas..." >&2
start=$(date +%s)
sqlite3 "$db" <<SQL
PRAGMA journal_mode=WAL;
PRAGMA synchronous=OFF;
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $n)
INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, needs_attention,
                   input, next_run_at, created_at, updated_at, lease_epoch)
SELECT printf('00000000-0000-7000-8000-%012x', i), '$key_row', 1, 'seed', '$key_row@1#seed',
       CASE WHEN i % 100 = 0 THEN 'COMPENSATING' ELSE 'COMPLETED' END,
       CASE WHEN i % 1000 = 0 THEN 1 ELSE 0 END,
       '{"order":"seed"}',
       CASE WHEN i % 100 = 0 THEN 4102444800000 ELSE NULL END,
       1700000000000 + i, 1700000000000 + i, 1
FROM n;
INSERT INTO steps (saga_id, idx, name, kind, status, attempts, output, comp_status, comp_attempts)
SELECT s.id, k.idx, k.name, 'compensatable',
       CASE WHEN s.status = 'COMPLETED' OR k.idx < 2 THEN 'SUCCEEDED' ELSE 'FAILED' END, 1,
       '{"ok":true}',
       CASE WHEN s.status = 'COMPENSATING' AND k.idx = 1 THEN 'RETRYING' ELSE 'PENDING' END, 0
FROM sagas s,
     (SELECT 0 AS idx, 'reserve_stock' AS name UNION ALL SELECT 1, 'charge_payment'
      UNION ALL SELECT 2, 'assign_rider') k;
COMMIT;
PRAGMA wal_checkpoint(TRUNCATE);
SQL
echo "seeded in $(( $(date +%s) - start )) s: $(sqlite3 "$db" 'SELECT COUNT(*) FROM sagas') sagas, $(sqlite3 "$db" 'SELECT COUNT(*) FROM steps') steps" >&2
one=$(sqlite3 "$db" "SELECT id FROM sagas WHERE status = 'COMPENSATING' LIMIT 1 OFFSET 5000")
hyperfine -N --warmup 3 --runs 20 \
    "$saga --database-url sqlite://$db list --status COMPENSATING" \
    "$saga --database-url sqlite://$db show $one" \
    "$saga --database-url sqlite://$db list --needs-attention"
# Alternating, and long enough (20,000 sagas, about two seconds each) that one stall or the
# first run's cold pages do not decide the figure: with 3,000-saga runs, all on the empty log
# first, a faster engine made the big log look 28 % slower where alternated runs show none.
echo "== throughput, empty log vs $n sagas in the log (3 alternating runs each) ==" >&2
for i in 1 2 3; do
    $bin bench --sagas 20000 --concurrency 64
    $bin bench --database-url "sqlite://$db" --sagas 20000 --concurrency 64
done
