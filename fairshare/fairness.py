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
* With ``holdForBlockedTenants`` (opt-in) u also counts when its waiting pod fits no
  node now but would fit a node drained of its pods (*blocked*, not unrunnable): t then
  waits even though capacity may stay idle, so that room freed later goes to u. A pod
  that fits no node even drained never holds anyone.
* With ``yieldBand`` b > 0 (opt-in) the gate applies from ``(1 - b)`` × t's fair share
  instead of from the fair share, for contenders with a pod that fits now (blocked
  pods hold only above the fair share). Below the fair share the order is by the
  fraction of its own fair share each tenant holds (``gating.check_fair_gate`` passes
  those fractions as the current shares): tenants near their fair shares go in turn,
  so what fragmentation leaves idle at the end is spread over them. Still
  work-conserving.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
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
) -> dict[str, FairShare]:
    """Hierarchical weighted DRF (H-DRF), computed exactly by event-driven filling.

    Bhattacharya et al., "Hierarchical Scheduling for Diverse Datacenter Workloads"
    (SoCC 2013). This is the fluid limit of the paper's *dynamic* H-DRF, the algorithm it
    proposes for a running scheduler (its "naive" version starves a child whose dominant
    resource differs from its siblings'; its static version is defined over all demands
    at once): at every node, the next bit of capacity goes to the non-blocked child of
    lowest weighted dominant share, so those children grow together, level. The rules:

    * a node's dominant share is measured on its children's usage summed, over the
      resources not saturated for it; a resource is saturated for a node when it is used
      up in the cluster or at the ``limit`` of the node or of an ancestor (the paper's
      "ignore saturated resources");
    * a leaf is blocked once its demand (capped by its own ``limit``) is met or a
      resource it needs is saturated for it (so the other leaves of that subtree that
      need it are blocked too); a node is blocked when all its leaves are. Blocked
      children count in the sum as they are and take no part in the comparison; a
      non-blocked child above its lowest non-blocked siblings counts scaled down to
      their level (the paper's "rescaling to the minimum node"), but not below its
      guaranteed start (fairshare's guarantees are not in the paper: a guarantee is
      held inside the parent's share, it does not enlarge it).

    Shares are divided by the node's own weight among its siblings, so weights divide a
    parent's share among its children. An idle child has nothing to grow, so its share
    goes to its siblings, and what a subtree cannot use goes up the tree (work
    conservation: every leaf ends met or blocked). When a node's share stops rising as
    its lowest children grow (its dominant resource is held by a blocked child), those
    children catch up first, as in the paper's task-by-task scheduler.

    The filling moves from event to event in closed form (everything is linear in
    between): a leaf met, a resource used up in the cluster or at a limit, a child
    reaching its lowest siblings or its guaranteed floor, a node's dominant resource
    changing. The flat case (no ``parent``) is ``_fill``'s weighted DRF, which is what
    this gives for the children of a single node.

    ``guaranteed`` sets starting allocations: a leaf starts at its guaranteed level of
    its demand; an inner node's guarantee is then filled by the same rules among its
    subtree's leaves that ask for a guaranteed column, as far as it goes; starts are
    scaled down where they exceed a limit or the cluster. A node on such a plateau
    waits until its siblings' level reaches it. Shares in the result are divided by the
    tenant's weight in the whole tree (``effective_weights``). A tenant whose parent is
    not among ``tenants`` counts as top-level; so do the members of a parent cycle.
    """
    tree = _Tree(tenants, capacity, res_weights)
    tree.start_from_guarantees()
    tree.fill(-1, {}, None)
    return tree.result()


_JOIN = 1e-12
"""Relative tolerance for two shares to count as level (they are computed, not exact)."""


