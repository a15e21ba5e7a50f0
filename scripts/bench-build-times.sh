#!/usr/bin/env bash
# Cold release builds of the four targets of BENCHMARKS.md "Lean to adopt", one commit per
# snapshot, each build with a fresh CARGO_TARGET_DIR (deleted afterwards), timed by `date`.
#
#   scripts/bench-build-times.sh OUT WORK NAME=COMMIT... -- TARGET-NAME...
#
# e.g. scripts/bench-build-times.sh out.txt /tmp/lb orig=9f4ba6f lean=HEAD -- c-lean c-orig
# Targets: a (the engine alone on SQLite, a crate outside the workspace whose program is
# orchestrator/examples/embedded.rs), b (the README's own-saga program with default features, a
# crate outside the workspace with examples/your-own-saga's manifest and sources), c (`cargo
# build --release -p example-sagas`), d (`cargo install --locked --path orchestrator`). (a) and
# (b) have path dependencies on the snapshot and its Cargo.lock. A build waits (up to ten
# minutes) for the load average to fall under 3 before it starts. The example-sagas binary of a
# (c) build is kept as WORK/bin/example-sagas-NAME, for runtime comparisons.
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
out=$(realpath -m "$1"); work=$(realpath -m "$2"); shift 2
mkdir -p "$work/bin"
declare -A commits
while [[ $# -gt 0 && $1 != -- ]]; do commits[${1%%=*}]=${1#*=}; shift; done
shift
load() { cut -d' ' -f1-3 /proc/loadavg; }

snapshot() { # name -> source dir
    local dir=$work/src-$1
    if [[ ! -d $dir ]]; then
        mkdir -p "$dir"
        git -C "$repo" archive "${commits[$1]}" | tar -x -C "$dir"
    fi
    echo "$dir"
}

crate_dir() { # kind name src -> a crate outside the workspace
    local kind=$1 name=$2 src=$3 dir=$work/$1-crate-$2
    rm -rf "$dir"; mkdir -p "$dir/src"
    if [[ $kind == a ]]; then
        cp "$src/orchestrator/examples/embedded.rs" "$dir/src/main.rs"
        cat >"$dir/Cargo.toml" <<TOML
[package]
name = "embedded"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
orchestrator = { path = "$src/orchestrator", default-features = false, features = ["sqlite"] }
saga-dsl = { path = "$src/saga-dsl" }
serde_json = "1"
tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
tokio-util = "0.7"
TOML
    else
        # main.rs, and lib.rs where the snapshot has one (the saga, reached by its tests).
        cp "$src"/examples/your-own-saga/src/*.rs "$dir/src/"
        sed -e "s#path = \"../../orchestrator\"#path = \"$src/orchestrator\"#" \
            -e "s#path = \"../../saga-dsl\"#path = \"$src/saga-dsl\"#" \
            -e "s#path = \"../../saga-test\"#path = \"$src/saga-test\"#" \
            "$src/examples/your-own-saga/Cargo.toml" >"$dir/Cargo.toml"
    fi
    cp "$src/Cargo.lock" "$dir/Cargo.lock"
    echo "$dir"
}

for target in "$@"; do
    kind=${target%%-*} name=${target#*-}
    src=$(snapshot "$name")
    waited=0
    while awk '{exit !($1 > 3)}' /proc/loadavg && ((waited < 600)); do sleep 30; waited=$((waited + 30)); done
    tdir=$work/target-$target
    rm -rf "$tdir" "$work/root-$target"
    case $kind in
        a | b) dir=$(crate_dir "$kind" "$name" "$src"); cmd=(cargo build --release) ;;
        c) dir=$src; cmd=(cargo build --release -p example-sagas) ;;
        d) dir=$src; cmd=(cargo install --locked --path orchestrator --root "$work/root-$target") ;;
    esac
    before=$(load); t0=$(date +%s.%N)
    set +e
    (cd "$dir" && CARGO_TARGET_DIR=$tdir "${cmd[@]}") >"$work/log-$target.txt" 2>&1
    rc=$?
    set -e
    t1=$(date +%s.%N)
    if [[ $kind == c && $rc == 0 ]]; then cp "$tdir/release/example-sagas" "$work/bin/example-sagas-$name"; fi
    printf '%s (%s) rc=%s %.1f s  started %s load %s, ended %s load %s%s\n' \
        "$target" "${commits[$name]}" "$rc" "$(echo "$t1 - $t0" | bc)" \
        "$(date -d @"${t0%.*}" +%H:%M:%S)" "$before" "$(date +%H:%M:%S)" "$(load)" \
        "$( ((waited > 0)) && echo ", waited ${waited} s for the load")" | tee -a "$out"
    rm -rf "$tdir" "$work/root-$target"
done
