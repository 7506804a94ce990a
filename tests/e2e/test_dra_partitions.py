"""Parts of a DRA GPU on the real control plane: MIG partitions and shares of a shareable
GPU count their fraction; kube-scheduler allocates, fairshare counts.

The test acts as NVIDIA's DRA driver on v1.36 (partitionable devices and consumable
capacity are beta and on by default): the classes ``gpu.nvidia.com`` and ``mig.nvidia.com``;
a kwok node whose GPU is published as the driver publishes partitionable GPUs on v1.35+ (a
slice of counter sets, a slice of the full GPU and its MIG placements consuming them); a
kwok node whose GPU allows several allocations, each consuming part of its 80Gi ``memory``.

* a pod with a 1g.10gb MIG claim binds on the partitionable node and counts 1/7 of a GPU
  (the dominant share of the counters its partition consumes), not a whole GPU;
* two pods with 40Gi claims share the shareable GPU, 0.5 each; a third 40Gi pod waits
  (kube-scheduler finds no capacity left) and binds once one share is gone;
* a tenant with a limit of 1 GPU may create seven 1g.10gb claims (7 x 1/7) at admission,
  and the eighth is refused naming tenant, limit and claim.

Counting every DRA device as one GPU (the first DRA slice), the tenant's usage reads 3
after the first two steps instead of 1/7 + 1, and the second MIG claim is refused.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from fractions import Fraction
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fairshare import quantities
from tests import nvidia_dra as nv

from .conftest import (
    CONFIG_HEAD,
    GPU,
    PAUSE_IMAGE,
    POOL,
    Cluster,
    FairshareDev,
    TenantNamespace,
    unique,
    wait_for,
    wait_node_ready,
)
from .test_dra_capacity import (
    delete_all,
    device_class,
    dra_node_manifest,
    fairshare,
    status_json,
    tenant_row,
    used,
    verdicts,
    wait_bound,
    wait_extender_gpus,
)

pytestmark = pytest.mark.e2e

__all__ = ["device_class", "fairshare"]  # fixtures used by name

MIG_SELECTOR = f"device.attributes['{nv.DRIVER}'].profile == '1g.10gb'"
SliceNode = Callable[..., Awaitable[str]]


@pytest.fixture
async def mig_class(api: client.ApiClient) -> AsyncIterator[str]:
    """NVIDIA's MIG DeviceClass, created if missing and deleted after the test."""
    v1 = client.ResourceV1Api(api)
    created = False
    try:
        await v1.create_device_class(nv.device_class(nv.MIG_CLASS, "mig", extended_resource=None))
        created = True
    except ApiException as exc:
        if exc.status != 409:
            raise
    yield nv.MIG_CLASS
    if created:
        await v1.delete_device_class(nv.MIG_CLASS)


@pytest.fixture
async def slice_node(
    api: client.ApiClient, fairshare: FairshareDev, device_class: str, mig_class: str
) -> AsyncIterator[SliceNode]:
    """``await slice_node(pool, slices)``: a Ready kwok node labelled ``POOL=pool`` with no
    ``nvidia.com/gpu`` allocatable, and ``slices`` (made for a node named as returned:
    pass a function's output through ``_for``) published for it, owned by the Node; waits
    until the extender counts its ``gpus`` GPUs (default 1)."""
    core, v1 = client.CoreV1Api(api), client.ResourceV1Api(api)
    nodes: list[str] = []
    made: list[str] = []

    async def make(pool: str, slices: list[dict[str, Any]], gpus: int = 1) -> str:
        name = str(slices[0]["spec"]["nodeName"])
        node = await core.create_node(dra_node_manifest(name, pool))
        nodes.append(name)
        await wait_node_ready(api, name)
        for rs in slices:
            rs["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
            ]
            await v1.create_resource_slice(rs)
            made.append(rs["metadata"]["name"])
        await wait_extender_gpus(fairshare, name, gpus)
        return name

    yield make
    await delete_all(v1.delete_resource_slice, made)
    await delete_all(core.delete_node, nodes)


def template(name: str, device_class: str, *, memory: str = "", selector: str = "") -> Any:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": nv.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def mig_claim(name: str) -> dict[str, Any]:
    body = template(name, nv.MIG_CLASS, selector=MIG_SELECTOR)
    return {
        "apiVersion": nv.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": body["spec"]["spec"],
    }


def claim_pod(name: str, pool: str, template_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": PAUSE_IMAGE,
                    "resources": {
                        "limits": {"cpu": "100m", "memory": "128Mi"},
                        "claims": [{"name": "gpu"}],
                    },
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
            "nodeSelector": {POOL: pool},
            "terminationGracePeriodSeconds": 0,
        },
    }


def gpus_used(report: dict[str, Any], tenant: str, column: str = "used") -> Fraction:
    text = used(tenant_row(report, tenant), GPU, column)
    return quantities.parse_fraction(text or "0")


