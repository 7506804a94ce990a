"""Gangs with a topology key: every member in one domain of a node label (pure model,
the extender's adapter, the status and the webhook's check of the annotation)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from extender import ganging, wire
from fairshare import gangs
from fairshare.config import loading
from fairshare.state import objects
from tests.extender_side import Side
from webhook.policies import gpu_sharing

CONFIG = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
)
RACK = "topology.kubernetes.io/rack"


def node(name: str, gpus: int, rack: str | None) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.memory": "81559"}
    if rack is not None:
        labels[RACK] = rack
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus)}},
    }


def member(
    ns: str, group: str, i: int, gpus: int = 2, *, key: str | None = RACK, node_name: str = ""
) -> dict[str, Any]:
    ann = {gangs.ANN_MIN_MEMBERS: "3"}
    if key is not None:
        ann[gangs.ANN_TOPOLOGY_KEY] = key
    res = {"cpu": "1", "nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": res, "limits": res}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"{group}-{i}",
            "namespace": ns,
            "uid": f"{ns}-{group}-{i}",
            "labels": {gangs.POD_GROUP_LABEL: group},
            "annotations": ann,
        },
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def tracker(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Side:
    t = Side(lambda: CONFIG)
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    t.on_resync("Node", nodes)
    t.on_resync("Pod", pods)
    return t


def gang(t: Side, name: str = "job", key: str | None = RACK) -> gangs.Gang:
    return gangs.gang_of(
        gangs.GroupKey("a", name),
        3,
        pods=t.pods,
        pending=t.pending,
        bound=t.state.pods,
        topology_key=key,
    )


def racks(nodes: list[dict[str, Any]]) -> dict[str, str | None]:
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(RACK) for n in nodes}


TWO_RACKS = [node("r1-a", 4, "r1"), node("r1-b", 4, "r1"), node("r2-a", 4, "r2"),
             node("r2-b", 4, "r2")]  # fmt: skip


def test_the_key_comes_from_the_native_podgroup_else_the_annotation():
    native = {"spec": {"schedulingConstraints": {"topology": [{"key": "nvidia.com/gpu.clique"}]}}}
    pod = member("a", "job", 0)
    assert gangs.podgroup_topology_key(native) == "nvidia.com/gpu.clique"
    assert gangs.topology_key(native, pod) == "nvidia.com/gpu.clique"
    assert gangs.topology_key({"spec": {"minMember": 3}}, pod) == RACK  # coscheduling
    assert gangs.topology_key(None, pod) == RACK
    assert gangs.topology_key(None, member("a", "job", 0, key=None)) is None
    assert gangs.podgroup_topology_key({"spec": {"schedulingConstraints": {}}}) is None
    assert (
        gangs.podgroup_topology_key({"spec": {"schedulingConstraints": {"topology": []}}}) is None
    )
    # the extender's slim copy of a pod keeps the annotation
    assert gangs.annotated_topology_key(objects.slim_pod(pod)) == RACK


def test_without_the_key_the_group_spreads_over_two_racks():
    """The baseline the constraint changes: 3 × 2 GPUs on two half-full racks."""
    nodes = [node("r1-a", 4, "r1"), node("r2-a", 4, "r2")]
    t = tracker(nodes, [member("a", "job", i) for i in range(3)])
    plan = gangs.plan_gang(t.state, gang(t, key=None))
    assert isinstance(plan, gangs.GangPlan)
    assert {racks(nodes)[p.node] for p in plan.placements} == {"r1", "r2"}
    refused = gangs.plan_gang(t.state, gang(t))
    assert isinstance(refused, gangs.Refusal)


def test_a_group_with_the_key_lands_in_one_domain():
    # r2-a holds another tenant's 2-GPU pod: packing member by member (no key) starts
    # there and spills into r1; with the key the group stays in one rack (r2: best fit)
    busy = member("b", "other", 0, gpus=2, key=None, node_name="r2-a")
    t = tracker(TWO_RACKS, [member("a", "job", i) for i in range(3)] + [busy])
    spread = gangs.plan_gang(t.state, gang(t, key=None))
    assert isinstance(spread, gangs.GangPlan)
    assert {racks(TWO_RACKS)[p.node] for p in spread.placements} == {"r1", "r2"}
    plan = gangs.plan_gang(t.state, gang(t))
    assert isinstance(plan, gangs.GangPlan)
    assert {racks(TWO_RACKS)[p.node] for p in plan.placements} == {"r2"}


def test_the_smallest_domain_that_fits_is_chosen_so_a_large_one_stays_whole():
    nodes = [
        node("big-a", 8, "big"),
        node("big-b", 8, "big"),
        node("small-a", 4, "small"),
        node("small-b", 4, "small"),
        node("tiny-a", 4, "tiny"),
    ]
    t = tracker(nodes, [member("a", "job", i) for i in range(3)])
    plan = gangs.plan_gang(t.state, gang(t))
    assert isinstance(plan, gangs.GangPlan)
    assert {racks(nodes)[p.node] for p in plan.placements} == {"small"}
    # with the small domain taken, the big one is next (tiny cannot hold 6 GPUs)
    gangs.reserve(t.state, plan)
    t.on_resync("Pod", list(t.pods.values()) + [member("a", "two", i) for i in range(3)])
    second = gangs.plan_gang(t.state, gang(t, "two"))
    assert isinstance(second, gangs.GangPlan)
    assert {racks(nodes)[p.node] for p in second.placements} == {"big"}


def test_no_domain_fits_names_each_domain_and_why():
    nodes = [
        node("r1-a", 4, "r1"),
        node("r1-b", 2, "r1"),  # 6 GPUs but one 2-GPU member is left on neither node
        node("r2-a", 4, "r2"),
        node("loose", 8, None),
    ]
    busy = [member("b", "other", 0, gpus=2, key=None, node_name="r1-a")]
    t = tracker(nodes, [member("a", "job", i) for i in range(3)] + busy)
    refused = gangs.plan_gang(t.state, gang(t))
    assert isinstance(refused, gangs.Refusal)
    text = refused.reason
    assert text.startswith(
        "gang a/job (3 × nvidia.com/gpu 2, cpu 1) does not fit whole in one domain of "
        f"node label {RACK}: "
    ), text
    assert f"{RACK}=r1: 4 free GPU on 2 node(s), the group needs 6" in text
    assert f"{RACK}=r2: 4 free GPU on 1 node(s), the group needs 6" in text
    assert "1 candidate node(s) without the label" in text
    # a domain with room in all, where the members do not fit its nodes one by one
    t2 = tracker([node("r1-a", 3, "r1"), node("r1-b", 3, "r1")],
                 [member("a", "job", i) for i in range(3)])  # fmt: skip
    refused = gangs.plan_gang(t2.state, gang(t2))
    assert isinstance(refused, gangs.Refusal)
    assert f"{RACK}=r1: 2 of 3 members placed, a/job-" in refused.reason, refused.reason


def test_no_node_with_the_label():
    t = tracker([node("n1", 8, None)], [member("a", "job", i) for i in range(3)])
    refused = gangs.plan_gang(t.state, gang(t))
    assert isinstance(refused, gangs.Refusal)
    assert refused.reason.endswith("none of the 1 candidate node(s) has that label")
    assert gangs.status.never_whole(t.state, gang(t), None) == (
        f"no node its members may use has the label {RACK}: it can never run as it is"
    )


def test_a_group_larger_than_every_domain_can_never_run():
    t = tracker(TWO_RACKS, [member("a", "job", i, gpus=4) for i in range(3)])
    g = gang(t)
    assert isinstance(gangs.plan_gang(t.state, g), gangs.Refusal)
    assert "than any one domain of" in gangs.status.never_whole(t.state, g, None)
    assert gangs.status.never_whole(t.state, dataclasses.replace(g, topology_key=None), None) == ""


def test_bound_members_keep_the_rest_in_their_domain():
    pods = [member("a", "job", 0, node_name="r2-a")] + [member("a", "job", i) for i in (1, 2)]
    t = tracker(TWO_RACKS, pods)
    plan = gangs.plan_gang(t.state, gang(t))
    assert isinstance(plan, gangs.GangPlan)
    assert len(plan.placements) == 2
    assert {racks(TWO_RACKS)[p.node] for p in plan.placements} == {"r2"}


def test_the_extender_plans_inside_one_domain_and_says_why_not():
    t = tracker(TWO_RACKS, [member("a", "job", i) for i in range(3)])
    coord = ganging.GangCoordinator(t.cache)
    names = [n["metadata"]["name"] for n in TWO_RACKS]

    def ask(i: int) -> wire.ExtenderFilterResult | None:
        pod = t.pods["a-job-" + str(i)]
        args = wire.ExtenderArgs(pod=pod, nodes=None, node_names=tuple(names))
        got = asyncio.run(coord.filter(args, CONFIG, lambda: t.reading(CONFIG)))
        return got.result if got is not None else None

    first = ask(0)
    assert first is not None and first.node_names
    planned = {k: live for k, live in coord.plans.items()}
    (live,) = planned.values()
    assert len({racks(TWO_RACKS)[p.node] for p in live.plan.placements}) == 1

    # a 3 × 3-GPU group fits no rack of two 4-GPU nodes: the answer names each domain
    # (the whole group needs 9 GPUs: no member is placed in a domain with 8)
    t2 = tracker(TWO_RACKS, [member("a", "big", i, gpus=3) for i in range(3)])
    coord2 = ganging.GangCoordinator(t2.cache)
    pod = t2.pods["a-big-0"]
    answer = asyncio.run(
        coord2.filter(
            wire.ExtenderArgs(pod=pod, nodes=None, node_names=tuple(names)),
            CONFIG,
            lambda: t2.reading(CONFIG),
        )
    )
    assert answer is not None
    out = answer.result
    assert not out.node_names
    why = next(iter((out.failed_nodes or {}).values()))
    assert f"does not fit whole in one domain of node label {RACK}" in why
    for rack in ("r1", "r2"):
        assert f"{RACK}={rack}: 8 free GPU on 2 node(s), the group needs 9" in why, why


def test_the_status_judges_the_annotated_key_as_the_extender_does():
    nodes = [node("r1-a", 4, "r1"), node("r2-a", 4, "r2")]
    t = tracker(nodes, [member("a", "job", i) for i in range(3)])
    (status,) = gangs.status.group_statuses(
        config=CONFIG,
        state=t.state,
        pods=t.pods,
        pending=t.pending,
        podgroups={},
        plans={},
        fair=t.fair_shares(CONFIG),
    )
    assert status.state == "waiting"
    assert "does not fit whole in one domain" in status.reason


def test_the_webhook_accepts_a_label_key_and_refuses_anything_else():
    pod = member("a", "job", 0, key="nvidia.com/gpu.clique")
    assert isinstance(gpu_sharing.check_gpu_sharing(pod, config=CONFIG), gpu_sharing.Normalised)
    for bad in ("", "rack/", "-rack", "Bad_Prefix/rack", "a/b/c", "x" * 64):
        refused = gpu_sharing.check_gpu_sharing(member("a", "job", 0, key=bad), config=CONFIG)
        assert isinstance(refused, gpu_sharing.Rejection), bad
        text = gpu_sharing.render_rejection(refused)
        assert text.startswith(f'annotation {gangs.ANN_TOPOLOGY_KEY}="{bad}": not a valid node'), (
            text
        )
