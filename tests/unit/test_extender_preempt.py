"""Preempt never takes a tenant below ``guaranteed``; bind plans devices and the Binding."""

from __future__ import annotations

from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare.config.loading import config_from_mapping
from fairshare.preemption.victims import Victim, protect_guaranteed
from fairshare.state import objects
from tests.unit.test_state_objects import node, pod, state_with

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "prod", "namespaces": ["prod"], "guaranteed": {"nvidia.com/gpu": "2"}},
            {"name": "research", "namespaces": ["research"]},
            {"name": "infer", "namespaces": ["infer"], "guaranteed": {"cpu": "4"}},
        ],
        # The guarantee rule alone (the fair-share rule: test_preempt_fair_share.py).
        "preemption": {"otherTenants": "Any"},
    }
)


def cluster():
    """a: prod p0, p1, p2 (1 GPU each, 3 GPUs: one above its guarantee of 2) and research r0;
    b: prod p3 (prod holds 4 GPUs in all), research r1; infer i0 (cpu 1, no GPU) on b."""
    st = state_with(node("a"), node("b"), config=CONFIG)
    for name, ns, where in [
        ("p0", "prod", "a"),
        ("p1", "prod", "a"),
        ("p2", "prod", "a"),
        ("r0", "research", "a"),
        ("p3", "prod", "b"),
        ("r1", "research", "b"),
    ]:
        objects.apply_pod(st, pod(name, ns=ns, gpu=1, node_name=where), CONFIG, ns)
    objects.apply_pod(st, pod("i0", ns="infer", node_name="b"), CONFIG, "infer")
    return st


def preempt_args(victims: dict[str, list[str]], *, preemptor: dict[str, Any] | None = None):
    return wire.decode_preemption_args(
        {
            "Pod": preemptor or pod("hi", ns="research", gpu=1, phase="Pending"),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                n: {"Pods": [{"UID": f"uid-{u}"} for u in uids], "NumPDBViolations": 1}
                for n, uids in victims.items()
            },
        }
    )


PREEMPT_CASES = [
    # prod holds 4 GPUs, guaranteed 2: two prod victims may go, a third may not.
    ({"a": ["p0", "p1", "p2"]}, {"a": ["p0", "p1"]}),
    # Per node: each candidate node is judged alone (the scheduler picks one).
    ({"a": ["p0", "p1"], "b": ["p3"]}, {"a": ["p0", "p1"], "b": ["p3"]}),
    # research has no guarantee: always evictable.
    ({"a": ["r0"], "b": ["r1"]}, {"a": ["r0"], "b": ["r1"]}),
    # Order matters: the scheduler's order is kept, the later prod victim is dropped.
    ({"a": ["r0", "p2", "p1", "p0"]}, {"a": ["r0", "p2", "p1"]}),
    # infer guarantees 4 CPUs but holds 1: its pod is protected; b is left empty, dropped.
    ({"a": ["p0"], "b": ["i0"]}, {"a": ["p0"]}),
    # Pods the state does not know are kept (no guarantee can be proven).
    ({"b": ["ghost"]}, {"b": ["ghost"]}),
]


@pytest.mark.parametrize(
    ("proposed", "allowed"),
    PREEMPT_CASES,
    ids=["cap-at-guarantee", "per-node", "no-guarantee", "order", "drop-empty-node", "unknown"],
)
def test_preempt_never_takes_a_tenant_below_guaranteed(proposed, allowed):
    out = verbs.preempt_result(preempt_args(proposed), Snapshot.of(cluster()), CONFIG).encode()
    got = {
        n: [p["UID"].removeprefix("uid-") for p in v["Pods"]]
        for n, v in out["NodeNameToMetaVictims"].items()
    }
    assert got == allowed
    for v in out["NodeNameToMetaVictims"].values():
        assert type(v["NumPDBViolations"]) is int and v["NumPDBViolations"] <= len(v["Pods"])


