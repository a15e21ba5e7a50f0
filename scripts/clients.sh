#!/usr/bin/env bash
# Clients in other languages (SPEC §16): a Python and a TypeScript client generated from the
# `/openapi.json` a real `example-sagas serve` publishes, each driven against that server by a
# small program that uses the generated client alone (clients/python/drive.py,
# clients/typescript/drive.ts): a start with an Idempotency-Key and its replay, a start with
# `Prefer: wait`, a signal to a waiting saga, a list by search attribute. No generated code is
# committed or edited: a document the generators read badly is fixed in the document.
#
# The generators are pinned: openapi-python-client (with everything its client needs, in
# clients/python/requirements.txt) installed once into a virtualenv under ~/.cache that later
# runs reuse (SAGA_CLIENTS_VENV names another), and @hey-api/openapi-ts, tsx and typescript
# from clients/typescript/package-lock.json. The clients are written to clients/*/generated/
# (ignored by git), from one copy of the document. The server is `target/debug/example-sagas`
# (built by scripts/test.sh; EXAMPLE_SAGAS names another binary), on a fresh SQLite file and a
# free loopback port, with a bearer token so that the clients send it.
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=clients/python/requirements.txt
pins="$(sha256sum "$requirements" | cut -c1-16)"
venv="${SAGA_CLIENTS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/saga-orchestrator/clients-python-$pins}"
if [ ! -x "$venv/bin/openapi-python-client" ]; then
    echo "installing the Python client generator into $venv"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" && command -v apt-get >/dev/null 2>&1; then
        # Debian's python3 makes virtualenvs only with its python3-venv package.
        rm -rf "$venv"
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$venv"
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
fi
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)

bin="${EXAMPLE_SAGAS:-target/debug/example-sagas}"
if [ ! -x "$bin" ]; then
    echo "no $bin: build it first (cargo build -p example-sagas)" >&2
    exit 1
fi

work="$(mktemp -d)"
token="clients-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
# Made before the server starts: the loop below reads them before the server may have opened them.
: >"$work/stdout"
: >"$work/server.log"
# Each program plays the bank `payout`'s send_transfer calls, in turn on this address: it answers
# 202 and completes the step through the client's task route.
bank="127.0.0.1:$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$bin" --database-url "sqlite://$work/saga.db" --shop-database-url "sqlite://$work/shop.db" \
    serve --listen 127.0.0.1:0 --api-token "$token" --bank-url "http://$bank" \
    >"$work/stdout" 2>"$work/server.log" &
server=$!
stop() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap stop EXIT
failed() {
    echo "$1; the server's log:" >&2
    tail -n 50 "$work/server.log" >&2
    exit 1
}

# The server prints its address once it can take requests (a free port, picked at bind).
url=""
for _ in $(seq 1 200); do
    url="$(sed -n 's/^listening on //p' "$work/stdout")"
    [ -n "$url" ] && break
    kill -0 "$server" 2>/dev/null || failed "the server did not start"
    sleep 0.1
done
[ -n "$url" ] || failed "the server did not say where it listens within 20 s"

# One copy of the document for both generators.
"$venv/bin/python" -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=30).read())' \
    "$url/openapi.json" >"$work/openapi.json"

echo "generating the Python client (openapi-python-client)"
rm -rf clients/python/generated
# `--fail-on-warning`: an operation the generator cannot read is left out of the client with
# a warning; here it fails the run, so that the document gets fixed.
PATH="$venv/bin:$PATH" "$venv/bin/openapi-python-client" generate --path "$work/openapi.json" \
    --meta none --output-path clients/python/generated/saga_client \
    --config clients/python/config.yaml --fail-on-warning

echo "generating the TypeScript client (@hey-api/openapi-ts)"
rm -rf clients/typescript/generated
(cd clients/typescript && npx openapi-ts -i "$work/openapi.json" -o generated \
    -c @hey-api/client-fetch --no-log-file --silent)
# tsx runs TypeScript without checking its types: the compiler checks the program against the
# generated types first.
(cd clients/typescript && npx tsc -p .)

echo "driving the server through the Python client"
SAGA_URL="$url" SAGA_API_TOKEN="$token" SAGA_BANK_LISTEN="$bank" PYTHONPATH=clients/python/generated \
    "$venv/bin/python" clients/python/drive.py || failed "the Python client's checks failed"

echo "driving the server through the TypeScript client"
(cd clients/typescript && SAGA_URL="$url" SAGA_API_TOKEN="$token" SAGA_BANK_LISTEN="$bank" npx tsx drive.ts) ||
    failed "the TypeScript client's checks failed"
