"""Kubernetes objects → ClusterState: health, device annotations, bound pods, List files."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fairshare import resources
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig, HealthPolicy
from fairshare.resources import ANN_GPU_DEVICES, ResourceIndex
from fairshare.state import objects
from fairshare.state.cluster import ClusterState, StateError
from tests.builders import make_pod

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "prod", "namespaces": ["prod"]},
            {"name": "research", "namespaceSelector": {"team": "research"}},
        ],
    }
)


def node(
    name: str,
    *,
    gpus: int = 4,
    cpu: str = "32",
    conditions: list[dict[str, str]] | None = None,
    taints: list[dict[str, str]] | None = None,
    memory_mib: str = "81920",
) -> dict[str, Any]:
    """A Node as the API returns it (GPU feature discovery labels, allocatable)."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": "A100", "nvidia.com/gpu.memory": memory_mib},
        },
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "256Gi", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}, *(conditions or [])],
        },
    }
    return obj


def pod(
    name: str,
    *,
    ns: str = "prod",
    gpu: Any = None,
    node_name: str | None = None,
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    builder = make_pod(name).ns(ns).req(cpu="1", gpu=gpu)
    if annotations:
        builder.annotations(annotations)
    obj = builder.obj()
    obj["metadata"]["uid"] = f"uid-{name}"
    if node_name:
        obj["spec"]["nodeName"] = node_name
    obj["status"] = {"phase": phase}
    return obj


def state_with(*nodes: dict[str, Any], config: FairShareConfig = CONFIG) -> ClusterState:
    st = ClusterState(ResourceIndex(config.resource_names()))
    for n in nodes:
        objects.apply_node(st, n, config)
    return st


# -- health ------------------------------------------------------------------------------

HEALTH_CASES = [
    # (conditions, taints, healthy, reason fragment)
    ([], [], True, ""),
    ([{"type": "GpuUnhealthy", "status": "True"}], [], False, "condition GpuUnhealthy=True"),
    ([{"type": "GpuUnhealthy", "status": "False"}], [], True, ""),
    ([{"type": "GpuUnhealthy", "status": "Unknown"}], [], True, ""),
    (
        [{"type": "XidCriticalError", "status": "True", "reason": "Xid79"}],
        [],
        False,
        "(Xid79)",
    ),
    ([{"type": "DiskPressure", "status": "True"}], [], True, ""),
    ([], [{"key": "nvidia.com/gpu.unhealthy", "effect": "NoSchedule"}], False, "taint"),
    ([], [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}], True, ""),
]


@pytest.mark.parametrize(
    ("conditions", "taints", "healthy", "fragment"),
    HEALTH_CASES,
    ids=[
        "no-signal",
        "condition-true",
        "condition-false",
        "condition-unknown",
        "xid-with-reason",
        "unrelated-condition",
        "unhealthy-taint",
        "unrelated-taint",
    ],
)
def test_node_gpu_health(conditions, taints, healthy, fragment):
    got_healthy, reason = objects.node_gpu_health(
        node("n", conditions=conditions, taints=taints), HealthPolicy()
    )
    assert got_healthy is healthy
    assert fragment in reason
    assert (reason == "") is healthy


def test_health_policy_lists_are_the_config_s():
    policy = HealthPolicy(unhealthy_conditions=("MyGpuBroken",), unhealthy_taints=())
    sick = node("n", conditions=[{"type": "MyGpuBroken", "status": "True"}])
    default_sick = node("n", conditions=[{"type": "GpuUnhealthy", "status": "True"}])
    assert objects.node_gpu_health(sick, policy)[0] is False
    assert objects.node_gpu_health(default_sick, policy)[0] is True


def test_apply_node_reads_allocatable_labels_and_health():
    st = state_with(
        node("a", gpus=2), node("b", conditions=[{"type": "GpuEccError", "status": "True"}])
    )
    a, b = st.nodes[st.node_index["a"]], st.nodes[st.node_index["b"]]
    assert a.gpu_model == "A100" and a.device_memory == 81920 * 1024 * 1024
    assert st.node_devices(st.node_index["a"])[:3] == [1000.0, 1000.0, -1.0]
    assert a.gpu_healthy and not b.gpu_healthy
    assert "GpuEccError" in b.health_reason
    # An update (the condition clears) replaces the node in place.
    objects.apply_node(st, node("b"), CONFIG)
    assert st.healthy[st.node_index["b"]] == 1


