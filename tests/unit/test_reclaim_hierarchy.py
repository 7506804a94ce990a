"""Reclaim toward guarantees in a tree of tenants: a guarantee at any level makes a
beneficiary, victims come from outside that level's subtree, and no victim takes its
tenant or any ancestor of it below their guarantees."""

from __future__ import annotations

from typing import Any

from fairshare import reclaim
from fairshare.config.loading import config_from_mapping
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
