"""Gangs (pod groups, the coscheduling convention) through the real kube-scheduler.

Two tenants each submit a 3-pod × 2-GPU job at once on two nodes of 4 GPUs. Placed pod
by pod, each job gets 2 of its 3 pods: every GPU held, neither job runs (issue 33). With
the extender's gang plans one job runs whole and the other waits whole, holding nothing,
and runs whole once the first is deleted.

The coscheduling PodGroup CRD (``podgroups.scheduling.x-k8s.io``, ``v1alpha1``) is
installed by the test when the cluster does not serve it, from the manifest fairshare
ships (``manifests/gangs/podgroup-crd.yaml``; ``make dev-up`` installs it too).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
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
    wait_event,
    wait_for,
)

pytestmark = pytest.mark.e2e

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
OPEN = "fairshare-e2e/open"
CRD_NAME = "podgroups.scheduling.x-k8s.io"
PODGROUP_CRD: dict[str, Any] = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "manifests" / "gangs" / "podgroup-crd.yaml").read_text()
)
"""The CRD fairshare ships (``manifests/gangs``, the chart's ``crds/``), as users install it."""


@pytest.fixture(autouse=True)
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender (no plans or pending pods of earlier tests)."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


@pytest.fixture
async def podgroup_crd(api: client.ApiClient) -> None:
    """The coscheduling PodGroup CRD, installed when absent (left for later tests)."""
    ext = client.ApiextensionsV1Api(api)
    try:
        await ext.create_custom_resource_definition(PODGROUP_CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise

    async def established() -> bool:
        crd = await ext.read_custom_resource_definition(CRD_NAME)
        conds = (crd.status.conditions if crd.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    await wait_for(established, timeout=30, what=f"CRD {CRD_NAME} established")


async def create_podgroup(api: client.ApiClient, namespace: str, name: str, min_member: int):
    body = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member, "scheduleTimeoutSeconds": 60},
    }

    async def created() -> bool:  # the API may take a moment to serve a new CRD's kind
        try:
            await client.CustomObjectsApi(api).create_namespaced_custom_object(
                "scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups", body
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    await wait_for(created, timeout=30, what=f"PodGroup {namespace}/{name}")


def member(name: str, group: str, pool: str, gpus: int = 2) -> dict[str, Any]:
    limits = {"cpu": "100m", "memory": "128Mi", GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {GROUP_LABEL: group}},
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": {POOL: pool, OPEN: "yes"},
            "terminationGracePeriodSeconds": 0,
        },
    }


async def bound_names(api: client.ApiClient, namespace: str) -> set[str]:
    pods = (await client.CoreV1Api(api).list_namespaced_pod(namespace)).items
    return {p.metadata.name for p in pods if p.spec.node_name}


async def nodes_with_pool(make_gpu_node: MakeNode, pool: str) -> list[str]:
    names = [unique("gang") for _ in range(2)]
    for n in names:
        await make_gpu_node(n, gpus=4, cpu="16", memory="64Gi", labels={POOL: pool})
    return names


async def open_nodes(api: client.ApiClient, nodes: list[str]) -> None:
    core = client.CoreV1Api(api)
    for n in nodes:
        await core.patch_node(n, {"metadata": {"labels": {OPEN: "yes"}}})


async def extender_sees(fairshare: FairshareDev, names: set[str]) -> None:
    async def seen() -> bool:
        status = await asyncio.to_thread(fairshare.extender_status)
        return names <= {p["pod"] for p in status["pendingPods"] + status["heldPods"]}

    await wait_for(seen, timeout=60, what=f"the extender to see {sorted(names)}")


async def sample_counts(
    api: client.ApiClient, namespaces: dict[str, str], seconds: float
) -> list[dict[str, int]]:
    """Bound pods per tenant, sampled every 0.5 s for ``seconds``."""
    out = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        out.append({t: len(await bound_names(api, ns)) for t, ns in namespaces.items()})
        await asyncio.sleep(0.5)
    return out


