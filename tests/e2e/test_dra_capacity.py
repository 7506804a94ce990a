"""GPUs through DRA on the real control plane: kube-scheduler allocates, fairshare counts.

The test acts as NVIDIA's DRA driver: it creates the driver's DeviceClass ``gpu.nvidia.com``
(CEL on the driver and ``type == 'gpu'``, ``extendedResourceName: nvidia.com/gpu``) and,
for each kwok node with no ``nvidia.com/gpu`` allocatable, the ResourceSlice of its pool
(owned by the Node, as the kubelet plugin publishes it; ``tests/nvidia_dra.py``). kwok runs
the pods once bound; no kubelet plugin is needed for scheduling.

* KEP-5004: pods asking ``nvidia.com/gpu`` bind on a DRA-only node (kube-scheduler's
  NodeResourcesFit delegates the request to DRA and allocates a generated claim), and
  count once in their tenant's usage; a pod with a 2-GPU claim counts 2;
  ``fairshare status -o json`` has the node's DRA GPUs in the cluster's ``gpus`` and in
  the tenants' dominant shares;
* the fair-share gate holds a tenant above its share on DRA GPUs;
* a pod kube-scheduler's DynamicResources refused for want of free devices binds within
  seconds once an allocated claim is deleted (as Unreserve deletes the claim of a pod the
  gate held at bind): the extender requeues it, not kube-scheduler's 5-minute flush;
* a fleet of a device-plugin node and a DRA node gives one set of shares.

Before DRA capacity (fairshare modelling ``nvidia.com/gpu`` allocatable only), the
KEP-5004 pods never bind (the extender's filter answers ``Insufficient nvidia.com/gpu
(free 0, requested 1)``), and status shows the DRA node with no GPUs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests import nvidia_dra as nv

from .conftest import (
    CONFIG_HEAD,
    GPU,
    PAUSE_IMAGE,
    POOL,
    Cluster,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    gpu_node_manifest,
    unique,
    wait_for,
    wait_node_ready,
)

pytestmark = pytest.mark.e2e

OPEN = "fairshare-e2e/open"
FAIR_REASON = "above its fair share"
DraNode = Callable[[str, int], Awaitable[str]]


@pytest.fixture
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender: no phantom pending pods of earlier tests (see
    test_fairshare_scheduling.py) take part in this test's fair shares."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


@pytest.fixture
async def device_class(api: client.ApiClient) -> AsyncIterator[str]:
    """NVIDIA's full-GPU DeviceClass, created if missing and deleted after the test."""
    v1 = client.ResourceV1Api(api)
    created = False
    try:
        await v1.create_device_class(nv.device_class())
        created = True
    except ApiException as exc:
        if exc.status != 409:
            raise
    yield nv.GPU_CLASS
    if created:
        await v1.delete_device_class(nv.GPU_CLASS)


@pytest.fixture
async def dra_node(
    api: client.ApiClient, fairshare: FairshareDev, device_class: str
) -> AsyncIterator[DraNode]:
    """``await dra_node(pool, gpus)``: a Ready kwok node labelled ``POOL=pool`` with no
    ``nvidia.com/gpu`` allocatable nor GPU feature discovery labels, and the ResourceSlice
    of its ``gpus`` GPUs; waits until the extender counts them. Both deleted afterwards."""
    core, v1 = client.CoreV1Api(api), client.ResourceV1Api(api)
    nodes: list[str] = []
    slices: list[str] = []

    async def make(pool: str, gpus: int) -> str:
        name = unique("dra")
        node = await core.create_node(dra_node_manifest(name, pool))
        nodes.append(name)
        await wait_node_ready(api, name)
        rs = nv.resource_slice(name, gpus, name=f"{name}-{nv.DRIVER}")
        rs["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
        ]
        await v1.create_resource_slice(rs)
        slices.append(rs["metadata"]["name"])
        await wait_extender_gpus(fairshare, name, gpus)
        return name

    yield make
    await delete_all(v1.delete_resource_slice, slices)
    await delete_all(core.delete_node, nodes)


def dra_node_manifest(name: str, pool: str) -> dict[str, Any]:
    """A kwok node labelled ``POOL=pool`` with no ``nvidia.com/gpu`` allocatable nor GPU
    feature discovery labels: its GPUs come from ResourceSlices only."""
    manifest = gpu_node_manifest(name, gpus=0, labels={POOL: pool})
    for part in ("capacity", "allocatable"):
        del manifest["status"][part][GPU]
    labels = manifest["metadata"]["labels"]
    for key in [k for k in labels if k.startswith("nvidia.com/gpu.")]:
        del labels[key]
    return manifest


