"""Property tests of hierarchical weighted DRF with mixed demands (leaves asking for
different mixes of 2–3 resources), random trees of depth up to 3, weights and limits at
every level:

* no node's subtree above its own or any ancestor's ``limit``, nor the cluster;
* work conservation: every leaf ends with its demand met (up to its own limit) or needs
  a resource used up in the cluster or at the limit of one of its ancestors;
* siblings with unmet demand end with equal weighted dominant shares (leaves asking for
  every resource, so that the first resource used up stops them all at once);
* a flat config is flat weighted DRF, checked against a slow reference written here
  (water-filling by bisection); and a flat config under one common parent gives the
  same allocation as the flat config itself.

The exact answers of hand-worked cases are in ``tests/unit/test_hierarchy.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairshare.fairness import TenantDemand, fair_allocation
from tests.reliability.conftest import FUZZ_CASES

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOL = 1e-9

weights = st.sampled_from([0.5, 1.0, 2.0, 3.0])
# Zero and fractions no float holds exactly (a third, a seventh) as well as 3-decimal values.
amounts = st.floats(min_value=0.0, max_value=64.0, allow_nan=False).map(
    lambda v: round(v, 3)
) | st.sampled_from([0.0, 1 / 3, 2 / 3, 10 / 3, 100 / 7])


def upto(top: float) -> st.SearchStrategy[float]:
    """0 .. ``top``: rounded to 3 decimals, zero, or an inexact fraction of ``top``."""
    return st.floats(0.0, top, allow_nan=False).map(lambda v: round(v, 3)) | st.sampled_from(
        [0.0, top / 3, top * 2 / 3, top / 7]
    )


Problem = tuple[list[TenantDemand], list[float], list[float]]


@st.composite
def trees(draw: st.DrawFn, *, limits: bool, every_resource: bool) -> Problem:
    """A random tree of depth <= 3; leaves with mixed demand vectors."""
    n_res = draw(st.integers(2, 3))
    capacity = [draw(st.sampled_from([4.0, 10.0, 16.0, 32.0])) for _ in range(n_res)]
    res_weights = [draw(st.sampled_from([0.5, 1.0, 2.0])) for _ in range(n_res)]
    tenants: list[TenantDemand] = []

    def limit_of() -> dict[int, float]:
        if not limits or not draw(st.booleans()):
            return {}
        r = draw(st.integers(0, n_res - 1))
        return {r: draw(upto(capacity[r]))}

    def node(name: str, parent: str | None, depth: int) -> None:
        n_kids = draw(st.integers(0, 3)) if depth < 3 else 0
        if n_kids == 0:
            if every_resource:
                demand = tuple(
                    draw(st.floats(0.5, 64.0, allow_nan=False) | st.sampled_from([2 / 3, 100 / 7]))
                    for _ in capacity
                )
                if draw(st.integers(0, 5)) == 0:
                    demand = tuple(0.0 for _ in capacity)  # an idle leaf
            else:
                demand = tuple(draw(amounts) if draw(st.booleans()) else 0.0 for _ in capacity)
            tenants.append(TenantDemand(name, draw(weights), demand, {}, limit_of(), parent))
            return
        zero = tuple(0.0 for _ in capacity)
        tenants.append(TenantDemand(name, draw(weights), zero, {}, limit_of(), parent))
        for k in range(n_kids):
            node(f"{name}.{k}", name, depth + 1)

    for k in range(draw(st.integers(1, 3))):
        node(f"t{k}", None, 1)
    return tenants, capacity, res_weights


def _dom(vec: Sequence[float], capacity: Sequence[float], rw: Sequence[float]) -> float:
    return max((w * v / c for v, c, w in zip(vec, capacity, rw, strict=True)), default=0.0)


def _leaf_level(t: TenantDemand) -> float:
    """The largest fraction of its demand a leaf's own limit lets it hold."""
    x = 1.0
    for r, amount in t.limit.items():
        if t.demand[r] > 0:
            x = min(x, max(0.0, amount) / t.demand[r])
    return x


def _ancestors(t: TenantDemand, by_name: Mapping[str, TenantDemand]) -> list[TenantDemand]:
    out = []
    while t.parent is not None:
        t = by_name[t.parent]
        out.append(t)
    return out