class _Tree:
    """Tenants as a tree in pre-order (a subtree is a contiguous range), leaf levels x."""

    def __init__(
        self,
        tenants: Sequence[TenantDemand],
        capacity: Sequence[float],
        res_weights: Sequence[float],
    ) -> None:
        order = sorted(tenants, key=lambda t: t.name)
        by_name = {t.name: t for t in order}

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
            name = stack.pop()
            if name not in reachable:
                reachable.add(name)
                stack.extend(kids.get(name, []))
        for name in sorted(set(by_name) - reachable):
            kids[by_name[name].parent].remove(name)
            kids.setdefault(None, []).append(name)
            kids.pop(name, None)
        names: list[str] = []
        parent: list[int] = []

        def visit(name: str, up: int) -> None:
            here = len(names)
            names.append(name)
            parent.append(up)
            for k in sorted(kids.get(name, [])):
                visit(k, here)

        for name in sorted(kids.get(None, [])):
            visit(name, -1)
        self.names = names
        self.by_name = by_name
        self.parent = parent
        n = len(names)
        self.kids: list[list[int]] = [[] for _ in range(n)]
        self.top: list[int] = []
        for i, p in enumerate(parent):
            (self.kids[p] if p >= 0 else self.top).append(i)
        self.end = list(range(1, n + 1))  # subtree of i = range(i, end[i])
        for i in range(n - 1, -1, -1):
            if self.kids[i]:
                self.end[i] = self.end[self.kids[i][-1]]
        self.n_res = len(capacity)
        self.cap = [float(c) for c in capacity]
        # Share of one unit of each resource; 0 for resources that count in no share.
        self.unit = [
            w / c if c > 0 and w > 0 else 0.0 for c, w in zip(capacity, res_weights, strict=True)
        ]
        self.rw = list(res_weights)
        self.w = [float(by_name[m].weight) for m in names]
        self.leaf = [not k for k in self.kids]
        self.demand = [by_name[m].demand if self.leaf[i] else () for i, m in enumerate(names)]
        self.limit = [
            dict(by_name[m].limit) if not self.leaf[i] else {} for i, m in enumerate(names)
        ]
        self.xmax = [
            (_level(by_name[m].limit, self.demand[i]) if by_name[m].limit else 1.0)
            if self.leaf[i]
            else 0.0
            for i, m in enumerate(names)
        ]
        self.delta = [
            _dom(self.demand[i], capacity, res_weights) if self.leaf[i] else 0.0 for i in range(n)
        ]
        self.need = [
            sum(1 << r for r, v in enumerate(self.demand[i]) if v > 0) if self.leaf[i] else 0
            for i in range(n)
        ]
        # A node of weight 0 (or below one) never grows, as in flat DRF.
        self.wok = [False] * n
        for i in range(n):
            self.wok[i] = self.w[i] > 0 and (parent[i] < 0 or self.wok[parent[i]])
        # A leaf's usage per unit of its weighted dominant share.
        self.per_leaf = [
            [v * self.w[i] / self.delta[i] for v in self.demand[i]] if self.delta[i] > 0 else []
            for i in range(n)
        ]
        self.x = [0.0] * n
        self.floor = [0.0] * n
        """Weighted share of each node's guaranteed start: not rescaled below it."""

    def usage(self) -> list[list[float]]:
        """Each node's subtree usage."""
        n_res = self.n_res
        use: list[list[float]] = [[]] * len(self.names)
        for i in range(len(self.names) - 1, -1, -1):
            if self.leaf[i]:
                xi = self.x[i]
                use[i] = [xi * v for v in self.demand[i]]
            else:
                row = [0.0] * n_res
                for k in self.kids[i]:
                    for r, v in enumerate(use[k]):
                        row[r] += v
                use[i] = row
        return use

    def _scale(self, lo: int, hi: int, factor: float) -> None:
        for i in range(lo, hi):
            if self.leaf[i]:
                self.x[i] *= factor
                if self.x[i] < MIN_LEVEL:
                    self.x[i] = 0.0

    def start_from_guarantees(self) -> None:
        n = len(self.names)
        for i in range(n - 1, -1, -1):
            g = self.by_name[self.names[i]].guaranteed
            if not g:
                continue
            if self.leaf[i]:
                level = min(_level(g, self.demand[i]), self.xmax[i])
                self.x[i] = level if level >= MIN_LEVEL else 0.0
                continue
            got = self.usage()[i]
            factor = min(
                (max(0.0, a) / got[r] for r, a in g.items() if got[r] > a and got[r] > 0),
                default=1.0,
            )
            if factor < 1.0:  # the children's guarantees overflow this one's
                self._scale(i, self.end[i], factor)
            cols = sum(1 << r for r in g)
            eligible = {k for k in range(i, self.end[i]) if self.need[k] & cols}
            self.fill(i, dict(g), eligible)
        # Starts never exceed a limit on the way up, nor the cluster.
        for i in range(n):
            if self.limit[i]:
                got = self.usage()[i]
                factor = min(
                    (max(0.0, a) / got[r] for r, a in self.limit[i].items() if got[r] > a),
                    default=1.0,
                )
                if factor < 1.0:
                    self._scale(i, self.end[i], factor)
        used = [sum(col) for col in zip(*(self.usage()[t] for t in self.top), strict=True)]
        factor = min(
            (c / u for c, u in zip(self.cap, used, strict=False) if c > 0 and u > c),
            default=1.0,
        )
        if factor < 1.0:
            self._scale(0, n, factor)
        use = self.usage()
        self.floor = [
            _dom(use[i], self.cap, self.rw) / self.w[i] if self.w[i] > 0 else 0.0 for i in range(n)
        ]

    def fill(self, root: int, extra: Mapping[int, float], eligible: set[int] | None) -> None:
        """Fill the subtree of ``root`` (-1: the whole tree) from the current levels.

        ``extra`` caps the root's subtree on the listed columns (a guarantee being
        filled); ``eligible`` (None: all) are the leaves that may grow. The filling goes
        from event to event (``_Filling.advance_to_next_event``) until no leaf can grow,
        nothing grows any more, or a bound on the number of events is reached.
        """
        run = _Filling(self, root, extra, eligible)
        if not run.alive:
            return
        for _event in range(20 * (len(run.alive) + 2) * (self.n_res + 2)):
            if not run.advance_to_next_event():
                return

    def result(self) -> dict[str, FairShare]:
        use = self.usage()
        weights = effective_weights(
            {m: self.w[i] for i, m in enumerate(self.names)},
            {
                m: (self.names[p] if p >= 0 else None)
                for m, p in zip(self.names, self.parent, strict=True)
            },
        )
        want: list[list[float]] = [[]] * len(self.names)
        for i in range(len(self.names) - 1, -1, -1):
            if self.leaf[i]:
                want[i] = list(self.demand[i])
            else:
                want[i] = [sum(col) for col in zip(*(want[k] for k in self.kids[i]), strict=True)]
        capacity, rw = self.cap, self.rw
        result: dict[str, FairShare] = {}
        for i, name in enumerate(self.names):
            vec = tuple(use[i])
            share = _dom(vec, capacity, rw)
            wt = weights[name]
            weighted = share / wt if wt > 0 else (math.inf if share > 0 else 0.0)
            d = _dom(want[i], capacity, rw)
            result[name] = FairShare(name, vec, weighted, share / d if d > 0 else 0.0)
        return dict(sorted(result.items()))


