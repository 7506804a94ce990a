"""Variants of ours' node choice on the openb trace, paired seed by seed with the shipped rule.

The shipped rule (``placement.choice_levels``): scores rounded to 30 levels, ties to the
first node of the run's fixed node order; pods of whole GPUs by the exact score where no
task class is restricted to GPU models. Each variant changes the choice for one kind of
pod and leaves every other pod, the gate and the protocol as they are; it is installed in
the worker process only (the package is not changed). The report gives, per pod list, the
mean difference in GPU allocation at 100 % arrived against the shipped rule on the same
seeds (same arrival order and node order), its standard error, and on how many seeds the
variant gains.

    python -m tests.bench.choice_variants --pods multigpu30,multigpu40 --seeds 42-51 \\
        --variants fgdint_pack,frac_exact --runs-dir /tmp/variants

A variant: ``pure_fgd``, ``exact_lex_pack``, ``fgdint_pack``, ``fgdint_idx`` (pods of
whole GPUs, where the shipped rule is exact: the FGD gradient alone; the exact score with
packing only as the tie-break; FGD's integer sigmoid with packing, then the node order, as
the tie-breaks; FGD's integers with the node order only); ``big_levels``,
``multi_levels`` (pods of 4+ / 2+ GPUs back on the levels); ``frac_fgdint_pack``,
``frac_exact`` (pods of a GPU fraction: FGD's integers with the packing tie-break; the
exact weighted score).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from tests.bench.bench_quality import _seeds

SHIPPED = "shipped"
WHOLE = ("pure_fgd", "exact_lex_pack", "fgdint_pack", "fgdint_idx")
LEVELS = ("big_levels", "multi_levels")
FRACTION = ("frac_fgdint_pack", "frac_exact")
VARIANTS = (SHIPPED, *WHOLE, *LEVELS, *FRACTION)


def _install(variant: str) -> None:
    """Patch the simulator's node choice for ``variant`` (in this process only)."""
    import fairshare.pipeline as C
    import fairshare.placement as P
    import fairshare.simulator.engine as E

    shipped_levels = P.choice_levels
    if variant == SHIPPED:
        return
    if variant in LEVELS:
        least = 4 if variant == "big_levels" else 2

        def levels(req: P.PodRequest, mix: P.WorkloadMix | None) -> int | None:
            if req.demand.gpu.count >= least:
                return P.CHOICE_LEVELS
            return shipped_levels(req, mix)

        C.choice_levels = levels  # type: ignore[assignment]
        return
    shipped_score = E.Simulation._score

    def applies(sim: E.Simulation, req: P.PodRequest) -> bool:
        if sim.policy != "ours":
            return False
        g = req.demand.gpu
        if variant in FRACTION:
            return g.count > 0 and g.source != "mig" and g.per_device < 1
        return shipped_levels(req, sim._context().mix) is None

    def score(sim: E.Simulation, req: P.PodRequest, fr: Any) -> P.Scored:
        if not applies(sim, req) or not fr.fits:
            return shipped_score(sim, req, fr)
        ctx = sim._context()
        mask = P.candidates(sim.state, fr.fits)
        delta, device = P.fgd_raw(sim.state, req, mask, ctx)
        tie = sim.tie_rank
        rank: Callable[[int], int] = (lambda i: i) if tie is None else tie.__getitem__
        key: Callable[[int], tuple[float, ...]]
        if variant == "pure_fgd":
            key = lambda i: (-delta[i], rank(i))  # noqa: E731
        elif variant == "frac_exact":
            exact = sim.scorer(sim.state, req, fr.fits, ctx).scores
            key = lambda i: (-exact[i], rank(i))  # noqa: E731
        else:
            pack, _ = P.score_packing(sim.state, req, mask, ctx)
            ints = {i: int(100.0 / (1.0 + math.exp(-delta[i] / 1000.0))) for i in fr.fits}
            if variant == "fgdint_idx":
                key = lambda i: (-ints[i], rank(i))  # noqa: E731
            elif variant == "exact_lex_pack":
                key = lambda i: (-delta[i], -pack[i], rank(i))  # noqa: E731
            else:  # fgdint_pack, frac_fgdint_pack
                key = lambda i: (-ints[i], -pack[i], rank(i))  # noqa: E731
        pick = min(fr.fits, key=key)
        return P.Scored({pick: 1.0}, {pick: device[pick]})

    E.Simulation._score = score  # type: ignore[method-assign]