@SETTINGS
@given(problem=trees(limits=True, every_resource=False))
def test_limits_hold_and_every_leaf_is_met_or_blocked(problem: Problem):
    tenants, capacity, rw = problem
    FUZZ_CASES["property/hierarchy-mixed"] += 1
    got = fair_allocation(tenants, capacity=capacity, res_weights=rw)
    by_name = {t.name: t for t in tenants}
    inner = {t.parent for t in tenants}
    used = [0.0] * len(capacity)
    for t in tenants:
        alloc = got[t.name].allocation
        for r, amount in t.limit.items():
            assert alloc[r] <= amount * (1 + TOL) + TOL, (t.name, alloc, t.limit)
        if t.name in inner:
            continue
        for r, v in enumerate(alloc):
            used[r] += v
            assert v <= t.demand[r] * (1 + TOL) + TOL
    for r, c in enumerate(capacity):
        assert used[r] <= c * (1 + TOL) + TOL
    # Work conservation.
    for t in tenants:
        if t.name in inner or not any(v > 0 for v in t.demand):
            continue
        alloc = got[t.name].allocation
        col = next(r for r, v in enumerate(t.demand) if v > 0)
        level = alloc[col] / t.demand[col]
        if level >= _leaf_level(t) * (1 - 1e-7):
            continue  # met
        blocked = [
            r
            for r, v in enumerate(t.demand)
            if v > 0
            and (
                used[r] >= capacity[r] * (1 - 1e-7)
                or any(
                    got[a.name].allocation[r] >= a.limit[r] * (1 - 1e-7) - 1e-12
                    for a in _ancestors(t, by_name)
                    if r in a.limit
                )
            )
        ]
        assert blocked, (t.name, t.demand, alloc, used)


@SETTINGS
@given(problem=trees(limits=False, every_resource=True))
def test_siblings_with_unmet_demand_end_level(problem: Problem):
    tenants, capacity, rw = problem
    FUZZ_CASES["property/hierarchy-mixed"] += 1
    got = fair_allocation(tenants, capacity=capacity, res_weights=rw)
    inner = {t.parent for t in tenants}
    leaves_under: dict[str, list[TenantDemand]] = {t.name: [] for t in tenants}
    by_name = {t.name: t for t in tenants}
    for t in tenants:
        if t.name not in inner:
            for a in [t, *_ancestors(t, by_name)]:
                leaves_under[a.name].append(t)

    def unmet(name: str) -> bool:
        return any(
            got[leaf.name].allocation[0] < leaf.demand[0] * (1 - 1e-7)
            for leaf in leaves_under[name]
        )

    groups: dict[str | None, list[TenantDemand]] = {}
    for t in tenants:
        groups.setdefault(t.parent, []).append(t)
    for siblings in groups.values():
        share = {t.name: _dom(got[t.name].allocation, capacity, rw) / t.weight for t in siblings}
        backlogged = [t.name for t in siblings if unmet(t.name)]
        if not backlogged:
            continue
        level = max(share[n] for n in backlogged)
        for n in backlogged:
            assert abs(share[n] - level) <= TOL * max(level, 1e-9), share
        for t in siblings:  # a met sibling stopped at or below its siblings' level
            assert share[t.name] <= level * (1 + TOL) + TOL, share


@st.composite
def flat_problems(draw: st.DrawFn) -> Problem:
    n_res = draw(st.integers(2, 3))
    capacity = [draw(st.sampled_from([4.0, 10.0, 16.0, 32.0])) for _ in range(n_res)]
    res_weights = [draw(st.sampled_from([0.5, 1.0, 2.0])) for _ in range(n_res)]
    tenants = []
    for k in range(draw(st.integers(1, 6))):
        demand = tuple(draw(amounts) if draw(st.booleans()) else 0.0 for _ in capacity)
        limit: dict[int, float] = {}
        if draw(st.booleans()):
            r = draw(st.integers(0, n_res - 1))
            limit[r] = draw(upto(capacity[r]))
        guaranteed: dict[int, float] = {}
        asked = [r for r, v in enumerate(demand) if v > 0]
        if asked and draw(st.integers(0, 3)) == 0:
            r = draw(st.sampled_from(asked))
            guaranteed[r] = draw(upto(capacity[r] / 8))
        tenants.append(TenantDemand(f"t{k}", draw(weights), demand, guaranteed, limit))
    return tenants, capacity, res_weights


