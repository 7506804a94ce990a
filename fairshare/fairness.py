"""Weighted dominant-resource fairness: shares, the fair allocation, and the gate.

Pure and deterministic: no network, no clock, no globals; tenants are always
visited in name order. Must not import aiohttp, kubernetes_asyncio or
prometheus_client. The per-tenant share kernel is in ``_native.drf``.

Definitions (Ghodsi et al., "Dominant Resource Fairness", NSDI'11, with weights):

* A tenant's **dominant share** is ``max_r(rw_r * used_r / capacity_r) / w_t`` where
  ``rw_r`` is the resource weight from the config and ``w_t`` the tenant's weight.
  A resource of zero capacity is ignored, used or not: the cluster's arrays hold none
  of it (GPUs offered only through DRA, ``storage`` with no capacity declared), so no
  share of it can be measured, and one tenant's use of it must not make its share
  infinite (which would freeze every fair allocation it takes part in).
* The **fair allocation** is computed by progressive filling: every tenant's
  allocation grows along the direction of its demand (running + pending), with
  weighted dominant shares rising at the same pace, starting from its
  ``guaranteed`` level. A tenant stops growing when it reaches its demand, its
  ``limit``, or when a resource it needs is exhausted. The result is Pareto-efficient
  for divisible demand, so it is work-conserving: nothing a tenant could still use is
  left unassigned.
* The **gate**: a pod of tenant t waits when t's share *after* the pod would exceed
  t's fair share **and** another tenant u with a lower current share (ties broken by
  tenant name) has a pending pod that fits now. The lowest-share tenant with a fitting
  pod is never held back, so no capacity is idle while a pod that fits waits.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NewType

from _native import drf

CurrentShare = NewType("CurrentShare", float)
ShareAfter = NewType("ShareAfter", float)

EPS = 1e-9
"""Relative tolerance for share comparisons (shares are ratios of exact integers)."""


def dominant_shares(
    *,
    used: Mapping[str, Sequence[float]],
    capacity: Sequence[float],
    res_weights: Sequence[float],
    tenant_weights: Mapping[str, float],
) -> dict[str, float]:
    """Weighted dominant share of every tenant in ``used`` (rows in kernel units).

    Range [0, +inf). A tenant missing from ``tenant_weights`` has weight 1.
    """
    names = sorted(used)
    n_res = len(capacity)
    if n_res == 0:
        raise ValueError("no resources")
    if len(res_weights) != n_res:
        raise ValueError("res_weights and capacity differ in length")
    flat = array("d")
    for name in names:
        row = used[name]
        if len(row) != n_res:
            raise ValueError(f"tenant {name}: usage row has {len(row)} columns, want {n_res}")
        flat.extend(row)
    tw = array("d", [float(tenant_weights.get(n, 1.0)) for n in names])
    out = array("d", bytes(8 * len(names)))
    # Zero capacity: weight 0, which the kernel skips (its own rule would give +inf).
    rw = array("d", [w if c > 0 else 0.0 for w, c in zip(res_weights, capacity, strict=True)])
    drf.dominant_shares(flat, array("d", capacity), rw, tw, len(names), n_res, out)
    return dict(zip(names, out, strict=True))


@dataclass(frozen=True)
class TenantDemand:
    """One tenant's input to the fair allocation, in kernel units.

    ``demand`` = running + pending; ``guaranteed``/``limit`` map a column to an amount
    (absent = no guarantee / no limit on that column).
    """

    name: str
    weight: float
    demand: tuple[float, ...]
    guaranteed: Mapping[int, float]
    limit: Mapping[int, float]


@dataclass(frozen=True)
class FairShare:
    """A tenant's fair allocation and its weighted dominant share."""

    name: str
    allocation: tuple[float, ...]
    share: float
    fraction_of_demand: float


def _dom(vec: Sequence[float], capacity: Sequence[float], rw: Sequence[float]) -> float:
    best = 0.0
    for v, c, w in zip(vec, capacity, rw, strict=True):
        if v <= 0 or w <= 0 or c <= 0:
            continue
        best = max(best, w * v / c)
    return best


def _level(amounts: Mapping[int, float], demand: Sequence[float]) -> float:
    """Largest x in [0, 1] with x * demand <= amounts on the listed columns."""
    x = 1.0
    for col, amount in amounts.items():
        if demand[col] > 0:
            x = min(x, max(0.0, amount) / demand[col])
    return x


