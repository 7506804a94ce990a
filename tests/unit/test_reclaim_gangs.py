"""Reclaim takes whole pod groups or none of one: a gang that loses a member is lost.

Each test also plans without ``groups`` (per pod, as before groups were known) and shows
that the per-pod plan would have split the gang, so these tests fail with per-pod victims.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from extender import reclaimer as rec
from fairshare import gangs
from fairshare import metrics as metrics_mod
from fairshare.preemption import reclaim
from fairshare.state import objects
from tests.extender_side import Side
from tests.unit.test_reclaim import World, config, gpus, victims
from tests.unit.test_reclaim_controller import FakeApi, bound
from tests.unit.test_state_objects import node, pod

GANG = ("uid-g0", "uid-g1", "uid-g2")


def run_member(w: World, tenant: str, name: str, node_name: str, group: str, gpu: int = 1) -> str:
    obj = pod(name, ns=tenant, gpu=gpu, node_name=node_name)
    obj["metadata"].setdefault("labels", {})[gangs.POD_GROUP_LABEL] = group
    objects.apply_pod(w.state, obj, w.cfg, tenant)
    w.clock += 1
    w.created[f"uid-{name}"] = w.clock
    w.grouped[f"uid-{name}"] = obj
    return f"uid-{name}"


def world(cfg: Any, *nodes: tuple[str, int]) -> World:
    w = World(cfg, *nodes)
    w.grouped = {}  # type: ignore[attr-defined]
    return w


def groups(w: World) -> dict[str, str]:
    """What the controller passes: bound pod uid -> its group (``gangs.group_of``)."""
    out = {}
    for uid, obj in w.grouped.items():  # type: ignore[attr-defined]
        key = gangs.group_of(obj)
        assert key is not None
        out[uid] = str(key)
    return out


def split(plan: reclaim.ReclaimPlan) -> bool:
    """Does the plan evict some but not all of the gang's members?"""
    taken = set(victims(plan)) & set(GANG)
    return 0 < len(taken) < len(GANG)


def test_the_lone_pod_rather_than_part_of_a_gang():
    # A (no guarantee) holds n1 (4 GPUs): gang members g0, g1 (1 GPU each) and the older
    # lone pod big (2 GPUs); g2, the gang's third member, and x run on n2 (2 GPUs).
    # B (guaranteed 2) wants a 2-GPU pod. Per pod, the youngest go first: g1 and g0 on n1
    # (two of the three members). By units: big alone (1 pod) beats the gang (3 pods).
    w = world(config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)}), ("n1", 4), ("n2", 2))
    w.run("a", "big", "n1", gpu=2)
    w.run("a", "x", "n2")
    for k, n in enumerate(("n1", "n1", "n2")):
        run_member(w, "a", f"g{k}", n, "job")
    w.want("b", "b0", gpu=2)
    assert split(w.plan())  # per pod: part of the gang
    plan = w.plan(groups=groups(w))
    assert victims(plan) == ["uid-big"]
    assert plan.room == {"uid-b0": "n1"}


def test_the_whole_gang_when_no_lone_pod_frees_enough():
    # n1 (4 GPUs): the gang's three 1-GPU members and the older lone pod x. B wants 2 GPUs:
    # x alone frees 1; so the gang goes, all three (not two), and x stays.
    w = world(config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)}), ("n1", 4))
    w.run("a", "x", "n1")
    for k in range(3):
        run_member(w, "a", f"g{k}", "n1", "job")
    w.want("b", "b0", gpu=2)
    assert split(w.plan())
    plan = w.plan(groups=groups(w))
    assert sorted(victims(plan)) == list(GANG)
    assert {e.group for e in plan.evictions} == {"a/job"}
    assert all(e.group_size == 3 for e in plan.evictions)
    assert "all 3 bound members of its pod group a/job" in plan.evictions[0].message
    assert plan.decisions == (("a", "b"),)


def test_members_on_other_nodes_go_too_and_their_room_counts():
    # The gang spans n1 and n2 (2 GPUs each, with a lone pod of A on each, protected by a
    # PodDisruptionBudget). B wants two 1-GPU pods: evicting the gang for b0 on n1 also
    # frees g1's GPU on n2, which b1 gets without another eviction.
    cfg = config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)})
    w = world(cfg, ("n1", 2), ("n2", 2))
    w.run("a", "x0", "n1")
    w.run("a", "x1", "n2")
    run_member(w, "a", "g0", "n1", "job")
    run_member(w, "a", "g1", "n2", "job")
    w.want("b", "b0")
    w.want("b", "b1")
    plan = w.plan(groups=groups(w), protected=frozenset({"uid-x0", "uid-x1"}))
    assert victims(plan) == ["uid-g0", "uid-g1"]
    assert {e.node for e in plan.evictions} == {"n1", "n2"}
    assert plan.room == {"uid-b0": "n1", "uid-b1": "n2"}
    assert [(x.uid, x.reason) for x in plan.waiting] == [("uid-b1", reclaim.WAIT_EVICTING)]


def test_the_gangs_guarantee_is_protected_as_a_whole():
    # A (guaranteed 2) runs a 3-member gang on n1 (3 GPUs). Per pod, one member may go
    # (A stays at 2); the whole gang would take A to 0: nothing is evicted, B waits.
    cfg = config({"name": "a", "guaranteed": gpus(2)}, {"name": "b", "guaranteed": gpus(1)})
    w = world(cfg, ("n1", 3))
    for k in range(3):
        run_member(w, "a", f"g{k}", "n1", "job")
    w.want("b", "b0")
    assert split(w.plan())
    plan = w.plan(groups=groups(w))
    assert plan.evictions == ()
    assert [x.reason for x in plan.waiting] == [reclaim.WAIT_NO_VICTIMS]


