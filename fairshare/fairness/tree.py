"""The tenants as a tree (``Tree``): pre-order rows, every leaf's level, subtree usage.

What ``hierarchy`` and ``filling`` read and change: the tree's shape (parents, children,
subtree ranges), each tenant's weight, demand, limit and the levels of the leaves; and
``Tree.result``, the allocation and weighted share of every tenant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fairshare.fairness.shares import (
    MIN_LEVEL,
    FairShare,
    TenantDemand,
    _dom,
    _level,
    effective_weights,
)


class Tree:
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

    def scale(self, lo: int, hi: int, factor: float) -> None:
        """Scale the levels of the leaves in rows ``lo..hi`` by ``factor`` (a level that
        falls below ``MIN_LEVEL`` becomes 0)."""
        for i in range(lo, hi):
            if self.leaf[i]:
                self.x[i] *= factor
                if self.x[i] < MIN_LEVEL:
                    self.x[i] = 0.0

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
