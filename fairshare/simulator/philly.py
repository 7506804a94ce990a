"""Replay Microsoft's Philly trace (Gavel's per-virtual-cluster form) as gangs.

Each ``<vc>.trace`` file is one tenant (``vc-<id>``, weight 1), one job a line. A job is
a gang of ``scale factor`` 1-GPU pods and runs ``total steps ÷ throughput`` seconds once
all its pods run, the throughput from ``simulation_throughputs.json`` for the chosen GPU
type (a scale factor without an entry: the single-worker throughput × workers × the
table's median scaling efficiency). All tenants share one cluster of ``--nodes`` ×
``--gpus-per-node`` GPUs, and the jobs are replayed under ``gangsim``'s three policies::

    python -m fairshare.simulator.philly [--trace DIR] [--nodes 64] [--jobs N] [--quick]
        [--yield-band B]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from fairshare import fairness, gangs
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import API_VERSION, KIND, FairShareConfig
from fairshare.simulator.gangsim import (
    GANG_POLICIES,
    GangPolicy,
    Job,
    Node,
    Replay,
    ReplayResult,
)

DEFAULT_TRACE = "../shared/data/philly-gavel"
THROUGHPUTS = "simulation_throughputs.json"
COLUMNS = (
    "job type",
    "command",
    "steps argument",
    "needs a data dir",
    "total steps",
    "arrival seconds",
    "scale factor",
)
TRACE_HELP = (
    "expected a folder of Gavel's Philly traces (<vc>.trace files, 7 tab-separated "
    f"columns) with {THROUGHPUTS} (github.com/stanford-futuredata/gavel, scheduler/traces/"
    "msr/seed=0 and scheduler/simulation_throughputs.json)"
)
HOUR = 3600.0
_KEY = re.compile(r"\('(.*)', (\d+)\)")


class TraceError(ValueError):
    """A trace or throughput file that cannot be read; the message is one line."""


@dataclass(frozen=True)
class TraceJob:
    vc: str
    line: int
    job_type: str
    steps: int
    arrival: float
    scale: int


def read_trace(path: Path) -> list[TraceJob]:
    """The jobs of one ``<vc>.trace`` file; TraceError names the file and line."""
    vc = path.name.removesuffix(".trace")
    jobs: list[TraceJob] = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot be read: {exc}") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        where = f"{path}:{n}"
        if len(cols) != len(COLUMNS):
            raise TraceError(
                f"{where}: expected {len(COLUMNS)} tab-separated columns "
                f"({', '.join(COLUMNS)}), got {len(cols)}"
            )
        job_type, steps_s, arrival_s, scale_s = cols[0], cols[4], cols[5], cols[6]
        try:
            steps = int(steps_s)
            arrival = float(arrival_s)
            scale = int(scale_s)
        except ValueError:
            raise TraceError(
                f"{where}: total steps {steps_s!r}, arrival {arrival_s!r} and scale factor "
                f"{scale_s!r} must be an integer, a number and an integer"
            ) from None
        if steps <= 0 or scale <= 0 or not math.isfinite(arrival) or arrival < 0:
            raise TraceError(
                f"{where}: total steps ({steps}) and scale factor ({scale}) must be positive "
                f"and the arrival ({arrival_s}) a number of seconds ≥ 0"
            )
        if not job_type.strip():
            raise TraceError(f"{where}: empty job type")
        jobs.append(TraceJob(vc, n, job_type, steps, arrival, scale))
    return jobs


@dataclass(frozen=True)
class Throughputs:
    """Steps per second by (job type, scale factor) for one GPU type."""

    table: dict[tuple[str, int], float]
    efficiency: float
    """Median of throughput(k) ÷ (k × throughput(1)) over the multi-worker entries."""

    def duration(self, job: TraceJob) -> tuple[float, bool]:
        """Seconds the job runs alone, and whether its own entry gave it."""
        own = self.table.get((job.job_type, job.scale))
        if own is not None:
            return job.steps / own, True
        one = self.table.get((job.job_type, 1))
        if one is None:
            raise TraceError(
                f"{job.vc}.trace:{job.line}: job type {job.job_type!r} has no throughput "
                "for one worker"
            )
        return job.steps / (one * job.scale * self.efficiency), False


def read_throughputs(path: Path, gpu_type: str = "v100") -> Throughputs:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: cannot be read as JSON: {exc}") from None
    by_type = doc.get(gpu_type) if isinstance(doc, dict) else None
    if not isinstance(by_type, dict):
        kinds = ", ".join(sorted(doc)) if isinstance(doc, dict) else "none"
        raise TraceError(f"{path}: no GPU type {gpu_type!r} (has: {kinds})")
    table: dict[tuple[str, int], float] = {}
    for key, entry in by_type.items():
        m = _KEY.fullmatch(key)
        alone = entry.get("null") if isinstance(entry, dict) else None
        if m is None or not isinstance(alone, int | float) or alone <= 0:
            raise TraceError(f"{path}: {gpu_type} entry {key!r} is not ('<job type>', <n>) "
                             "with a positive \"null\" throughput")  # fmt: skip
        table[(m.group(1), int(m.group(2)))] = float(alone)
    ratios = [
        v / (k * table[(name, 1)]) for (name, k), v in table.items() if k > 1 and (name, 1) in table
    ]
    return Throughputs(table, statistics.median(ratios) if ratios else 1.0)


def trace_files(folder: Path, vcs: Sequence[str] | None = None) -> list[Path]:
    if not folder.is_dir():
        raise TraceError(f"no trace folder {folder}; {TRACE_HELP}")
    files = sorted(folder.glob("*.trace"))
    if not files:
        raise TraceError(f"no .trace files in {folder}; {TRACE_HELP}")
    if vcs:
        known = {f.name.removesuffix(".trace"): f for f in files}
        missing = [v for v in vcs if v not in known]
        if missing:
            raise TraceError(f"no virtual cluster {', '.join(missing)} in {folder}")
        files = [known[v] for v in vcs]
    if not (folder / THROUGHPUTS).is_file():
        raise TraceError(f"no {THROUGHPUTS} in {folder}; {TRACE_HELP}")
    return files


def tenant_of(vc: str) -> str:
    return f"vc-{vc}"


def load_jobs(
    folder: Path, *, vcs: Sequence[str] | None = None, limit: int | None = None,
    gpu_type: str = "v100",
) -> tuple[list[Job], Throughputs, int]:  # fmt: skip
    """The first ``limit`` jobs by arrival over the chosen virtual clusters (all when
    None), as gangs; the throughput table; how many took the efficiency rule."""
    files = trace_files(folder, vcs)
    tput = read_throughputs(folder / THROUGHPUTS, gpu_type)
    rows = [j for f in files for j in read_trace(f)]
    rows.sort(key=lambda j: (j.arrival, j.vc, j.line))
    if limit is not None:
        rows = rows[:limit]
    jobs: list[Job] = []
    derived = 0
    for j in rows:
        seconds, own = tput.duration(j)
        derived += not own
        ns = tenant_of(j.vc)
        jobs.append(Job(f"j{j.line}", ns, j.arrival, seconds, j.scale, _REQUESTS))
    return jobs, tput, derived


_REQUESTS = (("nvidia.com/gpu", "1"), ("cpu", "4"), ("memory", "32Gi"))


def make_config(tenants: Sequence[str], yield_band: float | None = None) -> FairShareConfig:
    """Each tenant of weight 1; ``yield_band`` sets ``yieldBand`` (None: the default)."""
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "resources": {"nvidia.com/gpu": {}, "cpu": {}, "memory": {}},
        "tenants": [{"name": t, "namespaces": [t], "weight": 1} for t in sorted(tenants)],
    }
    if yield_band is not None:
        doc["yieldBand"] = yield_band
    return config_from_mapping(doc)


def make_nodes(count: int, gpus: int) -> list[Node]:
    alloc = (
        ("nvidia.com/gpu", Fraction(gpus)),
        ("cpu", Fraction(8 * gpus)),
        ("memory", Fraction(64 * gpus << 30)),
    )
    labels = (("nvidia.com/gpu.count", str(gpus)), ("nvidia.com/gpu.product", "Tesla-V100"))
    return [Node(f"gpu-{i:03d}", alloc, labels) for i in range(count)]


# -- figures ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(result: ReplayResult) -> dict[str, Any]:
    """The figures of one policy's replay (hours)."""
    waits = [w for f in result.tenants.values() for w in f.waits]
    used = {t: f.gpu_seconds for t, f in result.tenants.items()}
    fair = {t: f.fair_gpu_seconds for t, f in result.tenants.items()}
    total_fair = sum(fair.values())
    ratios = [used[t] / fair[t] for t in used if fair[t] > 0]
    tenants: dict[str, Any] = {}
    for t, f in result.tenants.items():
        tenants[t] = {
            "jobs": f.jobs,
            "notStarted": f.jobs - f.started,
            "waitHours": {
                "mean": _h(statistics.fmean(f.waits)) if f.waits else None,
                "p50": _h(percentile(f.waits, 50)) if f.waits else None,
                "p95": _h(percentile(f.waits, 95)) if f.waits else None,
            },
            "gpuHours": round(f.gpu_seconds / HOUR, 1),
            "fairGpuHours": round(f.fair_gpu_seconds / HOUR, 1),
            "usedOverFair": round(f.gpu_seconds / f.fair_gpu_seconds, 3)
            if f.fair_gpu_seconds > 0
            else None,
            "incompleteGangGpuHours": round(f.incomplete_gpu_seconds / HOUR, 1),
        }
    span = result.end - result.start
    return {
        "policy": result.policy,
        "incompleteGangGpuHours": round(result.incomplete_gpu_seconds / HOUR, 1),
        "busyGpuHours": round(result.busy_gpu_seconds / HOUR, 1),
        "utilization": round(result.busy_gpu_seconds / (result.gpus * span), 4) if span else 0,
        "idleWhileWaitingGpuHours": round(result.idle_while_waiting_gpu_seconds / HOUR, 1),
        "endHours": round(result.end / HOUR, 1),
        "jobs": sum(f.jobs for f in result.tenants.values()),
        "notStarted": result.not_started,
        "gpusHeldForEver": result.stuck_gpus,
        "waitHours": {
            "mean": _h(statistics.fmean(waits)) if waits else None,
            "p50": _h(percentile(waits, 50)) if waits else None,
            "p95": _h(percentile(waits, 95)) if waits else None,
        },
        "offFair": round(sum(abs(used[t] - fair[t]) for t in used) / total_fair, 4)
        if total_fair
        else None,
        "jain": round(fairness.jain_index(ratios), 4) if ratios else None,
        "tenants": tenants,
    }


