"""``holdForBlockedTenants`` on the real control plane.

One node of 8 GPUs. Tenant a takes 6 while alone. Tenant b then asks for 4 GPUs in one
pod: it fits nowhere now (2 free) but would fit the node drained (blocked, not
unrunnable). a asks for 2 more. a's fair share is 1/2 (b's demand counts), so each of
a's new pods takes it above. With the option off (the default) nothing of b fits now and
a's pods bind (work conservation). With it on, the gate holds a's pods, and
kube-scheduler's FailedScheduling event names b's blocked pod and its shape.
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
    wait_event,
    wait_for,
)
from .test_fairshare_scheduling import POOL, bound, create_pods, pod_manifest

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
async def fresh_extender(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender: no pending pods of earlier tests in its queue."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


@pytest.mark.parametrize("hold", [False, True], ids=["off", "on"])
async def test_a_blocked_pod_holds_a_tenant_above_its_fair_share_only_when_asked(
    hold: bool,
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    a, b = unique("hb-a"), unique("hb-b")
    option = f"holdForBlockedTenants: {'true' if hold else 'false'}\n"
    await fairshare.set_config(api, CONFIG_HEAD + option + f"tenants:\n- name: {a}\n- name: {b}\n")
    node = unique("hb")
    await make_gpu_node(node, gpus=8, labels={POOL: node})
    ns_a, ns_b = await tenant_namespace(a), await tenant_namespace(b)

    await create_pods(api, ns_a, [pod_manifest(f"a-{i}", node, gpus=1) for i in range(6)])

    async def a_has(n: int) -> bool:
        return len(await bound(api, ns_a)) == n

    await wait_for(lambda: a_has(6), timeout=60, what=f"tenant {a}'s first 6 pods bound")
    await create_pods(api, ns_b, [pod_manifest("b-big", node, gpus=4)])
    await asyncio.sleep(2)  # the extender's pod watch has b's pod (and its demand)
    await create_pods(api, ns_a, [pod_manifest(f"a-{i}", node, gpus=1) for i in (6, 7)])

    core = client.CoreV1Api(api)
    if not hold:
        await wait_for(lambda: a_has(8), timeout=60, what=f"tenant {a}'s 8 pods bound")
    else:
        event = await wait_event(
            api,
            ns_a,
            involved_name="a-6",
            reason="FailedScheduling",
            contains="holdForBlockedTenants",
        )
        assert f"tenant {a} above its fair share" in event.message
        assert f"while {b} waits" in event.message
        assert f"its pod {ns_b}/b-big (nvidia.com/gpu 4, cpu 100m" in event.message
        await asyncio.sleep(3)
        assert len(await bound(api, ns_a)) == 6, "a's pods above its fair share were bound"
    big = await core.read_namespaced_pod("b-big", ns_b)
    assert big.spec.node_name is None