def reference_drf(
    tenants: Sequence[TenantDemand], capacity: Sequence[float], rw: Sequence[float]
) -> dict[str, tuple[float, ...]] | None:
    """Weighted DRF by water-filling: raise the level L (weighted dominant share) of
    every tenant not yet stopped, x_t = max(start_t, L * w_t / dom_t) capped by its limit,
    to the largest L that fits (bisection), stop the tenants that are met or need a
    used-up resource, repeat. None when the guarantees alone do not fit."""
    n_res = len(capacity)
    by_name = {t.name: t for t in tenants}
    dom = {t.name: _dom(t.demand, capacity, rw) for t in tenants}
    cap_x = {t.name: _leaf_level(t) for t in tenants}
    start = {}
    for t in tenants:
        g = 1.0
        for r, amount in t.guaranteed.items():
            if t.demand[r] > 0:
                g = min(g, amount / t.demand[r])
        start[t.name] = min(g, cap_x[t.name]) if t.guaranteed else 0.0
    x = dict(start)

    def usage(level: float, active: set[str]) -> list[float]:
        out = [0.0] * n_res
        for t in tenants:
            v = x[t.name]
            if t.name in active:
                v = min(cap_x[t.name], max(start[t.name], level * t.weight / dom[t.name]))
            for r in range(n_res):
                out[r] += v * t.demand[r]
        return out

    def fits(use: list[float]) -> bool:
        return all(u <= c * (1 + 1e-12) for u, c in zip(use, capacity, strict=True))

    if not fits(usage(0.0, set())):
        return None
    active = {t.name for t in tenants if dom[t.name] > 0 and x[t.name] < cap_x[t.name]}
    level = 0.0
    while True:
        use = usage(level, set())
        full = {r for r in range(n_res) if use[r] >= capacity[r] * (1 - 1e-9)}
        active = {
            n
            for n in active
            if x[n] < cap_x[n] * (1 - 1e-9) and not any(by_name[n].demand[r] > 0 for r in full)
        }
        if not active:
            break
        lo = level
        hi = max(cap_x[n] * dom[n] / by_name[n].weight for n in active)
        if fits(usage(hi, active)):
            lo = hi
        else:
            for _ in range(200):
                mid = (lo + hi) / 2
                if fits(usage(mid, active)):
                    lo = mid
                else:
                    hi = mid
        level = lo
        for n in active:
            x[n] = min(cap_x[n], max(start[n], level * by_name[n].weight / dom[n]))
    return {t.name: tuple(x[t.name] * v for v in t.demand) for t in tenants}


@SETTINGS
@given(problem=flat_problems())
def test_flat_configs_are_flat_weighted_drf(problem: Problem):
    tenants, capacity, rw = problem
    FUZZ_CASES["property/hierarchy-mixed"] += 1
    want = reference_drf(tenants, capacity, rw)
    got = fair_allocation(tenants, capacity=capacity, res_weights=rw)
    if want is not None:
        for t in tenants:
            for a, b in zip(got[t.name].allocation, want[t.name], strict=True):
                assert abs(a - b) <= 1e-7 * max(1.0, b), (t.name, got[t.name], want[t.name])
    # The same tenants as the children of one top-level tenant: the tree's filling.
    wrapped = [
        TenantDemand("_root", 2.0, tuple(0.0 for _ in capacity), {}, {}),
        *(
            TenantDemand(t.name, t.weight, t.demand, t.guaranteed, t.limit, "_root")
            for t in tenants
        ),
    ]
    tree = fair_allocation(wrapped, capacity=capacity, res_weights=rw)
    for t in tenants:
        for a, b in zip(tree[t.name].allocation, got[t.name].allocation, strict=True):
            assert abs(a - b) <= 1e-9 * max(1.0, b), (t.name, tree[t.name], got[t.name])