def test_a_protected_member_protects_its_whole_gang():
    # g1's eviction was refused by a PodDisruptionBudget: none of the gang is chosen, the
    # lone pods (two of them, older) go instead.
    w = world(config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)}), ("n1", 5))
    w.run("a", "x0", "n1")
    w.run("a", "x1", "n1")
    for k in range(3):
        run_member(w, "a", f"g{k}", "n1", "job")
    w.want("b", "b0", gpu=2)
    protected = frozenset({"uid-g1"})
    assert split(w.plan(protected=protected))
    plan = w.plan(groups=groups(w), protected=protected)
    assert sorted(victims(plan)) == ["uid-x0", "uid-x1"]


def test_a_member_already_leaving_leaves_the_rest_as_the_unit():
    # g0 is being evicted already (its room counts as free on n1): what is left of the
    # gang, g1 and g2, goes whole when more room is needed.
    w = world(config({"name": "a"}, {"name": "b", "guaranteed": gpus(3)}), ("n1", 3))
    for k in range(3):
        run_member(w, "a", f"g{k}", "n1", "job")
    w.want("b", "b0", gpu=2)
    plan = w.plan(groups=groups(w), releasing=frozenset({"uid-g0"}))
    assert sorted(victims(plan)) == ["uid-g1", "uid-g2"]


def test_the_rate_limit_counts_every_member():
    w = world(config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)}), ("n1", 3))
    for k in range(3):
        run_member(w, "a", f"g{k}", "n1", "job")
    w.want("b", "b0")
    plan = w.plan(groups=groups(w), max_evictions=2)
    assert plan.evictions == ()
    assert [x.reason for x in plan.waiting] == [reclaim.WAIT_BUDGET]
    assert "needs 3 eviction(s)" in plan.waiting[0].detail


def test_toward_fair_share_takes_whole_gangs_too():
    # reclaimToFairShare: A holds all 4 GPUs (a 3-member gang and an older lone pod);
    # B (same weight) wants two 1-GPU pods and its fair share is 2. Per pod, two gang
    # members would go; by units, the lone pod and then the whole gang is not allowed
    # (A would fall from 4 to 0, below its fair share of 2), so only the lone pod goes.
    cfg = config({"name": "a"}, {"name": "b", "reclaimToFairShare": True})
    w = world(cfg, ("n1", 4))
    w.run("a", "x", "n1")
    for k in range(3):
        run_member(w, "a", f"g{k}", "n1", "job")
    w.want("b", "b0")
    w.want("b", "b1")
    assert split(w.plan())
    plan = w.plan(groups=groups(w))
    assert victims(plan) == ["uid-x"]


# -- the controller: a group is one decision, evicted whole ---------------------------------

CONTROLLER_CONFIG = config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)})


def controller(api: FakeApi) -> rec.Reclaimer:
    """n1 (2 GPUs) runs gang members g0, g1 and n2 (1 GPU) g2, all of tenant A."""
    tracker = Side(lambda: CONTROLLER_CONFIG)
    tracker.on_resync("Node", [node("n1", gpus=2), node("n2", gpus=1)])
    members = [bound(f"g{k}", "a", n, k) for k, n in enumerate(("n1", "n1", "n2"))]
    for m in members:
        m["metadata"].setdefault("labels", {})[gangs.POD_GROUP_LABEL] = "job"
    tracker.on_resync("Pod", members)
    tracker.on_event("Pod", "ADDED", pod("b0", ns="b", gpu=1))
    return rec.Reclaimer(
        tracker.cache,
        lambda: CONTROLLER_CONFIG,
        api,
        metrics_mod.Metrics(CollectorRegistry()),
        clock=lambda: 1000.0,
        feedback=tracker.feedback,
    )


def evicted_total(r: rec.Reclaimer, outcome: str) -> float | None:
    labels = {"outcome": outcome, "tenant": "a", "beneficiary": "b"}
    return r.metrics.registry.get_sample_value("fairshare_reclaim_evictions_total", labels)


async def test_the_controller_evicts_every_member_as_one_decision():
    api = FakeApi()
    r = controller(api)
    plan = await r.tick()
    assert sorted(api.evicted) == ["a/g0", "a/g1", "a/g2"]
    assert plan.decisions == (("a", "b"),)
    reclaimed = [n for n, reason, _ in api.events if reason == reclaim.REASON_RECLAIMED]
    assert sorted(reclaimed) == ["g0", "g1", "g2"]
    made_room = [m for n, reason, m in api.events if reason == reclaim.REASON_MADE_ROOM]
    assert len(made_room) == 1 and "pod group a/job (3 pods" in made_room[0]
    assert evicted_total(r, "evicted") == 3
    await r.tick()  # the members are leaving: nothing more
    assert len(api.evicted) == 3


async def test_a_budget_refusing_the_first_member_keeps_the_whole_group():
    api = FakeApi()
    api.refuse = {"g0"}
    r = controller(api)
    await r.tick()
    assert api.evicted == []
    assert set(r.protected) == set(GANG)
    blocked = [m for n, reason, m in api.events if reason == rec.REASON_BLOCKED]
    assert blocked and "the group stays whole" in blocked[0]


async def test_a_budget_refusing_a_later_member_lets_the_rest_go():
    # The group lost g0 already (it cannot run without it): g2 still goes, g1 is kept.
    api = FakeApi()
    api.refuse = {"g1"}
    r = controller(api)
    await r.tick()
    assert sorted(api.evicted) == ["a/g0", "a/g2"]
    assert "uid-g1" in r.protected
    assert evicted_total(r, "blocked") == 1
