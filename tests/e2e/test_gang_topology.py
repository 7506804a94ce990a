"""A gang with a topology key lands in one domain of that node label (the real
kube-scheduler and kwok nodes).

Two racks (node label ``topology.kubernetes.io/rack``) of two 4-GPU nodes each. Rack r2
already holds two 2-GPU pods, one per node, so it has 4 GPUs free and rack r1 has 8. A
3 × 2-GPU group whose members carry ``fairshare.io/gang-topology-key`` (the coscheduling
convention: the pods' label and ``fairshare.io/gang-min-members``) is placed on rack r1
whole. Placed member by member with the fewest free GPUs first, as fairshare places a
group without a key, it would take the two free halves of r2 and one node of r1, so with
the key disregarded the members end up in both racks.

A 3 × 3-GPU group with the key fits no rack (each has 8 GPUs, it needs 9): it waits, and
kube-scheduler's FailedScheduling event gives the extender's answer, which names each
rack and why the group does not fit there. (Without the key it would run on three nodes
of the two racks.)

The native PodGroup's ``spec.schedulingConstraints.topology`` is served only with the
``TopologyAwareWorkloadScheduling`` gate, which the local control plane does not turn on
(the field is dropped without it), so the native path is covered by unit tests.
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
    wait_for,
    wait_pod_phase,
)
from .test_gangs import GROUP_LABEL, OPEN, bound_names, extender_sees, fairshare, open_nodes

pytestmark = pytest.mark.e2e

__all__ = ["fairshare"]  # the autouse fixture of test_gangs (a freshly started extender)

RACK = "topology.kubernetes.io/rack"
TOPOLOGY_ANNOTATION = "fairshare.io/gang-topology-key"


def pod(name: str, pool: str, gpus: int, **extra: Any) -> dict[str, Any]:
    limits = {"cpu": "100m", "memory": "128Mi", GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": {POOL: pool, OPEN: "yes"},
            "terminationGracePeriodSeconds": 0,
            **extra,
        },
    }


def topology_member(name: str, group: str, pool: str, gpus: int) -> dict[str, Any]:
    body = pod(name, pool, gpus)
    body["metadata"]["labels"] = {GROUP_LABEL: group}
    body["metadata"]["annotations"] = {
        "fairshare.io/gang-min-members": "3",
        TOPOLOGY_ANNOTATION: RACK,
    }
    return body


async def two_racks(make_gpu_node: MakeNode, pool: str) -> dict[str, str]:
    """Four 4-GPU nodes, two per rack: node name -> rack."""
    racks = {unique(f"{rack}n"): rack for rack in ("r1", "r1", "r2", "r2")}
    for name, rack in racks.items():
        await make_gpu_node(name, gpus=4, cpu="16", memory="64Gi", labels={POOL: pool, RACK: rack})
    return racks


async def fill_r2_halfway(
    api: client.ApiClient, fairshare: FairshareDev, ns: str, pool: str, racks: dict[str, str]
) -> None:
    """A 2-GPU pod on each r2 node (put there by name, not scheduled), seen by the
    extender."""
    core = client.CoreV1Api(api)
    r2 = [n for n, rack in racks.items() if rack == "r2"]
    for k, name in enumerate(r2):
        body = pod(f"busy-{k}", pool, 2, nodeName=name)
        del body["spec"]["nodeSelector"]
        await core.create_namespaced_pod(ns, body)
    for k in range(len(r2)):
        await wait_pod_phase(api, ns, f"busy-{k}", "Running")

    async def seen() -> bool:
        status = await asyncio.to_thread(fairshare.extender_status)
        free = {
            n["name"]: sum(float(d["free"]) for d in n["devices"])
            for n in status["nodes"]
            if n["name"] in r2
        }
        return len(free) == len(r2) and all(abs(v - 2) < 1e-6 for v in free.values())

    await wait_for(seen, timeout=60, what="the extender to see r2 half full")


async def test_a_gang_with_a_topology_key_lands_in_one_domain(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    t = unique("tk")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {t}\n")
    ns = await tenant_namespace(t)
    pool = unique("rackpool")
    racks = await two_racks(make_gpu_node, pool)
    await fill_r2_halfway(api, fairshare, ns, pool, racks)
    core = client.CoreV1Api(api)
    for i in range(3):  # accepted by the webhook with the annotation
        await core.create_namespaced_pod(ns, topology_member(f"m-{i}", "job", pool, 2))
    await extender_sees(fairshare, {f"{ns}/m-{i}" for i in range(3)})
    # r2 first: a group placed without the key never finds r1 open alone
    await open_nodes(api, sorted(racks, key=lambda n: racks[n] != "r2"))

    async def whole() -> bool:
        return {f"m-{i}" for i in range(3)} <= await bound_names(api, ns)

    await wait_for(whole, timeout=60, what="the group bound whole")
    pods = (await core.list_namespaced_pod(ns)).items
    where = {p.metadata.name: p.spec.node_name for p in pods if p.metadata.name.startswith("m-")}
    assert {racks[n] for n in where.values()} == {"r1"}, where


async def test_a_gang_that_fits_no_domain_waits_and_says_why(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    t = unique("tn")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {t}\n")
    ns = await tenant_namespace(t)
    pool = unique("rackpool")
    racks = await two_racks(make_gpu_node, pool)
    core = client.CoreV1Api(api)
    for i in range(3):
        await core.create_namespaced_pod(ns, topology_member(f"big-{i}", "big", pool, 3))
    await extender_sees(fairshare, {f"{ns}/big-{i}" for i in range(3)})
    await open_nodes(api, list(racks))
    # the answer once all four nodes are open (they are opened one by one): every rack
    # named with why the group does not fit there
    clauses = [f"{RACK}={r}: 8 free GPU on 2 node(s), the group needs 9" for r in ("r1", "r2")]
    head = f"gang {ns}/big (3 × {GPU} 3, "
    seen: list[str] = []

    async def told() -> bool:
        events = await core.list_namespaced_event(
            ns, field_selector="involvedObject.name=big-0,reason=FailedScheduling"
        )
        seen[:] = [e.message or "" for e in events.items]
        return any(
            head in m
            and f"does not fit whole in one domain of node label {RACK}: " in m
            and all(c in m for c in clauses)
            for m in seen
        )

    try:
        await wait_for(told, timeout=60, what="FailedScheduling naming both racks")
    except AssertionError:
        raise AssertionError(f"no such event; FailedScheduling messages: {seen}") from None
    await asyncio.sleep(3)
    assert not await bound_names(api, ns)


async def test_the_webhook_refuses_a_topology_key_that_is_no_label_key(
    api: client.ApiClient, tenant_namespace: TenantNamespace, fairshare: FairshareDev
):
    t = unique("tw")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {t}\n")
    ns = await tenant_namespace(t)
    body = topology_member("bad", "job", "nopool", 1)
    body["metadata"]["annotations"][TOPOLOGY_ANNOTATION] = "rack name"
    with pytest.raises(client.exceptions.ApiException) as refused:
        await client.CoreV1Api(api).create_namespaced_pod(ns, body)
    assert refused.value.status in (400, 403), refused.value
    text = str(refused.value.body)
    assert TOPOLOGY_ANNOTATION in text and "not a valid node label key" in text, text