def test_same_tenant_preemptor_counts_its_own_demand():
    # A prod pod replacing prod pods: prod keeps 4 - 3 + 1 = 2 GPUs, at its guarantee.
    preemptor = pod("hi", ns="prod", gpu=1, phase="Pending")
    out = verbs.preempt_result(
        preempt_args({"a": ["p0", "p1", "p2"]}, preemptor=preemptor),
        Snapshot.of(cluster()),
        CONFIG,
    ).encode()
    assert [p["UID"] for p in out["NodeNameToMetaVictims"]["a"]["Pods"]] == [
        "uid-p0",
        "uid-p1",
        "uid-p2",
    ]


def test_full_victims_form_is_answered_by_uid():
    st = cluster()
    full = {"a": {"Pods": [pod("p0", ns="prod", gpu=1, node_name="a")], "NumPDBViolations": 0}}
    args = wire.decode_preemption_args(
        {
            "Pod": pod("hi", ns="research", gpu=1),
            "NodeNameToVictims": full,
            "NodeNameToMetaVictims": None,
        }
    )
    out = verbs.preempt_result(args, Snapshot.of(st), CONFIG).encode()
    assert out == {
        "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "uid-p0"}], "NumPDBViolations": 0}}
    }


def test_protect_guaranteed_formula():
    # usage 3000, guaranteed 2000: first victim (1000) leaves 2000 -> kept; second -> 1000 < 2000.
    victims = [Victim("x", "t", (1000.0,)), Victim("y", "t", (1000.0,))]
    kept = protect_guaranteed(
        victims,
        usage={"t": [3000.0]},
        guaranteed={"t": {0: 2000.0}},
        preemptor_tenant=None,
        preemptor_row=(),
    )
    assert kept == ("x",)


def _answer(out):
    return {
        n: [p["UID"].removeprefix("uid-") for p in v["Pods"]]
        for n, v in out["NodeNameToMetaVictims"].items()
    }


@pytest.mark.parametrize(
    ("gpus", "allowed"),
    [
        # prod holds 4 GPUs, guarantee 2: p2 is spared, p0 + p1 free 2 GPUs on a.
        (2, {"a": ["p0", "p1"]}),
        # The pod needs 3: with p2 spared the rest frees only 2, so a is no candidate.
        (3, {}),
    ],
    ids=["room-left", "no-room-left"],
)
def test_preempt_drops_a_node_whose_kept_victims_no_longer_make_room(gpus, allowed):
    preemptor = pod("hi", ns="research", gpu=gpus, phase="Pending")
    args = preempt_args({"a": ["p0", "p1", "p2"]}, preemptor=preemptor)
    out = verbs.preempt_result(args, Snapshot.of(cluster()), CONFIG).encode()
    assert _answer(out) == allowed


SHARED = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "prod", "namespaces": ["prod"], "guaranteed": {"nvidia.com/gpu": "1"}},
            {"name": "research", "namespaces": ["research"]},
        ],
        "preemption": {"otherTenants": "Any"},
    }
)


def test_preempt_checks_device_fit_of_the_victims_kept():
    """c: research x0 and prod y0 share GPU 0, research x1 and prod y1 share GPU 1 (halves);
    prod holds 1 GPU = its guarantee. d: research z0 and z1 hold a whole GPU each.
    A whole-GPU preemptor: on c, y0 is spared, so x0 + x1 free half of each GPU (a whole GPU
    in the column, but no device with a whole GPU free): c is dropped. On d, z0 frees GPU 0."""
    st = state_with(node("c", gpus=2), node("d", gpus=2), config=SHARED)
    half = "fairshare.io/gpu-fraction"
    for name, ns, where, dev in [
        ("x0", "research", "c", "0:500"),
        ("y0", "prod", "c", "0:500"),
        ("x1", "research", "c", "1:500"),
        ("y1", "prod", "c", "1:500"),
        ("z0", "research", "d", "0:1000"),
        ("z1", "research", "d", "1:1000"),
    ]:
        ann = {half: "0.5"} if dev.endswith("500") else {}
        ann["fairshare.io/gpu-devices"] = dev
        gpu = None if ann.get(half) else 1
        p = pod(name, ns=ns, gpu=gpu, node_name=where, annotations=ann)
        objects.apply_pod(st, p, SHARED, ns)
    preemptor = pod("hi", ns="research", gpu=1, phase="Pending")
    args = preempt_args({"c": ["x0", "x1", "y0"], "d": ["z0"]}, preemptor=preemptor)
    out = verbs.preempt_result(args, Snapshot.of(st), SHARED).encode()
    assert _answer(out) == {"d": ["z0"]}
    # Without the guarantee nothing is spared, and kube-scheduler's choice stands on c.
    relaxed = SHARED.model_copy(update={"tenants": SHARED.tenants[1:]})
    out = verbs.preempt_result(args, Snapshot.of(st), relaxed).encode()
    assert _answer(out) == {"c": ["x0", "x1", "y0"], "d": ["z0"]}