async def wait_used(cluster: Cluster, tenant: str, want: float) -> dict[str, Any]:
    seen: list[Any] = []

    async def counted() -> dict[str, Any] | None:
        report = await asyncio.to_thread(status_json, cluster)
        seen[:] = [tenant_row(report, tenant), report.get("unreadable")]
        return report if abs(float(gpus_used(report, tenant)) - want) < 0.002 else None

    try:
        found: dict[str, Any] = await wait_for(
            counted, timeout=30, what=f"{tenant} to use {want:.3f} GPUs in status"
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen}") from None
    return found


async def test_mig_partitions_and_gpu_shares_count_their_fraction(
    api: client.ApiClient,
    cluster: Cluster,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    slice_node: SliceNode,
):
    tenant = unique("drap")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    ns = await tenant_namespace(tenant)
    core, v1 = client.CoreV1Api(api), client.ResourceV1Api(api)
    mig_pool, shared_pool = unique("migpool"), unique("shrpool")
    await slice_node(mig_pool, nv.partitioned_slices(unique("mig"), 1))
    await slice_node(shared_pool, [nv.shareable_slice(unique("shr"), 1)])

    # A 1g.10gb partition: 1/7 of a GPU.
    await v1.create_namespaced_resource_claim_template(
        ns, template("one-g", nv.MIG_CLASS, selector=MIG_SELECTOR)
    )
    await core.create_namespaced_pod(ns, claim_pod("m1", mig_pool, "one-g"))
    await wait_bound(api, ns, ["m1"])
    await wait_used(cluster, tenant, 1 / 7)

    # Two 40Gi shares of the 80Gi shareable GPU: half a GPU each.
    await v1.create_namespaced_resource_claim_template(
        ns, template("half", nv.GPU_CLASS, memory="40Gi")
    )
    for name in ("s1", "s2"):
        await core.create_namespaced_pod(ns, claim_pod(name, shared_pool, "half"))
    await wait_bound(api, ns, ["s1", "s2"])
    report = await wait_used(cluster, tenant, 1 / 7 + 1)
    # The webhook's ledger counts the claims the same way.
    assert abs(float(gpus_used(report, tenant, "quotaUsed")) - (1 / 7 + 1)) < 0.002, report
    # Both shares sit on the one device of the shared node: none of it is free.
    shared = next(n for n in report["nodes"] if n["name"].startswith("shr"))
    assert sum(d["free"] for d in shared["devices"]) == pytest.approx(0, abs=1e-3), shared

    # A third share waits (no capacity left on the device), then binds once one is gone.
    await core.create_namespaced_pod(ns, claim_pod("s3", shared_pool, "half"))
    await asyncio.sleep(5)
    pod = await core.read_namespaced_pod("s3", ns)
    assert not pod.spec.node_name, await verdicts(api, ns)
    await core.delete_namespaced_pod("s1", ns, grace_period_seconds=0)
    await wait_bound(api, ns, ["s3"], timeout=120)
    await wait_used(cluster, tenant, 1 / 7 + 1)


async def test_a_limit_admits_mig_claims_at_their_fraction(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    slice_node: SliceNode,
):
    tenant = unique("dram")
    await fairshare.set_config(
        api, CONFIG_HEAD + f'tenants:\n- name: {tenant}\n  limit:\n    {GPU}: "1"\n'
    )
    ns = await tenant_namespace(tenant)
    await slice_node(unique("migpool"), nv.partitioned_slices(unique("mig"), 1))
    v1 = client.ResourceV1Api(api)
    # Seven 1g.10gb claims are 7/7 of a GPU: all within the limit of 1.
    for i in range(7):
        await v1.create_namespaced_resource_claim(ns, mig_claim(f"mig-{i}"))
    with pytest.raises(ApiException) as refused:
        await v1.create_namespaced_resource_claim(ns, mig_claim("mig-7"))
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert f"tenant {tenant} would exceed its {GPU} limit" in message, message
    assert "1/7 requested" in message or "0.143 requested" in message, message


async def test_a_device_taint_rule_takes_a_gpu_out_of_capacity(
    api: client.ApiClient, fairshare: FairshareDev, slice_node: SliceNode
):
    """The control plane serves DeviceTaintRules (resource.k8s.io/v1beta2, gate
    DRADeviceTaintRules; both off by default in v1.36): a rule tainting one device of a
    node takes it out of the extender's capacity, and deleting it gives it back."""
    name = unique("dtr")
    node = await slice_node(unique("dtrpool"), [nv.resource_slice(name, 2)], gpus=2)
    rules = client.ResourceV1beta2Api(api)
    rule = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": nv.DRIVER, "pool": node, "device": "gpu-1"},
            "taint": {"key": "example.com/xid", "value": "79", "effect": "NoSchedule"},
        },
    }
    await rules.create_device_taint_rule(rule)
    try:
        await wait_extender_gpus(fairshare, node, 1)
    finally:
        await rules.delete_device_taint_rule(name)
    await wait_extender_gpus(fairshare, node, 2)
