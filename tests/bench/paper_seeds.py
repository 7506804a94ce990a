"""Our bench-quality runs against the paper's own runs, seed by seed's distribution.

The FGD paper's artifact (github.com/hkust-adsl/kubernetes-scheduler-simulator) keeps
the GPU allocation of every run it reports, one row per pod list, policy and seed, in
``experiments/analysis/expected_results/analysis_allo_discrete.csv`` (columns
``workload, sc_policy, tune, seed, total_gpus, 0 … 130``: the allocation % at each
arrived %). The file is not part of this repository; download it and pass its path.

For every pod list and each of ours and our FGD control, the table gives our mean minus
the paper FGD's mean over the seeds both have, and Welch's t (the difference over its
standard error, the two sets of runs taken as independent samples): |t| below about 2
is within the seed-to-seed noise of the two runs.

    python -m tests.bench.paper_seeds --artifact-csv analysis_allo_discrete.csv \\
        --report bench/results/quality-2026-12-06.json
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.bench.bench_quality import TRACES

PAPER_POLICY = {"bestfit": "05-BestFit", "fgd": "06-FGD"}
WORKLOAD_PREFIX = "openb_pod_list_"


def welch_t(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """(mean ours − mean theirs) ÷ the standard error of that difference."""
    if len(ours) < 2 or len(theirs) < 2:
        raise ValueError("Welch's t needs at least two runs on each side")
    se = math.sqrt(
        statistics.variance(ours) / len(ours) + statistics.variance(theirs) / len(theirs)
    )
    diff = statistics.fmean(ours) - statistics.fmean(theirs)
    if se == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / se


def paper_runs(path: Path, *, arrived: str = "100") -> dict[tuple[str, str], dict[int, float]]:
    """{(pod list, our policy name): {seed: allocation % at ``arrived``}} from the artifact."""
    names = {v: k for k, v in PAPER_POLICY.items()}
    out: dict[tuple[str, str], dict[int, float]] = {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"workload", "sc_policy", "seed", arrived} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: not the artifact's allocation table (no {sorted(missing)})")
        for row in reader:
            policy = names.get(row["sc_policy"])
            if policy is None or not row["workload"].startswith(WORKLOAD_PREFIX):
                continue
            pods = row["workload"][len(WORKLOAD_PREFIX) :]
            try:
                out.setdefault((pods, policy), {})[int(row["seed"])] = float(row[arrived])
            except (TypeError, ValueError):
                raise ValueError(
                    f"{path}, line {reader.line_num}: seed {row['seed']!r} or allocation "
                    f"{row[arrived]!r} is not a number"
                ) from None
    return out


def our_runs(report: object) -> dict[tuple[str, str], dict[int, float]]:
    """{(pod list, policy): {seed: allocation %}} from a bench-quality JSON report."""
    runs = report.get("runs") if isinstance(report, dict) else None
    if not isinstance(runs, list):
        raise ValueError("not a bench-quality report (no list of runs)")
    out: dict[tuple[str, str], dict[int, float]] = {}
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or run.get("kind") != "allocation":
            continue
        try:
            key, seed = (str(run["pods"]), str(run["policy"])), int(run["seed"])
            out.setdefault(key, {})[seed] = float(run["allocationAt100"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"run {i} of the report is not an allocation run: {exc!r}") from None
    return out


def table(ours: dict, paper: dict) -> str:
    lines = [
        "| pod list | ours − paper FGD | t | our fgd − paper FGD | t | seeds |",
        "|---|---|---|---|---|---|",
    ]
    known = {p for p, _ in ours}
    lists = [p for p in TRACES if p in known] + sorted(known - set(TRACES))
    for pods in lists:
        ref = paper.get((pods, "fgd"))
        if not ref:
            continue
        cells: list[str] = []
        used: set[int] = set()
        for policy in ("ours", "fgd"):
            mine = ours.get((pods, policy), {})
            seeds = sorted(set(mine) & set(ref))
            if len(seeds) < 2:
                cells += ["–", "–"]
                continue
            used |= set(seeds)
            a, b = [mine[s] for s in seeds], [ref[s] for s in seeds]
            diff = statistics.fmean(a) - statistics.fmean(b)
            cells += [f"{diff:+.3f}", f"{welch_t(a, b):+.1f}"]
        seeds_txt = f"{min(used)}–{max(used)} ({len(used)})" if used else "–"
        lines.append(f"| {pods} | " + " | ".join(cells) + f" | {seeds_txt} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact-csv", type=Path, required=True, help="analysis_allo_discrete.csv")
    ap.add_argument("--report", type=Path, required=True, help="a bench-quality JSON report")
    args = ap.parse_args(argv)
    try:
        paper = paper_runs(args.artifact_csv)
        ours = our_runs(json.loads(args.report.read_text()))
    except (OSError, ValueError) as exc:
        print(f"paper_seeds: {exc}", file=sys.stderr)
        return 2
    if not ours:
        print(f"paper_seeds: {args.report} holds no allocation runs", file=sys.stderr)
        return 2
    sys.stdout.write(table(ours, paper))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