async def delete_all(delete: Callable[[str], Awaitable[Any]], names: list[str]) -> None:
    """``delete(name)`` for each of ``names``; one already gone is fine."""
    for name in names:
        try:
            await delete(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


async def wait_extender_gpus(fairshare: FairshareDev, node: str, gpus: int) -> None:
    """Until the extender's own view (``/status.json``) shows ``node`` with ``gpus`` GPUs."""

    async def seen() -> bool:
        status = await asyncio.to_thread(fairshare.extender_status)
        got = next((n for n in status["nodes"] if n["name"] == node), None)
        return got is not None and len(got["devices"]) == gpus

    await wait_for(seen, timeout=30, what=f"the extender to count {gpus} DRA GPUs on {node}")


def gpu_pod(name: str, pool: str, gpus: int, *, open_label: bool = False) -> dict[str, Any]:
    selector = {POOL: pool, **({OPEN: "yes"} if open_label else {})}
    limits = {"cpu": "100m", "memory": "128Mi", GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": selector,
            "terminationGracePeriodSeconds": 0,
        },
    }


def claim_pod(name: str, pool: str, template: str) -> dict[str, Any]:
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
                        "claims": [{"name": "gpus"}],
                    },
                }
            ],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
            "nodeSelector": {POOL: pool},
            "terminationGracePeriodSeconds": 0,
        },
    }


