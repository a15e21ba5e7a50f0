#!/usr/bin/env bash
# The OpenAPI document as an exact contract: schemathesis generates requests from the document a
# real `example-sagas serve` publishes (its own start route and input schema per saga), sends
# them over loopback and fails when an answer differs from the document: a valid request
# refused, an invalid one accepted, a status, header or body the document does not give, a
# server error. Every check (`--checks all`, with the hooks of scripts/contract/) and every
# phase, the stateful one included, on a fresh SQLite file, with a bearer token so that the
# authenticated routes are exercised (and refused without it).
#
# schemathesis is pinned (its CLI and checks change between releases) and installed once into
# a virtualenv under ~/.cache, which later runs reuse; SAGA_SCHEMATHESIS_VENV names another.
# The server is `target/debug/example-sagas` (built by scripts/test.sh; EXAMPLE_SAGAS names
# another binary).
#
# Time budget: at most 100 generated cases per operation and phase (about 3,000 requests) keep
# the run near a minute on two shared cores, a small part of CI's time; 200 take
# about three minutes and have found nothing more. The seed is fixed so that CI answers the
# same for the same code. A deeper run locally:
# SAGA_CONTRACT_EXAMPLES=500 SAGA_CONTRACT_SEED=$RANDOM ./scripts/contract.sh
set -euo pipefail
cd "$(dirname "$0")/.."

version=4.32.5
venv="${SAGA_SCHEMATHESIS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/saga-orchestrator/schemathesis-$version}"
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -qF "$version"; then
    echo "installing schemathesis $version into $venv"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" && command -v apt-get >/dev/null 2>&1; then
        # Debian's python3 makes virtualenvs only with its python3-venv package.
        rm -rf "$venv"
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$venv"
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
fi

bin="${EXAMPLE_SAGAS:-target/debug/example-sagas}"
if [ ! -x "$bin" ]; then
    echo "no $bin: build it first (cargo build -p example-sagas)" >&2
    exit 1
fi

work="$(mktemp -d)"
token="contract-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
# Made before the server starts: the loop below reads them before the server may have opened them.
: >"$work/stdout"
: >"$work/server.log"
# The participants' own database beside the log, both gone when the check ends.
"$bin" --database-url "sqlite://$work/saga.db" --shop-database-url "sqlite://$work/shop.db" \
    serve --listen 127.0.0.1:0 --api-token "$token" >"$work/stdout" 2>"$work/server.log" &
server=$!
stop() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap stop EXIT

# The server prints its address once it can take requests (a free port, picked at bind).
url=""
for _ in $(seq 1 200); do
    url="$(sed -n 's/^listening on //p' "$work/stdout")"
    [ -n "$url" ] && break
    if ! kill -0 "$server" 2>/dev/null; then
        echo "the server did not start:" >&2
        cat "$work/server.log" >&2
        exit 1
    fi
    sleep 0.1
done
if [ -z "$url" ]; then
    echo "the server did not say where it listens within 20 s" >&2
    cat "$work/server.log" >&2
    exit 1
fi

status=0
SCHEMATHESIS_HOOKS="scripts/contract/hooks.py" "$venv/bin/schemathesis" \
    --config-file scripts/contract/schemathesis.toml run "$url/openapi.json" \
    --checks all \
    --phases examples,coverage,fuzzing,stateful \
    --max-examples "${SAGA_CONTRACT_EXAMPLES:-100}" \
    --seed "${SAGA_CONTRACT_SEED:-20261203}" \
    --generation-database none \
    --header "Authorization: Bearer $token" \
    --workers 2 \
    --request-timeout 30 \
    --suppress-health-check too_slow \
    --no-color \
    --report junit --report-dir "${SAGA_CONTRACT_REPORT_DIR:-target/contract}" || status=$?
if [ "$status" -ne 0 ]; then
    echo "the server's log, for the failures above:" >&2
    tail -n 50 "$work/server.log" >&2
fi
exit "$status"
