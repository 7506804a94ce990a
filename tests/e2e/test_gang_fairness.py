"""The fair-share gate with pod groups on a full cluster, through the real kube-scheduler.

Three tenants of weights 1:1:2 each submit more 2-pod × 2-GPU groups than the cluster
holds (four nodes of 4 GPUs: 16 GPUs, four groups). The gate weighs each group's whole
demand and holds a tenant past its fair share while another tenant's waiting group fits
whole (``fairshare.gangs.waiting``), so the cluster ends split 4 : 4 : 8 GPUs, in whole
groups, with no group partly bound. And a waiting group that can never run whole holds
no other tenant back, though one of its members alone would fit.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client

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
ANN_MIN_MEMBERS = "fairshare.io/gang-min-members"
OPEN = "fairshare-e2e/open"
GROUPS_EACH = 4
"""Groups per tenant: 4 × 4 GPUs each, three tenants: 48 GPUs asked of 16."""


@pytest.fixture(autouse=True)
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender (no plans or pending pods of earlier tests)."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


def member(name: str, group: str, pool: str, size: int = 2) -> dict[str, Any]:
    limits = {"cpu": "100m", "memory": "128Mi", GPU: "2"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {GROUP_LABEL: group},
            "annotations": {ANN_MIN_MEMBERS: str(size)},
        },
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": {POOL: pool, OPEN: "yes"},
            "terminationGracePeriodSeconds": 0,
        },
    }


async def bound_by_group(api: client.ApiClient, namespace: str) -> dict[str, int]:
    """Bound members per group label."""
    pods = (await client.CoreV1Api(api).list_namespaced_pod(namespace)).items
    out: dict[str, int] = {}
    for p in pods:
        group = (p.metadata.labels or {}).get(GROUP_LABEL, "")
        out.setdefault(group, 0)
        if p.spec.node_name:
            out[group] += 1
    return out


async def test_gangs_of_weights_1_1_2_end_at_the_weighted_split_in_whole_gangs(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    a, b, c = unique("gfa"), unique("gfb"), unique("gfc")
    weights = {a: 1, b: 1, c: 2}
    await fairshare.set_config(
        api,
        CONFIG_HEAD
        + "tenants:\n"
        + "".join(f"- {{name: {t}, weight: {w}}}\n" for t, w in weights.items()),
    )
    namespaces = {t: await tenant_namespace(t) for t in weights}
    pool = unique("gfpool")
    nodes = [unique("gf") for _ in range(4)]
    for n in nodes:
        await make_gpu_node(n, gpus=4, cpu="16", memory="64Gi", labels={POOL: pool})
    core = client.CoreV1Api(api)
    # Every tenant's groups wait for the nodes to open, the members interleaved across
    # tenants, so kube-scheduler meets them all at once.
    for g in range(GROUPS_EACH):
        for i in range(2):
            for ns in namespaces.values():
                await core.create_namespaced_pod(ns, member(f"j{g}-{i}", f"j{g}", pool))

    async def extender_sees() -> bool:
        status = await asyncio.to_thread(fairshare.extender_status)
        seen = {p["pod"] for p in status["pendingPods"] + status["heldPods"]}
        return len([p for p in seen if p.split("/")[0] in namespaces.values()]) == 24

    await wait_for(extender_sees, timeout=60, what="the extender to see the 24 members")
    for n in nodes:
        await core.patch_node(n, {"metadata": {"labels": {OPEN: "yes"}}})

    last: dict[str, dict[str, int]] = {}

    async def full() -> bool:
        for t, ns in namespaces.items():
            last[t] = await bound_by_group(api, ns)
        return sum(sum(g.values()) for g in last.values()) == 8  # 16 GPUs, 2 each

    try:
        await wait_for(full, timeout=120, what="the 16 GPUs taken")
    except AssertionError:
        raise AssertionError(f"the cluster never filled; bound members: {last}") from None
    # Settled: sampled for a while, the split and the whole groups hold.
    loop = asyncio.get_running_loop()
    end = loop.time() + 10
    while loop.time() < end:
        for t, ns in namespaces.items():
            last[t] = await bound_by_group(api, ns)
        gpus = {t: 2 * sum(g.values()) for t, g in last.items()}
        assert gpus == {a: 4, b: 4, c: 8}, last
        partial = {t: [g for g, n in gs.items() if n not in (0, 2)] for t, gs in last.items()}
        assert not any(partial.values()), f"groups partly bound: {partial}"
        await asyncio.sleep(1)


def lone(name: str, gpus: int, pool: str) -> dict[str, Any]:
    pod = member(name, "", pool)
    del pod["metadata"]["labels"], pod["metadata"]["annotations"]
    pod["spec"]["containers"][0]["resources"]["limits"][GPU] = str(gpus)
    return pod


async def test_a_group_that_can_never_run_whole_holds_no_tenant_back(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    """a runs 6 of 8 GPUs, above its fair share; b waits with a group of five 2-GPU
    members, 10 GPUs, more than the nodes have. One member alone would fit the 2 free
    GPUs, but the group never can: a's next pod runs."""
    a, b = unique("gna"), unique("gnb")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {a}\n- name: {b}\n")
    ns = {t: await tenant_namespace(t) for t in (a, b)}
    pool = unique("gnpool")
    for n in (unique("gn"), unique("gn")):
        await make_gpu_node(n, gpus=4, cpu="16", memory="64Gi", labels={POOL: pool, OPEN: "yes"})
    core = client.CoreV1Api(api)
    for name, gpus in (("big", 4), ("mid", 2)):
        await core.create_namespaced_pod(ns[a], lone(name, gpus, pool))

    async def a_runs_six() -> bool:
        pods = (await core.list_namespaced_pod(ns[a])).items
        return sum(1 for p in pods if p.spec.node_name) == 2

    await wait_for(a_runs_six, timeout=60, what="a's 6 GPUs bound")
    for i in range(5):
        await core.create_namespaced_pod(ns[b], member(f"huge-{i}", "huge", pool, size=5))
    await wait_event(
        api,
        ns[b],
        involved_name="huge-0",
        reason="FailedScheduling",
        contains=f"gang {ns[b]}/huge",
    )
    await core.create_namespaced_pod(ns[a], lone("next", 1, pool))

    async def next_bound() -> bool:
        pod = await core.read_namespaced_pod("next", ns[a])
        return bool(pod.spec.node_name)

    try:
        await wait_for(next_bound, timeout=45, what="a's next pod bound beside b's group")
    except AssertionError:
        events = await core.list_namespaced_event(ns[a], field_selector="involvedObject.name=next")
        status = await asyncio.to_thread(fairshare.extender_status)
        raise AssertionError(
            f"a's next pod not bound: {[e.message for e in events.items]}; "
            f"extender: {status.get('heldPods')} {status.get('gangs')}"
        ) from None
