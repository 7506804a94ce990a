"""``objects.slim_pod``: every later reader of a stored pod sees the same answer."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender import reclaimer
from fairshare import dra
from fairshare.config.loading import config_from_mapping
from fairshare.resources import ANN_GPU_DEVICES, DemandError, ResourceIndex
from fairshare.state import objects
from tests.bench import bench_memory
from tests.builders import make_pod
from tests.extender_side import Side

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "prod", "namespaces": ["prod"]}],
    }
)
INDEX = ResourceIndex(CONFIG.resource_names())


def _pods() -> list[dict[str, Any]]:
    kinds = bench_memory.POD_KINDS
    out = [
        bench_memory.pod(k, "prod", kind, node_name="n1" if k % 2 else None, devices="0:250")
        for k, kind in enumerate(kinds)
    ]
    sidecar = (
        make_pod("side")
        .ns("prod")
        .init("setup", requests={"cpu": "2"})
        .init("proxy", requests={"cpu": "1"}, sidecar=True)
        .req(cpu="1", gpu=1)
        .overhead(cpu="100m")
        .ann(fairshare__io__gpu_models="A100|H100", other="x" * 500)
        .obj()
    )
    sidecar["spec"]["nodeName"] = "n1"
    sidecar["spec"]["nodeSelector"] = {"pool": "a"}
    sidecar["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "claim-1"}]
    sidecar["status"] = {
        "phase": "Running",
        "resourceClaimStatuses": [{"name": "t", "resourceClaimName": "claim-2"}],
    }
    sidecar["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    memory = make_pod("mem").ns("prod").ann(fairshare__io__gpu_memory="20Gi").req(cpu="1").obj()
    done = make_pod("done").ns("prod").req(cpu="1").obj()
    done["status"] = {"phase": "Succeeded"}
    placed = make_pod("placed").ns("prod").req(cpu="1", gpu=1).obj()
    placed["spec"].update(
        {
            "schedulerName": "fairshare-scheduler",
            "schedulingGates": [{"name": "hold"}],
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [],
                },
                "podAntiAffinity": {},
            },
        }
    )
    return [*out, sidecar, memory, done, placed]


def _readings(pod: dict[str, Any]) -> tuple[Any, ...]:
    try:
        req: Any = objects.pod_request(pod, config=CONFIG, tenant="prod", index=INDEX)
    except DemandError as exc:
        req = str(exc)
    meta = pod.get("metadata") or {}
    return (
        objects.pod_uid(pod),
        objects.is_bound(pod),
        objects.is_terminal(pod),
        objects.pod_tenant(pod, config=CONFIG, namespace_labels={}),
        req,
        dra.pod_claim_names(pod),
        (meta.get("annotations") or {}).get(ANN_GPU_DEVICES),
        reclaimer._created(pod),
        meta.get("deletionTimestamp"),
        meta.get("name"),
        meta.get("namespace"),
        (pod.get("spec") or {}).get("nodeSelector"),
    )


@pytest.mark.parametrize("pod", _pods(), ids=lambda p: str(p["metadata"]["name"]))
def test_slim_pod_reads_the_same(pod: dict[str, Any]) -> None:
    before = copy.deepcopy(pod)
    slim = objects.slim_pod(pod)
    assert pod == before  # the original is not changed
    assert _readings(slim) == _readings(pod)
    assert objects.slim_pod(slim) == slim


def test_slim_pod_drops_the_bulk() -> None:
    pod = bench_memory.pod(1, "prod", bench_memory.POD_KINDS[0], node_name="n1", devices=None)
    slim = objects.slim_pod(pod)
    assert "env" not in slim["spec"]["containers"][0]
    assert "volumes" not in slim["spec"] and "conditions" not in slim["status"]
    assert list(slim["metadata"]["annotations"]) == []
    assert len(repr(slim)) < len(repr(pod)) / 3


@pytest.mark.parametrize(
    "pod",
    [
        {"metadata": [], "spec": {}},
        {"metadata": {}, "spec": "x"},
        {"metadata": {}, "spec": {}, "status": 3},
        {"metadata": {"annotations": ["a"]}, "spec": {}},
        {"metadata": {}, "spec": {"containers": {"a": 1}}},
        {"metadata": {}, "spec": {"initContainers": [1]}},
    ],
)
def test_slim_pod_keeps_odd_shapes_whole(pod: dict[str, Any]) -> None:
    assert objects.slim_pod(pod) is pod


def test_tracker_keeps_slim_pods() -> None:
    tracker = Side(lambda: CONFIG)
    pod = bench_memory.pod(3, "prod", bench_memory.POD_KINDS[0], node_name=None, devices=None)
    tracker.on_event("Pod", "ADDED", pod)
    uid = objects.pod_uid(pod)
    assert tracker.pods[uid] == objects.slim_pod(pod)
    assert uid in tracker.pending


def test_equal_slim_parts_are_one_object_and_unequal_ones_are_not():
    def pod(name: str, cpu: str, phase: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "a", "uid": name},
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "c", "image": name, "resources": {"limits": {"cpu": cpu}}}],
            },
            "status": {"phase": phase, "podIP": name},
        }

    a, b, c = (
        objects.slim_pod(pod(n, cpu, "Running")) for n, cpu in (("a", "1"), ("b", "1"), ("c", "2"))
    )
    assert a["spec"]["containers"] is b["spec"]["containers"]  # images differ, kept parts equal
    assert a["spec"]["containers"] is not c["spec"]["containers"]
    assert a["status"] is b["status"] is c["status"] and a["status"] == {"phase": "Running"}
    assert a["metadata"] is not b["metadata"]  # per-pod identity is never shared