def claim_template(name: str, gpus: int) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": nv.GPU_CLASS, "count": gpus}}
    return {
        "apiVersion": nv.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


async def raw_pod(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    resp = await client.CoreV1Api(api).read_namespaced_pod(name, ns, _preload_content=False)
    try:
        data: dict[str, Any] = json.loads(await resp.read())
    finally:
        resp.release()
    return data


async def wait_bound(api: client.ApiClient, ns: str, names: list[str], timeout: float = 60) -> None:
    core = client.CoreV1Api(api)

    async def all_bound() -> bool:
        pods = {p.metadata.name: p for p in (await core.list_namespaced_pod(ns)).items}
        return all(n in pods and pods[n].spec.node_name for n in names)

    try:
        await wait_for(all_bound, timeout=timeout, what=f"pods {names} of {ns} to bind")
    except AssertionError as exc:  # with kube-scheduler's verdicts on them
        raise AssertionError(f"{exc}; {await verdicts(api, ns)}") from None


def status_json(cluster: Cluster) -> dict[str, Any]:
    kubeconfig = str(cluster.kubeconfig)
    out = subprocess.run(
        [sys.executable, "-m", "fairshare_cli", "status", "-o", "json", "--kubeconfig", kubeconfig],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def tenant_row(report: dict[str, Any], tenant: str) -> dict[str, Any]:
    return next(t for t in report["tenants"] if t["name"] == tenant)


def used(row: dict[str, Any], resource: str, column: str = "used") -> Any:
    return next(r[column] for r in row["resources"] if r["resource"] == resource)


def node_gpus(report: dict[str, Any]) -> dict[str, int]:
    return {n["name"]: len(n["devices"]) for n in report["nodes"]}


async def test_kep5004_and_claim_pods_bind_on_a_dra_only_node_and_count(
    api: client.ApiClient,
    cluster: Cluster,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    dra_node: DraNode,
):
    tenant = unique("drag")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    ns = await tenant_namespace(tenant)
    pool = unique("drapool")
    node = await dra_node(pool, 8)
    core = client.CoreV1Api(api)
    # Three pods asking nvidia.com/gpu (KEP-5004): 1 + 1 + 2 of the node's 8 DRA GPUs.
    for name, gpus in (("k1", 1), ("k2", 1), ("k3", 2)):
        await core.create_namespaced_pod(ns, gpu_pod(name, pool, gpus))
    await wait_bound(api, ns, ["k1", "k2", "k3"])
    for name in ("k1", "k2", "k3"):
        pod = await raw_pod(api, ns, name)
        assert pod["spec"]["nodeName"] == node
        # kube-scheduler served it through DRA: its generated claim is recorded.
        generated = pod["status"].get("extendedResourceClaimStatus", {}).get("resourceClaimName")
        assert generated, pod["status"]
        claim = await client.ResourceV1Api(api).read_namespaced_resource_claim(generated, ns)
        assert claim.metadata.annotations["resource.kubernetes.io/extended-resource-claim"]
    # A pod with a claim template of 2 GPUs of the class.
    await client.ResourceV1Api(api).create_namespaced_resource_claim_template(
        ns, claim_template("two", 2)
    )
    await core.create_namespaced_pod(ns, claim_pod("c2", pool, "two"))
    await wait_bound(api, ns, ["c2"])

    seen: list[Any] = []

    async def counted() -> dict[str, Any] | None:
        report = await asyncio.to_thread(status_json, cluster)
        row = tenant_row(report, tenant)
        seen[:] = [row, report["cluster"], report.get("unreadable")]
        return report if used(row, GPU) == "6" else None

    # 1 + 1 + 2 (generated claims not counted again) + 2 (the claim) = 6.
    try:
        report = await wait_for(counted, timeout=30, what=f"{tenant} to use 6 GPUs in status")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen}") from None
    row = tenant_row(report, tenant)
    assert used(row, GPU, "quotaUsed") == "6"  # the webhook's count agrees
    gpus = node_gpus(report)
    assert gpus[node] == 8
    # The claim's 2 devices are taken on the node too: 8 - 6 free.
    devices = next(n["devices"] for n in report["nodes"] if n["name"] == node)
    assert sum(d["free"] for d in devices) == 2, devices
    assert report["cluster"]["gpus"] == sum(gpus.values()) >= 8
    # GPUs dominate (100m CPU per pod on 64-CPU nodes): the share is 6 of the cluster's GPUs.
    assert row["dominantShare"] == pytest.approx(6 / report["cluster"]["gpus"], abs=1e-4)


async def test_a_tenant_at_its_limit_through_kep5004_pods(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    dra_node: DraNode,
):
    """Limit 2 GPUs: a pod asking 2 through DRA binds (the claim kube-scheduler generates
    for it, which the webhook validates too, counts 0: the pod's request is its usage;
    counted again it would be refused as '2 used + 2 requested > 2' and the pod would
    never bind), and a third GPU is refused at admission naming tenant, limit and usage."""
    tenant = unique("dral")
    await fairshare.set_config(
        api, CONFIG_HEAD + f'tenants:\n- name: {tenant}\n  limit:\n    {GPU}: "2"\n'
    )
    ns = await tenant_namespace(tenant)
    pool = unique("drapool")
    await dra_node(pool, 8)
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(ns, gpu_pod("two", pool, 2))
    await wait_bound(api, ns, ["two"])
    generated = (await raw_pod(api, ns, "two"))["status"]["extendedResourceClaimStatus"]
    assert generated["resourceClaimName"]
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(ns, gpu_pod("one-more", pool, 1))
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert f"tenant {tenant} would exceed its {GPU} limit: 2 used + 1 requested > 2" in message


async def wait_pending_in_extender(fairshare: FairshareDev, names: set[str]) -> None:
    """Until the extender's own view lists every ``namespace/name`` of ``names`` pending."""

    async def listed() -> bool:
        status = await asyncio.to_thread(fairshare.extender_status)
        return names <= {p["pod"] for p in status["pendingPods"] + status["heldPods"]}

    await wait_for(listed, timeout=60, what=f"the extender to list {sorted(names)} pending")


async def open_round(
    api: client.ApiClient,
    fairshare: FairshareDev,
    pods: list[tuple[str, str]],
    pool: str,
    nodes: list[str],
) -> None:
    """Create ``pods`` ((namespace, name), 1 GPU each, in that order) so that they all
    wait at once: they select ``OPEN``, which the nodes get only once the extender lists
    every one as pending; kube-scheduler then takes them in creation order."""
    core = client.CoreV1Api(api)
    for node in nodes:
        await core.patch_node(node, {"metadata": {"labels": {OPEN: None}}})
    for ns, name in pods:
        await core.create_namespaced_pod(ns, gpu_pod(name, pool, 1, open_label=True))
    await wait_pending_in_extender(fairshare, {f"{ns}/{name}" for ns, name in pods})
    for node in nodes:
        await core.patch_node(node, {"metadata": {"labels": {OPEN: "yes"}}})


async def settled(
    api: client.ApiClient, namespaces: dict[str, str], quiet: float = 4, timeout: float = 60
) -> dict[str, int]:
    """Bound pods per tenant once the counts stopped changing for ``quiet`` seconds."""
    core = client.CoreV1Api(api)
    loop = asyncio.get_running_loop()
    last: dict[str, int] = {}
    since = start = loop.time()
    while loop.time() - since < quiet:
        counts = {
            t: sum(1 for p in (await core.list_namespaced_pod(ns)).items if p.spec.node_name)
            for t, ns in namespaces.items()
        }
        if counts != last:
            last, since = counts, loop.time()
        assert loop.time() < start + timeout, f"bindings did not settle: {counts}"
        await asyncio.sleep(0.25)
    return last


async def verdicts(api: client.ApiClient, ns: str) -> list[str]:
    """kube-scheduler's PodScheduled messages of the pending pods of ``ns``."""
    pods = (await client.CoreV1Api(api).list_namespaced_pod(ns)).items
    return [
        f"{p.metadata.name}: {c.message}"
        for p in pods
        if not p.spec.node_name
        for c in (p.status.conditions or [])
        if c.type == "PodScheduled"
    ]


async def bound_after_dra_refusal(
    api: client.ApiClient, ns: str, names: list[str], timeout: float = 60
) -> None:
    """Until ``names`` are bound, well before kube-scheduler's 5-minute flush of its
    unschedulable pods.

    When the extender's node watch lags kube-scheduler's by the moment the pool opens,
    the first tenant's pod passes the filter and is held at bind instead (the gate
    judged again there), and kube-scheduler, having tried the waiting pods while that
    pod held the last devices, refused them with DynamicResources' 'cannot allocate all
    claims'. Unreserve then deletes the held pod's generated claim, still allocated,
    which DynamicResources does not retry its pods on: the extender requeues them
    (extender/requeue.py). Says on stderr when that path was taken."""
    started = time.monotonic()
    await wait_bound(api, ns, names, timeout=timeout)
    events = await client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector="reason=FailedScheduling"
    )
    if any("cannot allocate all claims" in (e.message or "") for e in events.items):
        took = time.monotonic() - started
        sys.stderr.write(f"\n[e2e] {ns}: refused by DRA first, all bound {took:.1f} s later\n")


async def held_by_the_gate(api: client.ApiClient, ns: str, name: str, tenant: str) -> None:
    core = client.CoreV1Api(api)

    async def event() -> bool:
        events = await core.list_namespaced_event(ns, field_selector="reason=FailedScheduling")
        return any(
            e.involved_object.name == name and f"tenant {tenant} {FAIR_REASON}" in (e.message or "")
            for e in events.items
        )

    try:
        await wait_for(event, timeout=30, what=f"{ns}/{name} held by the fair-share gate")
    except AssertionError as exc:
        events = await core.list_namespaced_event(ns)
        seen = [(e.reason, e.message) for e in events.items if e.involved_object.name == name]
        raise AssertionError(f"{exc}; its events: {seen}") from None


async def test_the_gate_holds_a_tenant_above_its_share_on_dra_gpus(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    dra_node: DraNode,
):
    """4 DRA GPUs; a, alone, takes 3. Then a's 4th pod and b's first wait at once, a's
    first in kube-scheduler's queue. Fair shares over the demand (a 4, b 1): b 1/4, a 3/4.
    Without the gate a's pod takes the last GPU and b's waits; with it a's is held (4/4
    would be above 3/4 while b waits with a pod that fits) and b's runs."""
    a, b = unique("draa"), unique("drab")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {a}\n- name: {b}\n")
    namespaces = {a: await tenant_namespace(a), b: await tenant_namespace(b)}
    pool = unique("drapool")
    node = await dra_node(pool, 4)
    core = client.CoreV1Api(api)
    for i in range(3):
        await core.create_namespaced_pod(namespaces[a], gpu_pod(f"{a}-{i}", pool, 1))
    await wait_bound(api, namespaces[a], [f"{a}-{i}" for i in range(3)])
    await open_round(
        api, fairshare, [(namespaces[a], f"{a}-3"), (namespaces[b], f"{b}-0")], pool, [node]
    )
    await bound_after_dra_refusal(api, namespaces[b], [f"{b}-0"])
    counts = await settled(api, namespaces)
    assert counts[a] == 3, await verdicts(api, namespaces[a])
    await held_by_the_gate(api, namespaces[a], f"{a}-3", a)


async def test_a_pod_dra_refused_binds_once_an_allocated_claim_is_deleted(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    dra_node: DraNode,
):
    """The gap the test above may fall into, made certain: the test stands for
    kube-scheduler's Unreserve, which deletes the claim it generated for a pod whose bind
    failed after PreBind (the gate held it at bind) while the claim is still allocated.
    A claim allocated the DRA node's one GPU; b's pod is refused by DynamicResources
    ('cannot allocate all claims'); the claim is deleted. DynamicResources retries its
    pods on a claim's deallocation, not on its deletion: without the extender's requeue,
    b would wait for kube-scheduler's 5-minute flush; with it, b binds in seconds."""
    b = unique("drar")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {b}\n")
    ns = await tenant_namespace(b)
    pool = unique("drapool")
    node = await dra_node(pool, 1)
    v1, core = client.ResourceV1Api(api), client.CoreV1Api(api)
    request = {"name": "gpu", "exactly": {"deviceClassName": nv.GPU_CLASS, "count": 1}}
    claim = {
        "apiVersion": nv.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": "held"},
        "spec": {"devices": {"requests": [request]}},
    }
    await v1.create_namespaced_resource_claim(ns, claim)
    result = {"request": "gpu", "driver": nv.DRIVER, "pool": node, "device": "gpu-0"}
    status = {"status": {"allocation": {"devices": {"results": [result]}}}}
    await v1.patch_namespaced_resource_claim_status("held", ns, status)
    await core.create_namespaced_pod(ns, gpu_pod(f"{b}-0", pool, 1))

    async def refused() -> list[str]:
        return [v for v in await verdicts(api, ns) if "cannot allocate all claims" in v]

    await wait_for(refused, timeout=60, what=f"{ns}/{b}-0 refused by DynamicResources")
    await v1.delete_namespaced_resource_claim("held", ns)
    started = time.monotonic()
    await wait_bound(api, ns, [f"{b}-0"], timeout=60)
    took = time.monotonic() - started
    sys.stderr.write(f"\n[e2e] {ns}/{b}-0 bound {took:.1f} s after the claim was deleted\n")
    assert (await raw_pod(api, ns, f"{b}-0"))["spec"]["nodeName"] == node


async def test_a_mixed_fleet_gives_one_set_of_shares(
    api: client.ApiClient,
    cluster: Cluster,
    fairshare: FairshareDev,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    dra_node: DraNode,
):
    """A device-plugin node of 4 GPUs and a DRA node of 4 in one pool. a takes the 4
    device-plugin GPUs alone; then a's 5th pod and 4 of b wait at once (a's first): the
    fair shares are over the 8 GPUs of both kinds, so a (4 of 8, at its share) is held
    and b's 4 run on the DRA node; status has both nodes' GPUs in the cluster's total and
    a and b at one dominant share."""
    a, b = unique("mixa"), unique("mixb")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {a}\n- name: {b}\n")
    namespaces = {a: await tenant_namespace(a), b: await tenant_namespace(b)}
    pool = unique("mixpool")
    plugin = unique("dp")
    await make_gpu_node(plugin, gpus=4, labels={POOL: pool})
    await fairshare.wait_extender_node(plugin)
    core = client.CoreV1Api(api)
    for i in range(4):
        pod = gpu_pod(f"{a}-{i}", pool, 1)
        pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] = plugin
        await core.create_namespaced_pod(namespaces[a], pod)
    await wait_bound(api, namespaces[a], [f"{a}-{i}" for i in range(4)])
    dra = await dra_node(pool, 4)
    waiting = [(namespaces[a], f"{a}-4")] + [(namespaces[b], f"{b}-{i}") for i in range(4)]
    # Only the DRA node opens (the device-plugin one is full): two label events would give
    # kube-scheduler two rounds, and a's pod, tried in the first, could come after b's.
    await open_round(api, fairshare, waiting, pool, [dra])
    await bound_after_dra_refusal(api, namespaces[b], [f"{b}-{i}" for i in range(4)])
    counts = await settled(api, namespaces)
    assert counts[a] == 4, await verdicts(api, namespaces[a])
    await held_by_the_gate(api, namespaces[a], f"{a}-4", a)
    on = {
        p.metadata.name: p.spec.node_name
        for p in (await core.list_namespaced_pod(namespaces[b])).items
    }
    assert set(on.values()) == {dra}, on
    report = await asyncio.to_thread(status_json, cluster)
    gpus = node_gpus(report)
    assert (gpus[plugin], gpus[dra]) == (4, 4)
    rows = {t: tenant_row(report, t) for t in (a, b)}
    assert used(rows[a], GPU) == used(rows[b], GPU) == "4"
    share = 4 / report["cluster"]["gpus"]
    assert rows[a]["dominantShare"] == rows[b]["dominantShare"] == pytest.approx(share, abs=1e-4)
