"""Extender filter and prioritize verbs over a ClusterState (pure, no HTTP).

Node and pod builders come from ``test_state_objects`` (a ``make_node`` belongs in
``tests/builders.py`` once that file is free to edit).
"""

from __future__ import annotations

from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare import pipeline
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.state import objects
from tests.unit.test_state_objects import node, pod, state_with

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "prod", "namespaces": ["prod"]},
            {"name": "research", "namespaces": ["research"]},
        ],
    }
)


def args(p: dict[str, Any], names: list[str] | None = None, nodes: list[Any] | None = None):
    body = {
        "Pod": p,
        "Nodes": None if nodes is None else {"metadata": {}, "items": nodes},
        "NodeNames": names,
    }
    return wire.decode_extender_args(body)


def run_filter(st, p, names, *, pending=(), config: FairShareConfig = CONFIG) -> dict[str, Any]:
    return verbs.filter_result(
        args(p, names), Snapshot.of(st, pending=list(pending)), config
    ).encode()


def request(p: dict[str, Any], st, config: FairShareConfig = CONFIG):
    return verbs.request_for(p, state=st, config=config, namespace_labels={})


# -- the fair-share gate ------------------------------------------------------------------

GATE_CASES = [
    # (research GPUs running on the 4-GPU node, prod pending?, gated?, reason)
    # research holds 3 of 4 GPUs; with the pod it would hold 4/4 = 1.00. Fair allocation
    # over demand research 4, prod 1 (progressive filling): prod 1 GPU = 0.25, research
    # the other 3 = 0.75. 1.00 > 0.75 and prod (share 0) has a pod that fits: gated.
    (3, True, True, "tenant research above its fair share (1.00 > 0.75) while prod waits"),
    # Nobody else waits: work conservation lets research take the last GPU.
    (3, False, False, ""),
    # research holds 1 GPU; after the pod 2/4 = 0.50, fair share 3/4: allowed.
    (1, True, False, ""),
]


@pytest.mark.parametrize(
    ("held", "prod_waits", "gated", "reason"),
    GATE_CASES,
    ids=["above-fair-share-while-prod-waits", "alone-takes-the-rest", "within-fair-share"],
)
def test_gate_reason_appears_in_failed_nodes(held, prod_waits, gated, reason):
    st = state_with(node("a", gpus=4), node("b", gpus=0))
    for k in range(held):
        objects.apply_pod(st, pod(f"r{k}", ns="research", gpu=1, node_name="a"), CONFIG, "research")
    pending = [request(pod("p0", ns="prod", gpu=1, phase="Pending"), st)] if prod_waits else []
    out = run_filter(
        st, pod("new", ns="research", gpu=1, phase="Pending"), ["a", "b"], pending=pending
    )
    if gated:
        assert out["NodeNames"] == []
        assert out["FailedNodes"]["a"] == reason
        # b has no GPU at all: that reason stays (and is not resolvable by preemption).
        assert "b" in out["FailedAndUnresolvableNodes"]
    else:
        assert out["NodeNames"] == ["a"]
        assert "a" not in out["FailedNodes"]


def test_gate_outcome_is_structured():
    st = state_with(node("a", gpus=4))
    for k in range(3):
        objects.apply_pod(st, pod(f"r{k}", ns="research", gpu=1, node_name="a"), CONFIG, "research")
    req = request(pod("new", ns="research", gpu=1, phase="Pending"), st)
    waiting = request(pod("p0", ns="prod", gpu=1, phase="Pending"), st)
    out = pipeline.filter_pod(st, config=CONFIG, req=req, names=["a"], pending=[waiting])
    assert out.passing == ()
    assert out.gate is not None and not out.gate.allowed
    assert (out.gate.tenant, out.gate.waiting_for) == ("research", "prod")
    assert out.gate.share_after == pytest.approx(1.0)
    assert out.gate.fair_share == pytest.approx(0.75)


# -- health -----------------------------------------------------------------------------

SICK = [{"type": "GpuUnhealthy", "status": "True", "reason": "DCGM"}]
TAINTED = [{"key": "nvidia.com/gpu.unhealthy", "effect": "NoSchedule"}]


