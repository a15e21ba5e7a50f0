#!/usr/bin/env bash
# The whole test suite: unit, doc, integration, crash and property tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# The crash tests spawn the real binaries; build them before the tests look for them.
cargo build --workspace --bins
cargo test --workspace "$@"