def test_apply_node_without_name_is_refused():
    with pytest.raises(StateError, match=r"metadata\.name"):
        objects.apply_node(state_with(), {"status": {}}, CONFIG)


# -- the device annotation ----------------------------------------------------------------

ANNOTATION_CASES = [
    ("0:1000", ((0, 1000.0),)),
    ("1:500,0:250", ((0, 250.0), (1, 500.0))),
    ("3:143", ((3, 143.0),)),
]


@pytest.mark.parametrize(("text", "devices"), ANNOTATION_CASES, ids=["whole", "two", "mig-1/7"])
def test_gpu_devices_annotation_parses(text, devices):
    assert objects.parse_gpu_devices(text) == devices
    assert objects.parse_gpu_devices(objects.format_gpu_devices(devices)) == devices


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not <device>:<milli-GPU>"),
        ("0", "not <device>:<milli-GPU>"),
        ("a:100", "not <device>:<milli-GPU>"),
        ("0:0", "1..1000"),
        ("0:1001", "1..1000"),
        ("0:500,0:500", "listed twice"),
        ("-1:500", "not <device>:<milli-GPU>"),
    ],
    ids=["empty", "no-colon", "bad-device", "zero", "above-one", "duplicate", "negative"],
)
def test_gpu_devices_annotation_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        objects.parse_gpu_devices(text)


def test_format_sorts_and_rounds_up():
    # 1/7 of a GPU is 142.857… milli: the kernels hold it as ceil = 143.
    assert objects.format_gpu_devices([(2, 142.857), (0, 1000.0)]) == "0:1000,2:143"


# -- pods ---------------------------------------------------------------------------------


def test_apply_pod_restores_annotated_devices():
    st = state_with(node("a"))
    p = pod("p", gpu=None, node_name="a", annotations={"fairshare.io/gpu-fraction": "0.5"})
    p["metadata"]["annotations"][ANN_GPU_DEVICES] = "2:500"
    bound = objects.apply_pod(st, p, CONFIG, "prod")
    assert bound is not None and bound.devices == ((2, 500.0),)
    assert st.node_devices(0)[:4] == [1000.0, 1000.0, 500.0, 1000.0]
    assert st.usage_of("prod")[st.gpu_col] == 500.0


def test_apply_pod_without_annotation_falls_back_to_choose_devices():
    st = state_with(node("a", gpus=2))
    objects.apply_pod(st, pod("w", gpu=1, node_name="a"), CONFIG, "prod")
    frac = pod("f", node_name="a", annotations={"fairshare.io/gpu-fraction": "0.25"})
    bound = objects.apply_pod(st, frac, CONFIG, "prod")
    # Device 0 is taken by the whole-GPU pod; the share goes on device 1.
    assert bound is not None and bound.devices == ((1, 250.0),)


def test_invalid_annotation_falls_back_too():
    st = state_with(node("a", gpus=2))
    p = pod("p", gpu=1, node_name="a", annotations={ANN_GPU_DEVICES: "9:1000"})
    bound = objects.apply_pod(st, p, CONFIG, None)
    assert bound is not None and bound.devices == ((0, 1000.0),)


@pytest.mark.parametrize(
    ("phase", "node_name", "accounted"),
    [
        ("Running", "a", True),
        ("Pending", "a", True),  # bound, containers starting: holds its resources
        ("Succeeded", "a", False),
        ("Failed", "a", False),
        ("Pending", None, False),
        ("Running", "elsewhere", False),  # node not known yet
    ],
    ids=["running", "bound-pending", "succeeded", "failed", "unbound", "unknown-node"],
)
def test_apply_pod_accounts_only_bound_non_terminal_pods(phase, node_name, accounted):
    st = state_with(node("a"))
    result = objects.apply_pod(st, pod("p", gpu=1, node_name=node_name, phase=phase), CONFIG, "p")
    assert (result is not None) is accounted
    assert ("uid-p" in st.pods) is accounted


