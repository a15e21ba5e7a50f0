#!/usr/bin/env bash
# The whole test suite: unit, doc, integration, crash and property tests, on the embedded SQLite
# store, then every storage-touching suite again on PostgreSQL (each test in a fresh database).
#
# PostgreSQL is started here if it is installed and down; SAGA_TEST_PG_URL names another server.
# If PostgreSQL cannot be reached, the PostgreSQL half fails: it is never skipped. `nats-server`
# is installed if missing (SAGA_TEST_NATS_SERVER names another binary), and started on
# 127.0.0.1:4222 with JetStream if nothing listens there; without it the broker tests fail.
# Debian's Chromium is installed if missing (CHROMIUM names another one) for the web console's
# browser tests, which drive it with playwright-core from npm; without it they fail.
# schemathesis, from PyPI, checks the served OpenAPI document against the server
# (scripts/contract.sh); it needs python3 with venv and pip.
set -euo pipefail
cd "$(dirname "$0")/.."

export SAGA_TEST_PG_URL="${SAGA_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
if [ -z "${SAGA_SKIP_PG_START:-}" ] && command -v pg_ctlcluster >/dev/null 2>&1; then
    version="$(ls /etc/postgresql | sort -V | tail -n 1)"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null || true
    for _ in $(seq 1 60); do
        pg_isready -q -h 127.0.0.1 -p 5432 && break
        sleep 0.5
    done
fi

# The broker tests run their own `nats-server` (JetStream), one per test, so that they can kill
# it; install it if missing. One test publishes to the machine's own server
# (SAGA_TEST_NATS_URL, by default 127.0.0.1:4222): started here with JetStream when nothing
# listens there.
if ! command -v nats-server >/dev/null 2>&1 && [ -z "${SAGA_TEST_NATS_SERVER:-}" ]; then
    if command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq nats-server >/dev/null
    fi
fi
if [ -z "${SAGA_TEST_NATS_URL:-}" ] && ! (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; then
    mkdir -p /var/lib/nats-server
    setsid nohup "${SAGA_TEST_NATS_SERVER:-nats-server}" -a 127.0.0.1 -p 4222 -js \
        -sd /var/lib/nats-server -l /var/log/nats-server.log >/dev/null 2>&1 < /dev/null &
    for _ in $(seq 1 40); do
        (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null && break
        sleep 0.25
    done
fi

if ! command -v chromium >/dev/null 2>&1 && [ -z "${CHROMIUM:-}" ]; then
    if command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
fi

# The crash tests spawn the real binaries; build them before the tests look for them.
cargo build --workspace --bins

echo "== all tests, embedded SQLite store =="
cargo test --workspace "$@"

# `--workspace` as above, so that dependencies are built with the same features and nothing is
# compiled twice.
echo "== storage tests again, PostgreSQL store =="
SAGA_TEST_BACKEND=postgres cargo test --workspace \
    --test store_contract --test operators --test retention --test engine --test stages --test children --test fulfil_order --test log_upgrade --test properties --test crash --test http --test cli \
    --test cli_terminal --test bad_input --test idempotency --test webhooks --test discovery \
    --test broker --test consumer --test tracing --test fork --test pause --test bulk --test flow --test limits_api --test http_steps "$@"

# The OpenAPI document as an exact contract: schemathesis (pinned, installed into a virtualenv
# under ~/.cache on first use) against the `example-sagas` built above, on a fresh SQLite file.
echo "== OpenAPI contract, schemathesis =="
./scripts/contract.sh

# The web console in a real browser, against the `example-sagas` built above.
echo "== web console, Chromium =="
(cd tests/browser && npm ci --no-audit --no-fund --loglevel=error && npm test)

# The install path the README gives for the `saga` CLI (a debug build, to reuse the artifacts
# of the tests; `cargo install --path orchestrator` builds it in release).
echo "== cargo install --path orchestrator =="
install_root="$(mktemp -d)"
trap 'rm -rf "$install_root"' EXIT
cargo install --quiet --locked --debug --path orchestrator --root "$install_root" --target-dir target
"$install_root/bin/saga" --version
