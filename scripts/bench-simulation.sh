#!/usr/bin/env bash
# A long run of the engine's deterministic simulation (tests/simulation.rs) in release mode: a
# range of seeds, each a run of several sagas under crashes, clock jumps and operator commands,
# every saga checked against the invariants. Prints the test's own summary (runs, sagas, faults
# by kind, how the sagas ended) and the rates: seeds/s, sagas/s and faults/s.
#
# Usage: scripts/bench-simulation.sh [SEEDS]   (SEEDS as A..B, default 0..2000)
# A failing seed is named with the command that runs it alone.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${1:-0..2000}"
cargo test --release -p saga-suite --test simulation --no-run
echo "bench-simulation: seeds $seeds on $(nproc) cores, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
SAGA_SIM_SEEDS="$seeds" cargo test --release -p saga-suite --test simulation \
    seeded_runs_keep_the_saga_invariants -- --nocapture --test-threads 1