# -- bind ---------------------------------------------------------------------------------


def _pending(st, p):
    return [verbs.request_for(p, state=st, config=CONFIG, namespace_labels={})]


def test_bind_plan_builds_the_binding_with_the_devices_annotation():
    st = cluster()
    p = pod("w", ns="research", gpu=2, phase="Pending")
    plan = verbs.bind_plan(
        wire.ExtenderBindingArgs("w", "research", "uid-w", "b"),
        Snapshot.of(st, pending=_pending(st, p)),
    )
    assert plan.error == ""
    assert plan.devices == ((2, 1000.0), (3, 1000.0))  # b: p3 on 0, r1 on 1
    assert plan.binding == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "w",
            "namespace": "research",
            "uid": "uid-w",
            "annotations": {"fairshare.io/gpu-devices": "2:1000,3:1000"},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": "b"},
    }
    assert plan.result() == {"Error": ""}
    verbs.commit_bind(st, plan)
    assert st.node_devices(st.node_index["b"])[:4] == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("binding", "error"),
    [
        (wire.ExtenderBindingArgs("nope", "research", "uid-nope", "b"), "not pending here"),
        (wire.ExtenderBindingArgs("w", "research", "uid-w", "zz"), "node zz is not known"),
        (wire.ExtenderBindingArgs("w", "research", "uid-w", "a"), "node a cannot take pod"),
    ],
    ids=["unknown-pod", "unknown-node", "no-room"],
)
def test_bind_plan_refusals_come_back_in_error(binding, error):
    st = cluster()
    plan = verbs.bind_plan(
        binding, Snapshot.of(st, pending=_pending(st, pod("w", ns="research", gpu=2)))
    )
    assert error in plan.error
    assert plan.result() == {"Error": plan.error}
    with pytest.raises(ValueError, match="refused"):
        verbs.commit_bind(st, plan)


def test_bind_plan_finds_the_pod_by_name_when_uid_is_empty_and_cpu_pods_get_no_devices():
    st = cluster()
    p = pod("c", ns="research", phase="Pending")
    plan = verbs.bind_plan(
        wire.ExtenderBindingArgs("c", "research", "", "a"),
        Snapshot.of(st, pending=_pending(st, p)),
    )
    assert plan.error == "" and plan.devices == ()
    assert plan.binding["metadata"]["annotations"] == {}


def test_a_second_bind_of_the_same_pod_is_refused():
    st = cluster()
    pending = _pending(st, pod("w", ns="research", gpu=1))
    args = wire.ExtenderBindingArgs("w", "research", "uid-w", "b")
    verbs.commit_bind(st, verbs.bind_plan(args, Snapshot.of(st, pending=pending)))
    assert "already bound" in verbs.bind_plan(args, Snapshot.of(st, pending=pending)).error


def test_commit_after_the_watch_already_reported_the_bound_pod_is_a_no_op():
    st = cluster()
    p = pod("w", ns="research", gpu=1, phase="Pending")
    plan = verbs.bind_plan(
        wire.ExtenderBindingArgs("w", "research", "uid-w", "b"),
        Snapshot.of(st, pending=_pending(st, p)),
    )
    # The watch event: the pod bound with the annotation the Binding wrote.
    p["spec"]["nodeName"] = "b"
    p["metadata"].setdefault("annotations", {}).update(plan.annotations)
    first = objects.apply_pod(st, p, CONFIG, "research")
    assert verbs.commit_bind(st, plan) is first
    assert first is not None and first.devices == plan.devices
