"""Reclaim toward guarantees in a tree of tenants: a guarantee at any level makes a
beneficiary, victims come from outside that level's subtree, and no victim takes its
tenant or any ancestor of it below their guarantees."""

from __future__ import annotations

from typing import Any

from fairshare.config.loading import config_from_mapping
from fairshare.preemption import reclaim
from fairshare.preemption.victims import Victim, protect_guaranteed
from tests.unit.test_reclaim import World, gpus, victims


def tree(*tenants: dict[str, Any]) -> Any:
    return config_from_mapping(
        {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig", "tenants": list(tenants)}
    )


def test_an_organisation_guarantee_reclaims_from_outside_never_from_a_sibling():
    cfg = tree(
        {"name": "org-a", "guaranteed": gpus(2)},
        {"name": "a1", "parent": "org-a", "namespaces": ["a1"]},
        {"name": "a2", "parent": "org-a", "namespaces": ["a2"]},
        {"name": "org-b"},
        {"name": "b1", "parent": "org-b", "namespaces": ["b1"]},
    )
    w = World(cfg, ("n1", 2), ("n2", 2))
    for k, n in enumerate(("n1", "n2", "n2")):
        w.run("b1", f"b1-{k}", n)
    w.run("a2", "a2-0", "n1")  # the youngest pod, but a2 shares a1's guarantee
    w.want("a1", "a1-0")
    plan = w.plan()
    assert victims(plan) == ["uid-b1-2"]
    (e,) = plan.evictions
    assert (e.victim_tenant, e.beneficiary_tenant) == ("b1", "a1")
    # Once the organisation is at its guarantee, a1 gets nothing more by reclaim.
    w.want("a1", "a1-1")
    assert victims(w.plan()) == ["uid-b1-2"]


def test_no_victim_takes_an_ancestor_below_its_guarantee():
    cfg = tree(
        {"name": "org-a", "guaranteed": gpus(1)},
        {"name": "a1", "parent": "org-a", "namespaces": ["a1"]},
        {"name": "org-b", "guaranteed": gpus(2)},
        {"name": "b1", "parent": "org-b", "namespaces": ["b1"]},
        {"name": "b2", "parent": "org-b", "namespaces": ["b2"]},
        {"name": "c", "namespaces": ["c"]},
    )
    w = World(cfg, ("n1", 2), ("n2", 2))
    w.run("b1", "b1-0", "n1")
    w.run("b1", "b1-1", "n1")
    w.run("c", "c-0", "n2")
    w.run("c", "c-1", "n2")
    w.want("b2", "b2-0")
    w.want("b2", "b2-1")
    w.want("a1", "a1-0")
    plan = w.plan()
    # b1 is the most over its fair share (it holds org-b's 2 GPUs, b2 waits), but
    # org-b is exactly at its guarantee: c's youngest pod goes.
    assert victims(plan) == ["uid-c-1"]
    assert plan.deficits == ("a1",)
    assert all(e.beneficiary_tenant == "a1" for e in plan.evictions)


def test_flat_reclaim_unchanged_without_parents():
    cfg = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [
                {"name": "a", "namespaces": ["a"]},
                {"name": "b", "namespaces": ["b"], "guaranteed": gpus(2)},
            ],
        }
    )
    w = World(cfg, ("n1", 2), ("n2", 2))
    for k, n in enumerate(("n1", "n1", "n2", "n2")):
        w.run("a", f"a{k}", n)
    w.want("b", "b0")
    assert isinstance(w.plan(), reclaim.ReclaimPlan)
    assert victims(w.plan()) == ["uid-a3"]


# -- reclaim toward fair share (opt-in) ------------------------------------------------------


def burst(**opt: Any) -> World:
    """Weights 1:1:2 on 8 GPUs (fair 2/2/4); the first arrivals left a 3, b 3, c 2."""
    flags = opt.get("tenants", {})
    cfg = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "reclaimToFairShare": opt.get("everyone", False),
            "tenants": [
                {"name": n, "namespaces": [n], "weight": w, **flags.get(n, {})}
                for n, w in (("a", 1), ("b", 1), ("c", 2))
            ],
        }
    )
    w = World(cfg, ("n1", 4), ("n2", 4))
    for name, node_name in (
        ("a-0", "n1"), ("b-0", "n1"), ("c-0", "n1"), ("a-1", "n1"),
        ("b-1", "n2"), ("c-1", "n2"), ("a-2", "n2"), ("b-2", "n2"),
    ):  # fmt: skip
        w.run(name[0], name, node_name)
    for k in range(3, 8):
        for t in "abc":
            w.want(t, f"{t}-{k}")
    return w


def test_reclaim_toward_fair_share_is_opt_in():
    assert victims(burst().plan()) == []


