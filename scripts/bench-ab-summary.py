#!/usr/bin/env python3
"""Summarises the `ab build=B run=R path=P inflight=N rate=X` lines of scripts/bench-ab.sh and
scripts/bench-ab-pg.sh (files named on the command line): per path and concurrency, the median
rate of each build, the median of the per-run new/old ratios (a run holds both builds, measured
minutes apart), and every run's ratio."""
import statistics
import sys
from collections import defaultdict

rates = defaultdict(lambda: defaultdict(dict))
for name in sys.argv[1:]:
    for line in open(name):
        if not line.startswith("ab "):
            continue
        fields = dict(kv.split("=", 1) for kv in line.split()[1:])
        key = (fields["path"], int(fields["inflight"]))
        rates[key][int(fields["run"])][fields["build"]] = float(fields["rate"])

print("| path | in flight | old /s | new /s | new ÷ old, median | per run |")
print("|---|---:|---:|---:|---:|---|")
for key in sorted(rates):
    runs = rates[key]
    both = [r for r in sorted(runs) if {"old", "new"} <= runs[r].keys()]
    ratios = [runs[r]["new"] / runs[r]["old"] for r in both]
    old = statistics.median(runs[r]["old"] for r in both)
    new = statistics.median(runs[r]["new"] for r in both)
    per_run = " / ".join(f"{x:.2f}" for x in ratios)
    print(f"| {key[0]} | {key[1]} | {old:,.0f} | {new:,.0f} | {statistics.median(ratios):.3f} | {per_run} |")
