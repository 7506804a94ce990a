"""The extender reads each pod version once: a watch event that changes nothing the
tracker looks at (a status update, Pending -> Running) is not parsed again, and filter
and prioritize of one scheduling attempt share one reading of the pod they are sent.
The state after every event must be what a full re-read gives."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fairshare import resources
from fairshare.config.loading import config_from_mapping
from fairshare.state import objects
from tests.builders import make_pod
from tests.extender_side import Side
from tests.unit.test_state_objects import node

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "prod", "namespaces": ["prod"]},
            {"name": "dev", "namespaceSelector": {"team": "dev"}},
        ],
    }
)


def gpu_pod(name: str, *, gpus: int = 1, node_name: str | None = None) -> dict[str, Any]:
    obj = make_pod(name).ns("prod").req(gpu=gpus, cpu="1").obj()
    obj["metadata"]["uid"] = f"uid-{name}"
    obj["metadata"]["resourceVersion"] = "1"
    if node_name:
        obj["spec"]["nodeName"] = node_name
    obj["status"] = {"phase": "Pending"}
    return obj


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The uid of every pod ``objects.pod_request`` parses."""
    seen: list[str] = []
    real = objects.pod_request

    def counting(pod: Any, **kw: Any) -> Any:
        seen.append(objects.pod_uid(pod))
        return real(pod, **kw)

    monkeypatch.setattr(objects, "pod_request", counting)
    return seen


def tracker() -> Side:
    t = Side(lambda: CONFIG)
    t.on_resync("Node", [node("n1"), node("n2")])
    t.on_resync("Namespace", [{"metadata": {"name": "prod"}}])
    return t


def snapshot(t: Side) -> Any:
    held = {u: (p.node, p.row, p.devices, p.tenant) for u, p in t.state.pods.items()}
    return held, dict(t.pending), t.state.total_free(), dict(t.unreadable)


def test_status_updates_are_not_parsed_again(reads: list[str]) -> None:
    t = tracker()
    pod = gpu_pod("a")
    t.on_event("Pod", "ADDED", pod)
    assert reads == ["uid-a"] and "uid-a" in t.pending
    running = copy.deepcopy(pod)
    running["status"] = {"phase": "Running", "conditions": [{"type": "Ready"}]}
    running["metadata"]["resourceVersion"] = "2"
    t.on_event("Pod", "MODIFIED", running)
    assert reads == ["uid-a"]  # nothing the tracker reads changed
    assert t.pods["uid-a"]["status"]["phase"] == "Running"  # the stored pod is the new one


def test_a_bound_pod_is_parsed_once_and_then_left(reads: list[str]) -> None:
    t = tracker()
    t.on_event("Pod", "ADDED", gpu_pod("a"))
    bound = gpu_pod("a", gpus=2, node_name="n1")
    t.on_event("Pod", "MODIFIED", bound)
    # Read again (nodeName changed), once: apply_pod takes the tracker's reading.
    assert reads == ["uid-a", "uid-a"]
    assert t.state.pods["uid-a"].node == "n1" and "uid-a" not in t.pending
    before = snapshot(t)
    running = copy.deepcopy(bound)
    running["status"] = {"phase": "Running", "podIP": "10.0.0.1"}
    t.on_event("Pod", "MODIFIED", running)
    assert reads == ["uid-a", "uid-a"]
    assert snapshot(t) == before


def test_skipping_leaves_the_state_a_full_read_gives() -> None:
    events = [
        ("ADDED", gpu_pod("a")),
        ("MODIFIED", gpu_pod("a", node_name="n1")),
        ("MODIFIED", {**gpu_pod("a", node_name="n1"), "status": {"phase": "Running"}}),
        ("ADDED", gpu_pod("b", gpus=3)),
        ("MODIFIED", {**gpu_pod("b", gpus=3), "status": {"phase": "Pending", "x": 1}}),
    ]
    fast = tracker()
    for kind, pod in events:
        fast.on_event("Pod", kind, copy.deepcopy(pod))
    full = tracker()
    full.on_resync("Pod", [copy.deepcopy(p) for _, p in events[2:]])
    assert snapshot(fast) == snapshot(full)


def test_changes_that_matter_are_read(reads: list[str]) -> None:
    t = tracker()
    t.on_event("Pod", "ADDED", gpu_pod("a"))
    more = gpu_pod("a", gpus=3)  # a resize: the spec changed
    t.on_event("Pod", "MODIFIED", more)
    assert len(reads) == 2
    assert t.pending["uid-a"].demand.gpu.count == 3
    annotated = copy.deepcopy(more)
    annotated["metadata"]["annotations"] = {resources.ANN_GPU_MODELS: "A100"}
    t.on_event("Pod", "MODIFIED", annotated)
    assert len(reads) == 3 and t.pending["uid-a"].gpu_models == frozenset({"A100"})


