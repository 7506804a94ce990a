"""``yieldBand`` on the real control plane.

Two nodes of 8 GPUs. Tenant a holds 9 GPUs, b 7 (the cluster is full); then a asks for 3
more and, a moment later, b for 5: nothing fits, both wait. A third 8-GPU node joins, so
both are owed 12 of 24 and both are below that. Without the band (0, the default) the gate
has nothing to say below the fair share: kube-scheduler's queue order decides.
With ``yieldBand: 1`` a's pods wait while b, further behind its share (7 of 12 against
a's 9 of 12), has pods that fit: kube-scheduler's FailedScheduling events on a's pods say
so. kube-scheduler's backoff can also retry b's pods first (seen with the band off too);
then b reaches 12 before a grows. Either way both end at 12.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from .conftest import (
    CONFIG_HEAD,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    unique,
    wait_for,
)
from .test_fairshare_scheduling import POOL, bound, create_pods, pod_manifest

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
async def fresh_extender(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender: no pending pods of earlier tests in its queue."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


async def _events(api: client.ApiClient, namespace: str) -> list[str]:
    core = client.CoreV1Api(api)
    found = await core.list_namespaced_event(namespace)
    return [e.message or "" for e in found.items if e.reason == "FailedScheduling"]


@pytest.mark.parametrize("band", [0, 1], ids=["off", "band-1"])
async def test_below_the_fair_share_the_band_lets_the_tenant_further_behind_go_first(
    band: int,
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    a, b = unique("yb-a"), unique("yb-b")
    option = f"yieldBand: {band}\n"
    await fairshare.set_config(api, CONFIG_HEAD + option + f"tenants:\n- name: {a}\n- name: {b}\n")
    pool = unique("yb")
    for k in (1, 2):
        await make_gpu_node(f"{pool}-{k}", gpus=8, labels={POOL: pool})
    ns_a, ns_b = await tenant_namespace(a), await tenant_namespace(b)

    async def held(ns: str, n: int) -> bool:
        return len(await bound(api, ns)) == n

    await create_pods(api, ns_a, [pod_manifest(f"a-{i}", pool, gpus=1) for i in range(9)])
    await create_pods(api, ns_b, [pod_manifest(f"b-{i}", pool, gpus=1) for i in range(7)])
    await wait_for(lambda: held(ns_a, 9), timeout=60, what=f"{a}'s 9 pods bound")
    await wait_for(lambda: held(ns_b, 7), timeout=60, what=f"{b}'s 7 pods bound")

    await create_pods(api, ns_a, [pod_manifest(f"a-{i}", pool, gpus=1) for i in range(9, 12)])
    await asyncio.sleep(1)  # a's pods are the older ones
    await create_pods(api, ns_b, [pod_manifest(f"b-{i}", pool, gpus=1) for i in range(7, 12)])
    await asyncio.sleep(2)  # the extender's watch has every pod (and its demand)
    await make_gpu_node(f"{pool}-3", gpus=8, labels={POOL: pool})

    # b's count when a got its 10th GPU (polled, so a coarse reading).
    b_when_a_grew: list[int] = []

    async def both_at_12() -> bool:
        na, nb = len(await bound(api, ns_a)), len(await bound(api, ns_b))
        if na > 9 and not b_when_a_grew:
            b_when_a_grew.append(nb)
        return na == 12 and nb == 12

    await wait_for(both_at_12, timeout=90, what=f"{a} and {b} at 12 GPUs each")
    band_msgs = [m for m in await _events(api, ns_a) if "yieldBand" in m]
    if band:
        # kube-scheduler's backoff decides whose pods it retries first when the node
        # joins (b's, often, band or not). When it retries a's while b has pods that fit,
        # the band holds them and the event says so; otherwise b reached 12 before a grew.
        assert band_msgs or b_when_a_grew == [12], (b_when_a_grew, band_msgs)
        for m in band_msgs:
            assert f"tenant {a} near its fair share" in m and "yieldBand 1" in m, m
            assert f"while {b} waits" in m, m
    else:
        assert not band_msgs
