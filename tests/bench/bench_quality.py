"""Scheduling quality on the openb trace: ours against our BestFit and FGD controls.

Run as ``python -m tests.bench.bench_quality --trace DIR`` (``make bench-quality``).
Protocol of Weng et al. (ATC'23), see ``fairshare/simulator/openb.py``: the default
pod list, seeds 42-51, GPU allocation at 100 % arrived. Prints a markdown table beside
the paper's figures and writes ``bench/results/quality-<date>.json``. Figures only:
nothing here asserts on a number.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

PAPER = {"bestfit": 92.86, "fgd": 95.23}
ATTRIBUTION = (
    "Trace: Alibaba Cluster Trace Program, cluster-trace-gpu-v2023 (openb). "
    "Paper figures: Weng et al., 'Beware of Fragmentation', USENIX ATC '23 (artifact results)."
)


def _one(job: tuple[str, str, int, str, int]) -> dict[str, Any]:
    from fairshare.simulator import openb, runner

    trace, pods, seed, policy, tenants = job
    t0 = time.perf_counter()
    sim, res = openb.run_trace(
        Path(trace),
        pods=pods,
        seed=seed,
        policy=policy,  # type: ignore[arg-type]
        tenants=tenants,
    )
    report = runner.build_report(sim)
    return {
        "policy": policy,
        "seed": seed,
        "tenants": tenants,
        "allocationAt100": res.allocation_at(100),
        "fragmentation": report["cluster"]["fragmentation"],
        "jainIndex": report["cluster"]["jainIndex"],
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="../shared/data/openb")
    p.add_argument("--pods", default="default")
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--tenants", type=int, default=4, help="synthetic tenants for the fairness row")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    if not Path(args.trace, "openb_node_list_gpu_node.csv").is_file():
        from fairshare.simulator.openb import TRACE_HELP

        print(f"bench-quality: no openb trace at {args.trace!r}. {TRACE_HELP}", file=sys.stderr)
        return 1
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    jobs = [(args.trace, args.pods, s, pol, 0) for pol in ("bestfit", "fgd", "ours") for s in seeds]
    jobs += [(args.trace, args.pods, s, "ours", args.tenants) for s in seeds]
    print(
        f"bench-quality: {len(jobs)} runs on {args.workers} worker(s), {os.cpu_count()} cores",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    results = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for n, r in enumerate(pool.map(_one, jobs), 1):
            results.append(r)
            print(
                f"  [{n}/{len(jobs)}] {r['policy']} tenants={r['tenants']} seed={r['seed']}: "
                f"{r['allocationAt100']:.2f} % ({r['seconds']} s)",
                file=sys.stderr,
            )
    rows = []
    for pol, ten in (("bestfit", 0), ("fgd", 0), ("ours", 0), ("ours", args.tenants)):
        vals = [r for r in results if r["policy"] == pol and r["tenants"] == ten]
        alloc = [r["allocationAt100"] for r in vals]
        rows.append(
            {
                "policy": pol if not ten else f"ours + gate, {ten} tenants",
                "mean": statistics.mean(alloc),
                "sd": statistics.stdev(alloc) if len(alloc) > 1 else 0.0,
                "min": min(alloc),
                "max": max(alloc),
                "fragmentation": statistics.mean(r["fragmentation"] for r in vals),
                "jain": statistics.mean(r["jainIndex"] for r in vals),
                "paper": PAPER.get(pol) if not ten else None,
            }
        )
    lines = [
        f"openb `{args.pods}` pod list, seeds {seeds[0]}-{seeds[-1]} ({len(seeds)} runs each), "
        f"GPU allocation at 100 % arrived; {os.cpu_count()} cores, "
        f"{time.perf_counter() - t0:.0f} s in all.",
        "",
        "| policy | GPU allocation % (mean ± sd) | min–max | paper "
        "| fragmentation % at end | Jain |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        paper = f"{r['paper']:.2f}" if r["paper"] else "–"
        lines.append(
            f"| {r['policy']} | {r['mean']:.2f} ± {r['sd']:.2f} | {r['min']:.2f}–{r['max']:.2f} "
            f"| {paper} | {r['fragmentation']:.2f} | {r['jain']:.3f} |"
        )
    lines += ["", ATTRIBUTION]
    text = "\n".join(lines)
    print(text)
    out = Path("bench/results") / f"quality-{datetime.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "runs": results, "summary": text}, indent=2) + "\n")
    print(f"\nwritten to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
