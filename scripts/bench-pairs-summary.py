#!/usr/bin/env python3
"""Summarises the `pair …` lines of scripts/bench-pairs.sh (files named on the command line):
per cell, the median rate of each build, the median and range of the per-pair new/old rate
ratios, how many pairs had the new build slower, and the same ratio for CPU time per saga."""
import statistics
import sys
from collections import defaultdict

runs = defaultdict(lambda: defaultdict(dict))
for name in sys.argv[1:]:
    for line in open(name):
        if not line.startswith("pair "):
            continue
        f = dict(kv.split("=", 1) for kv in line.split()[1:])
        cell = (f["backend"], f["scenario"], int(f["inflight"]))
        runs[cell][int(f["rep"])][f["build"]] = (float(f["rate"]), float(f["cpu_ms_per_saga"]))

print("| store | scenario | in flight | pairs | old /s | new /s | rate new ÷ old, median (min–max) "
      "| pairs new slower | CPU per saga new ÷ old, median (min–max) |")
print("|---|---|---:|---:|---:|---:|---|---:|---|")
for cell in sorted(runs):
    pairs = [p for p in runs[cell].values() if "old" in p and "new" in p]
    if not pairs:
        continue
    rate = [p["new"][0] / p["old"][0] for p in pairs]
    cpu = [p["new"][1] / p["old"][1] for p in pairs]
    old = statistics.median(p["old"][0] for p in pairs)
    new = statistics.median(p["new"][0] for p in pairs)
    slower = sum(r < 1 for r in rate)
    print(f"| {cell[0]} | {cell[1]} | {cell[2]} | {len(pairs)} | {old:,.0f} | {new:,.0f} | "
          f"{statistics.median(rate):.3f} ({min(rate):.2f}–{max(rate):.2f}) | {slower}/{len(pairs)} | "
          f"{statistics.median(cpu):.3f} ({min(cpu):.2f}–{max(cpu):.2f}) |")
