#!/usr/bin/env python3
"""Median-of-runs tables and ratios from scripts/compare-peers.sh results.

usage: scripts/summarize_bench.py [-o OUT.md | --no-write] FILE.jsonl [FILE.jsonl ...]

Reads one or more JSONL files holding, one object a line:
  * the peers' lines, as shared/peers/common.py `report` writes them:
      {"peer": "restate", "scenario": "happy", "n": 4000, "c": 16, "sagas_per_s": ..., "p50_ms": ...,
       "p99_ms": ..., "errors": 0, ...}
  * ours, as `example-sagas bench --json` prints them:
      {"backend": "sqlite", "scenario": "happy", "sagas": 10000, "concurrency": 16, "processes": 1,
       "sagas_per_s": ..., "p50_ms": ..., "p99_ms": ..., "commits_per_saga": ..., "errors": 0, ...}
    shown as system `ours-sqlite` / `ours-postgres` (`ours-postgres-p2` with 2 processes);
  * {"meta": {...}} (run settings, written first by compare-peers.sh) and
    {"peer": ..., "failed": true, "error": ...} for a run that failed or timed out.

Prints a markdown report (median sagas/s with the min-max spread, median p50/p99 per
system x scenario x C, then the throughput ratios of ours to each peer) and writes it to OUT.md:
by default next to a single input file with the same name (bench-results/<timestamp>.jsonl ->
bench-results/<timestamp>.md), or bench-results/<now>.md for several inputs.
Ratios are only meaningful between systems measured in the same run.
Python standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

# Display order: ours first, then the peers roughly as the harness lists them.
ORDER = ["ours-sqlite", "ours-postgres", "restate", "underway", "dbos", "dbos-sqlite",
         "temporal", "temporal-wal", "temporal-memory"]
SCENARIOS = ["happy", "compensate"]


def normalise(rec: dict) -> Optional[dict]:
    """One result line -> {system, scenario, c, n, sagas_per_s, p50_ms, p99_ms, errors, ...};
    None for lines that are not results (meta). Failed runs keep `failed: True`."""
    if "meta" in rec:
        return None
    if "backend" in rec:  # ours
        system = f"ours-{rec['backend']}"
        if int(rec.get("processes", 1) or 1) > 1:
            system += f"-p{int(rec['processes'])}"
        return {
            "system": system, "ours": True, "scenario": rec["scenario"], "c": int(rec["concurrency"]),
            "n": int(rec["sagas"]), "sagas_per_s": float(rec["sagas_per_s"]),
            "steps_per_s": rec.get("steps_per_s"), "p50_ms": rec.get("p50_ms"), "p99_ms": rec.get("p99_ms"),
            "errors": int(rec.get("errors", 0)), "commits_per_saga": rec.get("commits_per_saga"),
            "rss_mb": rec.get("peak_rss_mb"), "failed": False,
        }
    if "peer" in rec:
        system = rec["peer"]
        if rec.get("failed"):
            return {"system": system, "ours": system.startswith("ours-"), "scenario": rec["scenario"],
                    "c": int(rec["c"]), "n": int(rec.get("n", 0)), "failed": True,
                    "error": rec.get("error", "")}
        return {
            "system": system, "ours": False, "scenario": rec["scenario"], "c": int(rec["c"]),
            "n": int(rec["n"]), "sagas_per_s": float(rec["sagas_per_s"]),
            "steps_per_s": rec.get("steps_per_s"), "p50_ms": rec.get("p50_ms"), "p99_ms": rec.get("p99_ms"),
            "errors": int(rec.get("errors", 0)), "commits_per_saga": None,
            "rss_mb": rec.get("worker_rss_mb"), "failed": False,
        }
    raise ValueError(f"unrecognised line (neither ours nor a peer's): {rec!r}")


def load(paths: List[str]) -> Tuple[List[dict], List[dict]]:
    rows, metas = [], []
    for path in paths:
        with open(path) as f:
            for i, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                    if "meta" in rec:
                        metas.append(dict(rec["meta"], file=path))
                    r = normalise(rec)
                except (ValueError, KeyError, TypeError) as e:
                    print(f"{path}:{i}: skipped: {e}", file=sys.stderr)
                    continue
                if r is not None:
                    rows.append(r)
    return rows, metas


def sort_key(system: str) -> Tuple[int, str]:
    return (ORDER.index(system) if system in ORDER else (1 if system.startswith("ours") else 50), system)


def med(rows: List[dict], key: str) -> Optional[float]:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else None


def fmt(v: Optional[float], digits: int = 1) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def ratio(a: Optional[float], b: Optional[float]) -> str:
    if not a or not b:
        return "-"
    r = a / b
    return f"{r:.2f}×" if r < 10 else f"{r:.1f}×" if r < 100 else f"{r:.0f}×"


def compensate_vs_happy(ok: Dict[Tuple[str, str, int], List[dict]], systems: List[str],
                        concs: List[int]) -> Dict[Tuple[str, int], Tuple[float, float, float]]:
    """(system, C) -> (median, min, max) of compensate ÷ happy over the runs paired in order."""
    out = {}
    for system in systems:
        for c in concs:
            happy, comp = ok.get((system, "happy", c), []), ok.get((system, "compensate", c), [])
            ratios = [b["sagas_per_s"] / a["sagas_per_s"] for a, b in zip(happy, comp)
                      if a["sagas_per_s"]]
            if ratios:
                out[(system, c)] = (statistics.median(ratios), min(ratios), max(ratios))
    return out


def report(rows: List[dict], metas: List[dict], inputs: List[str]) -> str:
    ok: Dict[Tuple[str, str, int], List[dict]] = defaultdict(list)
    failed: Dict[Tuple[str, str, int], List[dict]] = defaultdict(list)
    for r in rows:
        (failed if r["failed"] else ok)[(r["system"], r["scenario"], r["c"])].append(r)
    keys = set(ok) | set(failed)
    scen = sorted({k[1] for k in keys}, key=lambda s: SCENARIOS.index(s) if s in SCENARIOS else 9)
    concs = sorted({k[2] for k in keys})
    systems = sorted({k[0] for k in keys}, key=sort_key)

    out: List[str] = []
    out.append("# Saga benchmark: ours vs peers")
    out.append("")
    out.append("Input: " + ", ".join(f"`{os.path.basename(p)}`" for p in inputs) + ".")
    for m in metas:
        bits = [f"started {m.get('started', '?')}", f"host {m.get('host', '?')} ({m.get('nproc', '?')} CPUs)",
                f"ours at {m.get('git_rev', '?')}{' (dirty tree)' if m.get('git_dirty') else ''}",
                f"Postgres {m.get('postgres') or '?'}", f"repeats {m.get('repeats', '?')}",
                f"scale {m.get('scale', '?')}"]
        if m.get("sagas"):
            bits.append(f"sagas {m['sagas']}")
        if m.get("ours_args"):
            bits.append(f"our extra args `{m['ours_args']}`")
        out.append("Run: " + ", ".join(bits) + ".")
    out.append("")
    out.append("Every cell is the median over the runs; (min–max) is the spread of sagas/s. "
               "`ours-sqlite`: `example-sagas bench` on a fresh SQLite file (default, durable settings); "
               "`ours-postgres`: on a fresh database of the peers' Postgres. "
               "Latency: submit → final result known to the caller (see each peer's definition in "
               "shared/peers/README.md).")
    out.append("")
    out.append("| system | scenario | C | N | runs | sagas/s | (min–max) | steps/s | p50 ms | p99 ms | commits/saga | errors | failed runs |")
    out.append("|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for sc in scen:
        for system in systems:
            for c in concs:
                rs, fs = ok.get((system, sc, c), []), failed.get((system, sc, c), [])
                if not rs and not fs:
                    continue
                if rs:
                    v = [r["sagas_per_s"] for r in rs]
                    ns = sorted({r["n"] for r in rs})
                    out.append(
                        f"| {system} | {sc} | {c} | {'/'.join(map(str, ns))} | {len(rs)} | "
                        f"{fmt(med(rs, 'sagas_per_s'))} | {fmt(min(v))}–{fmt(max(v))} | {fmt(med(rs, 'steps_per_s'))} | "
                        f"{fmt(med(rs, 'p50_ms'), 2)} | {fmt(med(rs, 'p99_ms'), 2)} | {fmt(med(rs, 'commits_per_saga'), 2)} | "
                        f"{sum(r['errors'] for r in rs)} | {len(fs)} |")
                else:
                    out.append(f"| {system} | {sc} | {c} | - | 0 | - | - | - | - | - | - | - | {len(fs)} |")

    ours = [s for s in systems if s.startswith("ours-")]
    peers = [s for s in systems if not s.startswith("ours-")]
    if ours and peers:
        out.append("")
        out.append("Throughput ratio, ours ÷ peer (median sagas/s of each, same run; > 1 = ours faster):")
        out.append("")
        out.append("| scenario | C | ours | " + " | ".join(f"÷ {p}" for p in peers) + " |")
        out.append("|---|---:|---|" + "---:|" * len(peers))
        for sc in scen:
            for c in concs:
                for o in ours:
                    mo = med(ok.get((o, sc, c), []), "sagas_per_s")
                    if mo is None:
                        continue
                    cells = [ratio(mo, med(ok.get((p, sc, c), []), "sagas_per_s")) for p in peers]
                    out.append(f"| {sc} | {c} | {o} ({fmt(mo)}/s) | " + " | ".join(cells) + " |")

    pairs = compensate_vs_happy(ok, systems, concs)
    if pairs:
        out.append("")
        out.append("Compensate ÷ happy, each system against itself: the median of the ratios of the "
                   "k-th compensate run to the k-th happy run at the same C (in the order they ran; "
                   "compare-peers.sh runs them back to back), and the spread of those ratios:")
        out.append("")
        out.append("| system | " + " | ".join(f"C={c}" for c in concs) + " |")
        out.append("|---|" + "---:|" * len(concs))
        for system in systems:
            cells = [pairs.get((system, c)) for c in concs]
            if not any(cells):
                continue
            out.append(f"| {system} | " + " | ".join(
                "-" if cell is None else f"{cell[0]:.0%} ({cell[1]:.0%}–{cell[2]:.0%})"
                for cell in cells) + " |")

    fails = [r for r in rows if r["failed"]]
    if fails:
        out.append("")
        out.append("Failed runs:")
        out.append("")
        for r in fails:
            out.append(f"* {r['system']} {r['scenario']} C={r['c']} N={r['n']}: {r.get('error') or 'failed'}")
    errs = [k for k, rs in ok.items() if any(r["errors"] for r in rs)]
    if errs:
        out.append("")
        out.append("Runs with wrong saga results (errors > 0): "
                   + ", ".join(f"{s} {sc} C={c}" for s, sc, c in sorted(errs)) + ".")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="JSONL files written by scripts/compare-peers.sh")
    ap.add_argument("-o", "--out", help="markdown file to write (default: see module doc)")
    ap.add_argument("--no-write", action="store_true", help="only print the report")
    args = ap.parse_args()

    rows, metas = load(args.files)
    if not rows:
        print("no result lines in " + ", ".join(args.files), file=sys.stderr)
        return 1
    text = report(rows, metas, args.files)
    print(text, end="", flush=True)
    if not args.no_write:
        out = args.out
        if not out:
            if len(args.files) == 1 and args.files[0].endswith(".jsonl"):
                out = args.files[0][: -len(".jsonl")] + ".md"
            else:
                root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                out = os.path.join(root, "bench-results", time.strftime("%Y%m%d-%H%M%S") + ".md")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