def _path(runs: Path, variant: str, pods: str, seed: int) -> Path:
    return runs / variant / f"allocation-{pods}-ours-{seed}.json"


def _run(job: tuple[str, str, str, int, str]) -> None:
    trace, runs, variant, pods, seed = job[0], Path(job[1]), job[2], job[3], job[4]
    _install(variant)
    from fairshare.simulator.openb import run_trace

    start = time.process_time()
    _, result = run_trace(Path(trace), pods=pods, seed=int(seed), policy="ours")
    out = _path(runs, variant, pods, int(seed))
    out.parent.mkdir(parents=True, exist_ok=True)
    at100 = result.allocation_at(100)
    record = {"allocationAt100": at100, "cpuSeconds": round(time.process_time() - start, 2)}
    out.write_text(json.dumps(record))


def _load(runs: Path, variant: str, pods: str, seed: int) -> float | None:
    p = _path(runs, variant, pods, seed)
    if not p.exists():
        return None
    value = json.loads(p.read_text()).get("allocationAt100")
    return float(value) if value is not None else None


def report(runs: Path, variants: list[str], pods: list[str], seeds: list[int]) -> str:
    """Markdown: per variant and pod list, mean Δ vs shipped ± se (seeds gaining / paired)."""
    head = "| variant | " + " | ".join(pods) + " |"
    lines = [head, "|---" * (len(pods) + 1) + "|"]
    base = {p: [_load(runs, SHIPPED, p, s) for s in seeds] for p in pods}
    for row in (SHIPPED, *[v for v in variants if v != SHIPPED]):
        cells = []
        for p in pods:
            pairs = [
                (x, y)
                for x, y in zip([_load(runs, row, p, s) for s in seeds], base[p], strict=True)
                if x is not None and y is not None
            ]
            if not pairs:
                cells.append("–")
            elif row == SHIPPED:
                cells.append(f"{statistics.mean(x for x, _ in pairs):.2f}")
            else:
                d = [x - y for x, y in pairs]
                se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
                gains = sum(v > 0 for v in d)
                cells.append(f"{statistics.mean(d):+.3f} ± {se:.3f} ({gains}/{len(d)})")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="../shared/data/openb", help="folder with the openb CSVs")
    ap.add_argument("--pods", default="multigpu30,multigpu40", help="comma list of pod lists")
    ap.add_argument("--seeds", default="42-51", help="seed or range, e.g. 42-51")
    ap.add_argument("--variants", default=",".join(VARIANTS[1:]), help="comma list of variants")
    ap.add_argument("--runs-dir", required=True, help="one JSON per run; runs there are reused")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        ap.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; "
                 f"choose from {', '.join(VARIANTS)}")  # fmt: skip
    if args.workers < 1:
        ap.error("--workers: at least 1")
    trace = Path(args.trace)
    if not trace.is_dir():
        ap.error(f"--trace: {trace} is not a folder")
    from fairshare.simulator import openb

    pods = [p for p in args.pods.split(",") if p]
    missing = [p for p in pods if p not in openb.pod_lists(trace)]
    if missing or not pods:
        ap.error(f"--pods: no pod list {', '.join(missing) or '(none given)'} in {trace}; "
                 f"found {', '.join(openb.pod_lists(trace))}")  # fmt: skip
    try:
        seeds = _seeds(args.seeds)
    except ValueError:
        ap.error(f"--seeds: {args.seeds!r} is not a seed or a range such as 42-51")
    if not seeds:
        ap.error(f"--seeds: {args.seeds!r} holds no seed")
    runs = Path(args.runs_dir)
    todo = [
        (str(trace), str(runs), v, p, s)
        for v in (SHIPPED, *variants)
        for p in pods
        for s in seeds
        if not _path(runs, v, p, s).exists()
    ]
    todo = list(dict.fromkeys(todo))
    print(f"{len(todo)} runs to do on {args.workers} worker(s)", file=sys.stderr, flush=True)
    start = time.monotonic()
    with Pool(args.workers, maxtasksperchild=1) as pool:
        for n, _ in enumerate(pool.imap_unordered(_run, todo), 1):
            spent = time.monotonic() - start
            left = spent / n * (len(todo) - n)
            print(f"{n}/{len(todo)} runs, {left / 60:.1f} min left", file=sys.stderr, flush=True)
    print(report(runs, variants, pods, seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
