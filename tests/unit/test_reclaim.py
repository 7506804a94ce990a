"""plan_reclaim: who is evicted, for whom, and why others wait (table-driven)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fairshare import gate
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest
from fairshare.preemption import reclaim
from fairshare.resources import ResourceIndex
from fairshare.state import objects
from fairshare.state.cluster import ClusterState
from tests.unit.test_state_objects import node, pod


def config(*tenants: dict[str, Any]) -> FairShareConfig:
    return config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"namespaces": [t["name"]], **t} for t in tenants],
        }
    )


def gpus(n: int) -> dict[str, str]:
    return {"nvidia.com/gpu": str(n)}


class World:
    """Nodes, bound pods (tenant = namespace) and a pending queue for the planner."""

    def __init__(self, cfg: FairShareConfig, *nodes: tuple[str, int]) -> None:
        self.cfg = cfg
        self.state = ClusterState(ResourceIndex(cfg.resource_names()))
        for name, n in nodes:
            self.add_node(name, n)
        self.pending: list[PodRequest] = []
        self.created: dict[str, float] = {}
        self.clock = 0.0

    def add_node(self, name: str, n: int) -> None:
        obj = node(name, gpus=n, cpu="64")
        obj["metadata"]["labels"]["kubernetes.io/hostname"] = name
        objects.apply_node(self.state, obj, self.cfg)

    def _req(self, obj: dict[str, Any], tenant: str) -> PodRequest:
        return objects.pod_request(obj, config=self.cfg, tenant=tenant, index=self.state.index)

    def run(self, tenant: str, name: str, node_name: str, gpu: int = 1) -> str:
        obj = pod(name, ns=tenant, gpu=gpu, node_name=node_name)
        objects.apply_pod(self.state, obj, self.cfg, tenant)
        self.clock += 1
        self.created[f"uid-{name}"] = self.clock
        return f"uid-{name}"

    def want(self, tenant: str, name: str, gpu: int = 1) -> str:
        self.pending.append(self._req(pod(name, ns=tenant, gpu=gpu), tenant))
        return f"uid-{name}"

    def plan(self, **kw: Any) -> reclaim.ReclaimPlan:
        args: dict[str, Any] = {
            "config": self.cfg,
            "pending": self.pending,
            "now": 100.0,
            "last_evictions": {},
            "cooldown": 60.0,
            "max_evictions": 100,
            "created": self.created,
        }
        args.update(kw)
        return reclaim.plan_reclaim(self.state, **args)


def victims(plan: reclaim.ReclaimPlan) -> list[str]:
    return [e.victim_uid for e in plan.evictions]


# -- who is a beneficiary -----------------------------------------------------------------


def full_world() -> World:
    cfg = config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)})
    w = World(cfg, ("n1", 2), ("n2", 2))
    for k, n in enumerate(("n1", "n1", "n2", "n2")):
        w.run("a", f"a{k}", n)
    return w


def test_youngest_pod_of_the_over_share_tenant_makes_room():
    # A holds all 4 GPUs (a3 is the youngest, on n2); B (guaranteed 2) wants one.
    w = full_world()
    w.want("b", "b0")
    plan = w.plan()
    assert victims(plan) == ["uid-a3"]
    (e,) = plan.evictions
    assert (e.victim_tenant, e.beneficiary_tenant, e.node) == ("a", "b", "n2")
    assert plan.decisions == (("a", "b"),)
    assert plan.deficits == ("b",)
    assert plan.room == {"uid-b0": "n2"}
    assert "guaranteed share" in e.message


@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        ({}, ["uid-a3"]),
        ({"schedulingGates": [{"name": "hold"}]}, []),  # not in a queue: nothing to free
        ({"schedulerName": "someone-else"}, []),  # not a pod the extender's scheduler places
        ({"nodeSelector": {"kubernetes.io/hostname": "n1"}}, ["uid-a1"]),  # n1's youngest
        ({"nodeSelector": {"zone": "nowhere"}}, []),  # no node could ever take it
    ],
    ids=["plain", "gated", "other-scheduler", "selector", "nowhere"],
)
def test_reclaim_only_for_pods_that_could_run(spec, expect):
    w = full_world()
    obj = pod("b0", ns="b", gpu=1)
    obj["spec"].update(spec)
    w.pending.append(w._req(obj, "b"))
    assert victims(w.plan()) == expect


def test_two_beneficiaries_get_two_places_and_stop_at_the_guarantee():
    # B guaranteed 2 and wants 3: two are reclaimed (a3, then a2 on the same node),
    # the third would exceed the guarantee and is left alone.
    w = full_world()
    for k in range(3):
        w.want("b", f"b{k}")
    plan = w.plan()
    assert victims(plan) == ["uid-a3", "uid-a2"]
    assert plan.waiting == ()


def test_rate_limit_makes_the_pod_wait():
    w = full_world()
    w.want("b", "b0")
    plan = w.plan(max_evictions=0)
    assert plan.evictions == ()
    assert [(x.uid, x.reason) for x in plan.waiting] == [("uid-b0", reclaim.WAIT_BUDGET)]


def fragmented_world() -> World:
    # A (guaranteed 2) holds 3 GPUs: a0, a1 on n1 and a2 on n2; one GPU free on n2.
    # B (guaranteed 2) wants one 2-GPU pod.
    cfg = config({"name": "a", "guaranteed": gpus(2)}, {"name": "b", "guaranteed": gpus(2)})
    w = World(cfg, ("n1", 2), ("n2", 2))
    for name, n in (("a0", "n1"), ("a1", "n1"), ("a2", "n2")):
        w.run("a", name, n)
    w.want("b", "b0", gpu=2)
    return w


@pytest.mark.parametrize(
    ("protected", "expect", "reason"),
    [
        # n2: evicting a2 leaves A at 2 = its guarantee; n1 would need both of a0, a1.
        (frozenset(), ["uid-a2"], None),
        # a2 refused by a PodDisruptionBudget: n1 would take A to 1 < 2, so B waits.
        (frozenset({"uid-a2"}), [], reclaim.WAIT_NO_VICTIMS),
    ],
    ids=["one-victim-keeps-guarantee", "only-option-breaks-guarantee"],
)
def test_victim_tenant_kept_at_its_guarantee(protected, expect, reason):
    plan = fragmented_world().plan(protected=protected)
    assert victims(plan) == expect
    assert [x.reason for x in plan.waiting] == ([reason] if reason else [])


@pytest.mark.parametrize(
    ("pending_gpus", "expect"),
    [
        (0, []),  # a CPU-only pod asks for no guaranteed column
        (3, []),  # 3 GPUs would take B above its guarantee of 2
        (2, ["uid-a3", "uid-a2"]),  # exactly the guarantee: both pods of n2 go
    ],
    ids=["cpu-only", "above-guarantee", "exactly-guarantee"],
)
def test_beneficiary_must_stay_within_its_guarantee(pending_gpus, expect):
    w = full_world()
    w.want("b", "b0", gpu=pending_gpus)
    assert victims(w.plan()) == expect


def test_pod_that_fits_now_needs_no_reclaim():
    w = World(config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)}), ("n1", 2))
    w.run("a", "a0", "n1")
    w.want("b", "b0")
    plan = w.plan()
    assert plan.evictions == () and plan.deficits == ("b",)


def test_unresolvable_failure_is_not_reclaimed_for():
    # A 3-GPU pod on 2-GPU nodes can never fit: evicting would not help.
    cfg = config({"name": "a"}, {"name": "b", "guaranteed": gpus(3)})
    w = World(cfg, ("n1", 2), ("n2", 2))
    w.run("a", "a0", "n1", gpu=2)
    w.run("a", "a1", "n2", gpu=2)
    w.want("b", "b0", gpu=3)
    plan = w.plan()
    assert plan.evictions == ()
    assert [x.reason for x in plan.waiting] == [reclaim.WAIT_NO_VICTIMS]


def test_most_over_share_tenant_goes_first():
    # A holds 3 GPUs, C holds 1 (all on one 4-GPU node); B (guaranteed 1) wants one:
    # A is further above its fair share, so A's youngest pod goes though C's is younger.
    cfg = config({"name": "a"}, {"name": "b", "guaranteed": gpus(1)}, {"name": "c"})
    w = World(cfg, ("n1", 4))
    for k in range(3):
        w.run("a", f"a{k}", "n1")
    w.run("c", "c0", "n1")
    w.want("b", "b0")
    assert victims(w.plan()) == ["uid-a2"]


def test_fewest_victims_node_wins():
    # n1 holds two 1-GPU pods of A, n2 one 2-GPU pod of A: a 2-GPU pod of B needs one
    # victim on n2 but two on n1.
    cfg = config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)})
    w = World(cfg, ("n1", 2), ("n2", 2))
    w.run("a", "big", "n2", gpu=2)
    w.run("a", "s0", "n1")
    w.run("a", "s1", "n1")
    w.want("b", "b0", gpu=2)
    assert victims(w.plan()) == ["uid-big"]


def test_prune_keeps_only_needed_victims():
    # Youngest first would take s1 (1 GPU) then big (2 GPUs) on n1 (3 GPUs, all used);
    # a 2-GPU pod needs only big: s1 is put back.
    cfg = config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)})
    w = World(cfg, ("n1", 3))
    w.run("a", "big", "n1", gpu=2)
    w.run("a", "s1", "n1")
    w.want("b", "b0", gpu=2)
    assert victims(w.plan()) == ["uid-big"]


@pytest.mark.parametrize(
    ("last", "now", "expect"),
    [
        ({("b", "a"): 90.0}, 100.0, reclaim.WAIT_COOLDOWN),  # a took from b 10 s ago
        ({("b", "a"): 30.0}, 100.0, None),  # 70 s ago: past the 60 s cool-down
        ({("a", "b"): 99.0}, 100.0, None),  # same direction again is not an undo
    ],
    ids=["undo-within-cooldown", "after-cooldown", "same-direction"],
)
def test_cooldown_blocks_undoing_a_decision(last, now, expect):
    w = full_world()
    w.want("b", "b0")
    plan = w.plan(last_evictions=last, now=now)
    if expect is None:
        assert victims(plan) == ["uid-a3"]
    else:
        assert plan.evictions == ()
        assert [x.reason for x in plan.waiting] == [expect]


def test_fair_share_caps_the_beneficiary():
    # B weighs 1 against A's 3 and is guaranteed 4 of 4 GPUs... but water-filling starts
    # from the guarantees, so B's fair share covers its first pod: reclaimed. A third
    # tenant with a zero fair share (no demand) is never a beneficiary.
    cfg = config({"name": "a", "weight": 3}, {"name": "b", "guaranteed": gpus(2)})
    w = World(cfg, ("n1", 2), ("n2", 2))
    for k, n in enumerate(("n1", "n1", "n2", "n2")):
        w.run("a", f"a{k}", n)
    w.want("b", "b0")
    assert victims(w.plan()) == ["uid-a3"]


def test_fair_share_refusal_is_explained(monkeypatch):
    w = full_world()
    w.want("b", "b0")
    fake = {"a": reclaim.fairness.FairShare("a", (), 1.0, 1.0)}
    fake["b"] = reclaim.fairness.FairShare("b", (), 0.0, 0.0)
    monkeypatch.setattr(reclaim.cluster_shares, "fair_shares_for", lambda *a, **k: fake)
    plan = w.plan()
    assert plan.evictions == ()
    (wait,) = plan.waiting
    assert wait.reason == reclaim.WAIT_FAIR_SHARE and "exceed fair share" in wait.detail


def test_releasing_pods_count_as_room_and_are_not_chosen_again():
    # a3 is already being evicted: B's pod waits for that room, nothing new is evicted.
    w = full_world()
    w.want("b", "b0")
    plan = w.plan(releasing=frozenset({"uid-a3"}))
    assert plan.evictions == ()
    assert [x.reason for x in plan.waiting] == [reclaim.WAIT_EVICTING]
    assert plan.room == {"uid-b0": "n2"}


def test_protected_pods_are_skipped_for_another_victim():
    # A PodDisruptionBudget refused a3 and a2: the planner picks n1's youngest instead.
    w = full_world()
    w.want("b", "b0")
    plan = w.plan(protected=frozenset({"uid-a3", "uid-a2"}))
    assert victims(plan) == ["uid-a1"]


def test_no_pending_no_plan():
    w = full_world()
    assert w.plan() == reclaim.ReclaimPlan()


@pytest.mark.parametrize(
    ("selector", "expect"),
    [
        (None, ["uid-a3"]),
        ({"kubernetes.io/hostname": "n1"}, ["uid-a1"]),
        ({"kubernetes.io/hostname": "elsewhere"}, []),
    ],
    ids=["any-node", "pinned-to-n1", "no-matching-node"],
)
def test_node_selector_limits_the_nodes(selector, expect):
    w = full_world()
    uid = w.want("b", "b0")
    plan = w.plan(node_selectors={uid: selector} if selector else None)
    assert victims(plan) == expect


def test_free_room_outside_the_selector_does_not_count():
    # n3 has free GPUs, but b0 may only go to n1: reclaim on n1.
    w = full_world()
    w.add_node("n3", 2)
    uid = w.want("b", "b0")
    assert victims(w.plan()) == []  # fits on n3
    assert victims(w.plan(node_selectors={uid: {"kubernetes.io/hostname": "n1"}})) == ["uid-a1"]


@pytest.mark.parametrize("band", [0.5, 1.0])
def test_tenants_tied_in_the_yield_band_do_not_wait_for_each_other(band):
    """Two tenants at the same fraction of their fair shares (zero here), both in the
    band: the gate's order is strict (equal fraction, smaller name first), so reclaim
    makes room for the first one now, and for the other once the first has its pods.
    (Each used to wait for the other: with band 1, no eviction ever.)"""
    cfg = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "reclaimToFairShare": True,
            "yieldBand": band,
            "tenants": [{"name": n, "namespaces": [n]} for n in ("hog", "bee", "cee")],
        }
    )
    w = World(cfg, ("n1", 8))
    for i in range(8):
        w.run("hog", f"h{i}", "n1")
    bees = [w.want("bee", f"b{i}") for i in range(3)]
    w.want("cee", "c0", gpu=2)
    plan = w.plan()
    assert set(plan.room or {}) == set(bees)  # bee goes first: same fraction, smaller name
    assert victims(plan) == ["uid-h7", "uid-h6", "uid-h5"]

    # bee's pods run; cee (now further behind than bee) gets its room next.
    for i in range(3):
        w.state.unbind(f"uid-h{7 - i}")
        w.run("bee", f"b{i}", "n1")
    w.pending = [p for p in w.pending if p.tenant == "cee"]
    plan = w.plan()
    assert set(plan.room or {}) == {"uid-c0"}
    assert len(victims(plan)) == 2


@pytest.mark.parametrize(
    ("u", "su", "t", "st", "expect"),
    [
        ("a", 0.0, "b", 0.0, True),
        ("b", 0.0, "a", 0.0, False),
        ("b", 0.1, "a", 0.2, True),
        ("a", 0.2, "b", 0.1, False),
        ("a", 0.3, "b", 0.3 * (1 + 1e-12), True),
        ("b", 0.3 * (1 + 1e-12), "a", 0.3, False),
        ("a", 1.0, "b", math.inf, True),
        ("b", math.inf, "a", 1.0, False),
    ],
)
def test_goes_first_is_a_strict_order(u, su, t, st, expect):
    assert gate.goes_first(u, su, t, st) is expect
    assert gate.goes_first(t, st, u, su) is not expect


def test_of_nodes_needing_as_many_victims_the_one_whose_worst_victim_is_best_wins():
    """n1 holds two of hog's older pods; n2 one of hog's, the youngest of all, and mid's
    pod (mid is at its fair share, hog 2 GPUs above). Both free a 2-GPU place for low's
    guarantee with two victims: n1 takes both from hog, the most over-share tenant.
    (Comparing the most preferred victim first chose n2 for its one young pod, and took
    mid's pod too.)"""
    cfg = config({"name": "hog"}, {"name": "mid"}, {"name": "low", "guaranteed": gpus(4)})
    w = World(cfg, ("n1", 2), ("n2", 2), ("n3", 2))
    w.run("low", "l1", "n3")
    w.run("low", "l2", "n3")
    w.run("hog", "h-old-1", "n1")
    w.run("hog", "h-old-2", "n1")
    w.run("mid", "m0", "n2")
    w.run("hog", "h-young", "n2")
    w.want("low", "l0", gpu=2)
    plan = w.plan()
    assert sorted(victims(plan)) == ["uid-h-old-1", "uid-h-old-2"]