class _Filling:
    """One ``_Tree.fill``: the subtree of ``root`` filled event by event.

    Between two events everything moves linearly, so each event is found in closed form.
    One event is five steps, each a method below: which leaves can still grow
    (``_prune_leaves``), every open node's weighted dominant share (``_measure_shares``),
    who grows (``_find_growing``), how fast each of them grows per unit of the lowest
    share (``_unit_usage``, ``_growth_rates``, ``_usage_rates``), and how far to the next
    event (``_next_step``); ``_advance`` then moves there.

    Node ``-1`` stands for the top of the tree (above the top-level tenants), so that a
    fill of the whole tree and a fill of one subtree follow the same steps.
    """

    def __init__(
        self, tree: _Tree, root: int, extra: Mapping[int, float], eligible: set[int] | None
    ) -> None:
        self.tree = tree
        self.root = root
        self.n_res = n_res = tree.n_res
        lo, hi = (0, len(tree.names)) if root < 0 else (root, tree.end[root])
        chain: list[int] = []  # the root and its ancestors, top first
        a = root
        while a >= 0:
            chain.append(a)
            a = tree.parent[a]
        chain.reverse()
        self.chain = chain
        bounds = {i: list(tree.limit[i].items()) for i in [*chain, *range(lo, hi)] if tree.limit[i]}
        if extra and root >= 0:
            bounds[root] = bounds.get(root, []) + list(extra.items())
        self.bounds = bounds
        """Per node, the (column, amount) caps on its subtree's usage: the limits on the
        way down to the root and inside its subtree, and ``extra`` on the root."""
        self.use = use = tree.usage()
        """Each node's subtree usage, kept up to date as the leaves grow."""
        self.used = [sum(col) for col in zip(*(use[t] for t in tree.top), strict=True)]
        """The whole cluster's usage."""
        # Leaves that may still grow; once met or blocked a leaf stays so (usage only grows).
        leaf, wok, delta = tree.leaf, tree.wok, tree.delta
        self.alive = [
            i
            for i in range(lo, hi)
            if leaf[i] and wok[i] and delta[i] > 0 and (eligible is None or i in eligible)
        ]
        self.top_kids = tree.top if root < 0 else tree.kids[root]
        self.all_res = (1 << n_res) - 1
        self.sat: dict[int, int] = {}
        """Per node, the resources saturated for it (bitmask), filled on demand."""
        self.sat_top = 0
        """The resources used up in the cluster (bitmask)."""
        self.share: dict[int, float] = {}
        """Weighted dominant share of each open node, as the comparison measures it."""
        self.per_res: dict[int, list[float]] = {}
        """Per inner node, its share on each resource (-1 for a saturated one)."""
        self.vec: dict[int, list[float]] = {}
        """What a node's share is measured on: its usage, rescaled children included."""
        self.last: tuple[int, list[int]] | None = None
        self.moved: Iterable[int] | None = None
        """The nodes whose usage moved in the last step (None: measure every share)."""
        # Set by each event's steps.
        self.open_: set[int] = set()
        self.growing: list[int] = []
        self.low: dict[int, list[int]] = {}
        self.level: dict[int, float] = {}
        self.over: dict[int, list[int]] = {}
        self.per: dict[int, list[float]] = {}
        self.sigma: dict[int, float] = {}
        self.free_kids: dict[int, list[int]] = {}
        self.rate: dict[int, float] = {}
        self.rho: dict[int, float] = {}
        self.du: dict[int, list[float]] = {}
        self.total: list[float] = []

    # -- saturation --------------------------------------------------------------------

    def _exhausted(self, i: int) -> int:
        """The columns on which node ``i``'s usage has reached one of its caps (bitmask)."""
        mask = 0
        use_i = self.use[i]
        for r, amount in self.bounds.get(i, ()):
            if amount - use_i[r] <= EPS * max(amount, 0.0):
                mask |= 1 << r
        return mask

    def _sat_of(self, i: int) -> int:
        """The resources saturated for node ``i``: used up in the cluster or at a cap of
        ``i`` or of an ancestor (bitmask; memoised per node until something is used up)."""
        sat, parent = self.sat, self.tree.parent
        path = []
        while i not in sat and i >= 0:
            path.append(i)
            i = parent[i]
        mask = sat[i] if i >= 0 else self.sat_top
        for j in reversed(path):
            mask |= self._exhausted(j)
            sat[j] = mask
        return mask

    def _tied(self, node: int) -> list[int]:
        """The resources at the node's dominant share (the non-saturated ones)."""
        s_max = self.share[node]
        floor = s_max - _JOIN * max(s_max, 1e-9)
        return [r for r, v in enumerate(self.per_res[node]) if v >= 0 and v >= floor]

    def _prune_leaves(self) -> None:
        """Which leaves can still grow. Decides that a leaf is done when it is met (its
        level at its cap), and, when something was used up since the last event (the
        cluster's saturated resources or the nodes' exhausted caps changed), also when a
        resource it needs is saturated for it (blocked); shares are then all measured
        anew."""
        tree, cap, used, n_res = self.tree, self.tree.cap, self.used, self.n_res
        x, xmax = tree.x, tree.xmax
        cluster_sat = sum(
            1 << r for r in range(n_res) if cap[r] > 0 and cap[r] - used[r] <= EPS * cap[r]
        )
        self.sat_top = cluster_sat
        signature = (cluster_sat, [self._exhausted(i) for i in self.bounds])
        if signature != self.last:
            # Something was used up: saturation, blocked leaves and shares anew.
            self.last = signature
            sat = self.sat
            sat.clear()
            mask = cluster_sat
            for i in self.chain:
                mask |= self._exhausted(i)
                sat[i] = mask
            need, sat_of = tree.need, self._sat_of
            self.alive = [
                i for i in self.alive if x[i] < xmax[i] * (1 - EPS) and not (need[i] & sat_of(i))
            ]
            self.share.clear()
            self.moved = None
        else:
            self.alive = [i for i in self.alive if x[i] < xmax[i] * (1 - EPS)]

    # -- shares -----------------------------------------------------------------------

    def _measure_shares(self) -> None:
        """The open (non-blocked) nodes of the run, and the weighted dominant share of
        each one whose usage moved in the last step (of all after a saturation).

        Decides what a node's share is measured on: a leaf's share is its level times its
        dominant share over its weight; an inner node's is measured on its children's
        usage summed over its non-saturated resources, with every open child above its
        lowest open siblings scaled down to their level, but not below its guaranteed
        start (the paper's rescaling to the minimum node); blocked children count as
        they are.
        """
        tree, root, n_res = self.tree, self.root, self.n_res
        parent, leaf, kids, w, unit = tree.parent, tree.leaf, tree.kids, tree.w, tree.unit
        share, vec, use, per_res = self.share, self.vec, self.use, self.per_res
        open_: set[int] = set()
        for i in self.alive:
            while i != root and i not in open_:
                open_.add(i)
                i = parent[i]
        self.open_ = open_
        moved = self.moved
        stale = open_ if moved is None else [k for k in moved if k in open_]
        for i in sorted(stale, reverse=True):  # children before their parent
            if leaf[i]:
                share[i] = tree.x[i] * tree.delta[i] / w[i]
                vec[i] = use[i]
                continue
            # The paper's rescaling: a non-blocked child above its lowest non-blocked
            # siblings counts as if it were level with them; blocked ones as they are.
            open_kids = [k for k in kids[i] if k in open_]
            m = min(share[k] for k in open_kids)
            above = m + _JOIN * max(m, 1e-9)
            scaled: list[float] | None = None
            for k in open_kids:
                f = min(1.0, max(m, tree.floor[k]) / share[k]) if share[k] > above else 1.0
                vk, uk = vec[k], use[k]
                if f == 1.0 and vk is uk:
                    continue
                if scaled is None:
                    scaled = list(use[i])
                for r in range(n_res):
                    scaled[r] += vk[r] * f - uk[r]
            row = vec[i] = use[i] if scaled is None else scaled
            free_res = self.all_res & ~self.sat[i]
            shares = [row[r] * unit[r] / w[i] if free_res >> r & 1 else -1.0 for r in range(n_res)]
            per_res[i] = shares
            share[i] = max(0.0, *shares)

    # -- who grows, and how fast ---------------------------------------------------------

    def _find_growing(self) -> None:
        """Who grows: from the run's root down, at each growing node its open children
        of lowest share (``low``, level with each other within ``_JOIN``); the open
        children above them (``over``) wait. ``level`` is each growing node's lowest
        child share."""
        root, kids, leaf, share, open_ = (
            self.root,
            self.tree.kids,
            self.tree.leaf,
            self.share,
            self.open_,
        )
        growing: list[int] = []
        low: dict[int, list[int]] = {}
        level: dict[int, float] = {}
        over: dict[int, list[int]] = {}  # non-blocked children above the lowest
        frontier = [root]
        while frontier:
            node = frontier.pop()
            cand = [k for k in (self.top_kids if node == root else kids[node]) if k in open_]
            m = min(share[k] for k in cand)
            level[node] = m
            above = m + _JOIN * max(m, 1e-9)
            low[node] = [k for k in cand if share[k] <= above]
            over[node] = [k for k in cand if share[k] > above]
            for k in low[node]:
                growing.append(k)
                if not leaf[k]:
                    frontier.append(k)
        growing.sort()
        self.growing, self.low, self.level, self.over = growing, low, level, over

    def _unit_usage(self) -> None:
        """Each growing node's usage per unit of its own share (``per``, ``sigma``: how
        much its share rises per unit of its children's), bottom-up.

        Decides which nodes are "free": a node whose share does not rise as its lowest
        children grow (its dominant resource is held by a blocked child) lets those
        children catch up first. Otherwise the children above the level that it rescales
        to the level count in its usage as they rise with it.
        """
        tree, root, n_res = self.tree, self.root, self.n_res
        leaf, w, unit, floor = tree.leaf, tree.w, tree.unit, tree.floor
        low, over, level, share, vec = self.low, self.over, self.level, self.share, self.vec
        per: dict[int, list[float]] = {}
        sigma: dict[int, float] = {}
        free: dict[int, bool] = {}
        free_kids: dict[int, list[int]] = {}
        self.per = per
        for i in [*reversed(self.growing), root]:
            if i >= 0 and leaf[i]:
                per[i] = tree.per_leaf[i]
                sigma[i], free[i] = 1.0, False
                continue
            fk = [k for k in low[i] if free[k]]
            free_kids[i] = fk
            row = [0.0] * n_res
            for k in fk or low[i]:
                s = 1.0 if fk else sigma[k]
                for r, v in enumerate(per[k]):
                    row[r] += v / s
            if i == root:
                break
            if not fk:  # siblings above the level are rescaled to it as it rises
                for k in over[i]:
                    if floor[k] <= level[i] + _JOIN * max(level[i], 1e-9):
                        for r, v in enumerate(vec[k]):
                            row[r] += v / share[k]
            per[i] = row
            sigma[i] = max((row[r] * unit[r] / w[i] for r in self._tied(i)), default=0.0)
            free[i] = sigma[i] <= 0.0
        self.sigma, self.free_kids = sigma, free_kids

    def _growth_rates(self) -> None:
        """How fast each growing node's share rises per unit of the driver (the lowest
        share below the run's root), top-down: a free node's catching-up children at its
        own rate, else its lowest children at its rate over their ``sigma``; and each
        growing leaf's level rate ``rho``. A level sibling of a catching-up child waits
        (it gets no rate)."""
        leaf, w, delta = self.tree.leaf, self.tree.w, self.tree.delta
        low, sigma, free_kids = self.low, self.sigma, self.free_kids
        rate: dict[int, float] = {self.root: 1.0}
        rho: dict[int, float] = {}
        for node in [self.root, *self.growing]:
            if node not in rate:
                continue  # a level sibling of a catching-up child waits
            if node >= 0 and leaf[node]:
                rho[node] = rate[node] * w[node] / delta[node]
            elif free_kids[node]:
                for k in free_kids[node]:
                    rate[k] = rate[node]
            else:
                for k in low[node]:
                    rate[k] = rate[node] / sigma[k]
        self.rate, self.rho = rate, rho

    def _usage_rates(self) -> bool:
        """The usage rates (per unit of the driver) of the growing nodes, bottom-up, of
        the run's root and of its ancestors (``total``). False when nothing grows."""
        leaf, demand, low, rho = self.tree.leaf, self.tree.demand, self.low, self.rho
        du: dict[int, list[float]] = {}
        for i in reversed(self.growing):
            if leaf[i]:
                if rho.get(i, 0.0) > 0:
                    du[i] = [rho[i] * v for v in demand[i]]
                continue
            rows = [du[k] for k in low[i] if k in du]
            if rows:
                du[i] = [sum(col) for col in zip(*rows, strict=True)]
        rows = [du[k] for k in low[self.root] if k in du]
        if not rows:
            return False
        total = [sum(col) for col in zip(*rows, strict=True)]
        for a in self.chain:
            du[a] = total
        self.du, self.total = du, total
        return True

    # -- the next event ----------------------------------------------------------------

    def _next_step(self) -> tuple[float, int]:
        """How far the driver moves to the next event, and the leaf met there (-1: none).

        The first of: a growing leaf meets its cap; a resource not yet used up is used
        up in the cluster; a node's usage reaches a cap; a waiting child above the level
        is joined by it (or the level reaches the child's guaranteed floor); a growing
        node's dominant resource changes (another resource's share overtakes it).
        """
        tree, n_res, root = self.tree, self.n_res, self.root
        leaf, w, unit, floor = tree.leaf, tree.w, tree.unit, tree.floor
        x, xmax, cap, used, use = tree.x, tree.xmax, tree.cap, self.used, self.use
        share, level, over, rate = self.share, self.level, self.over, self.rate
        step = math.inf
        met = -1
        for i, r_i in self.rho.items():
            if r_i > 0 and (xmax[i] - x[i]) / r_i < step:
                step, met = (xmax[i] - x[i]) / r_i, i
        cluster_sat, total = self.sat_top, self.total
        for r in range(n_res):
            if cap[r] > 0 and not (cluster_sat >> r & 1) and total[r] > 0:
                step = min(step, (cap[r] - used[r]) / total[r])
        bounds = self.bounds
        for i, rates in self.du.items():
            for r, amount in bounds.get(i, ()):
                if rates[r] > 0 and amount - use[i][r] > EPS * max(amount, 0.0):
                    step = min(step, (amount - use[i][r]) / rates[r])
        for node in [root, *self.growing]:
            if node not in rate or (node >= 0 and leaf[node]):
                continue
            if not self.free_kids[node]:
                above = level[node] + _JOIN * max(level[node], 1e-9)
                for k in over[node]:
                    # It joins the lowest, or the level passes its guaranteed floor.
                    target = floor[k] if above < floor[k] < share[k] else share[k]
                    step = min(step, (target - level[node]) / rate[node])
            if node == root:
                continue
            rates = [v * rate[node] * unit[r] / w[node] for r, v in enumerate(self.per[node])]
            top = self._tied(node)
            s_rate = max((rates[r] for r in top), default=0.0)
            for r, v in enumerate(self.per_res[node]):
                if v >= 0 and r not in top and rates[r] > s_rate:
                    step = min(step, (share[node] - v) / (rates[r] - s_rate))
        return step, met

    def _advance(self, step: float, met: int) -> None:
        """Move every growing leaf, node usage and the cluster's usage by ``step`` of
        the driver; the leaf ``met`` lands on its cap exactly."""
        x, xmax, rho = self.tree.x, self.tree.xmax, self.rho
        for i, r_i in rho.items():
            x[i] = min(xmax[i], x[i] + r_i * step)
        if met >= 0 and xmax[met] - x[met] <= rho[met] * step * EPS:
            x[met] = xmax[met]
        use = self.use
        for i, rates in self.du.items():
            row = use[i]
            for r, v in enumerate(rates):
                row[r] += v * step
        used = self.used
        for r, v in enumerate(self.total):
            used[r] += v * step
        self.moved = self.du

    def advance_to_next_event(self) -> bool:
        """One event of the filling; False when the filling is over (no leaf can grow,
        nothing grows, or no event lies ahead)."""
        self._prune_leaves()
        if not self.alive:
            return False
        self._measure_shares()
        self._find_growing()
        self._unit_usage()
        self._growth_rates()
        if not self._usage_rates():
            return False
        step, met = self._next_step()
        if not math.isfinite(step):
            return False
        self._advance(step, met)
        return True


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
    blocked: str = ""
    """With ``holdForBlockedTenants``: the tenant has no pod that fits now but a waiting
    pod that would fit a drained node; this names it and its shape (else "")."""


