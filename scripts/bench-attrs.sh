#!/usr/bin/env bash
# A list by search attribute over a large log: fills a fresh log with N finished `place_order`
# sagas (default 1,000,000) in bulk SQL, each with two attributes, `order_id` (unique) and
# `user` (ada: 1 saga in 100, grace: 1 in 1000, the rest spread over 200,000 users, about 5
# each), prints the plan of the list's query (EXPLAIN), starts a real `example-sagas serve` on
# it and times GET /v1/sagas?attr.user=… requests against it, one at a time: the first page
# (50) of ada, of grace and of a random light user, and ada's second page (after a cursor).
#
# Usage: scripts/bench-attrs.sh sqlite|postgres [N] [REQUESTS]
# The binary is EXAMPLE_SAGAS (default target/release/example-sagas, else target/debug); the
# PostgreSQL server is SAGA_TEST_PG_URL's (a database `saga_attrs_bench` is made afresh there).
# Prints `attrs backend=B sagas=N kind=K requests=R p50_ms=… p99_ms=…` per kind and overall.
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:?sqlite or postgres}"; n="${2:-1000000}"; requests="${3:-300}"
target="${CARGO_TARGET_DIR:-target}"
bin="${EXAMPLE_SAGAS:-$target/release/example-sagas}"
[ -x "$bin" ] || bin="$target/debug/example-sagas"
work="$(mktemp -d)"
server=""
stop() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$work"
}
trap stop EXIT

# The first saga's creation time; ids are UUIDv7 of consecutive milliseconds from it.
t0=1780000000000
user_expr() { # the user of saga number $1 (SQL)
    echo "CASE WHEN $1 % 100 = 0 THEN 'ada' WHEN $1 % 1000 = 1 THEN 'grace' ELSE 'u' || (($1 * 7919) % 200000) END"
}
list_sql="SELECT o.id FROM saga_attrs a0 JOIN sagas o ON o.id = a0.saga_id \
WHERE a0.attr = 'user' AND a0.value = 'ada' ORDER BY a0.saga_id DESC LIMIT 51"

case "$backend" in
sqlite)
    url="sqlite://$work/saga.db"
    "$bin" migrate --database-url "$url" >/dev/null
    start=$(date +%s)
    sqlite3 "$work/saga.db" <<SQL
PRAGMA journal_mode = WAL;
PRAGMA synchronous = OFF;
BEGIN;
CREATE TEMP TABLE n (i INTEGER PRIMARY KEY);
WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < $n - 1)
INSERT INTO n SELECT i FROM s;
INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, input,
                   created_at, updated_at)
SELECT printf('%08x-%04x-7000-8000-%012x', ($t0 + i) >> 16, ($t0 + i) & 65535, i),
       'place_order', 1, 'h', 'place_order@1#h', 'COMPLETED', '{}', $t0 + i, $t0 + i FROM n;
INSERT INTO saga_attrs (saga_id, attr, value)
SELECT printf('%08x-%04x-7000-8000-%012x', ($t0 + i) >> 16, ($t0 + i) & 65535, i), 'order_id',
       'o-' || i FROM n;
INSERT INTO saga_attrs (saga_id, attr, value)
SELECT printf('%08x-%04x-7000-8000-%012x', ($t0 + i) >> 16, ($t0 + i) & 65535, i), 'user',
       $(user_expr i) FROM n;
COMMIT;
SQL
    echo "filled $n sagas in $(( $(date +%s) - start )) s"
    echo "EXPLAIN QUERY PLAN $list_sql;"
    sqlite3 "$work/saga.db" "EXPLAIN QUERY PLAN $list_sql;"
    ;;
postgres)
    admin="${SAGA_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
    psql -q "$admin" -c "DROP DATABASE IF EXISTS saga_attrs_bench" -c "CREATE DATABASE saga_attrs_bench"
    url="${admin%/*}/saga_attrs_bench"
    "$bin" migrate --database-url "$url" >/dev/null
    start=$(date +%s)
    id="(lpad(to_hex(($t0 + i) >> 16), 8, '0') || '-' || lpad(to_hex(($t0 + i) & 65535), 4, '0') \
|| '-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid"
    psql -q "$url" <<SQL
SET synchronous_commit = off;
INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, input,
                   created_at, updated_at)
SELECT $id, 'place_order', 1, 'h', 'place_order@1#h', 'COMPLETED', '{}', $t0 + i, $t0 + i
FROM generate_series(0::bigint, $n - 1) AS i;
INSERT INTO saga_attrs (saga_id, attr, value)
SELECT $id, 'order_id', 'o-' || i FROM generate_series(0::bigint, $n - 1) AS i;
INSERT INTO saga_attrs (saga_id, attr, value)
SELECT $id, 'user', $(user_expr i) FROM generate_series(0::bigint, $n - 1) AS i;
VACUUM ANALYZE sagas;
VACUUM ANALYZE saga_attrs;
SQL
    echo "filled $n sagas in $(( $(date +%s) - start )) s"
    echo "EXPLAIN ANALYZE $list_sql;"
    psql -q "$url" -c "EXPLAIN ANALYZE $list_sql"
    ;;
*) echo "sqlite or postgres" >&2; exit 2 ;;
esac

"$bin" serve --listen 127.0.0.1:0 --database-url "$url" \
    --shop-database-url "sqlite://$work/shop.db" >"$work/stdout" 2>"$work/server.log" &
server=$!
base=""
for _ in $(seq 1 200); do
    base="$(sed -n 's/^listening on \(http:\/\/[^ ]*\).*/\1/p' "$work/stdout" | head -n 1)"
    [ -n "$base" ] && break
    sleep 0.1
done
[ -n "$base" ] || { echo "the server did not start:" >&2; cat "$work/server.log" >&2; exit 1; }

python3 - "$base" "$backend" "$n" "$requests" <<'PY'
import json, random, sys, time, urllib.request
base, backend, n, requests = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
random.seed(7)

def get(path):
    with urllib.request.urlopen(base + path) as r:
        return json.load(r)

ada_cursor = get("/v1/sagas?attr.user=ada")["next_cursor"]
kinds = {
    "ada_first_page": lambda: "/v1/sagas?attr.user=ada",
    "ada_second_page": lambda: f"/v1/sagas?attr.user=ada&cursor={ada_cursor}",
    "grace_first_page": lambda: "/v1/sagas?attr.user=grace",
    "light_user": lambda: f"/v1/sagas?attr.user=u{random.randrange(2, 200000)}",
}
for path in [k() for k in kinds.values()] * 5:  # warm up
    get(path)
times = {k: [] for k in kinds}
for r in range(requests):
    kind = list(kinds)[r % len(kinds)]
    path = kinds[kind]()
    t = time.perf_counter()
    page = get(path)
    times[kind].append((time.perf_counter() - t) * 1000)
    if kind.startswith("ada"):
        assert len(page["sagas"]) == 50, page
        assert all(s["attrs"]["user"] == "ada" for s in page["sagas"])

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]

every = [x for xs in times.values() for x in xs]
for kind, xs in list(times.items()) + [("all", every)]:
    print(f"attrs backend={backend} sagas={n} kind={kind} requests={len(xs)} "
          f"p50_ms={pct(xs, 0.50):.2f} p99_ms={pct(xs, 0.99):.2f}")
PY
