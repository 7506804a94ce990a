"""What a pod counts, on the real control plane: GPU-memory pods against the GPU quota,
and a config edit that changes the resource columns while pods are being scheduled.

Pods are pinned to the test's own kwok node with a `fairshare-e2e/pool` nodeSelector;
tenants are namespaces labelled `fairshare.io/tenant=<name>`.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    CONFIG_HEAD,
    GPU,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    unique,
    wait_pod,
)
from .test_fairshare_scheduling import POOL, pod_manifest

pytestmark = pytest.mark.e2e

ANN_MEMORY = "fairshare.io/gpu-memory"


def running(pod: client.V1Pod) -> bool:
    return bool(pod.spec.node_name) and pod.status.phase == "Running"


async def test_gpu_memory_pods_count_against_the_gpu_limit(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    """Limit 1 GPU, 8 x 80Gi GPUs: two 40Gi pods run, the third is denied. (The watch
    used to count a running GPU-memory pod as 0 GPUs, so every one was admitted.)"""
    tenant = unique("gpumem")
    config = CONFIG_HEAD + f'tenants:\n- name: {tenant}\n  limit:\n    {GPU}: "1"\n'
    await fairshare.set_config(api, config)
    node = unique("gpumem")
    await make_gpu_node(node, gpus=8, gpu_memory_mib=81920, labels={POOL: node})
    ns = await tenant_namespace(tenant)
    core = client.CoreV1Api(api)
    half = {ANN_MEMORY: "40Gi"}
    for i in range(2):
        # One after another, each running (so watched, its reservation released) before
        # the next is created: what is counted then is what the watch counts.
        await core.create_namespaced_pod(ns, pod_manifest(f"mem-{i}", node, annotations=half))
        await wait_pod(api, ns, f"mem-{i}", running, timeout=60, what="running")
    with pytest.raises(ApiException) as denied:
        await core.create_namespaced_pod(ns, pod_manifest("mem-2", node, annotations=half))
    assert denied.value.status == 403
    message = str(json.loads(denied.value.body)["message"])
    assert f"tenant {tenant} would exceed its {GPU} limit: 1 used + 0.5 requested > 1" in message
    pods = (await core.list_namespaced_pod(ns)).items
    assert sorted(p.metadata.name for p in pods) == ["mem-0", "mem-1"]


async def test_a_config_with_other_resource_columns_is_applied_live(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    """Dropping ephemeral-storage and storage from `resources` while the extender runs:
    GPU pods still schedule through it. (The arrays kept the old columns and every
    filter call failed with a 500, so every pod stayed Pending.)"""
    tenant = unique("columns")
    node = unique("columns")
    await make_gpu_node(node, gpus=2, labels={POOL: node})
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    ns = await tenant_namespace(tenant)
    errors = await asyncio.to_thread(
        fairshare.metric, "extender", "fairshare_unexpected_errors_total"
    )
    slim = (
        CONFIG_HEAD
        + f"resources:\n  {GPU}: {{}}\n  cpu: {{}}\n  memory: {{}}\n"
        + f"tenants:\n- name: {tenant}\n"
    )
    await fairshare.set_config(api, slim)
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(ns, pod_manifest("whole", node, gpus=1))
    await core.create_namespaced_pod(
        ns, pod_manifest("half", node, annotations={"fairshare.io/gpu-fraction": "0.5"})
    )
    for name in ("whole", "half"):
        pod = await wait_pod(api, ns, name, running, timeout=60, what="running")
        # Bound by the extender: its bind writes the device annotation.
        assert pod.spec.node_name == node
        assert (pod.metadata.annotations or {}).get("fairshare.io/gpu-devices")
    after = await asyncio.to_thread(
        fairshare.metric, "extender", "fairshare_unexpected_errors_total"
    )
    assert after == errors
