#!/usr/bin/env bash
# Two builds of example-sagas measured in pairs: for each cell (backend, scenario, sagas in
# flight) the old and the new build run back to back, the order flipped at every repetition, so
# that the machine's drift, which moves figures by more than a change is worth, hits both alike
# within a pair. Besides the rate, each run's CPU time (user + system, from /usr/bin/time) per
# saga is recorded: it drifts far less than the rate on shared cores.
#
# Usage: scripts/bench-pairs.sh OLD_BINARY NEW_BINARY [PAIRS]
# BACKENDS (default `sqlite postgres`), SCENARIOS (default `happy compensate`) and INFLIGHT
# (default `1 16 64`) pick the cells. PostgreSQL runs on a fresh database each time, at
# SAGA_BENCH_PG_HOST:SAGA_BENCH_PG_PORT (default 127.0.0.1:5432, user postgres, trust auth).
# OLD_ARGS and NEW_ARGS add `bench` flags to one build's runs (the same binary twice, with and
# without `--otlp-endpoint`, measures a setting instead of a change).
# Prints one line per run: `pair backend=B scenario=S inflight=N rep=R build=old|new rate=X
# cpu_ms_per_saga=Y commits_per_saga=Z`; scripts/bench-pairs-summary.py makes the table.
set -euo pipefail
old="$1"; new="$2"; pairs="${3:-4}"
backends="${BACKENDS:-sqlite postgres}"; scenarios="${SCENARIOS:-happy compensate}"
inflight="${INFLIGHT:-1 16 64}"
host="${SAGA_BENCH_PG_HOST:-127.0.0.1}"; port="${SAGA_BENCH_PG_PORT:-5432}"
run_one() { # build binary backend scenario n rep
    local build="$1" bin="$2" backend="$3" scenario="$4" n="$5" rep="$6"
    local sagas=$(( n == 1 ? 2000 : 15000 )) dir db_args=() extra
    if [ "$build" = old ]; then extra="${OLD_ARGS:-}"; else extra="${NEW_ARGS:-}"; fi
    dir="$(mktemp -d)"
    if [ "$backend" = postgres ]; then
        local db="pairs_${build}_${n}"
        dropdb -h "$host" -p "$port" -U postgres --if-exists "$db"
        createdb -h "$host" -p "$port" -U postgres "$db"
        db_args=(--database-url "postgres://postgres@$host:$port/$db")
    else
        db_args=(--database-url "sqlite://$dir/saga.db")
    fi
    /usr/bin/time -f "%U %S" -o "$dir/time" "$bin" bench --scenario "$scenario" "${db_args[@]}" \
        --shop-database-url "sqlite://$dir/shop.db" --sagas "$sagas" --concurrency "$n" --json \
        $extra >"$dir/report"
    python3 - "$dir" "$sagas" <<'PY' | sed "s/^/pair backend=$backend scenario=$scenario inflight=$n rep=$rep build=$build /"
import json, sys
d, sagas = sys.argv[1], int(sys.argv[2])
r = json.load(open(f"{d}/report"))
user, system = map(float, open(f"{d}/time").read().split()[-2:])
print(f"rate={r['sagas_per_s']:.0f} cpu_ms_per_saga={(user + system) * 1000 / sagas:.3f} "
      f"commits_per_saga={r['commits_per_saga']:.2f}")
PY
    [ "$backend" = postgres ] && dropdb -h "$host" -p "$port" -U postgres "$db"
    rm -rf "$dir"
}
for rep in $(seq 1 "$pairs"); do
    for backend in $backends; do
        for scenario in $scenarios; do
            for n in $inflight; do
                if [ $((rep % 2)) = 1 ]; then
                    run_one old "$old" "$backend" "$scenario" "$n" "$rep"
                    run_one new "$new" "$backend" "$scenario" "$n" "$rep"
                else
                    run_one new "$new" "$backend" "$scenario" "$n" "$rep"
                    run_one old "$old" "$backend" "$scenario" "$n" "$rep"
                fi
            done
        done
    done
done
