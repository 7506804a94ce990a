"""Shared GPUs in the ledger: fractional pods split a logical group with an id, whole GPUs
are counts, and the ledger comes back from the pods' annotations in any order."""

from __future__ import annotations

import itertools

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare.resources import ANN_GPU_DEVICES, ANN_GPU_GROUP
from fairshare.state import objects
from fairshare.state.cluster import StateError
from tests.unit.test_state_objects import CONFIG, node, pod, state_with


def share(name: str, frac: str, *, group: str = "", devices: str = "") -> dict[str, object]:
    ann = {"fairshare.io/gpu-fraction": frac}
    if group:
        ann[ANN_GPU_GROUP] = group
    if devices:
        ann[ANN_GPU_DEVICES] = devices
    return pod(name, node_name="a", annotations=ann)


def test_bind_plan_starts_a_group_then_joins_it():
    st = state_with(node("a", gpus=2))
    first = objects.pod_request(
        pod("p1", phase="Pending", annotations={"fairshare.io/gpu-fraction": "0.5"}),
        config=CONFIG,
        tenant="prod",
        index=st.index,
    )
    bind = wire.ExtenderBindingArgs("p1", "prod", first.uid, "a")
    plan = verbs.bind_plan(bind, Snapshot.of(st, pending=[first]))
    assert plan.new_group and plan.group == objects.new_group_id("a", first.uid)
    verbs.commit_bind(st, plan)
    second = objects.pod_request(
        pod("p2", phase="Pending", annotations={"fairshare.io/gpu-fraction": "0.5"}),
        config=CONFIG,
        tenant="prod",
        index=st.index,
    )
    bind = wire.ExtenderBindingArgs("p2", "prod", second.uid, "a")
    plan2 = verbs.bind_plan(bind, Snapshot.of(st, pending=[second]))
    assert (plan2.group, plan2.new_group) == (plan.group, False)
    assert plan2.annotations[ANN_GPU_GROUP] == plan.group
    verbs.commit_bind(st, plan2)
    assert st.groups[plan.group].members == {first.uid, second.uid}
    # The group ends with its last pod; its slot is free for anyone again.
    st.unbind(first.uid)
    assert plan.group in st.groups
    st.unbind(second.uid)
    assert plan.group not in st.groups and st.group_at("a", plan.devices[0][0]) is None


def test_whole_gpu_pods_take_no_slot_of_a_shared_gpu():
    st = state_with(node("a", gpus=2))
    objects.apply_pod(st, share("s", "0.25", group="g1"), CONFIG, "prod")
    slot = st.groups["g1"].slot
    whole = objects.apply_pod(st, pod("w", gpu=1, node_name="a"), CONFIG, "prod")
    assert whole is not None and whole.devices == ((1 - slot, 1000.0),)


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_the_ledger_comes_back_in_any_order(order):
    # Two groups of two shares and two whole-GPU pods on a 4-GPU node. Whole pods carry a
    # stale slot that collides with a group's old slot: slots of whole pods mean nothing.
    items = [
        share("a1", "0.5", group="ga", devices="0:500"),
        share("a2", "0.25", group="ga", devices="0:250"),
        share("b1", "0.5", group="gb", devices="1:500"),
        pod("w", gpu=2, node_name="a", annotations={ANN_GPU_DEVICES: "0:1000,1:1000"}),
    ]
    st = state_with(node("a", gpus=4))
    for k in order:
        objects.apply_pod(st, items[k], CONFIG, "prod")
    ga, gb = st.groups["ga"], st.groups["gb"]
    assert ga.members == {"uid-a1", "uid-a2"} and gb.members == {"uid-b1"}
    assert st.pods["uid-a1"].devices[0][0] == st.pods["uid-a2"].devices[0][0] == ga.slot
    assert ga.slot != gb.slot
    whole = {d for d, _ in st.pods["uid-w"].devices}
    assert len(whole) == 2 and not whole & {ga.slot, gb.slot}
    devs = [v for v in st.node_devices(0) if v >= 0]
    assert sorted(devs) == [0.0, 0.0, 250.0, 500.0]


def test_old_annotations_without_a_group_still_share_by_slot():
    st = state_with(node("a", gpus=2))
    objects.apply_pod(st, share("o1", "0.5", devices="1:500"), CONFIG, "prod")
    objects.apply_pod(st, share("o2", "0.5", devices="1:500"), CONFIG, "prod")
    legacy = objects.legacy_group_id("a", 1)
    assert st.groups[legacy].members == {"uid-o1", "uid-o2"} and st.groups[legacy].slot == 1


def test_a_share_cannot_join_a_group_on_another_slot():
    st = state_with(node("a", gpus=2))
    st.bind(uid="x", node="a", row=[0.0] * st.n_res, devices=[(0, 500.0)], group="g")
    with pytest.raises(StateError, match="shared GPU g is slot 0 of a"):
        st.bind(uid="y", node="a", row=[0.0] * st.n_res, devices=[(1, 500.0)], group="g")
    with pytest.raises(StateError, match="holds shared GPU g"):
        st.bind(uid="z", node="a", row=[0.0] * st.n_res, devices=[(0, 250.0)], group="h")


def test_a_hami_node_has_its_registered_devices_not_the_replicas():
    n = node("h", gpus=40)
    n["metadata"]["annotations"] = {
        "hami.io/node-nvidia-register": '[{"id":"GPU-a","count":10},{"id":"GPU-b","index":1}]'
    }
    st = state_with(n)
    assert [v for v in st.node_devices(0) if v >= 0] == [1000.0, 1000.0]
    assert objects.hami_device_count({"hami.io/node-nvidia-register": "a,10,1,100,T,0,true:"}) == 1


def test_share_group_joins_or_starts_a_group_and_ignores_whole_gpus():
    st = state_with(node("a", gpus=1))
    req = objects.pod_request(
        pod("s1", phase="Pending", annotations={"fairshare.io/gpu-fraction": "0.5"}),
        config=CONFIG,
        tenant="prod",
        index=st.index,
    )
    assert objects.share_group(st, req, "a", [(0, 500.0)]) == (
        objects.new_group_id("a", req.uid),
        True,
    )
    whole = objects.pod_request(pod("w", gpu=1), config=CONFIG, tenant="prod", index=st.index)
    assert objects.share_group(st, whole, "a", [(0, 1000.0)]) == ("", False)


def test_a_closed_group_takes_no_new_share_until_it_ends():
    st = state_with(node("a", gpus=2))
    objects.apply_pod(st, share("s", "0.25", group="g"), CONFIG, "prod")
    slot = st.groups["g"].slot
    st.close_group("g")
    assert st.node_devices(0)[slot] == 0.0
    req = objects.pod_request(
        pod("n", phase="Pending", annotations={"fairshare.io/gpu-fraction": "0.25"}),
        config=CONFIG,
        tenant="prod",
        index=st.index,
    )
    plan = verbs.bind_plan(
        wire.ExtenderBindingArgs("n", "prod", req.uid, "a"),
        Snapshot.of(st, pending=[req]),
    )
    assert plan.devices[0][0] != slot and plan.new_group
    st.unbind("uid-s")
    assert st.node_devices(0)[slot] == 1000.0 and "g" not in st.groups
