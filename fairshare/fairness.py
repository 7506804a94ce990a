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
    parent: str | None = None
    """The tenant this one belongs to (hierarchical DRF); None for a top-level tenant.
    An inner tenant's own ``demand`` is ignored: its subtree's demand counts."""


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


def hierarchical_allocation(
    tenants: Sequence[TenantDemand],
    *,
    capacity: Sequence[float],
    res_weights: Sequence[float],
    max_rounds: int = 64,
) -> dict[str, FairShare]:
    """Hierarchical weighted DRF (H-DRF) by progressive filling down the tree.

    At each level the children of a node fill the node's allocation by weighted DRF
    (``_fill``), each child standing for its whole subtree: its demand is the sum of its
    leaves' demands (each capped by the leaf's own limit), its ``limit`` caps the subtree
    and its ``guaranteed`` sets its starting level. An idle child has no demand, so its
    share goes to its siblings; what a subtree cannot use (its demand is smaller, or its
    children's mix saturates a resource first) is handed out again from the top in the
    next round, so it goes up the tree to whoever can use it (work conservation).
    Shares are divided by the tenant's weight in the whole tree (``effective_weights``).
    A tenant whose parent is not among ``tenants`` counts as top-level.

    A leaf is blocked once a resource it still needs is used up; from the next round
    on its subtree grows along its non-blocked leaves' demand only (H-DRF's
    "non-blocked" rule), so a leaf that does not need the saturated resource keeps
    growing.

    Approximation: a subtree grows along its aggregate demand (the sum of its
    non-blocked leaves' rows). With one resource, or leaves that ask for the same mix,
    this is H-DRF exactly; when the leaves' mixes differ, what the children cannot use
    of the subtree's share goes back up in the next round, so the result is
    work-conserving but a sibling may end above its weight's share (the siblings do
    not wait for it).
    """
    order = sorted(tenants, key=lambda t: t.name)
    by_name = {t.name: t for t in order}
    n_res = len(capacity)

    def parent_of(t: TenantDemand) -> str | None:
        p = t.parent
        return p if p is not None and p in by_name and p != t.name else None

    kids: dict[str | None, list[str]] = {}
    for t in order:
        kids.setdefault(parent_of(t), []).append(t.name)
    # A cycle (not in a validated config) leaves its members unreachable from the
    # top: they are treated as top-level leaves.
    reachable: set[str] = set()
    stack = list(kids.get(None, []))
    while stack:
        n = stack.pop()
        if n not in reachable:
            reachable.add(n)
            stack.extend(kids.get(n, []))
    for name in sorted(set(by_name) - reachable):
        kids[by_name[name].parent].remove(name)
        kids.setdefault(None, []).append(name)
        kids.pop(name, None)
    for children in kids.values():
        children.sort()

    def is_leaf(name: str) -> bool:
        return not kids.get(name)

    # A leaf's usable demand: its demand up to its own limit.
    leaf_cap: dict[str, tuple[float, ...]] = {}
    for t in order:
        if is_leaf(t.name):
            level = _level(t.limit, t.demand) if t.limit else 1.0
            leaf_cap[t.name] = tuple(level * v for v in t.demand)
    alloc: dict[str, list[float]] = {n: [0.0] * n_res for n in leaf_cap}

    def subtree_sum(name: str, vec: Mapping[str, Sequence[float]]) -> list[float]:
        if is_leaf(name):
            return list(vec[name])
        total = [0.0] * n_res
        for k in kids[name]:
            for r, v in enumerate(subtree_sum(k, vec)):
                total[r] += v
        return total

    blocked: set[str] = set()

    def remaining(name: str) -> tuple[float, ...]:
        # Blocked leaves (a resource they still need is used up) do not count: their
        # subtree grows along what its other leaves can still take (the "non-blocked"
        # rule of H-DRF), else a saturated resource in the sum would stop them too.
        rows = {n: leaf_cap[n] if n not in blocked else alloc[n] for n in leaf_cap}
        want = subtree_sum(name, rows)
        got = subtree_sum(name, alloc)
        return tuple(max(0.0, w - g) for w, g in zip(want, got, strict=True))

    def room(name: str) -> dict[int, float]:
        lim = by_name[name].limit
        if is_leaf(name) or not lim:
            return {}
        got = subtree_sum(name, alloc)
        return {r: max(0.0, amount - got[r]) for r, amount in lim.items()}

    def hand_out(parent: str | None, avail: Sequence[float], first: bool) -> None:
        children = kids.get(parent, [])
        items = [
            TenantDemand(n, by_name[n].weight, remaining(n), by_name[n].guaranteed, room(n))
            for n in children
        ]
        x = _fill(items, capacity, avail, res_weights, use_guarantees=first)
        for item in items:
            share = tuple(x[item.name] * v for v in item.demand)
            if not any(v > 0 for v in share):
                continue
            if is_leaf(item.name):
                row = alloc[item.name]
                for r, v in enumerate(share):
                    row[r] += v
            else:
                hand_out(item.name, share, first)

    for round_no in range(max_rounds):
        used = [0.0] * n_res
        for row in alloc.values():
            for r, v in enumerate(row):
                used[r] += v
        avail = [max(0.0, c - u) for c, u in zip(capacity, used, strict=True)]
        full = [r for r in range(n_res) if capacity[r] > 0 and avail[r] <= capacity[r] * EPS]
        blocked = {
            n
            for n, want in leaf_cap.items()
            if any(want[r] - alloc[n][r] > want[r] * EPS for r in full)
        }
        before = sum(_dom(row, capacity, res_weights) for row in alloc.values())
        hand_out(None, avail, round_no == 0)
        after = sum(_dom(row, capacity, res_weights) for row in alloc.values())
        if after <= before * (1 + 1e-12) + 1e-12:
            break

    weights = effective_weights(
        {t.name: t.weight for t in order}, {t.name: parent_of(t) for t in order}
    )
    result: dict[str, FairShare] = {}
    for t in order:
        vec = tuple(subtree_sum(t.name, alloc))
        want = subtree_sum(t.name, {n: by_name[n].demand for n in leaf_cap})
        share = _dom(vec, capacity, res_weights)
        w = weights[t.name]
        weighted = share / w if w > 0 else (math.inf if share > 0 else 0.0)
        d = _dom(want, capacity, res_weights)
        result[t.name] = FairShare(t.name, vec, weighted, share / d if d > 0 else 0.0)
    return result


def effective_weights(
    weights: Mapping[str, float], parents: Mapping[str, str | None]
) -> dict[str, float]:
    """Each tenant's weight in the whole tree, comparable across the tree.

    A top-level tenant keeps its weight; below it, each level multiplies by the
    tenant's weight over the sum of its siblings' weights (itself included). Flat
    configs: every tenant keeps its weight. A parent that is not in ``weights`` (or a
    cycle) ends the walk: the tenant then counts as top-level there.
    """

    def parent_of(name: str) -> str | None:
        p = parents.get(name)
        return p if p is not None and p in weights and p != name else None

    siblings: dict[str, float] = {}
    for name, w in weights.items():
        p = parent_of(name)
        if p is not None:
            siblings[p] = siblings.get(p, 0.0) + w
    out: dict[str, float] = {}

    def eff(name: str, seen: frozenset[str]) -> float:
        if name in out:
            return out[name]
        p = parent_of(name)
        if p is None or p in seen:
            value = weights[name]
        else:
            total = siblings[p]
            value = eff(p, seen | {name}) * weights[name] / total if total > 0 else 0.0
        out[name] = value
        return value

    for name in sorted(weights):
        eff(name, frozenset())
    return out


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
