"""MIG on the real control plane: a node with mixed-strategy slices takes MIG pods.

The node offers what the NVIDIA device plugin offers with the `mixed` strategy:
`nvidia.com/mig-1g.10gb: "7"` in allocatable and no `nvidia.com/gpu`. Pods asking for
`nvidia.com/mig-1g.10gb: 1` go through the extender's filter and bind (every pod does,
see tools/e2e/dev.py) and must be bound, seven of them; the eighth is refused with the
profile named.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from .conftest import CONFIG_HEAD, PAUSE_IMAGE, FairshareDev, unique, wait_event, wait_for
from .test_fairshare_scheduling import ANN_DEVICES, POOL, bound, create_pods

pytestmark = pytest.mark.e2e

MakeNode = Callable[..., Awaitable[client.V1Node]]
TenantNamespace = Callable[[str], Awaitable[str]]
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
    assert f"Insufficient {MIG}" in event.message
    await asyncio.sleep(2)
    eighth = await client.CoreV1Api(api).read_namespaced_pod("slice-7", ns)
    assert eighth.spec.node_name is None
    assert len(await bound(api, ns)) == 7