async def test_two_tenants_gangs_never_end_partly_bound(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
    podgroup_crd: None,
):
    a, b = unique("ga"), unique("gb")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {a}\n- name: {b}\n")
    namespaces = {t: await tenant_namespace(t) for t in (a, b)}
    pool = unique("gangpool")
    nodes = await nodes_with_pool(make_gpu_node, pool)
    for t, ns in namespaces.items():
        await create_podgroup(api, ns, f"job-{t}", 3)
    # Interleaved: a-0, b-0, a-1, b-1, a-2, b-2, all waiting for the nodes to open, so
    # kube-scheduler takes them in that order once they do (the reproduction).
    core = client.CoreV1Api(api)
    for i in range(3):
        for t, ns in namespaces.items():
            await core.create_namespaced_pod(ns, member(f"{t}-{i}", f"job-{t}", pool))
    await extender_sees(
        fairshare, {f"{ns}/{t}-{i}" for t, ns in namespaces.items() for i in range(3)}
    )
    await asyncio.sleep(0.5)
    await open_nodes(api, nodes)

    last: dict[str, int] = {}

    async def one_runs() -> bool:
        last.update({t: len(await bound_names(api, ns)) for t, ns in namespaces.items()})
        return 3 in last.values()

    try:
        await wait_for(one_runs, timeout=60, what="one job bound whole")
    except AssertionError:
        raise AssertionError(f"no job bound whole in 60 s; bound pods per tenant: {last}") from None
    samples = await sample_counts(api, namespaces, 8)
    assert all(sorted(s.values()) == [0, 3] for s in samples), samples
    first = next(t for t, n in samples[-1].items() if n == 3)
    second = b if first == a else a
    # the waiting job was told why, as a whole group
    await wait_event(
        api,
        namespaces[second],
        involved_name=f"{second}-0",
        reason="FailedScheduling",
        contains=f"gang {namespaces[second]}/job-{second} (3 × {GPU} 2",
    )

    # The running job ends: the waiting one runs whole.
    await core.delete_collection_namespaced_pod(namespaces[first], grace_period_seconds=0)

    async def second_runs() -> bool:
        return len(await bound_names(api, namespaces[second])) == 3

    await wait_for(second_runs, timeout=90, what=f"job of {second} bound whole")
    names = await bound_names(api, namespaces[second])
    assert names == {f"{second}-{i}" for i in range(3)}


async def test_a_gang_short_of_min_member_holds_nothing(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
    podgroup_crd: None,
):
    t = unique("gs")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {t}\n")
    ns = await tenant_namespace(t)
    pool = unique("gangpool")
    nodes = await nodes_with_pool(make_gpu_node, pool)
    await create_podgroup(api, ns, "job", 3)
    core = client.CoreV1Api(api)
    for i in range(2):  # 2 of its 3 members
        await core.create_namespaced_pod(ns, member(f"m-{i}", "job", pool))
    await extender_sees(fairshare, {f"{ns}/m-{i}" for i in range(2)})
    await open_nodes(api, nodes)
    await wait_event(
        api,
        ns,
        involved_name="m-0",
        reason="FailedScheduling",
        contains=f"gang {ns}/job has 2 of its 3 members",
    )
    samples = await sample_counts(api, {t: ns}, 5)
    assert all(s[t] == 0 for s in samples), samples
    # nothing is held: a pod wanting every GPU of one node binds
    whole = member("whole", "", pool, gpus=4)
    del whole["metadata"]["labels"]
    await core.create_namespaced_pod(ns, whole)

    async def whole_bound() -> bool:
        return "whole" in await bound_names(api, ns)

    await wait_for(whole_bound, timeout=30, what="a 4-GPU pod beside the short gang")
    await core.delete_namespaced_pod("whole", ns, grace_period_seconds=0)

    async def whole_gone() -> bool:
        pods = (await core.list_namespaced_pod(ns)).items
        return "whole" not in {p.metadata.name for p in pods}

    await wait_for(whole_gone, timeout=30, what="the 4-GPU pod gone")
    # the third member arrives: the gang runs whole
    await core.create_namespaced_pod(ns, member("m-2", "job", pool))

    async def gang_bound() -> bool:
        return {f"m-{i}" for i in range(3)} <= await bound_names(api, ns)

    await wait_for(gang_bound, timeout=60, what="the completed gang bound whole")
