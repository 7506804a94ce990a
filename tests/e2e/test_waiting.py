"""Work conservation on the real control plane: a pod that cannot run now holds no one back.

Tenant b's only pending pod asks for half the node's GPUs but can run nowhere (a
nodeSelector no node matches) or is not in a queue at all (a scheduling gate). The
fair-share gate must not count it as waiting: tenant a's pods keep being placed past a's
fair share (1/2, b's demand counts) until the node is full, instead of stopping at
"tenant a above its fair share (0.62 > 0.50) while b waits" with half the node idle.

a's pods are created only once the extender's own view (its /status.json) lists b's pod
as pending: the gate has b's pod (and its demand, which sets a's fair share to 1/2) in
front of it when a's pods arrive, so an extender that counted it as waiting would hold a
at 4 pods here, however slow its watch.
"""

from __future__ import annotations

import asyncio
from typing import Any

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


BLOCKED: dict[str, dict[str, Any]] = {
    "node-selector": {"node_selector": {"zone": "nowhere"}},
    "scheduling-gate": {"gated": True},
}


@pytest.fixture(autouse=True)
async def fresh_extender(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender: no pending pods of earlier tests in its queue."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


@pytest.mark.parametrize("why", list(BLOCKED))
async def test_a_pod_that_cannot_run_now_leaves_no_capacity_idle(
    why: str,
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    a, b = unique("wc-a"), unique("wc-b")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {a}\n- name: {b}\n")
    node = unique("wc")
    await make_gpu_node(node, gpus=8, labels={POOL: node})
    ns_a, ns_b = await tenant_namespace(a), await tenant_namespace(b)

    blocked = pod_manifest("b-blocked", node, gpus=4, **BLOCKED[why])
    if why == "node-selector":
        blocked["spec"]["nodeSelector"][POOL] = node
    await create_pods(api, ns_b, [blocked])
    seen = f"{ns_b}/b-blocked"

    async def extender_sees_blocked() -> dict[str, Any] | None:
        status = await asyncio.to_thread(fairshare.extender_status)
        mine = [p for p in status["pendingPods"] + status["heldPods"] if p["pod"] == seen]
        return mine[0] if mine else None

    entry = await wait_for(
        extender_sees_blocked, timeout=60, what=f"the extender to list {seen} as pending"
    )
    assert entry["tenant"] == b, entry

    await create_pods(api, ns_a, [pod_manifest(f"a-{i}", node, gpus=1) for i in range(8)])

    async def all_bound() -> list[client.V1Pod] | None:
        pods = await bound(api, ns_a)
        return pods if len(pods) == 8 else None

    try:
        await wait_for(all_bound, timeout=60, what=f"tenant {a}'s 8 pods bound")
    except AssertionError:
        core = client.CoreV1Api(api)
        events = await core.list_namespaced_event(ns_a, field_selector="reason=FailedScheduling")
        reasons = sorted({e.message for e in events.items})
        raise AssertionError(
            f"{len(await bound(api, ns_a))} of tenant {a}'s 8 pods bound; "
            f"FailedScheduling: {reasons}"
        ) from None
    assert {p.spec.node_name for p in await bound(api, ns_a)} == {node}
    still = await client.CoreV1Api(api).read_namespaced_pod("b-blocked", ns_b)
    assert still.spec.node_name is None
