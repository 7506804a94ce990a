"""Cost of one ``fairness.fair_allocation`` call on a tree of tenants.

Run with ``python -m tests.bench.bench_fairness``. Builds a seeded three-level tree
(organisations → teams → projects) with about 100 and about 1,000 leaf tenants asking for
mixed CPU / memory / GPU demands (a third of them small enough to be met, a few idle),
weights 1–3 at every level and a limit on some organisations, and times one call of
``fair_allocation`` (median and min–max of N calls, N adapting to about a second per size).
Also times a flat config of the same leaves. Times are printed, never asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from fairshare.fairness import TenantDemand, fair_allocation

SEED = 20131001
CAPACITY = (4_000.0, 16_000.0, 512.0)  # CPU cores, GiB, GPUs
RES_WEIGHTS = (1.0, 1.0, 1.0)


def make_tree(n_orgs: int, teams: int, projects: int, *, seed: int = SEED) -> list[TenantDemand]:
    """n_orgs × teams × projects leaves, with their organisations and teams."""
    rng = random.Random(seed)
    out: list[TenantDemand] = []
    for o in range(n_orgs):
        org = f"org{o:02d}"
        limit = {2: CAPACITY[2] / 3} if o % 3 == 0 else {}
        out.append(TenantDemand(org, float(rng.choice((1, 2, 3))), (0.0, 0.0, 0.0), {}, limit))
        for t in range(teams):
            team = f"{org}-team{t:02d}"
            out.append(TenantDemand(team, float(rng.choice((1, 2))), (0.0, 0.0, 0.0), {}, {}, org))
            for p in range(projects):
                kind = rng.random()
                scale = 0.2 if kind < 0.33 else 10.0
                if kind > 0.95:
                    demand = (0.0, 0.0, 0.0)
                elif kind < 0.6:
                    demand = (rng.uniform(8, 64), rng.uniform(32, 256), rng.choice((0.0, 8.0)))
                else:
                    demand = (rng.uniform(1, 8), rng.uniform(8, 64), rng.uniform(1, 16))
                demand = tuple(v * scale for v in demand)
                name = f"{team}-p{p:02d}"
                out.append(TenantDemand(name, float(rng.choice((1, 1, 2))), demand, {}, {}, team))
    return out


def flat(tenants: list[TenantDemand]) -> list[TenantDemand]:
    inner = {t.parent for t in tenants}
    return [
        TenantDemand(t.name, t.weight, t.demand, t.guaranteed, t.limit)
        for t in tenants
        if t.name not in inner
    ]


def measure(tenants: list[TenantDemand], budget: float) -> dict[str, Any]:
    times: list[float] = []
    spent = 0.0
    while spent < budget or len(times) < 3:
        start = time.perf_counter()
        fair_allocation(tenants, capacity=CAPACITY, res_weights=RES_WEIGHTS)
        times.append(time.perf_counter() - start)
        spent += times[-1]
        if len(times) >= 200:
            break
    return {
        "n": len(times),
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per cell")
    args = parser.parse_args(argv)
    print("| tenants (leaves) | shape | fair_allocation median (min–max), N |")
    print("|---|---|---|")
    for n_orgs, teams, projects in ((4, 5, 5), (10, 10, 10)):
        tree = make_tree(n_orgs, teams, projects)
        leaves = n_orgs * teams * projects
        for label, tenants in (("3-level tree", tree), ("flat", flat(tree))):
            m = measure(tenants, args.budget)
            print(
                f"| {len(tenants)} ({leaves}) | {label} | {m['median'] * 1e3:.2f} ms "
                f"({m['min'] * 1e3:.2f}–{m['max'] * 1e3:.2f}), {m['n']} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
