"""fairshare.gangs: the model of a pod group and its all-or-nothing plan (pure)."""

from __future__ import annotations

from typing import Any

from fairshare import gangs
from fairshare.config import loading
from fairshare.state import objects
from fairshare.state.cluster import ClusterState
from tests.extender_side import Side

CONFIG = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "a", "namespaces": ["a"]},
            {"name": "b", "namespaces": ["b"]},
        ],
    }
)


def node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": "81559"}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus)}},
    }


def member(
    ns: str, group: str, i: int, gpus: int = 2, *, min_members: int | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"{group}-{i}",
        "namespace": ns,
        "uid": f"{ns}-{group}-{i}",
        "labels": {gangs.POD_GROUP_LABEL: group},
    }
    if min_members is not None:
        meta["annotations"] = {gangs.ANN_MIN_MEMBERS: str(min_members)}
    res = {"cpu": "1", "nvidia.com/gpu": str(gpus)}
    return {
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "resources": {"requests": res, "limits": res}}]},
        "status": {"phase": "Pending"},
    }


def tracker(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Side:
    t = Side(lambda: CONFIG)
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    t.on_resync("Node", nodes)
    t.on_resync("Pod", pods)
    return t


def gang(t: Side, ns: str, name: str, min_count: int) -> gangs.Gang:
    key = gangs.GroupKey(ns, name)
    return gangs.gang_of(key, min_count, pods=t.pods, pending=t.pending, bound=t.state.pods)


def free_gpus(state: ClusterState) -> float:
    return state.total_free()[state.gpu_col] / 1000


def test_group_of_and_min_count_readers():
    pod = member("a", "job", 0, min_members=3)
    assert gangs.group_of(pod) == gangs.GroupKey("a", "job")
    assert str(gangs.group_of(pod)) == "a/job"
    assert gangs.annotated_min_count(pod) == 3
    assert gangs.group_of({"metadata": {"name": "x", "labels": {}}}) is None
    assert gangs.podgroup_min_count({"spec": {"minMember": 4}}) == 4
    assert gangs.podgroup_min_count({"spec": {"minMember": 0}}) is None
    assert gangs.podgroup_min_count({"spec": {}}) is None
    bad = member("a", "job", 0)
    bad["metadata"]["annotations"] = {gangs.ANN_MIN_MEMBERS: "three"}
    assert gangs.annotated_min_count(bad) is None


def test_the_slim_pod_keeps_the_group_label():
    slim = objects.slim_pod(member("a", "job", 0, min_members=3))
    assert gangs.group_of(slim) == gangs.GroupKey("a", "job")
    assert gangs.annotated_min_count(slim) == 3


def test_model_members_demand_and_tenant():
    t = tracker([node("n1", 4)], [member("a", "job", i) for i in range(3)])
    g = gang(t, "a", "job", 3)
    assert (g.members, g.needed, g.tenant, g.running) == (3, 3, "a", False)
    assert [p.name for p in g.waiting] == ["job-0", "job-1", "job-2"]
    assert g.demand_row()[t.state.gpu_col] == 6000.0
    assert g.describe().startswith("a/job (3 × nvidia.com/gpu 2")


def test_a_group_that_fits_is_planned_whole_and_the_state_is_left_as_it_was():
    t = tracker([node("n1", 4), node("n2", 4)], [member("a", "job", i) for i in range(3)])
    before = free_gpus(t.state)
    plan = gangs.plan_gang(t.state, gang(t, "a", "job", 3))
    assert isinstance(plan, gangs.GangPlan)
    assert len(plan.placements) == 3
    nodes = [p.node for p in plan.placements]
    assert sorted(nodes.count(n) for n in set(nodes)) == [1, 2]  # 2 GPUs each, 4 per node
    assert free_gpus(t.state) == before  # planning holds nothing
    for n in set(nodes):  # the devices of one node are not given twice
        devs = [d for p in plan.placements if p.node == n for d, _ in p.devices]
        assert len(devs) == len(set(devs)) == 2 * nodes.count(n)
    gangs.reserve(t.state, plan)
    assert free_gpus(t.state) == before - 6
    gangs.release(t.state, plan)
    assert free_gpus(t.state) == before


def test_a_reserved_group_keeps_the_next_group_out_whole():
    pods = [member("a", "ja", i) for i in range(3)] + [member("b", "jb", i) for i in range(3)]
    t = tracker([node("n1", 4), node("n2", 4)], pods)
    first = gangs.plan_gang(t.state, gang(t, "a", "ja", 3))
    assert isinstance(first, gangs.GangPlan)
    gangs.reserve(t.state, first)
    second = gangs.plan_gang(t.state, gang(t, "b", "jb", 3))
    assert isinstance(second, gangs.Refusal)
    assert second.reason.startswith("gang b/jb (3 × nvidia.com/gpu 2")
    assert "does not fit whole: 1 of 3 members placed" in second.reason
    assert free_gpus(t.state) == 2  # the refused group holds nothing
    gangs.release(t.state, first)
    again = gangs.plan_gang(t.state, gang(t, "b", "jb", 3))
    assert isinstance(again, gangs.GangPlan)


def test_a_group_with_fewer_than_min_count_members_is_refused():
    t = tracker([node("n1", 8)], [member("a", "job", i) for i in range(2)])
    out = gangs.plan_gang(t.state, gang(t, "a", "job", 3))
    assert isinstance(out, gangs.Refusal)
    assert out.reason == "gang a/job has 2 of its 3 members; it holds nothing until all exist"


def test_only_the_members_not_bound_are_planned():
    pods = [member("a", "job", i) for i in range(3)]
    pods[0]["spec"]["nodeName"] = "n1"
    t = tracker([node("n1", 4), node("n2", 2)], pods)
    g = gang(t, "a", "job", 3)
    assert (len(g.bound), g.needed) == (1, 2)
    plan = gangs.plan_gang(t.state, g)
    assert isinstance(plan, gangs.GangPlan)
    assert sorted(p.name for p in plan.placements) == ["job-1", "job-2"]
    assert sorted(p.node for p in plan.placements) == ["n1", "n2"]


def test_members_beyond_min_count_that_do_not_fit_are_left_out():
    t = tracker([node("n1", 4)], [member("a", "job", i) for i in range(3)])
    plan = gangs.plan_gang(t.state, gang(t, "a", "job", 2))
    assert isinstance(plan, gangs.GangPlan)
    assert len(plan.placements) == 2


def test_candidate_rows_limit_the_plan():
    t = tracker([node("n1", 4), node("n2", 4)], [member("a", "job", i) for i in range(3)])
    only = [t.state.node_index["n1"]]
    out = gangs.plan_gang(t.state, gang(t, "a", "job", 3), rows=only)
    assert isinstance(out, gangs.Refusal)
    assert "2 of 3 members placed" in out.reason
    assert "Insufficient nvidia.com/gpu" in out.reason


def test_gate_lets_a_tenant_below_its_share_start_a_group_past_it():
    pods = [member("a", "ja", i) for i in range(3)] + [member("b", "jb", i) for i in range(3)]
    t = tracker([node("n1", 4), node("n2", 4)], pods)
    fair = t.fair_shares(CONFIG)
    for ns, name in (("a", "ja"), ("b", "jb")):
        g = gang(t, ns, name, 3)
        # 6 of 8 GPUs is past the fair 4, but either tenant holds nothing yet
        decision = gangs.gang_gate(t.state, CONFIG, g, pending=t.pending_queue(), fair=fair)
        assert decision is None or decision.allowed


def test_gate_holds_a_tenant_above_its_share_for_a_waiting_tenant():
    pods = [member("a", "run", i) for i in range(2)]
    for p in pods:
        p["spec"]["nodeName"] = "n1"
    # a holds its fair half (4 of 8) and asks 2 more; b asks 4 and holds nothing
    pods += [member("a", "ja", i, gpus=1) for i in range(2)]
    pods += [member("b", "jb", i, gpus=1) for i in range(4)]
    t = tracker([node("n1", 4), node("n2", 4)], pods)
    g = gang(t, "a", "ja", 2)
    decision = gangs.gang_gate(
        t.state, CONFIG, g, pending=t.pending_queue(), fair=t.fair_shares(CONFIG)
    )
    assert decision is not None and not decision.allowed
    assert decision.reason == "tenant a above its fair share (0.75 > 0.50) while b waits"


# -- the native pod-group convention (scheduling.k8s.io/v1alpha2) ---------------------------


def test_native_pod_groups_are_read_before_the_coscheduling_label():
    from fairshare.state import objects as state_objects

    p = {
        "metadata": {"name": "w-0", "namespace": "ml", "labels": {gangs.POD_GROUP_LABEL: "old"}},
        "spec": {"schedulingGroup": {"podGroupName": "job"}, "containers": []},
    }
    key = gangs.group_of(p)
    assert key == gangs.GroupKey("ml", "job", native=True)
    assert key.api == ("scheduling.k8s.io", "v1alpha2", "podgroups")
    assert gangs.GroupKey("ml", "job").api == ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
    # The extender's slimmed pod keeps the field, so its tracker groups the pod too.
    assert gangs.group_of(state_objects.slim_pod(p)) == key
    del p["spec"]["schedulingGroup"]
    assert gangs.group_of(p) == gangs.GroupKey("ml", "old")


def test_native_podgroup_min_count():
    gang = {"spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}}
    assert gangs.podgroup_min_count(gang) == 4
    assert gangs.podgroup_min_count({"spec": {"schedulingPolicy": {"basic": {}}}}) == 1
    assert (
        gangs.podgroup_min_count({"spec": {"schedulingPolicy": {"gang": {"minCount": 0}}}}) is None
    )
    assert gangs.podgroup_min_count({"spec": {"minMember": 3}}) == 3
