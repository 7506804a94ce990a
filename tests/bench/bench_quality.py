"""Scheduling quality on the openb trace: ours against our BestFit and FGD controls.

Run as ``python -m tests.bench.bench_quality --trace DIR`` (``make bench-quality``);
``--quick`` (``make bench-quality QUICK=1``) runs 3 pod lists × 3 seeds for development.
Figures only: nothing here asserts on a number.

Two protocols, both in ``fairshare/simulator/openb.py``:

* **allocation** (Weng et al., ATC'23): for each pod list (default: the 11 traces of
  ``TRACES``), each policy and each seed (42-51), the mean GPU allocation at 100 %
  arrived, beside the paper's published BestFit and FGD means;
* **fairness at saturation** (ours): ``--tenants`` synthetic tenants with ``--weights``
  (default 4 tenants, 1:1:2:4) asking for ``--load`` × the GPU capacity; each tenant's
  unweighted dominant share at the end against its weighted fair share. One such run
  of ``ours`` takes about ten times an allocation run, so traces other than
  ``default`` use only the first ``--fair-seeds`` seeds (the output says how many).

Writes ``bench/results/quality-<date>.json``, ``.md`` and (with matplotlib, the
``[bench]`` extra) ``.png``: mean GPU allocation against arrived workload, one panel
per trace. Prints the markdown; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

POLICIES = ("ours", "bestfit", "fgd")
TRACES = (
    "default",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "multigpu20",
    "multigpu50",
    "cpu050",
    "cpu250",
    "gpuspec20",
    "gpuspec33",
)
# ``--quick``: one pod list per family that behaves differently (plain, GPU-model
# restricted, multi-GPU), three seeds; for development, not for the README's table.
QUICK_TRACES = ("default", "gpuspec20", "multigpu20")
QUICK_SEEDS = "42-44"
# Weng et al.'s published mean GPU allocation % at 100 % arrived (artifact result files;
# the bars of their Figs. 11-14), for the two policies we run as controls.
PAPER: dict[str, dict[str, float]] = {
    "default": {"bestfit": 92.86, "fgd": 95.23},
    "cpu050": {"bestfit": 93.56, "fgd": 95.00},
    "cpu100": {"bestfit": 93.26, "fgd": 95.21},
    "cpu200": {"bestfit": 92.15, "fgd": 94.82},
    "cpu250": {"bestfit": 91.21, "fgd": 93.20},
    "gpushare40": {"bestfit": 91.44, "fgd": 93.96},
    "gpushare60": {"bestfit": 89.06, "fgd": 91.25},
    "gpushare80": {"bestfit": 86.66, "fgd": 89.08},
    "gpushare100": {"bestfit": 84.62, "fgd": 86.64},
    "gpuspec10": {"bestfit": 93.10, "fgd": 94.66},
    "gpuspec20": {"bestfit": 88.46, "fgd": 94.66},
    "gpuspec25": {"bestfit": 85.67, "fgd": 93.91},
    "gpuspec33": {"bestfit": 80.39, "fgd": 87.84},
    "multigpu20": {"bestfit": 93.73, "fgd": 95.53},
    "multigpu30": {"bestfit": 94.57, "fgd": 96.36},
    "multigpu40": {"bestfit": 95.10, "fgd": 96.91},
    "multigpu50": {"bestfit": 95.62, "fgd": 97.09},
}
ATTRIBUTION = (
    "Trace: Alibaba Cluster Trace Program, cluster-trace-gpu-v2023 (openb). "
    "Paper figures: Weng et al., 'Beware of Fragmentation', USENIX ATC '23 (artifact results)."
)
RESULTS = Path("bench/results")

Job = tuple[Any, ...]


# -- one run (in a worker process) ---------------------------------------------------------


def _allocation_run(job: Job) -> dict[str, Any]:
    from fairshare.simulator import openb, runner

    _kind, trace, pods, seed, policy = job
    t0 = time.perf_counter()
    sim, res = openb.run_trace(Path(trace), pods=pods, seed=seed, policy=policy)
    report = runner.build_report(sim)
    return {
        "kind": "allocation",
        "pods": pods,
        "policy": policy,
        "seed": seed,
        "allocationAt100": res.allocation_at(100),
        "fragmentation": report["cluster"]["fragmentation"],
        "placed": res.placed,
        "failed": res.failed,
        "curve": {str(k): round(v, 4) for k, v in res.curve.items()},
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _fairness_run(job: Job) -> dict[str, Any]:
    from fairshare.simulator import openb

    _kind, trace, pods, seed, policy, weights, load = job
    t0 = time.perf_counter()
    _sim, res = openb.run_saturation(
        Path(trace), pods=pods, seed=seed, policy=policy, weights=weights, load=load
    )
    return {
        "kind": "fairness",
        "pods": pods,
        "policy": policy,
        "seed": seed,
        "allocation": round(res.allocation, 4),
        "maxAbsDeviation": round(res.max_abs_deviation, 4),
        "maxRelDeviation": round(res.max_rel_deviation, 4),
        "jain": round(res.jain, 5),
        "submitted": res.pods,
        "placed": res.placed,
        "pending": res.pending,
        "passes": res.passes,
        "tenants": [
            {
                "tenant": t.tenant,
                "weight": t.weight,
                "pods": t.pods,
                "running": t.running,
                "demand": round(t.demand, 5),
                "share": round(t.share, 5),
                "fair": round(t.fair, 5),
                "gpuShare": round(t.gpu_share, 5),
            }
            for t in res.tenants
        ],
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _run(job: Job) -> dict[str, Any]:
    return _allocation_run(job) if job[0] == "allocation" else _fairness_run(job)


# -- aggregation ------------------------------------------------------------------------------


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "mean": statistics.mean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def _mean_curve(curves: Iterable[dict[str, float]]) -> dict[int, float]:
    acc: dict[int, list[float]] = {}
    for c in curves:
        for k, v in c.items():
            acc.setdefault(int(k), []).append(v)
    return {x: statistics.mean(v) for x, v in sorted(acc.items())}


def summarize(runs: list[dict[str, Any]], traces: Sequence[str]) -> dict[str, Any]:
    allocation: dict[str, Any] = {}
    fairness: dict[str, Any] = {}
    curves: dict[str, dict[str, dict[int, float]]] = {}
    for pods in traces:
        per: dict[str, Any] = {}
        curves[pods] = {}
        for pol in POLICIES:
            rs = [r for r in runs if r["kind"] == "allocation" and r["pods"] == pods]
            rs = [r for r in rs if r["policy"] == pol and r["allocationAt100"] is not None]
            if not rs:
                continue
            per[pol] = _stats([r["allocationAt100"] for r in rs])
            per[pol]["fragmentation"] = statistics.mean(r["fragmentation"] for r in rs)
            curves[pods][pol] = _mean_curve(r["curve"] for r in rs)
        if per:
            per["paper"] = PAPER.get(pods, {})
            if "ours" in per and "fgd" in per:
                per["oursMinusFgd"] = per["ours"]["mean"] - per["fgd"]["mean"]
            allocation[pods] = per
        fair: dict[str, Any] = {}
        for pol in POLICIES:
            rs = [r for r in runs if r["kind"] == "fairness" and r["pods"] == pods]
            rs = [r for r in rs if r["policy"] == pol]
            if not rs:
                continue
            tenants: dict[str, dict[str, float]] = {}
            for r in rs:
                for t in r["tenants"]:
                    acc = tenants.setdefault(t["tenant"], {"weight": t["weight"]})
                    for k in ("demand", "share", "fair", "gpuShare"):
                        acc.setdefault(k + "Sum", 0.0)
                        acc[k + "Sum"] += t[k]
            fair[pol] = {
                "seeds": [r["seed"] for r in rs],
                "allocation": statistics.mean(r["allocation"] for r in rs),
                "maxAbsDeviation": statistics.mean(r["maxAbsDeviation"] for r in rs),
                "maxAbsDeviationWorst": max(r["maxAbsDeviation"] for r in rs),
                "maxRelDeviation": statistics.mean(r["maxRelDeviation"] for r in rs),
                "maxRelDeviationWorst": max(r["maxRelDeviation"] for r in rs),
                "jain": statistics.mean(r["jain"] for r in rs),
                "jainWorst": min(r["jain"] for r in rs),
                "tenants": {
                    name: {
                        "weight": acc["weight"],
                        **{
                            k: acc[k + "Sum"] / len(rs)
                            for k in ("demand", "share", "fair", "gpuShare")
                        },
                    }
                    for name, acc in sorted(tenants.items())
                },
            }
        if fair:
            fairness[pods] = fair
    return {"allocation": allocation, "fairness": fairness, "curves": curves}


# -- rendering --------------------------------------------------------------------------------


def _pm(s: dict[str, float]) -> str:
    return f"{s['mean']:.2f} ± {s['sd']:.2f}"


def _paper(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "–"


def render(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    alloc, fair = summary["allocation"], summary["fairness"]
    seeds = meta["seeds"]
    lines = [
        "### GPU allocation at 100 % arrived (openb, paper protocol)",
        "",
        f"Mean over seeds {seeds[0]}–{seeds[-1]} ({len(seeds)} runs per cell); "
        "bestfit and fgd are our implementations of the paper's controls.",
        "",
        "| trace | ours | bestfit | fgd | paper BestFit | paper FGD | ours − fgd |",
        "|---|---|---|---|---|---|---|",
    ]
    for pods, per in alloc.items():
        cells = [_pm(per[p]) if p in per else "–" for p in POLICIES]
        diff = f"{per['oursMinusFgd']:+.2f}" if "oursMinusFgd" in per else "–"
        lines.append(
            f"| {pods} | {' | '.join(cells)} | {_paper(per['paper'].get('bestfit'))} "
            f"| {_paper(per['paper'].get('fgd'))} | {diff} |"
        )
    lines += ["", "#### Per trace", ""]
    for pods, per in alloc.items():
        lines += [
            f"`{pods}`",
            "",
            "| policy | GPU allocation % (mean ± sd) | min–max | paper | fragmentation % at end |",
            "|---|---|---|---|---|",
        ]
        for p in POLICIES:
            if p not in per:
                continue
            s = per[p]
            lines.append(
                f"| {p} | {_pm(s)} | {s['min']:.2f}–{s['max']:.2f} "
                f"| {_paper(per['paper'].get(p))} | {s['fragmentation']:.2f} |"
            )
        if "oursMinusFgd" in per:
            lines.append(f"| ours − fgd | {per['oursMinusFgd']:+.2f} | | | |")
        lines.append("")
    if fair:
        w = ":".join(f"{x:g}" for x in meta["weights"])
        lines += [
            f"### Fairness at saturation ({len(meta['weights'])} tenants, weights {w}, "
            f"demand {meta['load']:g} × GPU capacity)",
            "",
            "Each tenant's unweighted dominant share at the end against its fair share "
            "(weighted DRF over its admitted demand); deviation = max over tenants, "
            "mean over seeds (worst seed in brackets). Seeds: "
            + ", ".join(
                f"`{pods}` {len(next(iter(per.values()))['seeds'])}" for pods, per in fair.items()
            )
            + ".",
            "",
            "| trace | policy | GPU alloc % | max abs dev (pp) | max rel dev | Jain |",
            "|---|---|---|---|---|---|",
        ]
        for pods, per in fair.items():
            for p in POLICIES:
                if p not in per:
                    continue
                f = per[p]
                lines.append(
                    f"| {pods} | {p} | {f['allocation']:.2f} "
                    f"| {f['maxAbsDeviation']:.2f} ({f['maxAbsDeviationWorst']:.2f}) "
                    f"| {100 * f['maxRelDeviation']:.1f} % "
                    f"({100 * f['maxRelDeviationWorst']:.1f} %) "
                    f"| {f['jain']:.3f} ({f['jainWorst']:.3f}) |"
                )
        first = "default" if "default" in fair else next(iter(fair))
        per = fair[first]
        pols = [p for p in POLICIES if p in per]
        names = list(next(iter(per.values()))["tenants"])
        lines += [
            "",
            f"Per tenant on `{first}` (mean over seeds): dominant share % held "
            "(GPU share % in brackets) against the fair dominant share.",
            "",
            "| tenant | weight | demand % | fair % | " + " | ".join(pols) + " |",
            "|---|---|---|---|" + "---|" * len(pols),
        ]
        for name in names:
            t0 = per[pols[0]]["tenants"][name]
            cells = [
                f"{100 * per[p]['tenants'][name]['share']:.1f} "
                f"({100 * per[p]['tenants'][name]['gpuShare']:.1f})"
                for p in pols
            ]
            lines.append(
                f"| {name} | {t0['weight']:g} | {100 * t0['demand']:.1f} "
                f"| {100 * t0['fair']:.1f} | " + " | ".join(cells) + " |"
            )
    lines += [
        "",
        f"{meta['runs']} runs on {meta['workers']} worker(s), {meta['cores']} cores, "
        f"{meta['seconds'] / 60:.1f} min in all.",
        "",
        ATTRIBUTION,
    ]
    return "\n".join(lines)


def plot(path: Path, summary: dict[str, Any]) -> bool:
    """Allocation against arrived, one panel per trace; False when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {k: v for k, v in summary["curves"].items() if v}
    n = len(curves)
    cols = min(4, n) or 1
    rows = math.ceil(n / cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    styles = {
        "ours": {"color": "tab:green", "lw": 1.8},
        "bestfit": {"color": "tab:blue", "lw": 1.2},
        "fgd": {"color": "tab:orange", "lw": 1.2},
    }
    for ax, (pods, per) in zip(axes.flat, curves.items(), strict=False):
        low = 100.0
        for pol in POLICIES:
            if pol not in per:
                continue
            xs = [x for x in per[pol] if x >= 60]
            ys = [per[pol][x] for x in xs]
            low = min([low, *ys])
            ax.plot(xs, ys, label=pol, **styles[pol])
        for pol, marker in (("bestfit", "s"), ("fgd", "D")):
            v = PAPER.get(pods, {}).get(pol)
            if v is not None:
                low = min(low, v)
                ax.plot(
                    [100],
                    [v],
                    marker=marker,
                    ms=6,
                    ls="none",
                    mfc="none",
                    color=styles[pol]["color"],
                    label=f"paper {pol} at 100 %",
                )
        ax.plot([60, 100], [60, 100], color="0.7", lw=0.8, ls=":", label="all placed")
        ax.set_title(pods)
        ax.set_xlim(60, 101)
        ax.set_ylim(max(0.0, min(60.0, low - 2)), 100)
        ax.grid(alpha=0.3)
        ax.set_xlabel("arrived workload, % of GPU capacity")
        ax.set_ylabel("GPU allocation %")
    spare = list(axes.flat)[n:]
    for ax in spare:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    title = "openb: mean GPU allocation against arrived workload (paper protocol)"
    if spare:
        spare[0].legend(handles, labels, loc="center", frameon=False)
        fig.suptitle(title)
        fig.tight_layout()
    else:
        fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False, fontsize=9)
        fig.suptitle(title)
        fig.tight_layout(rect=(0, 0.12 / rows, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- main -------------------------------------------------------------------------------------


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _weights(text: str | None, k: int) -> tuple[float, ...]:
    from fairshare.simulator import openb

    if text is None:
        return openb.DEFAULT_WEIGHTS if k == len(openb.DEFAULT_WEIGHTS) else (1.0,) * k
    ws = openb.check_weights([float(x) for x in text.replace(":", ",").split(",") if x.strip()])
    if len(ws) != k:
        raise ValueError(f"--weights gives {len(ws)} weights for --tenants {k}")
    return ws


def _commit() -> str | None:
    """The checkout's HEAD commit, if git is at hand."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _describe(job: Job) -> str:
    if job[0] == "allocation":
        return f"allocation {job[2]} {job[4]} seed {job[3]}"
    return f"fairness {job[2]} {job[4]} seed {job[3]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="../shared/data/openb", help="folder with the openb CSVs")
    p.add_argument("--pods", default=None, help="comma list of pod lists (default: TRACES)")
    p.add_argument("--seeds", default=None, help="seed or range, e.g. 42-51 (the default)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"development run: pod lists {','.join(QUICK_TRACES)}, seeds {QUICK_SEEDS} "
        "(--pods/--seeds still override)",
    )
    p.add_argument("--tenants", type=int, default=4, help="tenants for fairness (0: skip it)")
    p.add_argument("--weights", default=None, help="tenant weights, e.g. 1,1,2,4 (the default)")
    p.add_argument("--load", type=float, default=2.0, help="saturation demand × GPU capacity")
    p.add_argument(
        "--fair-seeds",
        type=int,
        default=3,
        help="seeds for the fairness runs on traces other than default (default 3)",
    )
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    from fairshare.simulator import openb

    trace = Path(args.trace)
    if not (trace / openb.NODE_FILE).is_file():
        print(
            f"bench-quality: no openb trace at {args.trace!r}. {openb.TRACE_HELP}", file=sys.stderr
        )
        return 1
    if args.pods is None:
        args.pods = ",".join(QUICK_TRACES if args.quick else TRACES)
    if args.seeds is None:
        args.seeds = QUICK_SEEDS if args.quick else "42-51"
    traces = [t.strip() for t in args.pods.split(",") if t.strip()]
    missing = [t for t in traces if t not in openb.pod_lists(trace)]
    if missing or not traces:
        print(
            f"bench-quality: no pod list {', '.join(missing) or '(none given)'} in "
            f"{args.trace!r}; found {', '.join(openb.pod_lists(trace))}",
            file=sys.stderr,
        )
        return 1
    seeds = _seeds(args.seeds)
    try:
        weights = _weights(args.weights, args.tenants) if args.tenants > 0 else ()
        if args.tenants > 0 and not (math.isfinite(args.load) and args.load > 0):
            raise ValueError(f"--load must be > 0, got {args.load}")
    except ValueError as exc:
        print(f"bench-quality: {exc}", file=sys.stderr)
        return 2
    jobs: list[Job] = []
    if weights:
        # The saturation runs of ours are the long ones: queue them first.
        for pol in POLICIES:
            for pods in traces:
                n = len(seeds) if pods == "default" else max(0, args.fair_seeds)
                for s in seeds[:n]:
                    jobs.append(("fairness", str(trace), pods, s, pol, weights, args.load))
    jobs += [
        ("allocation", str(trace), pods, s, pol)
        for pods in traces
        for pol in POLICIES
        for s in seeds
    ]
    workers = max(1, args.workers)
    print(
        f"bench-quality: {len(jobs)} runs on {workers} worker(s), {os.cpu_count()} cores",
        file=sys.stderr,
    )
    commit = _commit()  # the checkout the runs start from
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures: dict[Future[dict[str, Any]], Job] = {pool.submit(_run, j): j for j in jobs}
        for n, fut in enumerate(as_completed(futures), 1):
            job = futures[fut]
            try:
                r = fut.result()
            except Exception as exc:  # report which run broke, then stop
                print(f"bench-quality: {_describe(job)} failed: {exc!r}", file=sys.stderr)
                raise
            runs.append(r)
            figure = r.get("allocationAt100")
            figure = figure if figure is not None else r.get("allocation")
            print(
                f"  [{n}/{len(jobs)}] {time.perf_counter() - t0:7.0f} s  {_describe(job)}: "
                f"{figure:.2f} % ({r['seconds']} s)",
                file=sys.stderr,
            )
    runs.sort(key=lambda r: (r["kind"], r["pods"], r["policy"], r["seed"]))
    summary = summarize(runs, traces)
    meta = {
        "date": datetime.date.today().isoformat(),
        "traces": traces,
        "seeds": seeds,
        "fairSeeds": {pods: len(seeds) if pods == "default" else args.fair_seeds for pods in traces}
        if weights
        else {},
        "weights": list(weights),
        "load": args.load,
        "workers": workers,
        "cores": os.cpu_count(),
        "commit": commit,
        "runs": len(jobs),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    text = render(summary, meta)
    print(text)
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"quality-{meta['date']}"
    curves = {
        pods: {pol: {str(x): round(v, 3) for x, v in c.items()} for pol, c in per.items()}
        for pods, per in summary["curves"].items()
    }
    for r in runs:
        r.pop("curve", None)
    doc = {
        "meta": meta,
        "allocation": summary["allocation"],
        "fairness": summary["fairness"],
        "curves": curves,
        "runs": runs,
        "summary": text,
        "attribution": ATTRIBUTION,
    }
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    stem.with_suffix(".md").write_text(text + "\n")
    written = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    if plot(stem.with_suffix(".png"), summary):
        written.append(stem.with_suffix(".png"))
    else:
        print(
            "bench-quality: matplotlib is not installed, so no PNG; "
            "install it with: pip install -e '.[bench]'",
            file=sys.stderr,
        )
    print(f"\nwritten: {', '.join(str(w) for w in written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