@dataclass(frozen=True)
class GateDecision:
    """Whether a pod may be placed now; if not, who it waits for and why."""

    allowed: bool
    tenant: str
    share_after: ShareAfter
    fair_share: float
    waiting_for: str | None = None
    blocked: str = ""
    """When ``waiting_for`` has no pod that fits now: its blocked pod and shape
    (``holdForBlockedTenants``)."""
    yield_band: float = 0.0
    """The ``yieldBand`` the decision was taken with."""

    @property
    def reason(self) -> str:
        """The text kube-scheduler shows in the pod's FailedScheduling event."""
        if self.allowed:
            return ""
        if self.share_after <= self.fair_share * (1 + EPS) + EPS:
            return (
                f"tenant {self.tenant} near its fair share ({self.share_after:.2f} of "
                f"{self.fair_share:.2f}, yieldBand {self.yield_band:g}) while "
                f"{self.waiting_for} waits"
            )
        head = (
            f"tenant {self.tenant} above its fair share "
            f"({self.share_after:.2f} > {self.fair_share:.2f}) while {self.waiting_for} waits"
        )
        if not self.blocked:
            return head
        return (
            f"{head} (holdForBlockedTenants: its pod {self.blocked} fits no node now "
            "but would fit a drained one)"
        )


def check_gate(
    *,
    tenant: str,
    current_share: CurrentShare,
    share_after: ShareAfter,
    fair_share: float,
    contenders: Sequence[Contender],
    yield_band: float = 0.0,
) -> GateDecision:
    """Decide whether a pod of ``tenant`` may be placed now (see module docstring).

    The tenant waits only for a contender that has a pending pod fitting now (or, with
    ``holdForBlockedTenants``, a blocked one: ``Contender.blocked``) and a lower current
    share, or an equal share and a smaller name. Up to ``(1 - yield_band)`` × its fair
    share it never waits; from there to the fair share only for a fitting pod.
    """
    if share_after <= gate_floor(fair_share, yield_band):
        return GateDecision(True, tenant, share_after, fair_share, yield_band=yield_band)
    above = share_after > fair_share * (1 + EPS) + EPS
    ahead = [
        c
        for c in contenders
        if c.tenant != tenant
        and (c.has_fitting_pending or (above and c.blocked))
        and goes_first(c.tenant, c.current_share, tenant, current_share)
    ]
    if not ahead:
        return GateDecision(True, tenant, share_after, fair_share, yield_band=yield_band)
    first = min(ahead, key=lambda c: (c.current_share, c.tenant))
    blocked = "" if first.has_fitting_pending else first.blocked
    return GateDecision(
        False,
        tenant,
        share_after,
        fair_share,
        waiting_for=first.tenant,
        blocked=blocked,
        yield_band=yield_band,
    )


def goes_first(u: str, share_u: float, t: str, share_t: float) -> bool:
    """The gate's order of tenants: ``u`` goes before ``t`` with a lower share, or an
    equal one (within the tolerance) and a smaller name. A strict order: of two tenants
    exactly one goes first, so ties never hold both."""
    if share_u == share_t or (
        math.isfinite(share_t) and abs(share_u - share_t) <= EPS * max(1.0, share_t)
    ):
        return u < t
    return share_u < share_t


def gate_floor(fair_share: float, yield_band: float = 0.0) -> float:
    """The share after a pod up to which the gate lets it through unconditionally:
    the fair share (with the comparison tolerance), or ``(1 - yield_band)`` of it."""
    if yield_band <= 0:
        return fair_share * (1 + EPS) + EPS
    return fair_share * (1 - yield_band) + EPS


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(Σx)² / (n Σx²)``, 1 = perfectly even; 1.0 for no data."""
    vals = [v for v in values if math.isfinite(v)]
    sq = sum(v * v for v in vals)
    if not vals or sq == 0:
        return 1.0
    return sum(vals) ** 2 / (len(vals) * sq)