def test_apply_pod_is_idempotent_and_releases_on_termination():
    st = state_with(node("a"))
    p = pod("p", gpu=2, node_name="a")
    first = objects.apply_pod(st, p, CONFIG, "prod")
    again = objects.apply_pod(st, p, CONFIG, "prod")
    assert first is again
    assert st.node_free(0)[st.gpu_col] == 2000.0
    p["status"]["phase"] = "Succeeded"
    assert objects.apply_pod(st, p, CONFIG, "prod") is None
    assert st.node_free(0)[st.gpu_col] == 4000.0
    assert objects.delete_pod(st, "uid-p") is None


def test_pod_request_and_tenant_resolution():
    labels = {"lab": {"team": "research"}}
    p = pod("p", ns="lab", gpu=1, annotations={"fairshare.io/gpu-models": "A100|H100"})
    tenant = objects.pod_tenant(p, config=CONFIG, namespace_labels=labels)
    req = objects.pod_request(p, config=CONFIG, tenant=tenant, index=state_with().index)
    assert tenant == "research"
    assert req.uid == "uid-p" and req.gpu_models == frozenset({"A100", "H100"})
    assert req.row[0] == 1000.0  # nvidia.com/gpu is the first column
    # without the webhook's normalising, blanks around the names are still no part of them
    spaced = pod("q", ns="lab", gpu=1, annotations={"fairshare.io/gpu-models": " A100 | H100|"})
    req = objects.pod_request(spaced, config=CONFIG, tenant=tenant, index=state_with().index)
    assert req.gpu_models == frozenset({"A100", "H100"})
    # no list, an empty one or a malformed annotations map: the one shared empty set
    for given in (None, {}, {"fairshare.io/gpu-models": " | "}, ["not", "a", "map"]):
        assert resources.gpu_models(given) is resources.NO_GPU_MODELS


def test_delete_node_drops_its_pods():
    st = state_with(node("a"), node("b"))
    objects.apply_pod(st, pod("p", gpu=1, node_name="a"), CONFIG, "prod")
    assert [p.uid for p in objects.delete_node(st, "a")] == ["uid-p"]
    assert objects.delete_node(st, "a") == []
    assert st.usage_of("prod")[st.gpu_col] == 0.0


# -- List files -------------------------------------------------------------------------


def _list() -> dict[str, Any]:
    # The unannotated pod comes first in the List but must not take device 0,
    # which the annotated pod holds.
    guessed = pod(
        "guess", ns="lab", node_name="a", annotations={"fairshare.io/gpu-fraction": "0.5"}
    )
    pinned = pod("pinned", node_name="a", gpu=1, annotations={ANN_GPU_DEVICES: "0:1000"})
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            guessed,
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": "lab", "labels": {"team": "research"}},
            },
            node("a", gpus=1),
            pinned,
            pod("waiting", ns="lab", gpu=1, phase="Pending"),
            pod("done", gpu=1, node_name="a", phase="Succeeded"),
            pod("bad", node_name="a", annotations={"fairshare.io/gpu-fraction": "2"}),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ignored"}},
        ],
    }


def test_load_state_file_orders_nodes_namespaces_and_annotated_pods_first():
    loaded = objects.load_state_file(_list(), CONFIG)
    st = loaded.state
    assert st.pods["uid-pinned"].devices == ((0, 1000.0),)
    # Only device 0 exists and it is full: the guessed pod gets no device but still counts.
    assert st.pods["uid-guess"].devices == ()
    assert st.pods["uid-guess"].tenant == "research"
    assert [p.uid for p in loaded.pending] == ["uid-waiting"]
    assert loaded.pending[0].tenant == "research"
    assert "uid-done" not in st.pods
    assert len(loaded.skipped) == 1 and "Pod prod/bad" in loaded.skipped[0]
    assert loaded.namespace_labels == {"lab": {"team": "research"}}


@pytest.mark.parametrize("suffix", [".json", ".yaml"], ids=["json", "yaml"])
def test_load_state_file_reads_a_file(tmp_path, suffix):
    import yaml

    path = tmp_path / f"state{suffix}"
    data = _list()
    path.write_text(json.dumps(data) if suffix == ".json" else yaml.safe_dump(data))
    assert set(objects.load_state_file(path, CONFIG).state.pods) == {"uid-pinned", "uid-guess"}


def test_load_state_file_needs_items():
    with pytest.raises(StateError, match="items"):
        objects.load_state_file({"kind": "List"}, CONFIG)
