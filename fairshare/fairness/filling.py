"""The filling of one subtree of the tenant tree, event by event (``fill``, ``Filling``).

The core of ``hierarchy.hierarchical_allocation``: between two events every leaf's level
grows linearly, so the next event is found in closed form and the filling jumps to it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from fairshare.fairness.shares import EPS
from fairshare.fairness.tree import Tree

JOIN = 1e-12
"""Relative tolerance for two shares to count as level (they are computed, not exact)."""


def fill(tree: Tree, root: int, extra: Mapping[int, float], eligible: set[int] | None) -> None:
    """Fill the subtree of ``root`` (-1: the whole tree) from the current levels.

    ``extra`` caps the root's subtree on the listed columns (a guarantee being
    filled); ``eligible`` (None: all) are the leaves that may grow. The filling goes
    from event to event (``Filling.advance_to_next_event``) until no leaf can grow,
    nothing grows any more, or a bound on the number of events is reached.
    """
    run = Filling(tree, root, extra, eligible)
    if not run.alive:
        return
    for _event in range(20 * (len(run.alive) + 2) * (tree.n_res + 2)):
        if not run.advance_to_next_event():
            return


class Filling:
    """One ``fill``: the subtree of ``root`` filled event by event.

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
        self,
        tree: Tree,
        root: int,
        extra: Mapping[int, float],
        eligible: set[int] | None,
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
        floor = s_max - JOIN * max(s_max, 1e-9)
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
        parent, leaf, kids, w, unit = (
            tree.parent,
            tree.leaf,
            tree.kids,
            tree.w,
            tree.unit,
        )
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
            above = m + JOIN * max(m, 1e-9)
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
        of lowest share (``low``, level with each other within ``JOIN``); the open
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
            above = m + JOIN * max(m, 1e-9)
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
        low, over, level, share, vec = (
            self.low,
            self.over,
            self.level,
            self.share,
            self.vec,
        )
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
                    if floor[k] <= level[i] + JOIN * max(level[i], 1e-9):
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
                above = level[node] + JOIN * max(level[node], 1e-9)
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
