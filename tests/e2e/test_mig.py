"""MIG on the real control plane: a node with mixed-strategy slices takes MIG pods.

The node offers what the NVIDIA device plugin offers with the `mixed` strategy:
`nvidia.com/mig-1g.10gb: "7"` in allocatable and no `nvidia.com/gpu`. Pods asking for
`nvidia.com/mig-1g.10gb: 1` go through the extender's filter and bind (every pod does,
see tools/e2e/dev.py) and must be bound, seven of them; the eighth is refused with the
profile named.

kube-scheduler refuses the eighth itself (its NodeResourcesFit counts the slices) and then
does not call the extender (no node left to filter), so its FailedScheduling event says
nothing about fairshare. fairshare's own refusal is read where it is given: the
extender's filter answer for that pod on the node, and its /status.json view of the
pending pod, both ``Insufficient nvidia.com/mig-1g.10gb (free 0, requested 1)`` from
fairshare's ledger of the slices the seven hold.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client

from .conftest import (
    CONFIG_HEAD,
    PAUSE_IMAGE,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    gpu_pod_manifest,
    unique,
    wait_event,
    wait_for,
    wait_pod,
)
from .test_fairshare_scheduling import ANN_DEVICES, POOL, bound, create_pods
from .test_pick_in_filter import post_extender

pytestmark = pytest.mark.e2e

MIG = "nvidia.com/mig-1g.10gb"


@pytest.fixture(autouse=True)
async def fresh_extender(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender: no pending pods of earlier tests in its queue."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


def mig_pod(name: str, pool: str) -> dict[str, Any]:
    limits = {"cpu": "100m", "memory": "128Mi", MIG: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": {POOL: pool},
            "terminationGracePeriodSeconds": 0,
        },
    }


async def test_mixed_strategy_mig_pods_are_placed_and_the_eighth_is_refused(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    tenant = unique("mig")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    node = unique("mig")
    await make_gpu_node(
        node,
        gpus=0,
        labels={POOL: node, "nvidia.com/mig.strategy": "mixed"},
        extra_resources={MIG: "7"},
    )
    allocatable = (await client.CoreV1Api(api).read_node(node)).status.allocatable
    assert allocatable.get(MIG) == "7" and "nvidia.com/gpu" not in allocatable
    ns = await tenant_namespace(tenant)

    await create_pods(api, ns, [mig_pod(f"slice-{i}", node) for i in range(7)])

    async def seven_bound() -> list[client.V1Pod] | None:
        pods = await bound(api, ns)
        return pods if len(pods) == 7 else None

    try:
        pods = await wait_for(seven_bound, timeout=60, what="7 MIG pods bound")
    except AssertionError:
        events = await client.CoreV1Api(api).list_namespaced_event(
            ns, field_selector="reason=FailedScheduling"
        )
        reasons = sorted({e.message for e in events.items})
        raise AssertionError(
            f"{len(await bound(api, ns))} of 7 MIG pods bound; FailedScheduling: {reasons}"
        ) from None
    assert {p.spec.node_name for p in pods} == {node}
    # Slices are no devices of fairshare's ledger: the device plugin picks the slice.
    assert all(ANN_DEVICES not in (p.metadata.annotations or {}) for p in pods)

    await create_pods(api, ns, [mig_pod("slice-7", node)])
    event = await wait_event(
        api, ns, involved_name="slice-7", reason="FailedScheduling", contains=MIG
    )
    assert f"Insufficient {MIG}" in event.message  # kube-scheduler's own words
    full = f"Insufficient {MIG} (free 0, requested 1)"  # fairshare's
    assert full not in event.message, event.message

    # fairshare's view of the pending eighth pod: no slice left on the node.
    pending = f"{ns}/slice-7"

    async def listed() -> dict[str, Any] | None:
        status = await asyncio.to_thread(fairshare.extender_status)
        return next((p for p in status["pendingPods"] if p["pod"] == pending), None)

    entry = await wait_for(listed, timeout=30, what=f"the extender to list {pending}")
    assert (entry["fitsNodes"], entry["reason"]) == (0, f"{node}: {full}"), entry
    # What the extender answers kube-scheduler's filter for that pod on that node.
    eighth = await client.CoreV1Api(api).read_namespaced_pod("slice-7", ns)
    assert eighth.spec.node_name is None
    answer = await post_extender(
        fairshare, "/filter", {"Pod": api.sanitize_for_serialization(eighth), "NodeNames": [node]}
    )
    refused = (answer.get("FailedNodes") or {}) | (answer.get("FailedAndUnresolvableNodes") or {})
    assert not answer.get("NodeNames") and refused == {node: full}, answer
    assert len(await bound(api, ns)) == 7


async def test_single_strategy_slices_take_whole_gpu_pods_but_no_shared_ones(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    """`single` strategy: 7 `nvidia.com/gpu` that are 1g.5gb slices (the product label
    says so). A pod asking for one GPU gets a slice; a shared-GPU pod (a fraction) must
    not be put on a slice as if it were a device."""
    tenant = unique("migs")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    node = unique("migs")
    await make_gpu_node(
        node,
        gpus=7,
        labels={POOL: node, "nvidia.com/mig.strategy": "single"},
        gpu_product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
    )
    ns = await tenant_namespace(tenant)
    whole = gpu_pod_manifest("whole", 1)
    shared = gpu_pod_manifest("shared", 0, annotations={"fairshare.io/gpu-fraction": "0.5"})
    for pod in (whole, shared):
        pod["spec"]["nodeSelector"] = {POOL: node}
        pod["spec"]["terminationGracePeriodSeconds"] = 0
    await create_pods(api, ns, [whole, shared])

    placed = await wait_pod(api, ns, "whole", lambda p: bool(p.spec.node_name), what="bound")
    assert placed.spec.node_name == node
    assert ANN_DEVICES not in (placed.metadata.annotations or {})
    event = await wait_event(
        api, ns, involved_name="shared", reason="FailedScheduling", contains="MIG slices"
    )
    assert "no GPU devices (only MIG slices)" in event.message
    still = await client.CoreV1Api(api).read_namespaced_pod("shared", ns)
    assert still.spec.node_name is None
