"""Tenants in a tree: config validation and hierarchical weighted DRF (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from fairshare import fairness, tenancy
from fairshare.config import loading
from fairshare.errors import ConfigError
from fairshare.fairness import TenantDemand


def _config(tenants: list[dict[str, Any]]) -> Any:
    return loading.config_from_mapping(
        {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig", "tenants": tenants}
    )


def _errors(tenants: list[dict[str, Any]]) -> str:
    with pytest.raises(ConfigError) as info:
        _config(tenants)
    return str(info.value)


def test_unknown_parent_is_a_field_error():
    assert 'tenants[1].parent: unknown tenant "org"' in _errors(
        [{"name": "a"}, {"name": "b", "parent": "org"}]
    )


def test_cycle_is_a_field_error():
    text = _errors([{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}])
    assert "tenants[0].parent: parents form a cycle: a -> b -> a" in text
    assert "tenants[1].parent: parents form a cycle: b -> a -> b" in text
    assert "cannot be its own parent" in _errors([{"name": "a", "parent": "a"}])


def test_namespaces_belong_to_leaves():
    text = _errors(
        [
            {"name": "ml", "namespaces": ["x"], "namespaceSelector": {"team": "ml"}},
            {"name": "a1", "parent": "ml"},
        ]
    )
    assert "tenants[0].namespaces: tenant has children (a1)" in text
    assert "tenants[0].namespaceSelector: tenant has children (a1)" in text


def test_the_default_tenant_must_be_a_leaf():
    cfg = {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "defaultTenant": {"mode": "tenant", "name": "ml"},
        "tenants": [{"name": "ml"}, {"name": "a1", "parent": "ml"}],
    }
    with pytest.raises(ConfigError) as info:
        loading.config_from_mapping(cfg)
    assert 'defaultTenant.name: tenant "ml" has children (a1)' in str(info.value)


def test_children_guarantees_must_fit_in_the_parent():
    text = _errors(
        [
            {"name": "ml", "guaranteed": {"cpu": "3"}},
            {"name": "a1", "parent": "ml", "guaranteed": {"cpu": "2"}},
            {"name": "a2", "parent": "ml", "guaranteed": {"cpu": "2"}},
        ]
    )
    assert (
        "tenants[0].guaranteed.cpu: children's guaranteed cpu adds up to 4, "
        "above this tenant's guaranteed 3"
    ) in text
    ok = _config(
        [
            {"name": "ml", "guaranteed": {"cpu": "4"}},
            {"name": "a1", "parent": "ml", "guaranteed": {"cpu": "2"}, "namespaces": ["a1"]},
            {"name": "a2", "parent": "ml", "guaranteed": {"cpu": "2"}},
        ]
    )
    assert [t.name for t in ok.ancestors("a1")] == ["ml"]
    assert [t.name for t in ok.children("ml")] == ["a1", "a2"]


def test_capacity_counts_only_top_level_guarantees():
    cfg = loading.config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "capacity": {"cpu": "4"},
            "tenants": [
                {"name": "ml", "guaranteed": {"cpu": "4"}},
                {"name": "a1", "parent": "ml", "guaranteed": {"cpu": "4"}},
            ],
        }
    )
    assert cfg.is_hierarchical()


def test_flat_weights_unchanged_tree_weights_multiply():
    flat = _config([{"name": "a", "weight": 2}, {"name": "b"}])
    assert tenancy.tenant_weights(flat) == {"a": 2.0, "b": 1.0, "default": 1.0}
    tree = _config(
        [
            {"name": "ml"},
            {"name": "cv", "weight": 2},
            {"name": "a1", "parent": "ml"},
            {"name": "a2", "parent": "ml", "weight": 3},
            {"name": "b1", "parent": "cv"},
        ]
    )
    w = tenancy.tenant_weights(tree)
    assert w["a1"] == pytest.approx(0.25)
    assert w["a2"] == pytest.approx(0.75)
    assert w["b1"] == pytest.approx(2.0)
    assert w["default"] == 1.0


def test_a_label_naming_an_inner_tenant_does_not_place_a_namespace_there():
    tree = _config([{"name": "ml"}, {"name": "a1", "parent": "ml"}])
    got = tenancy.resolve_tenant("ns", {"fairshare.io/tenant": "ml"}, tree)
    assert got.tenant == "default"
    assert got.unknown_label == "ml"
    assert tenancy.resolve_tenant("ns", {"fairshare.io/tenant": "a1"}, tree).tenant == "a1"


def test_the_warning_for_a_label_naming_an_inner_tenant_says_so():
    tree = _config([{"name": "ml"}, {"name": "a1", "parent": "ml"}])
    inner = tenancy.resolve_tenant("ns", {"fairshare.io/tenant": "ml"}, tree)
    text = inner.label_warning("ns")
    assert text is not None
    assert "a tenant with child tenants" in text
    assert "no configured tenant" not in text
    unknown = tenancy.resolve_tenant("ns", {"fairshare.io/tenant": "nope"}, tree)
    assert unknown.label_warning("ns") == (
        "namespace ns has label fairshare.io/tenant=nope, "
        "which names no configured tenant; it was ignored"
    )
    leaf = tenancy.resolve_tenant("ns", {"fairshare.io/tenant": "a1"}, tree)
    assert leaf.label_warning("ns") is None


BIG = (100.0,)


def _tree(
    *,
    wa: float = 1,
    wb: float = 1,
    wa1: float = 1,
    wa2: float = 1,
    a2: tuple[float, ...] = BIG,
    limit_a: dict[int, float] | None = None,
) -> dict[str, float]:
    tenants = [
        TenantDemand("A", wa, (0.0,), {}, limit_a or {}),
        TenantDemand("B", wb, (0.0,), {}, {}),
        TenantDemand("a1", wa1, BIG, {}, {}, "A"),
        TenantDemand("a2", wa2, a2, {}, {}, "A"),
        TenantDemand("b1", 1, BIG, {}, {}, "B"),
    ]
    got = fairness.fair_allocation(tenants, capacity=(12.0,), res_weights=(1.0,))
    return {name: round(share.allocation[0], 9) for name, share in got.items()}


def test_hand_worked_tree_outcomes():
    # 12 CPUs; A{a1, a2}, B{b1}; every leaf backlogged: flat DRF would give 4/4/4.
    assert _tree() == {"A": 6, "B": 6, "a1": 3, "a2": 3, "b1": 6}
    # a2 idle: its share goes to its sibling first.
    assert _tree(a2=(0.0,)) == {"A": 6, "B": 6, "a1": 6, "a2": 0, "b1": 6}
    # A limited to 4 CPUs: the rest goes up the tree, to B.
    assert _tree(limit_a={0: 4.0}) == {"A": 4, "B": 8, "a1": 2, "a2": 2, "b1": 8}
    # Weights A 1, B 2; a1 1, a2 3.
    assert _tree(wb=2, wa2=3) == {"A": 4, "B": 8, "a1": 1, "a2": 3, "b1": 8}
    # A small sibling under a limit keeps what it asks; the other takes the rest of A's.
    assert _tree(limit_a={0: 4.0}, a2=(1.0,)) == {"A": 4, "B": 8, "a1": 3, "a2": 1, "b1": 8}


def test_tree_shares_are_comparable_across_levels():
    tenants = [
        TenantDemand("A", 1, (0.0,), {}, {}),
        TenantDemand("B", 1, (0.0,), {}, {}),
        TenantDemand("a1", 1, BIG, {}, {}, "A"),
        TenantDemand("a2", 1, BIG, {}, {}, "A"),
        TenantDemand("b1", 1, BIG, {}, {}, "B"),
    ]
    got = fairness.fair_allocation(tenants, capacity=(12.0,), res_weights=(1.0,))
    # a1 holds 3/12 with weight 1/2 * 1/2; b1 6/12 with weight 1/2 * 1 (times the root 1+1).
    assert got["a1"].share == pytest.approx(got["b1"].share)
    assert got["a1"].fraction_of_demand == pytest.approx(0.03)


def test_guarantees_at_two_levels():
    tenants = [
        TenantDemand("A", 1, (0.0,), {0: 8.0}, {}),
        TenantDemand("B", 1, (0.0,), {}, {}),
        TenantDemand("a1", 1, BIG, {0: 6.0}, {}, "A"),
        TenantDemand("a2", 1, BIG, {}, {}, "A"),
        TenantDemand("b1", 1, BIG, {}, {}, "B"),
    ]
    got = fairness.fair_allocation(tenants, capacity=(12.0,), res_weights=(1.0,))
    alloc = {n: round(s.allocation[0], 9) for n, s in got.items()}
    assert alloc == {"A": 8, "B": 4, "a1": 6, "a2": 2, "b1": 4}


def test_leftover_of_a_subtree_goes_up_the_tree():
    # a1 wants CPU only, a2 GPU only, b1 little: nothing may stay idle that someone asks.
    tenants = [
        TenantDemand("A", 1, (0.0, 0.0), {}, {}),
        TenantDemand("B", 1, (0.0, 0.0), {}, {}),
        TenantDemand("a1", 1, (100.0, 0.0), {}, {}, "A"),
        TenantDemand("a2", 1, (0.0, 100.0), {}, {}, "A"),
        TenantDemand("b1", 1, (2.0, 2.0), {}, {}, "B"),
    ]
    got = fairness.fair_allocation(tenants, capacity=(12.0, 12.0), res_weights=(1.0, 1.0))
    assert got["b1"].allocation == pytest.approx((2.0, 2.0))
    assert got["a1"].allocation == pytest.approx((10.0, 0.0))
    assert got["a2"].allocation == pytest.approx((0.0, 10.0))


def _mixed(a1: tuple[float, ...], a2: tuple[float, ...], b1: tuple[float, ...]) -> dict[str, Any]:
    tenants = [
        TenantDemand("A", 1, (0.0, 0.0), {}, {}),
        TenantDemand("B", 1, (0.0, 0.0), {}, {}),
        TenantDemand("a1", 1, a1, {}, {}, "A"),
        TenantDemand("a2", 1, a2, {}, {}, "A"),
        TenantDemand("b1", 1, b1, {}, {}, "B"),
    ]
    got = fairness.fair_allocation(tenants, capacity=(10.0, 10.0), res_weights=(1.0, 1.0))
    return {n: tuple(round(v, 9) for v in s.allocation) for n, s in got.items()}


def test_a_leaf_not_blocked_by_a_saturated_resource_keeps_growing():
    # 10 CPU / 10 GPU. a1 wants 2 CPU in all, a2 GPUs only, b1 CPU and GPU alike.
    # H-DRF by hand: a1 = a2 = x (equal shares in A), A's share x/10 = b1's y/10; the
    # GPUs run out at a2 + y = 10, so x = y = 5, but a1 stops at its 2 CPUs first, then
    # a2 alone keeps A level with B: a1 2 CPU, a2 5 GPU, b1 5 CPU + 5 GPU. The GPUs
    # saturate; a1 does not need them, so it must still get its 2 CPUs (it got 0.1
    # when A grew along its summed demand, which needs the saturated GPUs).
    got = _mixed(a1=(2.0, 0.0), a2=(0.0, 100.0), b1=(100.0, 100.0))
    assert got["a1"] == (2.0, 0.0)
    assert got["a2"] == (0.0, 5.0)
    assert got["b1"] == (5.0, 5.0)
    # Mirror image: a2 wants 2 GPUs in all, b1 CPUs only. a1 = b1 = 5 CPU (the CPUs run
    # out), a2 gets its 2 GPUs although the CPUs are used up.
    got = _mixed(a1=(100.0, 0.0), a2=(0.0, 2.0), b1=(100.0, 0.0))
    assert (got["a1"], got["a2"], got["b1"]) == ((5.0, 0.0), (0.0, 2.0), (5.0, 0.0))


def _alloc(
    tenants: list[TenantDemand], capacity: tuple[float, ...]
) -> dict[str, tuple[float, ...]]:
    got = fairness.fair_allocation(tenants, capacity=capacity, res_weights=(1.0,) * len(capacity))
    return {n: tuple(round(v, 9) for v in s.allocation) for n, s in got.items()}


Z2 = (0.0, 0.0)


def test_a_child_of_another_dominant_resource_is_not_starved():
    # The H-DRF paper's starvation example: 10 CPU / 10 GPU; n1 wants GPUs, n2's children
    # n21 CPUs and n22 GPUs. n1, n21 and n22 rise level (n2's aggregate share is
    # max(n21, n22) = n1's) until the GPUs run out at 5 + 5; n21 then takes the CPUs.
    got = _alloc(
        [
            TenantDemand("n1", 1, (0.0, 100.0), {}, {}),
            TenantDemand("n2", 1, Z2, {}, {}),
            TenantDemand("n21", 1, (100.0, 0.0), {}, {}, "n2"),
            TenantDemand("n22", 1, (0.0, 100.0), {}, {}, "n2"),
        ],
        (10.0, 10.0),
    )
    assert (got["n1"], got["n21"], got["n22"]) == ((0, 5), (10, 0), (0, 5))


def test_a_blocked_sibling_does_not_hand_its_parent_an_edge():
    # The paper's blocking example: 12 CPU / 12 GPU; n1, n2 want CPUs, n3 = {n31 CPUs,
    # n32 GPUs}, n4 GPUs. All rise level until the CPUs run out at 4 + 4 + 4; n32 and n4
    # then share the GPUs left (12 - 4 - 4 = 4) evenly: 6 each. (The round-based
    # filling gave n32 4 and n4 8: n3's CPU share held n32 back.)
    got = _alloc(
        [
            TenantDemand("n1", 1, (100.0, 0.0), {}, {}),
            TenantDemand("n2", 1, (100.0, 0.0), {}, {}),
            TenantDemand("n3", 1, Z2, {}, {}),
            TenantDemand("n31", 1, (100.0, 0.0), {}, {}, "n3"),
            TenantDemand("n32", 1, (0.0, 100.0), {}, {}, "n3"),
            TenantDemand("n4", 1, (0.0, 100.0), {}, {}),
        ],
        (12.0, 12.0),
    )
    assert got["n1"] == got["n2"] == got["n31"] == (4, 0)
    assert got["n32"] == got["n4"] == (0, 6)


def test_a_child_catches_up_under_a_share_held_by_its_met_sibling():
    # 10 CPU / 10 GPU; n = {c1 CPUs (weight 1), c2 4 GPUs (weight 3)}, m CPUs.
    # Level rise: c2 = 3 * c1 in share, n's share = c2's = m's; c2 is met at 4 GPUs
    # (0.4) with c1 at 0.4 / 3 and m at 0.4. n's share stays 0.4 (c2's GPUs) while c1
    # grows to 4 CPUs; then n (now c1's CPUs) and m rise level: 5 CPUs each.
    got = _alloc(
        [
            TenantDemand("n", 1, Z2, {}, {}),
            TenantDemand("c1", 1, (100.0, 0.0), {}, {}, "n"),
            TenantDemand("c2", 3, (0.0, 4.0), {}, {}, "n"),
            TenantDemand("m", 1, (100.0, 0.0), {}, {}),
        ],
        (10.0, 10.0),
    )
    assert (got["c1"], got["c2"], got["m"]) == ((5, 0), (0, 4), (5, 0))


@pytest.mark.parametrize("shape", ["flat", "one parent", "two parents", "parent's limit"])
def test_mixed_demands_under_a_parent_are_filled_exactly(shape: str):
    # Capacity (1 CPU, 4 GB, 1 GPU); a asks (9, 1, 0), b (0, 4, 0). a's dominant share
    # is its CPU: 9 x_a, b's its memory: x_b; level: x_b = 9 x_a. Memory runs out first:
    # x_a + 4 x_b = 37 x_a = 4, so a gets 36/37 CPU and 4/37 GB, b 144/37 GB, and both
    # are blocked (both need memory). The same under one parent, under two, and when
    # the parent's limit, not the cluster, is (1, 4, 1). (The round-based filling gave
    # a 0.9641 CPU whenever a and b shared a parent: it stopped short of the exact fill.)
    cap = (1.0, 4.0, 1.0)
    a, b = (9.0, 1.0, 0.0), (0.0, 4.0, 0.0)
    none = (0.0, 0.0, 0.0)
    tenants = {
        "flat": [TenantDemand("a", 1, a, {}, {}), TenantDemand("b", 1, b, {}, {})],
        "one parent": [
            TenantDemand("P", 1, none, {}, {}),
            TenantDemand("a", 1, a, {}, {}, "P"),
            TenantDemand("b", 1, b, {}, {}, "P"),
        ],
        "two parents": [
            TenantDemand("P", 1, none, {}, {}),
            TenantDemand("Q", 1, none, {}, {}),
            TenantDemand("a", 1, a, {}, {}, "P"),
            TenantDemand("b", 1, b, {}, {}, "Q"),
        ],
        "parent's limit": [
            TenantDemand("P", 1, none, {}, {0: 1.0, 1: 4.0, 2: 1.0}),
            TenantDemand("a", 1, a, {}, {}, "P"),
            TenantDemand("b", 1, b, {}, {}, "P"),
        ],
    }[shape]
    if shape == "parent's limit":
        cap = (10.0, 40.0, 10.0)
    got = fairness.fair_allocation(tenants, capacity=cap, res_weights=(1.0, 1.0, 1.0))
    assert got["a"].allocation == pytest.approx((36 / 37, 4 / 37, 0.0), rel=1e-12)
    assert got["b"].allocation == pytest.approx((0.0, 144 / 37, 0.0), rel=1e-12)


def test_an_inner_guarantee_is_filled_among_the_leaves_that_ask_for_it():
    # 12 CPU / 12 GPU; A guaranteed 6 GPUs, with a1 (GPUs) and a2 (CPUs only, so A's
    # GPU guarantee does nothing for it); B = {b1 GPUs}. A's 6 GPUs all start with a1, so
    # A starts at 0.5 and B alone rises to it: b1 6 GPUs, and the GPUs are used up. A's
    # share without the GPUs is a2's 0, and a2 takes the CPUs nobody else asks for.
    got = _alloc(
        [
            TenantDemand("A", 1, Z2, {1: 6.0}, {}),
            TenantDemand("B", 1, Z2, {}, {}),
            TenantDemand("a1", 1, (0.0, 100.0), {}, {}, "A"),
            TenantDemand("a2", 1, (100.0, 0.0), {}, {}, "A"),
            TenantDemand("b1", 1, (0.0, 100.0), {}, {}, "B"),
        ],
        (12.0, 12.0),
    )
    assert (got["a1"], got["a2"], got["b1"]) == ((0, 6), (12, 0), (0, 6))


def test_a_guaranteed_child_above_its_siblings_counts_in_full_for_its_parent():
    # 20 CPUs; A guaranteed 8 = {a1 guaranteed 6, a2}, B = {b1}; all backlogged. Starts:
    # a1 6, and A's 8 filled with a2's 2. A (8) waits while B rises to it, then A and B
    # rise level, A's growth going to a2: 6 + a2 = b1 and 6 + a2 + b1 = 20, so a2 4 and
    # b1 10: A's guarantee is inside its half, it does not enlarge it. (Were a1 rescaled
    # to a2's level, as the paper does for children above their level without a
    # guarantee, A would count as 2 * a2 and take 10.67.)
    tenants = [
        TenantDemand("A", 1, (0.0,), {0: 8.0}, {}),
        TenantDemand("B", 1, (0.0,), {}, {}),
        TenantDemand("a1", 1, BIG, {0: 6.0}, {}, "A"),
        TenantDemand("a2", 1, BIG, {}, {}, "A"),
        TenantDemand("b1", 1, BIG, {}, {}, "B"),
    ]
    got = _alloc(tenants, (20.0,))
    assert (got["a1"], got["a2"], got["b1"]) == ((6,), (4,), (10,))
