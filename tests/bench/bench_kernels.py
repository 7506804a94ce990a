"""Micro-benchmark of the ``_native`` kernels: compiled (C) against the pure-Python twin.

Run with ``python -m tests.bench.bench_kernels`` (``make bench-kernels``). For 1,000,
5,000 and 10,000 nodes × 6 resources it times one call of ``fit_nodes``,
``bestfit_scores``, ``drfh_scores`` and ``fgd_scores`` (8 devices per node, 35 task
classes, a fractional pod: the costliest FGD case), plus a plain NumPy ``bestfit`` for
scale. Each cell is the median and min–max of N calls (``time.perf_counter``); N adapts
so that every cell takes about a second, and the whole run stays well under two minutes.

Prints a markdown table and writes ``bench/results/kernels-<YYYY-MM-DD>.json``. Times are
reported, never asserted: they depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import array
import datetime
import importlib
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SIZES = (1_000, 5_000, 10_000)
N_RES = 6  # cpu, memory, gpu, ephemeral storage, two extended resources
GPU_COL = 2
MAX_DEV = 8
N_CLASSES = 35
SEED = 20230710


@dataclass(frozen=True)
class Cluster:
    n: int
    free: array.array[float]
    capacity: array.array[float]
    demand: array.array[float]
    norm: array.array[float]
    weights: array.array[float]
    mask: array.array[int]
    dev_free: array.array[float]
    node_cpu: array.array[float]
    node_model: array.array[int]
    cls: tuple[Any, ...]  # cls_cpu, cls_gpu_milli, cls_gpu_count, cls_models, cls_pop, n


def make_cluster(n: int, seed: int = SEED) -> Cluster:
    """A seeded openb-like cluster: 0–8 GPUs per node, partly used, a few GPU models."""
    rng = random.Random(seed)
    cap_row = [96_000.0, 512.0 * 2**30, 8_000.0, 2.0**40, 110.0, 16.0]
    capacity: list[float] = []
    free: list[float] = []
    dev_free: list[float] = []
    node_cpu: list[float] = []
    for _ in range(n):
        n_dev = rng.choice([0, 1, 2, 4, 8, 8, 8])
        devs = [rng.choice([0.0, 250.0, 500.0, 700.0, 1000.0, 1000.0]) for _ in range(n_dev)]
        dev_free += devs + [-1.0] * (MAX_DEV - n_dev)
        row = list(cap_row)
        row[GPU_COL] = 1000.0 * n_dev
        capacity += row
        used = [float(int(rng.random() * c)) for c in row]
        used[GPU_COL] = 1000.0 * n_dev - sum(devs)
        free += [c - u for c, u in zip(row, used, strict=True)]
        node_cpu.append(row[0] - used[0])
    pops = [rng.random() for _ in range(N_CLASSES)]
    total = sum(pops)
    cls = (
        array.array("d", [float(rng.choice([0, 1000, 4000, 8000, 16000])) for _ in pops]),
        array.array("d", [float(rng.choice([0, 100, 250, 500, 1000, 1000])) for _ in pops]),
        array.array("q", [rng.choice([1, 1, 1, 2, 4, 8]) for _ in pops]),
        array.array("q", [rng.choice([0, 0, 0, 1 << 3, (1 << 1) | (1 << 5)]) for _ in pops]),
        array.array("d", [p / total for p in pops]),
        N_CLASSES,
    )
    return Cluster(
        n=n,
        free=array.array("d", free),
        capacity=array.array("d", capacity),
        demand=array.array("d", [4000.0, 16.0 * 2**30, 500.0, 2.0**30, 0.0, 0.0]),
        norm=array.array("d", cap_row),
        weights=array.array("d", [0.5, 0.0, 0.5, 0.0, 0.0, 0.0]),
        mask=array.array("b", [1 if rng.random() < 0.9 else 0 for _ in range(n)]),
        dev_free=array.array("d", dev_free),
        node_cpu=array.array("d", node_cpu),
        node_model=array.array("q", [rng.randrange(-1, 8) for _ in range(n)]),
        cls=cls,
    )


def kernel_calls(fit: ModuleType, scoring: ModuleType, k: Cluster) -> dict[str, Callable[[], Any]]:
    """One zero-argument closure per kernel, outputs preallocated."""
    out_i = array.array("i", [0] * k.n)
    out_d = array.array("d", [0.0] * k.n)
    return {
        "fit_nodes": lambda: fit.fit_nodes(
            k.free, k.dev_free, k.demand, k.n, N_RES, MAX_DEV, 500.0, 1, out_i
        ),
        "bestfit_scores": lambda: scoring.bestfit_scores(
            k.free, k.demand, k.norm, k.weights, k.mask, k.n, N_RES, out_d
        ),
        "drfh_scores": lambda: scoring.drfh_scores(
            k.free, k.capacity, k.demand, k.mask, k.n, N_RES, out_d
        ),
        "fgd_scores": lambda: scoring.fgd_scores(
            k.dev_free,
            MAX_DEV,
            k.node_cpu,
            k.node_model,
            k.mask,
            k.n,
            4000.0,
            500.0,
            1,
            *k.cls,
            out_d,
            out_i,
        ),
    }


def numpy_bestfit(np: Any, k: Cluster) -> Callable[[], Any]:
    """A straightforward vectorised bestfit over the same buffers (zero-copy views)."""
    free = np.frombuffer(k.free, dtype=np.float64).reshape(k.n, N_RES)
    demand = np.frombuffer(k.demand, dtype=np.float64)
    norm = np.frombuffer(k.norm, dtype=np.float64)
    w = np.frombuffer(k.weights, dtype=np.float64)
    mask = np.frombuffer(k.mask, dtype=np.int8) != 0
    sel = (norm > 0) & (w > 0)
    wsum = w[sel].sum()

    def call() -> Any:
        left = (free[:, sel] - demand[sel]) * w[sel] / norm[sel]
        s = np.clip(1.0 - left.sum(axis=1) / wsum, 0.0, 1.0)
        return np.where(mask, s, -1.0)

    return call


def measure(call: Callable[[], Any], budget: float, max_reps: int) -> dict[str, Any]:
    """Median and min–max seconds per call over N calls, N fitted to ``budget`` seconds."""
    t0 = time.perf_counter()
    call()  # warm-up, and a first estimate
    first = time.perf_counter() - t0
    reps = max(3, min(max_reps, int(budget / max(first, 1e-9))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "reps": reps,
    }


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def cell(m: dict[str, Any] | None) -> str:
    if m is None:
        return "n/a"
    return f"{fmt(m['median_s'])} ({fmt(m['min_s'])}–{fmt(m['max_s'])}, N={m['reps']})"


def load_c() -> tuple[ModuleType, ModuleType] | None:
    try:
        return importlib.import_module("_native.fit_c"), importlib.import_module(
            "_native.scoring_c"
        )
    except ImportError:
        return None


def run(budget: float, sizes: tuple[int, ...]) -> dict[str, Any]:
    from _native import fit_py, scoring_py

    c_mods = load_c()
    np: Any
    try:
        np = importlib.import_module("numpy")
    except ImportError:
        np = None
    rows: list[dict[str, Any]] = []
    for n in sizes:
        k = make_cluster(n)
        py_calls = kernel_calls(fit_py, scoring_py, k)
        c_calls = kernel_calls(*c_mods, k) if c_mods else None
        for name, py_call in py_calls.items():
            row: dict[str, Any] = {"kernel": name, "nodes": n, "resources": N_RES}
            row["c"] = measure(c_calls[name], budget, 2000) if c_calls else None
            row["py"] = measure(py_call, budget, 200)
            row["numpy"] = None
            if name == "bestfit_scores" and np is not None:
                np_call = numpy_bestfit(np, k)
                row["numpy"] = measure(np_call, budget, 2000)
                want = np.frombuffer(_bestfit_out(scoring_py, k), np.float64)
                row["numpy_max_abs_diff"] = float(np.max(np.abs(np_call() - want), initial=0.0))
            if row["c"] is not None:
                row["speedup_py_over_c"] = row["py"]["median_s"] / row["c"]["median_s"]
            rows.append(row)
            progress = f"{name:15s} {n:6d} nodes: c {cell(row['c'])}, py {cell(row['py'])}"
            print(progress, file=sys.stderr)
    return {
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "workload": {
            "resources": N_RES,
            "devices_per_node": MAX_DEV,
            "fgd_classes": N_CLASSES,
            "fgd_pod": "4 cores, 500 milli-GPU x1 (fractional)",
            "seed": SEED,
            "budget_s_per_cell": budget,
        },
        "c_available": c_mods is not None,
        "numpy": None if np is None else np.__version__,
        "results": rows,
    }


def _bestfit_out(scoring: ModuleType, k: Cluster) -> array.array[float]:
    out = array.array("d", [0.0] * k.n)
    scoring.bestfit_scores(k.free, k.demand, k.norm, k.weights, k.mask, k.n, N_RES, out)
    return out


def table(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"Kernel timings per call, {report['date']}: {m['cpu_count']} cores "
        f"(os.cpu_count()), {m['processor']}, Python {m['python']}. "
        "Median (min–max, N calls).",
        "",
        "| kernel | nodes | C | py twin | NumPy | speedup py/C |",
        "|---|---:|---|---|---|---:|",
    ]
    for r in report["results"]:
        speed = r.get("speedup_py_over_c")
        lines.append(
            f"| {r['kernel']} | {r['nodes']:,} | {cell(r['c'])} | {cell(r['py'])} "
            f"| {cell(r['numpy'])} | {'n/a' if speed is None else f'{speed:,.0f}×'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per cell (~1)")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(SIZES), help="node counts to run"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: dated)")
    args = parser.parse_args(argv)
    report = run(args.budget, tuple(args.sizes))
    print(table(report))
    out = args.out or ROOT / "bench" / "results" / f"kernels-{report['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
