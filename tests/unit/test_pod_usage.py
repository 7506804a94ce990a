"""One rule for what a pod counts: admission, reservations, the webhook's watch and the
extender's shares agree, for GPU-memory requests above all (issue: they escaped the
GPU quota once the watch saw them, counted as 0 GPUs)."""

from __future__ import annotations

import json
from fractions import Fraction as F
from typing import Any

import pytest

from fairshare import resources
from fairshare.config.loading import config_from_mapping
from fairshare.resources import GPU
from fairshare.state.usage import UsageTracker
from tests.builders import make_pod
from tests.extender_side import Side
from tests.unit.test_state_objects import node
from webhook import review, wire
from webhook.reservations import ReservationLedger, pod_key

GI = 2**30
MEM = resources.ANN_GPU_MEMORY
CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "prod", "namespaces": ["prod"], "limit": {GPU: "1"}}],
    }
)
MIG = CONFIG.mig_fractions()


def mem_pod(name: str, memory: str = "40Gi", *, node_name: str | None = None) -> dict[str, Any]:
    obj = make_pod(name).ns("prod").annotations({MEM: memory}).req(cpu="1").obj()
    obj["metadata"]["uid"] = f"uid-{name}"
    if node_name:
        obj["spec"]["nodeName"] = node_name
    obj["status"] = {"phase": "Running" if node_name else "Pending"}
    return obj


@pytest.mark.parametrize(
    ("node_name", "by_node", "largest", "counted"),
    [
        ("a", {"a": 40 * GI, "b": 80 * GI}, 80 * GI, F(1)),  # the node's device
        (None, {"a": 40 * GI, "b": 80 * GI}, 80 * GI, F(1, 2)),  # pending: the largest
        ("c", {"a": 40 * GI, "b": 80 * GI}, 80 * GI, F(1, 2)),  # unlabelled node: largest
        (None, {}, None, F(1)),  # no device size known: a whole GPU
    ],
    ids=["bound-node", "pending-largest", "unknown-node-largest", "unknown-whole-gpu"],
)
def test_pod_usage_resolves_gpu_memory(
    node_name: str | None, by_node: dict[str, int], largest: int | None, counted: F
) -> None:
    got = resources.pod_usage(
        mem_pod("p", node_name=node_name), mig=MIG, device_memory=by_node, largest_memory=largest
    )
    assert got.get(GPU) == counted
    assert got.gpu.memory == 40 * GI and got.gpu.per_device == 0  # placement still resolves


def test_other_pods_count_as_they_ask() -> None:
    whole = make_pod("w").ns("prod").req(gpu=2).obj()
    frac = make_pod("f").ns("prod").annotations({resources.ANN_GPU_FRACTION: "0.25"}).obj()
    assert resources.pod_usage(whole, mig=MIG).get(GPU) == 2
    assert resources.pod_usage(frac, mig=MIG).get(GPU) == F(1, 4)


def _labelled_node(name: str, mib: int | None) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.memory": str(mib)} if mib else {}
    return {"metadata": {"name": name, "labels": labels}}


def test_watch_counts_gpu_memory_pods_like_admission() -> None:
    t = UsageTracker(lambda: CONFIG)
    t.on_resync("Node", [_labelled_node("n80", 81920), _labelled_node("n40", 40960)])
    t.on_event("Pod", "ADDED", mem_pod("a"))  # pending: half of the largest device
    assert t.tenant_usage("prod") == {GPU: F(1, 2), "cpu": F(1)}
    t.on_event("Pod", "MODIFIED", mem_pod("a", node_name="n40"))  # bound: the whole 40Gi
    assert t.tenant_usage("prod")[GPU] == F(1)
    t.on_event("Pod", "DELETED", mem_pod("a", node_name="n40"))
    assert t.tenant_usage("prod") == {}


def test_watch_recounts_gpu_memory_pods_when_device_memory_changes() -> None:
    t = UsageTracker(lambda: CONFIG)
    t.on_event("Pod", "ADDED", mem_pod("a", node_name="n80"))
    assert t.tenant_usage("prod")[GPU] == F(1)  # no device size known yet: a whole GPU
    t.on_event("Node", "ADDED", _labelled_node("n80", 81920))
    assert t.tenant_usage("prod")[GPU] == F(1, 2)
    t.on_event("Node", "DELETED", _labelled_node("n80", 81920))
    assert t.tenant_usage("prod")[GPU] == F(1)


def test_third_40gi_pod_is_denied_after_the_watch_saw_two() -> None:
    """Reservations and the watch count alike: admitted, watched, then the third is denied."""
    t = UsageTracker(lambda: CONFIG)
    ledger = ReservationLedger(ttl=60)
    t.listeners.append(lambda name, _event: ledger.release(pod_key(*name.split("/"))))
    t.on_resync("Node", [_labelled_node("n", 81920)])
    answers = []
    for i in range(3):
        p = mem_pod(f"m{i}")
        request = wire.decode_review(
            json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {
                        "uid": f"r{i}",
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "operation": "CREATE",
                        "namespace": "prod",
                        "name": f"m{i}",
                        "object": p,
                    },
                }
            ).encode()
        )
        answers.append(review.admit(request, view=t, config=CONFIG, ledger=ledger, now=0.0))
        if answers[-1].allowed:
            t.on_event("Pod", "ADDED", mem_pod(f"m{i}", node_name="n"))
    assert [a.allowed for a in answers] == [True, True, False]
    status = answers[2].status
    assert status is not None and status.message is not None
    assert "prod" in status.message and GPU in status.message


def test_extender_counts_a_bound_gpu_memory_pod_by_its_nodes_device() -> None:
    tr = Side(lambda: CONFIG)
    tr.on_resync("Node", [node("n80", gpus=8, memory_mib="81920")])
    tr.on_event("Pod", "ADDED", mem_pod("p"))
    assert tr.pending["uid-p"].row[tr.state.gpu_col] == 500  # half of the largest device
    tr.on_event("Pod", "MODIFIED", mem_pod("p", node_name="n80"))
    assert tr.state.usage_of("prod")[tr.state.gpu_col] == 500


def test_extender_never_counts_a_gpu_memory_pod_as_zero() -> None:
    """On a node without a device-memory label the pod counts as the webhook counts it."""
    tr = Side(lambda: CONFIG)
    tr.on_resync("Node", [node("bare", gpus=8, memory_mib="")])
    tr.on_event("Pod", "ADDED", mem_pod("p", node_name="bare"))
    assert tr.state.usage_of("prod")[tr.state.gpu_col] == 1000  # no size known: whole GPU
    tr.on_event("Node", "ADDED", node("n80", gpus=8, memory_mib="81920"))
    assert tr.state.usage_of("prod")[tr.state.gpu_col] == 500  # the largest device known


def test_the_simulator_counts_gpu_memory_pods_against_the_limit() -> None:
    from fairshare.simulator.engine import Simulation

    sim = Simulation(CONFIG)
    alloc = {GPU: F(8), "cpu": F(64), "memory": F(512 * GI)}
    sim.add_node("n", alloc, {"nvidia.com/gpu.memory": "81920"})
    outcomes = [sim.submit(sim.request_for(mem_pod(f"m{i}"), uid=f"u{i}")) for i in range(3)]
    assert [o.status for o in outcomes] == ["pending", "pending", "rejected"]
