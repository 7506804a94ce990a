"""Gangs through Kubernetes' native pod groups (v1.36 alpha) and the real kube-scheduler.

The control plane runs with ``GenericWorkload`` and ``GangScheduling`` on and serves
``scheduling.k8s.io/v1alpha2`` (tools/e2e/cluster.py). A member names its group with the
immutable ``spec.schedulingGroup.podGroupName``; the ``PodGroup`` holds
``spec.schedulingPolicy.gang.minCount``. kube-scheduler's GangScheduling plugin waits for
``minCount`` members, then its pod-group cycle calls the extender once per member with
tentative placements it never reports; fairshare plans the whole group at the first
member's filter and answers each member with its planned node.

Two tenants each submit a 3-pod x 2-GPU job at once on two nodes of 4 GPUs: one job runs
whole, the other waits whole, holding nothing, and runs whole once the first is deleted.
With fairshare blind to the native group (its members judged one by one, as before
this test), no group was bound whole within 90 s.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    CONFIG_HEAD,
    GPU,
    PAUSE_IMAGE,
    POOL,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    unique,
    wait_for,
)
from .test_gangs import (
    OPEN,
    bound_names,
    extender_sees,
    fairshare,
    nodes_with_pool,
    open_nodes,
    sample_counts,
)

pytestmark = pytest.mark.e2e

__all__ = ["fairshare"]  # the autouse fixture of test_gangs, used here too


async def create_native_podgroup(
    api: client.ApiClient, namespace: str, name: str, min_count: int
) -> None:
    body = {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }
    try:
        await client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduling.k8s.io", "v1alpha2", namespace, "podgroups", body
        )
    except ApiException as exc:
        raise AssertionError(f"native PodGroup not created: {exc.status} {exc.body}") from None


def native_member(name: str, group: str, pool: str, gpus: int = 2) -> dict[str, Any]:
    limits = {"cpu": "100m", "memory": "128Mi", GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": {POOL: pool, OPEN: "yes"},
            "terminationGracePeriodSeconds": 0,
        },
    }


async def test_native_pod_groups_of_two_tenants_never_end_partly_bound(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    a, b = unique("na"), unique("nb")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {a}\n- name: {b}\n")
    namespaces = {t: await tenant_namespace(t) for t in (a, b)}
    pool = unique("nativepool")
    nodes = await nodes_with_pool(make_gpu_node, pool)
    for t, ns in namespaces.items():
        await create_native_podgroup(api, ns, f"job-{t}", 3)
    core = client.CoreV1Api(api)
    for i in range(3):
        for t, ns in namespaces.items():
            await core.create_namespaced_pod(ns, native_member(f"{t}-{i}", f"job-{t}", pool))
    # The pods read back with their group (the API serves the field with the gate on).
    pod = await core.read_namespaced_pod(f"{a}-0", namespaces[a], _preload_content=False)
    assert b'"podGroupName"' in await pod.read()
    await extender_sees(
        fairshare, {f"{ns}/{t}-{i}" for t, ns in namespaces.items() for i in range(3)}
    )
    await open_nodes(api, nodes)

    last: dict[str, int] = {}

    async def one_runs() -> bool:
        last.update({t: len(await bound_names(api, ns)) for t, ns in namespaces.items()})
        return 3 in last.values()

    try:
        await wait_for(one_runs, timeout=90, what="one native group bound whole")
    except AssertionError:
        raise AssertionError(f"no group bound whole in 90 s; bound per tenant: {last}") from None
    samples = await sample_counts(api, namespaces, 8)
    assert all(sorted(s.values()) == [0, 3] for s in samples), samples
    first = next(t for t, n in samples[-1].items() if n == 3)
    second = b if first == a else a
    status = fairshare.extender_status()
    assert any(p["pod"].startswith(f"{namespaces[second]}/") for p in status["pendingPods"]), (
        status["pendingPods"]
    )

    await core.delete_collection_namespaced_pod(namespaces[first], grace_period_seconds=0)

    async def second_runs() -> bool:
        return len(await bound_names(api, namespaces[second])) == 3

    await wait_for(second_runs, timeout=120, what=f"native group of {second} bound whole")