def _h(seconds: float) -> float:
    return round(seconds / HOUR, 2)


def _fmt(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def render(figures: dict[str, dict[str, Any]], header: str) -> str:
    """The Markdown tables of a run (policy summary, then per tenant)."""
    out = [header, ""]
    out.append(
        "| policy | GPU-h held by incomplete gangs | GPU-h free while jobs wait | run "
        "ends (h) | jobs not started | wait mean / p50 / p95 (h) | GPU-time off fair "
        "| Jain (used ÷ fair) |"
    )
    out.append("|---|---:|---:|---:|---:|---|---:|---:|")
    for name, f in figures.items():
        w = f["waitHours"]
        out.append(
            f"| {name} | {_fmt(f['incompleteGangGpuHours'], 1)} "
            f"| {_fmt(f['idleWhileWaitingGpuHours'], 1)} | {_fmt(f['endHours'], 0)} "
            f"| {f['notStarted']}"
            + (f" ({f['gpusHeldForEver']:g} GPUs held for ever)" * bool(f["gpusHeldForEver"]))
            + " "
            f"| {_fmt(w['mean'])} / {_fmt(w['p50'])} / {_fmt(w['p95'])} "
            f"| {100 * (f['offFair'] or 0):.1f} % | {_fmt(f['jain'], 3)} |"
        )
    out.append("")
    names = list(figures)
    out.append(
        "| tenant | jobs | "
        + " | ".join(f"{n}: wait mean / p50 / p95 (h), used ÷ fair" for n in names)
        + " |"
    )
    out.append("|---|---:|" + "---|" * len(names))
    tenants = list(next(iter(figures.values()))["tenants"]) if figures else []
    for t in tenants:
        cells = []
        for n in names:
            f = figures[n]["tenants"][t]
            w = f["waitHours"]
            cell = f"{_fmt(w['mean'])} / {_fmt(w['p50'])} / {_fmt(w['p95'])}, "
            cell += _fmt(f["usedOverFair"], 2)
            if f["notStarted"]:
                cell += f" ({f['notStarted']} not started)"
            cells.append(cell)
        jobs = figures[names[0]]["tenants"][t]["jobs"]
        out.append(f"| {t} | {jobs} | " + " | ".join(cells) + " |")
    return "\n".join(out)


# -- the command -----------------------------------------------------------------------


class Progress:
    """One stderr line every few seconds while a replay runs."""

    def __init__(self, label: str, every: float = 3.0) -> None:
        self.label, self.every = label, every
        self.t0 = self.last = time.monotonic()

    def __call__(self, now: float, done: int, total: int) -> None:
        t = time.monotonic()
        if t - self.last < self.every:
            return
        self.last = t
        print(
            f"philly: {self.label}: {done}/{total} jobs done, trace time {now / HOUR:,.0f} h, "
            f"{t - self.t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )


def replay_one(
    folder: Path,
    policy: GangPolicy,
    *,
    nodes: int,
    gpus_per_node: int,
    limit: int | None,
    vcs: Sequence[str] | None = None,
    gpu_type: str = "v100",
    quiet: bool = False,
    group_rule: gangs.waiting.Rule = gangs.waiting.RULE,
    yield_band: float | None = None,
) -> dict[str, Any]:
    """One policy's replay of the trace, summarised (a worker process runs one)."""
    jobs, _, _ = load_jobs(folder, vcs=vcs, limit=limit, gpu_type=gpu_type)
    config = make_config(sorted({j.namespace for j in jobs}), yield_band)
    t0 = time.monotonic()
    prog = None if quiet else Progress(policy)
    horizon = max(j.arrival + j.duration for j in jobs)
    replay = Replay(
        config, make_nodes(nodes, gpus_per_node), jobs, policy, progress=prog,
        group_rule=group_rule,
    )  # fmt: skip
    result = replay.run(horizon=horizon)
    if not quiet:
        print(f"philly: {policy}: done in {time.monotonic() - t0:.0f} s", file=sys.stderr,
              flush=True)  # fmt: skip
    return summary(result)


def run(
    folder: Path,
    *,
    nodes: int,
    gpus_per_node: int,
    limit: int | None,
    vcs: Sequence[str] | None = None,
    policies: Sequence[GangPolicy] = GANG_POLICIES,
    gpu_type: str = "v100",
    quiet: bool = False,
    workers: int = 1,
    group_rule: gangs.waiting.Rule = gangs.waiting.RULE,
    yield_band: float | None = None,
) -> tuple[dict[str, dict[str, Any]], str]:
    """Replay the trace under each policy (``workers`` processes at once); the figures
    by policy and the header line."""
    jobs, tput, derived = load_jobs(folder, vcs=vcs, limit=limit, gpu_type=gpu_type)
    if not jobs:
        raise TraceError(f"no jobs in the chosen traces of {folder}")
    tenants = sorted({j.namespace for j in jobs})
    too_big = [j for j in jobs if j.size > nodes * gpus_per_node]
    header = (
        f"Philly (Gavel, seed 0): {len(jobs):,} jobs of {len(tenants)} virtual clusters "
        f"(tenants, weight 1 each), {sum(j.size for j in jobs):,} pods of 1 GPU; cluster "
        f"{nodes} nodes × {gpus_per_node} GPUs = {nodes * gpus_per_node} GPUs ({gpu_type} "
        f"throughputs; {derived} jobs had no entry for their scale factor: single-worker "
        f"throughput × workers × {tput.efficiency:.3f}, the table's median scaling "
        f"efficiency)" + (f"; {len(too_big)} jobs larger than the cluster" * bool(too_big))
    )
    common: dict[str, Any] = dict(
        nodes=nodes, gpus_per_node=gpus_per_node, limit=limit, vcs=vcs, gpu_type=gpu_type,
        quiet=quiet, group_rule=group_rule, yield_band=yield_band,
    )  # fmt: skip
    if workers <= 1 or len(policies) <= 1:
        return {p: replay_one(folder, p, **common) for p in policies}, header
    with ProcessPoolExecutor(max_workers=min(workers, len(policies))) as pool:
        futures = {p: pool.submit(replay_one, folder, p, **common) for p in policies}
        return {p: f.result() for p, f in futures.items()}, header


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fairshare.simulator.philly", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--trace", type=Path, default=Path(DEFAULT_TRACE), help="trace folder")
    ap.add_argument("--nodes", type=int, default=64, help="nodes (default 64)")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="GPUs a node (default 8)")
    ap.add_argument("--jobs", type=int, help="replay only the first N jobs by arrival")
    ap.add_argument("--vcs", help="comma-separated virtual clusters (default: every .trace)")
    ap.add_argument("--gpu-type", default="v100", help="throughput column (default v100)")
    ap.add_argument(
        "--policies", default=",".join(GANG_POLICIES), help="comma-separated, of: "
        + ", ".join(GANG_POLICIES)
    )  # fmt: skip
    ap.add_argument(
        "--group-rule", default=gangs.waiting.RULE, choices=gangs.waiting.RULES,
        help="how a waiting group counts at the gate under ours (fairshare.gangs.waiting; "
        f"default {gangs.waiting.RULE})",
    )  # fmt: skip
    ap.add_argument(
        "--yield-band", type=float, metavar="B",
        help="the config's yieldBand (default: the config's default, 0: off)",
    )  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="the first 1,500 jobs only")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument(
        "--workers", type=int, default=min(3, os.cpu_count() or 1),
        help="policies replayed at once, one process each (default: the cores, up to 3)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.gpus_per_node < 1:
        ap.error("--nodes and --gpus-per-node must be at least 1")
    if args.jobs is not None and args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if args.yield_band is not None and not 0 <= args.yield_band <= 1:
        ap.error("--yield-band must be between 0 and 1")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in GANG_POLICIES]
    if unknown or not policies:
        ap.error(f"--policies: unknown {', '.join(unknown) or 'empty'}; "
                 f"choose from {', '.join(GANG_POLICIES)}")  # fmt: skip
    limit = args.jobs if args.jobs is not None else (1500 if args.quick else None)
    vcs = [v.strip() for v in args.vcs.split(",")] if args.vcs else None
    try:
        figures, header = run(
            args.trace,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            limit=limit,
            vcs=vcs,
            policies=policies,
            gpu_type=args.gpu_type,
            workers=args.workers,
            group_rule=args.group_rule,
            yield_band=args.yield_band,
        )
    except TraceError as exc:
        print(f"philly: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump({"header": header, "policies": figures}, sys.stdout, indent=1)
        print()
    else:
        print(render(figures, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