def test_reclaim_toward_fair_share_converges_and_stops_at_fair():
    for w in (burst(everyone=True), burst(tenants={"c": {"reclaimToFairShare": True}})):
        plan = w.plan()
        # c gains two pods (2 -> 4), a and b each give their youngest (3 -> 2): 2/2/4.
        assert sorted(victims(plan)) == ["uid-a-2", "uid-b-2"]
        assert {e.beneficiary_tenant for e in plan.evictions} == {"c"}
        assert all("fair share" in e.message for e in plan.evictions)
        assert len(plan.room or {}) == 2


def test_a_tenant_that_opts_out_is_not_lifted():
    w = burst(everyone=True, tenants={"c": {"reclaimToFairShare": False}})
    assert victims(w.plan()) == []


def test_fair_share_reclaim_in_a_tree_keeps_the_victims_organisation_at_its_fair_share():
    # org-x {x1, x2} and y, weights 1:1, on 4 GPUs: fair org-x 2 (x1 1, x2 1), y 2.
    cfg = tree(
        {"name": "org-x"},
        {"name": "x1", "parent": "org-x", "namespaces": ["x1"]},
        {"name": "x2", "parent": "org-x", "namespaces": ["x2"]},
        {"name": "y", "namespaces": ["y"], "reclaimToFairShare": True},
    )
    w = World(cfg, ("n1", 4))
    w.run("x1", "x1-0", "n1")
    w.run("x1", "x1-1", "n1")
    w.run("x2", "x2-0", "n1")
    w.run("y", "y-0", "n1")
    for k in range(1, 4):
        w.want("x1", f"x1-p{k}")
        w.want("x2", f"x2-p{k}")
        w.want("y", f"y-p{k}")
    plan = w.plan()
    # x1 is above its fair share (2 > 1): its youngest goes; then org-x is at its fair
    # share 2 and x2 at its own 1, so y gets one pod only.
    assert victims(plan) == ["uid-x1-1"]


# -- kube-scheduler's preemption, vetoed per level ---------------------------------------------


def test_preemption_veto_protects_an_organisations_guarantee():
    # org-b guaranteed 2 GPUs (column 0), b1 holds 1 and b2 holds 2; neither team has a
    # guarantee of its own. Evicting one pod keeps org-b at 2; a second would take it to 1.
    victims_ = [Victim("b1-0", "b1", (1.0,)), Victim("b2-0", "b2", (1.0,))]
    kept = protect_guaranteed(
        victims_,
        usage={"org-b": [3.0]},
        guaranteed={"org-b": {0: 2.0}},
        preemptor_tenant="a1",
        preemptor_row=(1.0,),
        ancestors={"b1": ("org-b",), "b2": ("org-b",), "a1": ("org-a",)},
    )
    assert kept == ("b1-0",)
    # A preemptor inside org-b replaces its sibling's pod: org-b's usage does not fall.
    kept = protect_guaranteed(
        victims_,
        usage={"org-b": [3.0]},
        guaranteed={"org-b": {0: 2.0}},
        preemptor_tenant="b2",
        preemptor_row=(1.0,),
        ancestors={"b1": ("org-b",), "b2": ("org-b",)},
    )
    assert kept == ("b1-0", "b2-0")
    # Flat (no ancestors): no guarantee on b1/b2, nothing protected.
    flat = protect_guaranteed(
        victims_, usage={}, guaranteed={}, preemptor_tenant="a1", preemptor_row=(1.0,)
    )
    assert flat == ("b1-0", "b2-0")


def test_a_teams_guarantee_is_restored_from_a_sibling_above_its_share():
    # The simulator's two-level case after the gate: org-a (guaranteed 8) holds a1 5 and
    # a2 3, a1 is guaranteed 6. Evicting a2's youngest keeps org-a at 8 (a1 gains what a2
    # loses), so a1 gets its guarantee back from its sibling; b1 is at its fair share.
    cfg = tree(
        {"name": "org-a", "guaranteed": gpus(8)},
        {"name": "a1", "parent": "org-a", "namespaces": ["a1"], "guaranteed": gpus(6)},
        {"name": "a2", "parent": "org-a", "namespaces": ["a2"]},
        {"name": "org-b"},
        {"name": "b1", "parent": "org-b", "namespaces": ["b1"]},
    )
    w = World(cfg, ("n1", 12))
    for k in range(5):
        w.run("a1", f"a1-{k}", "n1")
    for k in range(3):
        w.run("a2", f"a2-{k}", "n1")
    for k in range(4):
        w.run("b1", f"b1-{k}", "n1")
    for k in range(5, 9):
        w.want("a1", f"a1-{k}")
        w.want("a2", f"a2-{k}")
        w.want("b1", f"b1-{k}")
    plan = w.plan()
    assert victims(plan) == ["uid-a2-2"]
    assert plan.deficits == ("a1",)
