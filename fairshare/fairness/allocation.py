"""The fair allocation: ``fair_allocation``, flat weighted DRF by progressive filling; a
config whose tenants name a parent goes to ``hierarchy.hierarchical_allocation``. The
definitions are in ``fairshare.fairness``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fairshare.fairness.hierarchy import hierarchical_allocation
from fairshare.fairness.shares import (
    EPS,
    MIN_LEVEL,
    FairShare,
    TenantDemand,
    _dom,
    _level,
)


def fair_allocation(
    tenants: Sequence[TenantDemand],
    *,
    capacity: Sequence[float],
    res_weights: Sequence[float],
) -> dict[str, FairShare]:
    """Weighted DRF fair allocation by progressive filling (see ``fairshare.fairness``).

    Each tenant gets ``x_t * demand_t`` with ``x_t`` in [0, 1]. ``guaranteed`` sets the
    starting level (scaled down together if the guarantees do not fit the capacity);
    ``limit`` caps the level. Tenants without demand get an empty allocation, share 0.
    When some tenant names a ``parent``, the tenants form a tree and the allocation is
    hierarchical (``hierarchical_allocation``).
    """
    if any(t.parent is not None for t in tenants):
        return hierarchical_allocation(tenants, capacity=capacity, res_weights=res_weights)
    order = sorted(tenants, key=lambda t: t.name)
    x = _fill(order, capacity, capacity, res_weights, use_guarantees=True)
    result: dict[str, FairShare] = {}
    for t in order:
        alloc = tuple(x[t.name] * v for v in t.demand)
        share = _dom(alloc, capacity, res_weights)
        weighted = share / t.weight if t.weight > 0 else (math.inf if share > 0 else 0.0)
        result[t.name] = FairShare(t.name, alloc, weighted, x[t.name])
    return result


def _fill(
    order: Sequence[TenantDemand],
    capacity: Sequence[float],
    avail: Sequence[float],
    res_weights: Sequence[float],
    *,
    use_guarantees: bool,
) -> dict[str, float]:
    """Progressive filling of ``order`` (sorted by name) inside ``avail``; levels x_t.

    ``capacity`` measures dominant shares (the whole cluster); ``avail`` is what may be
    handed out (the cluster itself for flat DRF, a parent's allocation in a tree). A
    resource of zero ``capacity`` is not constrained.
    """
    n_res = len(capacity)
    x: dict[str, float] = {}
    xmax: dict[str, float] = {}
    rate: dict[str, float] = {}
    for t in order:
        d = _dom(t.demand, capacity, res_weights)
        xmax[t.name] = _level(t.limit, t.demand) if t.limit else 1.0
        g = _level(t.guaranteed, t.demand) if t.guaranteed and use_guarantees else 0.0
        x[t.name] = min(g, xmax[t.name])
        if x[t.name] < MIN_LEVEL:
            # A level this small (a subnormal guarantee) underflows in x / rate and left
            # the tenant neither growing nor frozen; it guarantees nothing measurable.
            x[t.name] = 0.0
        rate[t.name] = t.weight / d if 0 < d < math.inf and t.weight > 0 else 0.0
    by_name = {t.name: t for t in order}

    def usage(r: int) -> float:
        return sum(x[t.name] * t.demand[r] for t in order)

    # Guarantees that together overflow a resource are scaled down together.
    scale = 1.0
    for r in range(n_res):
        u = usage(r)
        if u > avail[r] and capacity[r] > 0:
            scale = min(scale, avail[r] / u)
    if scale < 1.0:
        for name in x:
            x[name] *= scale

    active = {t.name for t in order if rate[t.name] > 0 and x[t.name] < xmax[t.name]}

    def freeze_saturated() -> None:
        for r in range(n_res):
            if capacity[r] > 0 and usage(r) >= avail[r] * (1 - EPS):
                for name in sorted(active):
                    if by_name[name].demand[r] > 0:
                        active.discard(name)

    freeze_saturated()
    lam = 0.0
    while active:
        # The next breakpoint: a tenant leaves its guaranteed plateau or reaches its cap.
        next_bp = math.inf
        for name in active:
            start, stop = x[name] / rate[name], xmax[name] / rate[name]
            next_bp = min(next_bp, start if start > lam * (1 + EPS) else stop)
        growing = [n for n in sorted(active) if lam * rate[n] >= x[n] * (1 - EPS)]
        lam_next = next_bp
        for r in range(n_res):
            slope = sum(rate[n] * by_name[n].demand[r] for n in growing)
            if slope > 0 and capacity[r] > 0:
                lam_next = min(lam_next, lam + (avail[r] - usage(r)) / slope)
        lam_next = max(lam_next, lam)
        for n in growing:
            x[n] = min(xmax[n], max(x[n], lam_next * rate[n]))
        lam = lam_next
        for n in sorted(active):
            if x[n] >= xmax[n] * (1 - EPS):
                x[n] = xmax[n]
                active.discard(n)
        freeze_saturated()
        if not growing and next_bp == math.inf:
            break
    return x
