"""Property tests of hierarchical weighted DRF (tenants in a tree).

* no tenant's subtree above its own or any ancestor's ``limit``; allocation <= capacity;
* no leaf above its demand;
* whenever every leaf is backlogged (asks more than the cluster, on every resource),
  siblings' weighted dominant shares are equal: shares proportional to weights at
  every level of the tree (leaves asking for one mix of resources, scaled).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairshare.fairness import TenantDemand, _dom, fair_allocation
from tests.reliability.conftest import FUZZ_CASES

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOL = 1e-6

# Fractions no float holds exactly (a third, a seventh) as well as 3-decimal values; zero
# demands and limits below. No zero capacity here: a resource no node has counts in no
# share, which test_properties_fairness.py's test_a_resource_no_node_has_counts_in_no_share pins.
INEXACT = [1 / 3, 2 / 3, 10 / 3, 100 / 7]
positive = st.floats(min_value=0.5, max_value=100.0, allow_nan=False).map(
    lambda v: round(v, 3)
) | st.sampled_from(INEXACT[1:])


def upto(top: float) -> st.SearchStrategy[float]:
    """0 .. ``top``: rounded to 3 decimals, zero, or an inexact fraction."""
    return st.floats(0, top, allow_nan=False).map(lambda v: round(v, 3)) | st.sampled_from(
        [0.0, *INEXACT]
    )


weights = st.sampled_from([0.5, 1.0, 2.0, 3.0])


@st.composite
def trees(draw: st.DrawFn, *, backlogged: bool) -> tuple[list[TenantDemand], list[float]]:
    n_res = draw(st.integers(1, 3))
    capacity = [draw(positive) for _ in range(n_res)]
    mix = [draw(st.sampled_from([0.25, 0.5, 1.0])) for _ in range(n_res)]
    n = draw(st.integers(2, 8))
    parents: list[str | None] = [None]
    for i in range(1, n):
        parents.append(draw(st.sampled_from([None, *[f"t{j}" for j in range(i)]])))
    inner = {p for p in parents if p is not None}
    tenants = []
    for i in range(n):
        name = f"t{i}"
        if name in inner:
            demand = tuple(0.0 for _ in range(n_res))
        elif backlogged:
            # One mix for every leaf, so every leaf is stopped by the same resource
            # (mixed demands: test_properties_hierarchy_mixed.py).
            scale = draw(st.sampled_from([10.0, 50.0]))
            demand = tuple(c * mix[r] * scale for r, c in enumerate(capacity))
        else:
            demand = tuple(draw(upto(100)) for _ in capacity)
        limit: dict[int, float] = {}
        if not backlogged and draw(st.booleans()):
            r = draw(st.integers(0, n_res - 1))
            limit[r] = draw(upto(60))
        tenants.append(TenantDemand(name, draw(weights), demand, {}, limit, parents[i]))
    return tenants, capacity


@SETTINGS
@given(problem=trees(backlogged=False))
def test_no_subtree_above_any_limit_on_the_path(problem):
    tenants, capacity = problem
    FUZZ_CASES["property/hierarchy"] += 1
    got = fair_allocation(tenants, capacity=capacity, res_weights=[1.0] * len(capacity))
    by_name = {t.name: t for t in tenants}
    parents = {t.parent for t in tenants}
    total = [0.0] * len(capacity)
    for t in tenants:
        alloc = got[t.name].allocation
        # The tenant's own limit caps its subtree; every ancestor's is checked as its own.
        for r, amount in t.limit.items():
            assert alloc[r] <= amount * (1 + TOL) + TOL, (t.name, alloc, t.limit)
        if t.name not in parents:
            for r, v in enumerate(alloc):
                assert v <= t.demand[r] * (1 + TOL) + TOL
                total[r] += v
            ancestor = t.parent
            while ancestor is not None:
                up = got[ancestor].allocation
                assert all(a <= b * (1 + TOL) + TOL for a, b in zip(alloc, up, strict=True))
                ancestor = by_name[ancestor].parent
    for r, c in enumerate(capacity):
        assert total[r] <= c * (1 + TOL) + TOL


@SETTINGS
@given(problem=trees(backlogged=True))
def test_backlogged_siblings_share_in_proportion_to_weights(problem):
    tenants, capacity = problem
    FUZZ_CASES["property/hierarchy"] += 1
    res_weights = [1.0] * len(capacity)
    got = fair_allocation(tenants, capacity=capacity, res_weights=res_weights)
    groups: dict[str | None, list[TenantDemand]] = {}
    for t in tenants:
        groups.setdefault(t.parent, []).append(t)
    for siblings in groups.values():
        per_weight = [
            _dom(got[t.name].allocation, capacity, res_weights) / t.weight for t in siblings
        ]
        assert max(per_weight) - min(per_weight) <= 1e-6 * max(1.0, max(per_weight)), per_weight
        # And the cluster is used: some resource is saturated.
    used = [
        sum(got[t.name].allocation[r] for t in tenants if t.name not in groups)
        for r in range(len(capacity))
    ]
    assert any(u >= c * (1 - 1e-6) for u, c in zip(used, capacity, strict=True))
