"""Dominant shares and the types of the fair allocation: ``dominant_shares`` (through the
``_native.drf`` kernel), ``TenantDemand`` and ``FairShare`` (a tenant's input and output),
``effective_weights`` (a tenant's weight in the whole tree), ``jain_index``, and the small
helpers both allocations use.
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


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(Σx)² / (n Σx²)``, 1 = perfectly even; 1.0 for no data."""
    vals = [v for v in values if math.isfinite(v)]
    sq = sum(v * v for v in vals)
    if not vals or sq == 0:
        return 1.0
    return sum(vals) ** 2 / (len(vals) * sq)
