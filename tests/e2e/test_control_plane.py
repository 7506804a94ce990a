"""The local control plane itself: real kube-apiserver, kube-scheduler,
kube-controller-manager and kwok doing their jobs, before any fairshare component is added."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json

import pytest
from kubernetes_asyncio import client

from .conftest import (
    GPU,
    Cluster,
    MakeNode,
    condition,
    gpu_pod_manifest,
    unique,
    wait_event,
    wait_for,
    wait_pod,
    wait_pod_gone,
    wait_pod_phase,
)

pytestmark = pytest.mark.e2e


async def test_apiserver_reports_the_pinned_version(cluster: Cluster, api: client.ApiClient):
    info = await client.VersionApi(api).get_code()
    if cluster.managed:
        assert cluster.kube_version, "tools/e2e/versions.env has no KUBE_VERSION"
        assert info.git_version == cluster.kube_version
        client_version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
        assert client_version["clientVersion"]["gitVersion"] == cluster.kube_version
        assert client_version["serverVersion"]["gitVersion"] == cluster.kube_version
    else:
        assert info.major == "1"


async def test_kwok_gpu_node_becomes_ready(api: client.ApiClient, make_gpu_node: MakeNode):
    name = unique("gpu-ready")
    node = await make_gpu_node(
        name, gpus=8, conditions=[{"type": "GpuUnhealthy", "status": "False", "reason": "Ok"}]
    )

    assert node.status.allocatable[GPU] == "8"
    assert node.status.capacity[GPU] == "8"
    assert node.status.allocatable["cpu"] == "64"
    assert node.status.allocatable["memory"] == "512Gi"
    labels = node.metadata.labels
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.memory"] == "81920"
    ready = condition(node, "Ready")
    assert ready.status == "True" and ready.reason == "KubeletReady"  # written by kwok
    assert node.status.node_info.kubelet_version.startswith("kwok-")
    # kwok keeps conditions it does not own, and it holds the node's Lease.
    assert condition(node, "GpuUnhealthy").status == "False"
    lease = await client.CoordinationV1Api(api).read_namespaced_lease(name, "kube-node-lease")
    assert lease.spec.holder_identity
    age = dt.datetime.now(dt.UTC) - lease.spec.renew_time
    assert age < dt.timedelta(seconds=40)


async def test_one_gpu_pod_is_bound_by_kube_scheduler_and_runs(
    api: client.ApiClient, namespace: str, make_gpu_node: MakeNode
):
    node = unique("gpu-bind")
    await make_gpu_node(node, gpus=8)
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(namespace, gpu_pod_manifest("one-gpu", 1, node=node))

    pod = await wait_pod_phase(api, namespace, "one-gpu", "Running")
    assert pod.spec.node_name == node
    assert condition(pod, "PodScheduled").status == "True"
    assert condition(pod, "Ready").status == "True"
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network("10.244.0.0/16")
    scheduled = await wait_event(api, namespace, involved_name="one-gpu", reason="Scheduled")
    assert f"Successfully assigned {namespace}/one-gpu to {node}" in scheduled.message
    assert "default-scheduler" in (scheduled.reporting_component, scheduled.source.component)

    # No kubelet: kwok finishes the graceful deletion.
    await core.delete_namespaced_pod("one-gpu", namespace)
    await wait_pod_gone(api, namespace, "one-gpu")


async def test_pod_asking_for_more_gpus_than_any_node_has_stays_pending(
    api: client.ApiClient, namespace: str, make_gpu_node: MakeNode
):
    node = unique("gpu-full")
    await make_gpu_node(node, gpus=8)
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(namespace, gpu_pod_manifest("nine-gpus", 9, node=node))

    event = await wait_event(
        api,
        namespace,
        involved_name="nine-gpus",
        reason="FailedScheduling",
        contains=f"Insufficient {GPU}",
    )
    assert event.type == "Warning"
    pod = await wait_pod(
        api,
        namespace,
        "nine-gpus",
        lambda p: (c := condition(p, "PodScheduled")) is not None and c.status == "False",
        what="PodScheduled=False",
    )
    assert condition(pod, "PodScheduled").reason == "Unschedulable"
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


async def test_job_pods_run_to_completion(
    api: client.ApiClient, namespace: str, make_gpu_node: MakeNode
):
    node = unique("gpu-job")
    await make_gpu_node(node, gpus=8)
    pod = gpu_pod_manifest("worker", 2, node=node)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {"metadata": {}, "spec": pod["spec"] | {"restartPolicy": "Never"}},
        },
    }
    batch = client.BatchV1Api(api)
    await batch.create_namespaced_job(namespace, job)

    async def complete() -> client.V1Job | None:
        current = await batch.read_namespaced_job_status("train", namespace)
        return current if condition(current, "Complete") else None

    done = await wait_for(complete, timeout=60, what=f"job {namespace}/train Complete")
    assert done.status.succeeded == 2
    pods = await client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector="batch.kubernetes.io/job-name=train"
    )
    assert {p.status.phase for p in pods.items} == {"Succeeded"}
    assert {p.spec.node_name for p in pods.items} == {node}
