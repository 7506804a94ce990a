"""Cost of one fair-share gate decision on a saturated openb cluster.

Run with ``python -m tests.bench.bench_gate --trace DIR`` (the openb CSVs). It builds a
saturated state with the saturation protocol of ``fairshare/simulator/openb.py``
(``--policy``, default ``fgd``: the quickest to build; its tenants end at equal, not
weighted, shares, so every tenant above its fair share makes the gate probe the
others' queues), then times ``gate.check_fair_gate`` for a sample of pending pods of
every tenant, with the fair allocation cached as the simulator caches it:

* **cold**: no memo (a node changed, or room was given back): every shape is probed;
* **after a bind**: the per-state memo is gone, the shapes known to fit nowhere stay
  (``ClusterState.memo(..., growing_only=True)``), as after each bind of a pass;

each with the dominance skip (``gate.dominates``: a shape asking at least as much
as one that fits nowhere is not probed) and without it (the previous behaviour).
``--hold-for-blocked`` times the gate with ``holdForBlockedTenants`` on (a lower-share
tenant with no pod that fits now is also probed against the drained nodes; "cold" then
also drops the drained state and its memo, as a node change does).
Figures are printed, never asserted: they depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fairshare import gate
from fairshare.placement import PodRequest
from fairshare.simulator import openb
from fairshare.simulator.engine import Simulation


def saturated(trace: Path, pods: str, seed: int, policy: str) -> Simulation:
    sim, _ = openb.run_saturation(trace, pods=pods, seed=seed, policy=policy)  # type: ignore[arg-type]
    sim.policy = "ours"
    return sim


@contextmanager
def probes_counted() -> Iterator[list[int]]:
    """Count ``pod_fits_somewhere`` calls (node probes) while inside."""
    real = gate.cluster.pod_fits_somewhere
    n = [0]

    def counting(state: Any, p: PodRequest) -> bool:
        n[0] += 1
        return real(state, p)

    gate.cluster.pod_fits_somewhere = counting  # type: ignore[assignment]
    try:
        yield n
    finally:
        gate.cluster.pod_fits_somewhere = real  # type: ignore[assignment]


@contextmanager
def without_dominance() -> Iterator[None]:
    """Only shapes probed before count as misfits (the skip turned off)."""
    real = gate.cluster._Misfits.covers

    def listed(self: Any, key: Any, order: Any, mig: bool) -> bool:
        return key in self.keys

    gate.cluster._Misfits.covers = listed  # type: ignore[method-assign]
    try:
        yield
    finally:
        gate.cluster._Misfits.covers = real  # type: ignore[method-assign]


def forget(sim: Simulation, *, keep_no_fit: bool) -> None:
    """Drop the gate's memos as a node change (all) or a bind (per-state only) does."""
    memos = sim.state._memos
    memos.pop("gate.shape_fits", None)
    if not keep_no_fit:
        memos.pop("gate.shape_fits_nowhere", None)
        sim.state._drained = None


def decide(sim: Simulation, reqs: list[PodRequest], *, keep_no_fit: bool) -> Callable[[], None]:
    pending = list(sim.pending.values())
    fair = sim.fair_shares()

    def run() -> None:
        for r in reqs:
            forget(sim, keep_no_fit=keep_no_fit)
            gate.check_fair_gate(sim.state, config=sim.config, req=r, pending=pending, fair=fair)

    return run


def timed(call: Callable[[], None], reps: int, n: int) -> tuple[float, float]:
    """(median, min) CPU seconds per decision over ``reps`` rounds of ``n`` decisions
    (process time: on a shared machine wall time mostly measures the other load)."""
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        call()
        times.append((time.process_time() - t0) / n)
    return statistics.median(times), min(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="../shared/data/openb", help="folder with the openb CSVs")
    p.add_argument("--pods", default="gpuspec20", help="pod list (default gpuspec20)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--policy", default="fgd", choices=("ours", "bestfit", "fgd"))
    p.add_argument("--sample", type=int, default=20, help="pending pods per tenant timed")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--hold-for-blocked", action="store_true", help="gate with holdForBlockedTenants on"
    )
    args = p.parse_args(argv)
    trace = Path(args.trace)
    if not (trace / openb.NODE_FILE).is_file():
        print(f"bench-gate: no openb trace at {args.trace!r}. {openb.TRACE_HELP}", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    sim = saturated(trace, args.pods, args.seed, args.policy)
    if args.hold_for_blocked:
        sim.config = sim.config.model_copy(update={"hold_for_blocked_tenants": True})
    by_tenant: dict[str, list[PodRequest]] = {}
    for r in sim.pending.values():
        if r.tenant is not None and len(by_tenant.setdefault(r.tenant, [])) < args.sample:
            by_tenant[r.tenant].append(r)
    reqs = [r for t in sorted(by_tenant) for r in by_tenant[t]]
    shapes = len({gate.shape_key(r) for r in sim.pending.values()})
    print(
        f"bench-gate: {args.pods} seed {args.seed}, saturated by {args.policy} in "
        f"{time.perf_counter() - t0:.0f} s: {100 * sim.gpu_allocation_ratio():.2f} % GPU "
        f"allocated, {len(sim.pending)} pods pending in {shapes} shapes; "
        f"{len(reqs)} decisions timed per round, {args.reps} rounds, "
        f"holdForBlockedTenants {'on' if args.hold_for_blocked else 'off'}\n"
    )
    print("| memo at each decision | dominance skip | CPU per decision: median (min) | probes |")
    print("|---|---|---|---|")
    for label, keep in (("cold (none)", False), ("after a bind (no-fit kept)", True)):
        for skip in (False, True):
            ctx = without_dominance() if not skip else _null()
            forget(sim, keep_no_fit=False)
            with ctx, probes_counted() as n:
                med, low = timed(decide(sim, reqs, keep_no_fit=keep), args.reps, len(reqs))
            per = n[0] / (args.reps * len(reqs))
            print(
                f"| {label} | {'on' if skip else 'off'} | {med * 1e3:.2f} ms "
                f"({low * 1e3:.2f} ms) | {per:.1f} |"
            )
    return 0


@contextmanager
def _null() -> Iterator[None]:
    yield


if __name__ == "__main__":
    sys.exit(main())