def test_a_node_arriving_reads_its_waiting_pods() -> None:
    t = tracker()
    pod = gpu_pod("a", node_name="n3")  # its node is not known yet
    t.on_event("Pod", "ADDED", pod)
    t.on_event("Pod", "MODIFIED", {**pod, "status": {"phase": "Running"}})
    assert "uid-a" not in t.state.pods
    t.on_event("Node", "ADDED", node("n3"))
    assert t.state.pods["uid-a"].node == "n3"


def test_a_pod_left_unaccounted_is_read_again(reads: list[str]) -> None:
    t = tracker()
    bound = gpu_pod("a", node_name="n1")
    t.on_event("Pod", "ADDED", bound)
    t.state.unbind("uid-a")  # e.g. a failed bind un-assumed it
    t.on_event("Pod", "MODIFIED", {**bound, "status": {"phase": "Running"}})
    assert t.state.pods["uid-a"].node == "n1" and len(reads) == 2


def test_namespace_labels_still_move_a_pod_to_its_tenant() -> None:
    t = tracker()
    pod = make_pod("a").ns("team-x").req(gpu=1).obj()
    pod["metadata"]["uid"] = "uid-a"
    t.on_event("Pod", "ADDED", pod)
    assert t.pending["uid-a"].tenant == "default"
    t.on_event("Namespace", "MODIFIED", {"metadata": {"name": "team-x", "labels": {"team": "dev"}}})
    assert t.pending["uid-a"].tenant == "dev"
    t.on_event("Pod", "MODIFIED", {**pod, "status": {"phase": "Pending"}})
    assert t.pending["uid-a"].tenant == "dev"


def test_scheduler_calls_share_one_reading_per_pod_version(reads: list[str]) -> None:
    t = tracker()
    pod = gpu_pod("a")
    first = t.request(pod, CONFIG)
    assert t.request(copy.deepcopy(pod), CONFIG) is first  # prioritize after filter
    assert reads == ["uid-a"]
    newer = copy.deepcopy(pod)
    newer["metadata"]["resourceVersion"] = "7"
    newer["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "2"
    assert t.request(newer, CONFIG).demand.gpu.count == 2
    assert len(reads) == 2


def test_scheduler_calls_reuse_the_watch_reading_of_that_version(reads: list[str]) -> None:
    t = tracker()
    pod = gpu_pod("a")
    t.on_event("Pod", "ADDED", copy.deepcopy(pod))  # watch events carry the whole pod
    assert reads == ["uid-a"]
    sent = copy.deepcopy(pod)  # what kube-scheduler sends for the same version
    assert t.request(sent, CONFIG) is t.pending["uid-a"]  # filter: no second reading
    assert t.request(sent, CONFIG) is t.pending["uid-a"]  # prioritize
    assert reads == ["uid-a"]
    newer = copy.deepcopy(pod)
    newer["metadata"]["resourceVersion"] = "2"
    t.request(newer, CONFIG)
    assert reads == ["uid-a", "uid-a"]
    t.remember(gpu_pod("b"))  # a pod seen first in a scheduler call: read once, for both
    assert t.request(gpu_pod("b"), CONFIG) is t.pending["uid-b"]
    assert reads.count("uid-b") == 1


def test_scheduler_call_readings_follow_tenant_and_config(reads: list[str]) -> None:
    t = tracker()
    pod = make_pod("a").ns("team-x").req(gpu=1).obj()
    pod["metadata"].update(uid="uid-a", resourceVersion="3")
    assert t.request(pod, CONFIG).tenant == "default"
    t.on_event("Namespace", "ADDED", {"metadata": {"name": "team-x", "labels": {"team": "dev"}}})
    assert t.request(pod, CONFIG).tenant == "dev"  # same version, new tenant: read again
    other = config_from_mapping(CONFIG.model_dump(mode="json", by_alias=True, exclude_none=True))
    t.request(pod, other)
    assert len(reads) == 3


def test_unversioned_or_unreadable_pods_are_not_remembered(reads: list[str]) -> None:
    t = tracker()
    pod = gpu_pod("a")
    del pod["metadata"]["resourceVersion"]
    t.request(pod, CONFIG)
    t.request(pod, CONFIG)
    assert len(reads) == 2
    bad = gpu_pod("b")
    bad["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "lots"
    for _ in range(2):
        with pytest.raises(resources.DemandError):
            t.request(bad, CONFIG)
    assert reads.count("uid-b") == 2


def test_apply_pod_with_the_request_given_is_the_same() -> None:
    a, b = tracker(), tracker()
    pod = gpu_pod("a", gpus=2, node_name="n2")
    req = objects.pod_request(pod, config=CONFIG, tenant="prod", index=a.state.index)
    got = objects.apply_pod(a.state, pod, CONFIG, "prod", request=req)
    want = objects.apply_pod(b.state, pod, CONFIG, "prod")
    assert got is not None and want is not None
    assert (got.node, got.row, got.devices, got.tenant) == (
        want.node,
        want.row,
        want.devices,
        want.tenant,
    )
