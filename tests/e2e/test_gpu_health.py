"""Failed GPUs on the real control plane: the signals GPU health tools write take GPUs out
of the capacity that fair shares divide, and status says which tenants they cost.

* A GPU node gets NVSentinel's fatal condition ``SysLogsGPUFallenOff=True`` (its syslog
  monitor's XID 79): the extender counts its GPUs out of service, a tenant's dominant
  share is measured against the GPUs left, its guarantee is reported not covered (status
  and ``fairshare_guarantee_coverage_ratio``), and status lists the tenant's GPU on the
  failed node. The condition back to ``False`` puts the GPUs back.
* A DRA GPU tainted ``gpu.nvidia.com/xid=79:NoSchedule`` in its ResourceSlice leaves the
  node's devices, the capacity and the share, and shows as an unhealthy GPU of the node;
  one tainted ``gpu.nvidia.com/unmonitored`` with effect ``None`` stays in service with a
  warning.

With the capacity counting failed nodes' GPUs (``ClusterState.total_capacity`` before
issue 44's healthy fleet), the first test fails at the in-service count: the GPUs of the
failed node stay in it and the share does not move.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client

from tests import nvidia_dra as nv

from .conftest import (
    CONFIG_HEAD,
    POOL,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    gpu_pod_manifest,
    unique,
    wait_for,
    wait_pod,
)
from .test_dra_capacity import device_class, dra_node, fairshare, wait_extender_gpus

pytestmark = pytest.mark.e2e

__all__ = ["device_class", "dra_node", "fairshare"]  # fixtures used by name

TENANT = "team-h"


async def extender(fairshare: FairshareDev) -> dict[str, Any]:
    return await asyncio.to_thread(fairshare.extender_status)


def share_of(status: dict[str, Any], tenant: str) -> float:
    return float(next(t["dominantShare"] for t in status["tenants"] if t["name"] == tenant))


async def wait_status(
    fairshare: FairshareDev, test: Any, what: str, timeout: float = 45
) -> dict[str, Any]:
    seen: list[Any] = []

    async def check() -> dict[str, Any] | None:
        status = await extender(fairshare)
        seen[:] = [status.get("health")]
        return status if test(status) else None

    try:
        got: dict[str, Any] = await wait_for(check, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last health seen: {seen}") from None
    return got


async def bound_pod(api: client.ApiClient, ns: str, name: str, node: str) -> None:
    await client.CoreV1Api(api).create_namespaced_pod(ns, gpu_pod_manifest(name, 1, node=node))
    await wait_pod(api, ns, name, lambda p: p.spec.node_name == node, what=f"bound to {node}")


async def test_a_fatal_nvsentinel_condition_takes_the_nodes_gpus_out_of_fair_shares(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    pool = unique("hw")
    ok, sick = unique("hw-ok"), unique("hw-sick")
    await make_gpu_node(ok, gpus=4, labels={POOL: pool})
    await make_gpu_node(sick, gpus=4, labels={POOL: pool})
    await fairshare.wait_extender_node(sick, healthy=True)
    before = await extender(fairshare)
    total = float(before["health"]["gpusInService"])
    assert total >= 8, before["health"]
    # A guarantee the whole fleet covers and the fleet without ``sick`` does not.
    guaranteed = int(total) - 2
    await fairshare.set_config(
        api,
        CONFIG_HEAD
        + f"tenants:\n- name: {TENANT}\n  guaranteed:\n    nvidia.com/gpu: '{guaranteed}'\n",
    )
    ns = await tenant_namespace(TENANT)
    await bound_pod(api, ns, "on-ok", ok)
    await bound_pod(api, ns, "on-sick", sick)
    status = await wait_status(
        fairshare,
        lambda s: abs(share_of(s, TENANT) - 2 / total) < 1e-3,
        f"{TENANT}'s share to be 2 of {total:g} GPUs",
    )
    assert all(g["covered"] for g in status["health"]["guarantees"]), status["health"]

    await client.CoreV1Api(api).patch_node_status(
        sick,
        {
            "status": {
                "conditions": [
                    {
                        "type": "SysLogsGPUFallenOff",
                        "status": "True",
                        "reason": "SysLogsGPUFallenOffIsNotHealthy",
                        "message": "[79] GPU fell off the bus - RecommendedAction: RESTART_BM",
                    }
                ]
            }
        },
    )
    await fairshare.wait_extender_node(sick, healthy=False)
    status = await wait_status(
        fairshare,
        lambda s: s["health"]["gpusInService"] == total - 4,
        f"{total - 4:g} GPUs in service",
    )
    health = status["health"]
    assert health["gpusFailed"] >= 4, health
    assert health["tenantsOnFailedHardware"].get(TENANT) == 1, health
    failed = next(n for n in health["nodes"] if n["name"] == sick)
    assert failed["failed"] and "SysLogsGPUFallenOff=True" in failed["reason"], failed
    assert failed["tenants"] == {TENANT: 1}, failed
    # The share is measured against the GPUs in service.
    assert abs(share_of(status, TENANT) - 2 / (total - 4)) < 1e-3, status["tenants"]
    (gpu,) = [g for g in health["guarantees"] if g["resource"] == "nvidia.com/gpu"]
    assert not gpu["covered"] and gpu["inService"] == total - 4, gpu

    async def exported() -> bool:
        failed_gpus = await asyncio.to_thread(fairshare.metric, "extender", "fairshare_gpus_failed")
        ratio = await asyncio.to_thread(
            fairshare.metric, "extender", "fairshare_guarantee_coverage_ratio"
        )
        return failed_gpus >= 4 and 0 < ratio < 1

    await wait_for(exported, timeout=60, what="the failed GPUs and the coverage in /metrics")

    await client.CoreV1Api(api).patch_node_status(
        sick,
        {"status": {"conditions": [{"type": "SysLogsGPUFallenOff", "status": "False"}]}},
    )
    await fairshare.wait_extender_node(sick, healthy=True)
    await wait_status(
        fairshare,
        lambda s: s["health"]["gpusInService"] == total,
        f"all {total:g} GPUs back in service",
    )


async def test_dra_device_taints_count_effect_by_effect(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
    dra_node: Any,
):
    pool = unique("hwdra")
    plain = unique("hw-plain")
    await make_gpu_node(plain, gpus=1, labels={POOL: pool})
    node = await dra_node(pool, 3)
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {TENANT}\n")
    ns = await tenant_namespace(TENANT)
    await bound_pod(api, ns, "holds-one", plain)
    status = await extender(fairshare)
    total = float(status["health"]["gpusInService"])
    await wait_status(
        fairshare,
        lambda s: abs(share_of(s, TENANT) - 1 / total) < 1e-3,
        f"{TENANT}'s share to be 1 of {total:g} GPUs",
    )

    v1 = client.ResourceV1Api(api)
    name = f"{node}-{nv.DRIVER}"
    rs = await v1.read_resource_slice(name)
    body = api.sanitize_for_serialization(rs)
    devices = body["spec"]["devices"]
    devices[1]["taints"] = [{"key": "gpu.nvidia.com/unmonitored", "effect": "None"}]
    devices[2]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    body["spec"]["pool"]["generation"] += 1
    await v1.replace_resource_slice(name, body)

    await wait_extender_gpus(fairshare, node, 2)
    status = await wait_status(
        fairshare,
        lambda s: s["health"]["gpusInService"] == total - 1,
        f"{total - 1:g} GPUs in service",
    )
    row = next(n for n in status["nodes"] if n["name"] == node)
    assert row["healthy"] and row["unhealthyGpus"] == 1, row
    assert "informational DRA device taint" in row["healthWarning"], row
    assert abs(share_of(status, TENANT) - 1 / (total - 1)) < 1e-3, status["tenants"]
    listed = next(n for n in status["health"]["nodes"] if n["name"] == node)
    assert (listed["failed"], listed["gpus"]) == (False, 1), listed

    rs = await v1.read_resource_slice(name)
    body = api.sanitize_for_serialization(rs)
    for device in body["spec"]["devices"]:
        device.pop("taints", None)
    body["spec"]["pool"]["generation"] += 1
    await v1.replace_resource_slice(name, body)
    await wait_extender_gpus(fairshare, node, 3)
    status = await wait_status(
        fairshare,
        lambda s: s["health"]["gpusInService"] == total,
        f"all {total:g} GPUs back in service",
    )
    row = next(n for n in status["nodes"] if n["name"] == node)
    assert row["unhealthyGpus"] == 0 and not row["healthWarning"], row