@pytest.mark.parametrize(
    ("sick_node", "gpu", "annotations", "passes"),
    [
        (node("s", conditions=SICK), 1, None, False),
        (node("s", taints=TAINTED), 1, None, False),
        (node("s", conditions=SICK), None, {"fairshare.io/gpu-fraction": "0.5"}, False),
        (node("s", conditions=SICK), None, None, True),  # CPU-only pods may still go there
    ],
    ids=["condition-whole-gpu", "taint-whole-gpu", "condition-fractional", "cpu-only-passes"],
)
def test_unhealthy_node_is_unresolvable_for_gpu_pods(sick_node, gpu, annotations, passes):
    st = state_with(node("ok"), sick_node)
    p = pod("p", gpu=gpu, phase="Pending", annotations=annotations)
    out = run_filter(st, p, ["ok", "s"])
    assert ("s" in out["NodeNames"]) is passes
    assert "ok" in out["NodeNames"]
    if not passes:
        assert out["FailedAndUnresolvableNodes"]["s"].startswith("GPU unhealthy: ")
        assert "s" not in out["FailedNodes"]


# -- fit reasons and both request forms --------------------------------------------------


def test_failure_reasons_name_the_resource_and_split_by_resolvability():
    st = state_with(node("small", gpus=1), node("full", gpus=2), node("cpu", gpus=0))
    objects.apply_pod(st, pod("hog", gpu=2, node_name="full"), CONFIG, "prod")
    out = run_filter(st, pod("p", gpu=2, phase="Pending"), ["small", "full", "cpu", "ghost"])
    assert out["NodeNames"] == []
    # 2 GPUs can never fit a 1-GPU or GPU-less node; the full node may free up.
    assert set(out["FailedAndUnresolvableNodes"]) == {"small", "cpu"}
    assert out["FailedNodes"]["full"] == "Insufficient nvidia.com/gpu (free 0, requested 2)"
    assert out["FailedNodes"]["ghost"] == pipeline.UNKNOWN_NODE


def test_nodes_form_echoes_passing_node_objects():
    st = state_with(node("a"), node("b", conditions=SICK))
    items = [node("a"), node("b", conditions=SICK)]
    out = verbs.filter_result(
        args(pod("p", gpu=1, phase="Pending"), nodes=items),
        Snapshot.of(st, pending=[]),
        CONFIG,
    ).encode()
    assert out["NodeNames"] is None
    assert out["Nodes"] == {"metadata": {}, "items": [items[0]]}
    assert list(out) == ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]


def test_unreadable_pod_fails_every_node_as_unresolvable():
    st = state_with(node("a"))
    p = pod("p", phase="Pending", annotations={"fairshare.io/gpu-fraction": "3"})
    out = run_filter(st, p, ["a"])
    assert out["NodeNames"] == [] and out["Error"] == ""
    assert "gpu-fraction" in out["FailedAndUnresolvableNodes"]["a"]


# -- fractional pods never overfill a device ------------------------------------------------


@pytest.mark.parametrize(
    ("fraction", "fits"),
    [
        ("0.5", 4),  # 2 per device x 2 devices
        ("0.3", 6),  # 3 x 0.3 = 0.9 per device; a 4th would need 1.2
        ("0.7", 2),  # one per device: 0.7 + 0.7 > 1
        ("0.25", 8),
        # 1/7 of a GPU is ceil(1000/7) = 143 milli-GPU; 7 x 143 = 1001 > 1000, so only
        # 6 fit per device: 12 on two devices.
        ("1/7", 12),
    ],
    ids=["half", "0.3", "0.7", "quarter", "seventh"],
)
def test_fractional_pods_never_overfill_a_device(fraction, fits):
    st = state_with(node("a", gpus=2))
    placed = 0
    for k in range(fits + 3):
        p = pod(f"f{k}", phase="Pending", annotations={"fairshare.io/gpu-fraction": fraction})
        req = request(p, st)
        out = run_filter(st, p, ["a"])
        if not out["NodeNames"]:
            # Either the node's GPU total or every single device is short.
            assert (
                "nvidia.com/gpu" in out["FailedNodes"]["a"] or "device" in out["FailedNodes"]["a"]
            )
            break
        bind = wire.ExtenderBindingArgs(f"f{k}", "prod", req.uid, "a")
        plan = verbs.bind_plan(bind, Snapshot.of(st, pending=[req]))
        assert plan.error == ""
        verbs.commit_bind(st, plan)
        placed += 1
        assert all(v >= 0 for v in st.node_devices(0)[:2])
    assert placed == fits
    held: dict[int, float] = {}
    for bp in st.pods.values():
        for dev, milli in bp.devices:
            held[dev] = held.get(dev, 0.0) + milli
    assert all(v <= 1000.0 for v in held.values())


