"""The no-take-back rule of reclaim toward fair share, on and off, over the same worlds.

    python -m tests.bench.bench_take_back [--worlds 2000]

The worlds are the reclaim property test's (``test_reclaim_property.hold_worlds``: 1 to 3
nodes of 4 GPUs, guarantees, up to 30 arrivals of pods up to a whole node) with
``holdForBlockedTenants`` and ``reclaimToFairShare`` on and a ``yieldBand`` of 0, 0.1 or
0.25, drawn deterministically (hypothesis, derandomized). Each world is played to the end
twice by the property test's simulator: with the records of who gave room to whom
(``holds.ANN_RECLAIMED_FROM``) and without them (each plan alone). Printed: how many
worlds end differently, how many reverse a pair without the records, and the evictions
in all, with and without. Figures only, never asserted.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit import test_reclaim_property as prop


def play(world: Any, band: float, *, records: bool) -> tuple[tuple[float, ...], int, int]:
    """(GPUs of each tenant at the end, evictions, reversed pairs)."""
    guarantees, n_nodes, seq = world
    sim = prop.Sim(
        guarantees,
        n_nodes,
        records=records,
        holdForBlockedTenants=True,
        reclaimToFairShare=True,
        yieldBand=band,
    )
    sim.check_reversals = False  # counted here instead
    now, evictions = 0.0, 0
    for tenant, gpus in seq:
        sim.arrive(tenant, gpus)
        sim.place()
        now += 1
        evictions += sim.reclaim_round(now)
    for _ in range(prop.SETTLE_ROUNDS):
        now += 1
        n = sim.reclaim_round(now)
        evictions += n
        if n == 0:
            break
    seen: set[tuple[str, str]] = set()
    reversed_ = 0
    for pair in sim.pairs:
        reversed_ += (pair[1], pair[0]) in seen
        seen.add(pair)
    return tuple(sim.gpus_of(t) for t in prop.TENANTS), evictions, reversed_


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, default=2000)
    args = ap.parse_args()
    tally = {"worlds": 0, "differ": 0, "reversing": 0, "ev_on": 0, "ev_off": 0}
    started = time.perf_counter()

    @settings(
        max_examples=args.worlds,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(prop.hold_worlds(), st.sampled_from([0.0, 0.1, 0.25]))
    def each(world: Any, band: float) -> None:
        on = play(world, band, records=True)
        off = play(world, band, records=False)
        tally["worlds"] += 1
        tally["ev_on"] += on[1]
        tally["ev_off"] += off[1]
        tally["reversing"] += off[2] > 0
        if on[0] != off[0]:
            tally["differ"] += 1
            print(f"differs: band {band} {world}: GPUs {on[0]} with, {off[0]} without")
        if tally["worlds"] % 250 == 0:
            print(f"... {tally['worlds']} worlds", flush=True)

    each()
    took = time.perf_counter() - started
    print(
        f"{tally['worlds']} worlds in {took:.0f} s: {tally['differ']} end differently; "
        f"{tally['reversing']} reverse a pair without the records; evictions "
        f"{tally['ev_on']} with the records, {tally['ev_off']} without"
    )


if __name__ == "__main__":
    main()