MIN_LEVEL = 1e-12
"""Guarantee levels (fractions of a tenant's demand) below this count as no guarantee."""


def fair_allocation(
    tenants: Sequence[TenantDemand],
    *,
    capacity: Sequence[float],
    res_weights: Sequence[float],
) -> dict[str, FairShare]:
    """Weighted DRF fair allocation by progressive filling (see module docstring).

    Each tenant gets ``x_t * demand_t`` with ``x_t`` in [0, 1]. ``guaranteed`` sets the
    starting level (scaled down together if the guarantees do not fit the capacity);
    ``limit`` caps the level. Tenants without demand get an empty allocation, share 0.
    """
    order = sorted(tenants, key=lambda t: t.name)
    n_res = len(capacity)
    x: dict[str, float] = {}
    xmax: dict[str, float] = {}
    rate: dict[str, float] = {}
    for t in order:
        d = _dom(t.demand, capacity, res_weights)
        xmax[t.name] = _level(t.limit, t.demand) if t.limit else 1.0
        x[t.name] = min(_level(t.guaranteed, t.demand) if t.guaranteed else 0.0, xmax[t.name])
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
        if u > capacity[r] > 0:
            scale = min(scale, capacity[r] / u)
    if scale < 1.0:
        for name in x:
            x[name] *= scale

    active = {t.name for t in order if rate[t.name] > 0 and x[t.name] < xmax[t.name]}

    def freeze_saturated() -> None:
        for r in range(n_res):
            if capacity[r] > 0 and usage(r) >= capacity[r] * (1 - EPS):
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
                lam_next = min(lam_next, lam + (capacity[r] - usage(r)) / slope)
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
    result: dict[str, FairShare] = {}
    for t in order:
        alloc = tuple(x[t.name] * v for v in t.demand)
        share = _dom(alloc, capacity, res_weights)
        weighted = share / t.weight if t.weight > 0 else (math.inf if share > 0 else 0.0)
        result[t.name] = FairShare(t.name, alloc, weighted, x[t.name])
    return result


@dataclass(frozen=True)
class Contender:
    """Another tenant competing for capacity right now."""

    tenant: str
    current_share: CurrentShare
    has_fitting_pending: bool


@dataclass(frozen=True)
class GateDecision:
    """Whether a pod may be placed now; if not, who it waits for and why."""

    allowed: bool
    tenant: str
    share_after: ShareAfter
    fair_share: float
    waiting_for: str | None = None

    @property
    def reason(self) -> str:
        """The text kube-scheduler shows in the pod's FailedScheduling event."""
        if self.allowed:
            return ""
        return (
            f"tenant {self.tenant} above its fair share "
            f"({self.share_after:.2f} > {self.fair_share:.2f}) while {self.waiting_for} waits"
        )


def check_gate(
    *,
    tenant: str,
    current_share: CurrentShare,
    share_after: ShareAfter,
    fair_share: float,
    contenders: Sequence[Contender],
) -> GateDecision:
    """Decide whether a pod of ``tenant`` may be placed now (see module docstring).

    The tenant waits only for a contender that has a pending pod fitting now and a
    lower current share, or an equal share and a smaller name.
    """
    if share_after <= fair_share * (1 + EPS) + EPS:
        return GateDecision(True, tenant, share_after, fair_share)
    ahead = [
        c
        for c in contenders
        if c.tenant != tenant
        and c.has_fitting_pending
        and (
            c.current_share < current_share * (1 - EPS) - EPS
            or (
                abs(c.current_share - current_share) <= EPS * max(1.0, current_share)
                and c.tenant < tenant
            )
        )
    ]
    if not ahead:
        return GateDecision(True, tenant, share_after, fair_share)
    first = min(ahead, key=lambda c: (c.current_share, c.tenant))
    return GateDecision(False, tenant, share_after, fair_share, waiting_for=first.tenant)


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(Σx)² / (n Σx²)``, 1 = perfectly even; 1.0 for no data."""
    vals = [v for v in values if math.isfinite(v)]
    sq = sum(v * v for v in vals)
    if not vals or sq == 0:
        return 1.0
    return sum(vals) ** 2 / (len(vals) * sq)