def test_fractional_pod_lands_on_a_device_with_room():
    st = state_with(node("a", gpus=2))
    big = pod("big", node_name="a", annotations={"fairshare.io/gpu-fraction": "0.75"})
    big["metadata"]["annotations"]["fairshare.io/gpu-devices"] = "0:750"
    objects.apply_pod(st, big, CONFIG, "prod")
    p = pod("p", phase="Pending", annotations={"fairshare.io/gpu-fraction": "0.5"})
    req = request(p, st)
    plan = verbs.bind_plan(
        wire.ExtenderBindingArgs("p", "prod", req.uid, "a"),
        Snapshot.of(st, pending=[req]),
    )
    # Device 0 has 250 free: too small; device 1 takes it.
    assert plan.devices == ((1, 500.0),)
    # A new shared GPU on device 1, named after the pod; device 0 keeps big's (legacy) group.
    assert plan.annotations == {
        "fairshare.io/gpu-devices": "1:500",
        "fairshare.io/gpu-group": objects.new_group_id("a", req.uid),
    }
    assert plan.new_group and st.group_at("a", 0) == objects.legacy_group_id("a", 0)


def test_total_gpu_free_is_not_enough_without_one_device_with_room():
    st = state_with(node("a", gpus=2))
    for dev in (0, 1):
        half = pod(f"h{dev}", node_name="a", annotations={"fairshare.io/gpu-fraction": "0.5"})
        half["metadata"]["annotations"]["fairshare.io/gpu-devices"] = f"{dev}:500"
        objects.apply_pod(st, half, CONFIG, "prod")
    # 1.0 GPU free in total, but 0.5 on each device: a 0.75 share fits nowhere.
    p = pod("p", phase="Pending", annotations={"fairshare.io/gpu-fraction": "0.75"})
    out = run_filter(st, p, ["a"])
    assert out["NodeNames"] == []
    assert out["FailedNodes"]["a"] == (
        "no 1 GPU device(s) with 0.75 free (free per device: gpu0=0.5, gpu1=0.5)"
    )
    req = request(p, st)
    plan = verbs.bind_plan(
        wire.ExtenderBindingArgs("p", "prod", req.uid, "a"),
        Snapshot.of(st, pending=[req]),
    )
    assert plan.error.startswith("node a cannot take pod prod/p: no 1 GPU device(s)")


# -- prioritize ------------------------------------------------------------------------------

WEIGHTS = [
    {},
    {"fragmentation": 0, "packing": 0, "health": 0},
    {"fit": 1, "fragmentation": 0},
    {"spread": 5, "fairness": 1, "stranding": 1},
]


@pytest.mark.parametrize("weights", WEIGHTS, ids=["default", "all-zero", "fit-only", "spread"])
@pytest.mark.parametrize(
    ("gpu", "annotations"),
    [(1, None), (None, {"fairshare.io/gpu-fraction": "0.5"}), (None, None)],
    ids=["whole", "fractional", "cpu-only"],
)
def test_scores_are_ints_in_0_to_10_for_every_node_given(weights, gpu, annotations):
    config = config_from_mapping(
        {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig", "scoring": weights}
    )
    st = state_with(node("a", gpus=8), node("b", gpus=2), node("c", gpus=0), config=config)
    objects.apply_pod(st, pod("x", gpu=1, node_name="b"), config, None)
    p = pod("p", gpu=gpu, phase="Pending", annotations=annotations)
    names = ["c", "b", "a", "ghost"]
    out = wire.encode_scores(*verbs.prioritize_scores(args(p, names), Snapshot.of(st), config))
    assert [h["Host"] for h in out] == names
    for h in out:
        assert list(h) == ["Host", "Score"]
        assert type(h["Score"]) is int and 0 <= h["Score"] <= wire.MAX_EXTENDER_PRIORITY
    assert out[-1]["Score"] == 0  # unknown node
    if gpu or annotations:
        assert out[0]["Score"] == 0  # c has no GPU: does not fit, scores 0
    if weights.get("health", 1) == 0 and sum(weights.values()) == 0:
        assert all(h["Score"] == 0 for h in out)


def test_prioritize_prefers_the_healthy_node_for_cpu_pods():
    st = state_with(node("ok"), node("sick", conditions=SICK))
    out = wire.encode_scores(
        *verbs.prioritize_scores(
            args(pod("p", phase="Pending"), ["sick", "ok"]), Snapshot.of(st), CONFIG
        )
    )
    scores = {h["Host"]: h["Score"] for h in out}
    assert scores["ok"] > scores["sick"]
