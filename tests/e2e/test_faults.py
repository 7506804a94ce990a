"""Faults on the real control plane while the webhook and the extender run (issue 8, item 1).

* kube-apiserver down for 4 s, then restarted (same flags, same ports): the servers'
  /readyz drops (no API for longer than --not-ready-after) and recovers; their watches
  resume (a deletion made after the restart frees quota in the webhook and a device in
  the extender), nothing is lost or counted twice.
* etcd unreachable for ~3 s (SIGSTOP/SIGCONT): both servers keep answering from their
  caches (AdmissionReview and ExtenderArgs posted to them directly), and converge after.
* a node deleted with pods on it: the extender releases their devices; a re-created node
  of the same name is fully usable.
* the webhook's certificate rotated on disk (same CA): new TLS connections get the new
  certificate, same process.
* the extender SIGKILLed while binds are in flight: every pod is either bound with its
  `fairshare.io/gpu-devices` annotation or not bound at all (the annotation rides on the
  Binding); after a restart no device is leaked or doubled.
* an invalid ConfigMap edit keeps the last good config: covered by
  `test_fairshare_webhook.py::test_an_invalid_config_edit_is_refused_and_the_last_good_one_stays`
  (not duplicated here).

Each test records what it injected in `FAULT_SUMMARY` (printed at the end of the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    ANN_DEVICES,
    ANN_FRACTION,
    CONFIG_HEAD,
    FAULT_SUMMARY,
    GPU,
    PAUSE_IMAGE,
    POOL,
    STATE_DIR,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    cluster_module,
    dev_module,
    unique,
    wait_event,
    wait_for,
    wait_pod,
)

pytestmark = pytest.mark.e2e

HALF = {ANN_FRACTION: "0.5"}


@pytest.fixture(autouse=True)
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender, as in test_fairshare_scheduling.py (phantom pending pods
    of earlier tests, see there, must not hold these tenants back)."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


# --------------------------------------------------------------------------------------------
# Helpers


def pod(
    name: str,
    *,
    gpus: int = 0,
    annotations: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = {"cpu": "10m", "memory": "16Mi"}
    if gpus:
        limits[GPU] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": node_selector or {POOL: "nowhere"},
            "terminationGracePeriodSeconds": 0,
        },
    }


def message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body).get("message", ""))
    except (TypeError, ValueError):
        return str(exc.body)


async def create_retrying(
    api: client.ApiClient, namespace: str, manifest: dict[str, Any], *, timeout: float = 30
) -> str:
    """Create a pod, retrying while the control plane recovers (5xx, connection errors):
    'created', or the 403 denial message."""
    core = client.CoreV1Api(api)

    async def attempt() -> str | None:
        try:
            await core.create_namespaced_pod(namespace, manifest)
        except ApiException as exc:
            if exc.status == 403:
                return f"403 {message(exc)}"
            if exc.status == 409:  # an earlier attempt got through after all
                return "created"
            return None
        except (TimeoutError, OSError, aiohttp.ClientError):
            return None
        return "created"

    return await wait_for(attempt, timeout=timeout, what=f"create {manifest['metadata']['name']}")


def device_load(pods: list[client.V1Pod]) -> dict[int, float]:
    from fairshare.state.objects import parse_gpu_devices

    load: dict[int, float] = {}
    for p in pods:
        text = (p.metadata.annotations or {}).get(ANN_DEVICES)
        assert text, f"bound pod {p.metadata.name} has no {ANN_DEVICES}"
        for dev, milli in parse_gpu_devices(text):
            load[int(dev)] = load.get(int(dev), 0.0) + float(milli) / 1000
    for dev, total in load.items():
        assert total <= 1.0 + 1e-9, f"device {dev} above 100 %: {total}"
    return load


async def pods_of(api: client.ApiClient, namespace: str) -> list[client.V1Pod]:
    return list((await client.CoreV1Api(api).list_namespaced_pod(namespace)).items)


async def bound(api: client.ApiClient, namespace: str) -> list[client.V1Pod]:
    return [p for p in await pods_of(api, namespace) if p.spec.node_name]


async def wait_bound(api: client.ApiClient, namespace: str, name: str) -> client.V1Pod:
    return await wait_pod(
        api, namespace, name, lambda p: bool(p.spec.node_name), timeout=60, what="bound"
    )


async def stays_pending(api: client.ApiClient, namespace: str, name: str) -> None:
    """kube-scheduler refused the pod (FailedScheduling) and it is still unbound."""
    await wait_event(api, namespace, involved_name=name, reason="FailedScheduling", timeout=30)
    await asyncio.sleep(1.5)
    p = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    assert p.spec.node_name is None, f"{name} was bound to {p.spec.node_name}"


async def nudge_until_bound(api: client.ApiClient, namespace: str, name: str, node: str) -> None:
    """Wait for a pod that was unschedulable to be bound, touching a label of `node` every
    2 s (a Node update moves unschedulable pods back to kube-scheduler's active queue)."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + 45
    i = 0
    while time.monotonic() < deadline:
        p = await core.read_namespaced_pod(name, namespace)
        if p.spec.node_name:
            return
        if i % 8 == 7:
            await core.patch_node(node, {"metadata": {"labels": {"fairshare-e2e/nudge": str(i)}}})
        i += 1
        await asyncio.sleep(0.25)
    raise AssertionError(f"{namespace}/{name} not bound within 45s")


def server_ready(fairshare: FairshareDev, server: str) -> bool:
    return bool(dev_module().server_ready(fairshare.handles, server)[0])


class ReadyProbe:
    """Polls both servers' /readyz in a thread; records whether each ever failed."""

    def __init__(self, fairshare: FairshareDev) -> None:
        self.fairshare = fairshare
        self.failed: dict[str, int] = {s: 0 for s in ("webhook", "extender")}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for server in self.failed:
                if not server_ready(self.fairshare, server):
                    self.failed[server] += 1
            self.samples += 1
            self._stop.wait(0.1)

    def __enter__(self) -> ReadyProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


async def wait_servers_ready(fairshare: FairshareDev, timeout: float = 30) -> None:
    async def both() -> bool:
        results = await asyncio.gather(
            *(asyncio.to_thread(server_ready, fairshare, s) for s in ("webhook", "extender"))
        )
        return all(results)

    await wait_for(both, timeout=timeout, what="both servers ready", interval=0.2)


def cluster_paths() -> Any:
    mod = cluster_module()
    return mod.Paths(STATE_DIR)


async def wait_apiserver(api: client.ApiClient, timeout: float = 60) -> None:
    async def up() -> bool:
        try:
            await client.CoreV1Api(api).list_namespace(limit=1, _request_timeout=3)
        except (TimeoutError, ApiException, OSError, aiohttp.ClientError):
            return False
        return True

    await wait_for(up, timeout=timeout, what="kube-apiserver to answer", interval=0.25)


# --------------------------------------------------------------------------------------------
# The scenario the control-plane faults run in


@dataclass
class Scene:
    quota_tenant: str
    quota_ns: str  # tenant limited to 2 GPUs; pods never schedule (only admission matters)
    frac_ns: str  # tenant without limit; half-GPU pods on `node`
    node: str  # one GPU


async def set_scene(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    make_gpu_node: MakeNode,
) -> Scene:
    """Before the fault: q1 (1 GPU of the quota tenant's 2) admitted, h1 (half of the
    node's only GPU) bound."""
    quota, frac = unique("fq"), unique("ff")
    config = CONFIG_HEAD + (
        f'tenants:\n- name: {quota}\n  limit:\n    {GPU}: "2"\n- name: {frac}\n'
    )
    await fairshare.set_config(api, config)
    node = unique("fault")
    await make_gpu_node(node, gpus=1, labels={POOL: node})
    scene = Scene(quota, await tenant_namespace(quota), await tenant_namespace(frac), node)
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(scene.quota_ns, pod("q1", gpus=1))
    await core.create_namespaced_pod(
        scene.frac_ns, pod("h1", annotations=HALF, node_selector={POOL: node})
    )
    h1 = await wait_bound(api, scene.frac_ns, "h1")
    assert h1.metadata.annotations[ANN_DEVICES] == "0:500"
    return scene


async def check_converged(api: client.ApiClient, scene: Scene) -> None:
    """After the fault, quota and devices are counted once each, and both servers' watches
    deliver again (a deletion, which no reservation or local assume covers, frees them)."""
    core = client.CoreV1Api(api)
    ns = scene.quota_ns
    assert await create_retrying(api, ns, pod("q2", gpus=1)) == "created"
    refused = await create_retrying(api, ns, pod("q3", gpus=1))
    assert refused.startswith("403 ") and "2 used + 1 requested > 2" in refused, refused

    # The extender still holds h1 exactly once: h2 takes the other half, h3 finds no room.
    frac = {POOL: scene.node}
    await create_retrying(api, scene.frac_ns, pod("h2", annotations=HALF, node_selector=frac))
    h2 = await wait_bound(api, scene.frac_ns, "h2")
    assert h2.metadata.annotations[ANN_DEVICES] == "0:500"
    await create_retrying(api, scene.frac_ns, pod("h3", annotations=HALF, node_selector=frac))
    await stays_pending(api, scene.frac_ns, "h3")

    # Watches resumed: deleting q1 frees its GPU in the webhook, deleting h1 its half in
    # the extender.
    await core.delete_namespaced_pod("q1", ns, grace_period_seconds=0)

    async def q3_admitted() -> bool:
        return await create_retrying(api, ns, pod("q3", gpus=1)) == "created"

    await wait_for(q3_admitted, timeout=20, what="the webhook to see q1 deleted")
    over = await create_retrying(api, ns, pod("q4", gpus=1))
    assert "2 used + 1 requested > 2" in over, over

    await core.delete_namespaced_pod("h1", scene.frac_ns, grace_period_seconds=0)
    await nudge_until_bound(api, scene.frac_ns, "h3", scene.node)
    now = await bound(api, scene.frac_ns)
    assert sorted(p.metadata.name for p in now) == ["h2", "h3"]
    assert device_load(now) == {0: 1.0}


# --------------------------------------------------------------------------------------------
# Tests


async def test_apiserver_restart(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    make_gpu_node: MakeNode,
):
    scene = await set_scene(api, fairshare, tenant_namespace, make_gpu_node)
    mod = cluster_module()
    t0 = time.monotonic()
    # Down for longer than the dev servers' --not-ready-after (2 s): /readyz must drop
    # (a replica whose cache goes stale leaves the Service) and come back by itself.
    down = 2 * dev_module().NOT_READY_AFTER
    with ReadyProbe(fairshare) as probe:
        took = await asyncio.to_thread(
            mod.restart_component, cluster_paths(), "kube-apiserver", down
        )
        await wait_apiserver(api)
        await wait_servers_ready(fairshare)
    recovered = time.monotonic() - t0
    assert probe.failed["webhook"] > 0 and probe.failed["extender"] > 0, (
        f"/readyz never dropped during a {took:.1f}s outage: {probe.failed}"
    )
    await check_converged(api, scene)
    FAULT_SUMMARY.append(
        f"kube-apiserver down {down:.0f}s and restarted ({took:.1f}s down+up); /readyz "
        f"failed in {probe.failed} of {probe.samples} samples (dropped, as it must after "
        f"{dev_module().NOT_READY_AFTER:.0f}s without the API); servers ready "
        f"{recovered:.1f}s after the outage began; quota and device ledger correct, "
        "watches resumed"
    )


def review(namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """An AdmissionReview CREATE of `manifest` in `namespace` (a dry run: reserves nothing)."""
    obj = json.loads(json.dumps(manifest))
    obj["metadata"]["namespace"] = namespace
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": obj["metadata"]["name"],
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": obj,
            "dryRun": True,
        },
    }


def post(url: str, ctx: ssl.SSLContext, body: dict[str, Any], timeout: float = 3) -> dict[str, Any]:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with opener.open(req, timeout=timeout) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


async def test_etcd_briefly_unreachable(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    make_gpu_node: MakeNode,
):
    scene = await set_scene(api, fairshare, tenant_namespace, make_gpu_node)
    await asyncio.sleep(1)  # both servers' watches have q1 and h1
    mod, h = cluster_module(), fairshare.handles
    webhook, extender = h.url("webhook", "/validate"), h.url("extender", "/filter")

    def frac_pod(name: str, **kwargs: Any) -> dict[str, Any]:
        p = pod(name, node_selector={POOL: scene.node}, **kwargs)
        p["metadata"] |= {"namespace": scene.frac_ns, "uid": str(uuid.uuid4())}
        return p

    answers: dict[str, Any] = {}
    mod.signal_component(cluster_paths(), "etcd", signal.SIGSTOP)
    paused = time.monotonic()
    try:
        await asyncio.sleep(0.5)
        # The webhook judges from its cache: 1 of 2 used.
        one = await asyncio.to_thread(
            post, webhook, h.client_context("webhook"), review(scene.quota_ns, pod("w1", gpus=1))
        )
        two = await asyncio.to_thread(
            post, webhook, h.client_context("webhook"), review(scene.quota_ns, pod("w2", gpus=2))
        )
        # The extender filters from its cache: half a GPU is free on the node, a whole is not.
        half = await asyncio.to_thread(
            post,
            extender,
            h.client_context("extender"),
            {"Pod": frac_pod("x1", annotations=HALF), "NodeNames": [scene.node]},
        )
        whole = await asyncio.to_thread(
            post,
            extender,
            h.client_context("extender"),
            {"Pod": frac_pod("x2", gpus=1), "NodeNames": [scene.node]},
        )
        answers = {"one": one, "two": two, "half": half, "whole": whole}
        ready = {s: server_ready(fairshare, s) for s in ("webhook", "extender")}
        await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - paused)))
    finally:
        mod.signal_component(cluster_paths(), "etcd", signal.SIGCONT)
    stopped = time.monotonic() - paused

    assert answers["one"]["response"]["allowed"] is True, answers["one"]
    assert answers["two"]["response"]["allowed"] is False, answers["two"]
    assert "1 used + 2 requested > 2" in answers["two"]["response"]["status"]["message"]
    assert answers["half"]["NodeNames"] == [scene.node], answers["half"]
    assert scene.node in (answers["whole"]["FailedNodes"] or {}), answers["whole"]
    await wait_apiserver(api)
    await wait_servers_ready(fairshare)
    await check_converged(api, scene)
    FAULT_SUMMARY.append(
        f"etcd stopped (SIGSTOP) for {stopped:.1f}s: webhook and extender answered 4/4 "
        f"decisions from their caches (readyz while stopped: {ready}); converged after"
    )


async def test_node_deleted_with_pods_on_it(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    make_gpu_node: MakeNode,
):
    tenant = unique("nodedel")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    node = unique("nodedel")
    await make_gpu_node(node, gpus=2, labels={POOL: node})
    ns = await tenant_namespace(tenant)
    core = client.CoreV1Api(api)
    sel = {POOL: node}
    for i in range(4):
        await core.create_namespaced_pod(ns, pod(f"half-{i}", annotations=HALF, node_selector=sel))

    async def four() -> list[client.V1Pod] | None:
        pods = await bound(api, ns)
        return pods if len(pods) == 4 else None

    assert device_load(await wait_for(four, timeout=60, what="4 halves bound")) == {0: 1.0, 1: 1.0}

    # The node goes away with its pods bound to it; then its pods are removed (as
    # kube-controller-manager's pod GC does for pods of a deleted node, after a delay).
    await core.delete_node(node)
    await fairshare.wait_extender_node(node, present=False)  # its node watch first
    await core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)

    async def no_pods() -> bool:
        return not await pods_of(api, ns)

    await wait_for(no_pods, timeout=30, what="the deleted node's pods to be gone")
    await asyncio.sleep(1)
    await make_gpu_node(node, gpus=2, labels={POOL: node})  # same name, deleted at the end

    # The re-created node is entirely free: two whole GPUs, then two more halves... none.
    for i in range(2):
        await core.create_namespaced_pod(ns, pod(f"whole-{i}", gpus=1, node_selector=sel))
    pods = [await wait_bound(api, ns, f"whole-{i}") for i in range(2)]
    assert device_load(pods) == {0: 1.0, 1: 1.0}
    await core.create_namespaced_pod(ns, pod("half-x", annotations=HALF, node_selector=sel))
    await stays_pending(api, ns, "half-x")
    assert await asyncio.to_thread(server_ready, fairshare, "extender")
    FAULT_SUMMARY.append(
        "node deleted with 4 half-GPU pods bound: devices released; the re-created node "
        "took 2 whole GPUs, and nothing more"
    )


async def test_node_recreated_before_its_pods_are_gone(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    make_gpu_node: MakeNode,
):
    """The other order: the node comes back (same name) while its pods, still bound to it
    with their device annotations, have not been removed yet. They hold their devices
    again; once they are deleted the devices are free."""
    tenant = unique("noderecreate")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    node = unique("noderec")
    await make_gpu_node(node, gpus=2, labels={POOL: node})
    ns = await tenant_namespace(tenant)
    core = client.CoreV1Api(api)
    sel = {POOL: node}
    # Half-GPU pods: kube-scheduler does not see their share, only the extender counts it.
    for i in range(4):
        await core.create_namespaced_pod(ns, pod(f"half-{i}", annotations=HALF, node_selector=sel))

    async def four() -> list[client.V1Pod] | None:
        pods = await bound(api, ns)
        return pods if len(pods) == 4 else None

    assert device_load(await wait_for(four, timeout=60, what="4 halves bound")) == {0: 1.0, 1: 1.0}

    await core.delete_node(node)
    await fairshare.wait_extender_node(node, present=False)
    assert len(await bound(api, ns)) == 4  # nothing removed them (pod GC waits 40 s)
    await make_gpu_node(node, gpus=2, labels={POOL: node})
    await core.create_namespaced_pod(ns, pod("late", annotations=HALF, node_selector=sel))
    await stays_pending(api, ns, "late")

    await core.delete_namespaced_pod("half-0", ns, grace_period_seconds=0)
    await nudge_until_bound(api, ns, "late", node)
    now = await bound(api, ns)
    assert sorted(p.metadata.name for p in now) == ["half-1", "half-2", "half-3", "late"]
    assert device_load(now) == {0: 1.0, 1: 1.0}
    FAULT_SUMMARY.append(
        "node deleted and re-created while its 4 half-GPU pods were still bound: they held "
        "their devices again (a 5th half stayed Pending until one of them was deleted)"
    )


# --------------------------------------------------------------------------------------------
# Certificate rotation


def mint(ca_pem: bytes, ca_key_pem: bytes, out: Path) -> None:
    from fairshare import tls

    cert, key = tls.make_serving_cert(
        ca_pem,
        ca_key_pem,
        dns_names=("localhost",),
        ip_addresses=("127.0.0.1",),
        days=1,
        now=dt.datetime.now(dt.UTC),
    )
    for name, data in (("tls.crt", cert), ("tls.key", key)):
        tmp = out / f".{name}.tmp"
        tmp.write_bytes(data)
        tmp.replace(out / name)


def served_serial(port: int, cafile: Path) -> int:
    from cryptography import x509

    ctx = ssl.create_default_context(cafile=str(cafile))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=3) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls_sock,
    ):
        der = tls_sock.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def file_serial(path: Path) -> int:
    from cryptography import x509

    return int(x509.load_pem_x509_certificate(path.read_bytes()).serial_number)


@contextlib.contextmanager
def extra_webhook(certs: Path) -> Iterator[tuple[int, int]]:
    dev = dev_module()
    port = cluster_module().free_port()
    pid = dev.start_extra_webhook(STATE_DIR, port, certs_dir=certs, name="webhook-rotation")
    try:
        yield port, pid
    finally:
        dev.stop_extra_webhook(pid)


async def test_webhook_certificate_rotated_on_disk(fairshare: FairshareDev, tmp_path: Path):
    from fairshare import tls

    now = dt.datetime.now(dt.UTC)
    ca_pem, ca_key_pem = tls.make_ca("fairshare-e2e-rotation-ca", days=1, now=now)
    (tmp_path / "ca.crt").write_bytes(ca_pem)
    mint(ca_pem, ca_key_pem, tmp_path)
    first = file_serial(tmp_path / "tls.crt")
    with extra_webhook(tmp_path) as (port, pid):
        assert await asyncio.to_thread(served_serial, port, tmp_path / "ca.crt") == first
        t0 = time.monotonic()
        mint(ca_pem, ca_key_pem, tmp_path)
        second = file_serial(tmp_path / "tls.crt")
        assert second != first

        async def rotated() -> int | None:
            serial = await asyncio.to_thread(served_serial, port, tmp_path / "ca.crt")
            return serial if serial == second else None

        # The reloader checks the files every 10 s.
        await wait_for(rotated, timeout=20, what="the new certificate to be served")
        took = time.monotonic() - t0
        assert dev_module()._alive(pid), "the webhook restarted"
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        status, _ = cluster_module().http_get(f"https://127.0.0.1:{port}/readyz", ctx)
        assert status == 200
    FAULT_SUMMARY.append(
        f"webhook certificate rotated on disk: new serial served after {took:.1f}s, "
        "same process, no restart"
    )


# --------------------------------------------------------------------------------------------
# The extender killed while binding


async def test_extender_killed_during_binds(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    make_gpu_node: MakeNode,
):
    tenant = unique("kill")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    node = unique("kill")
    gpus, halves = 4, 8
    await make_gpu_node(node, gpus=gpus, labels={POOL: node})
    ns = await tenant_namespace(tenant)
    core = client.CoreV1Api(api)
    sel = {POOL: node}

    # SIGKILL as soon as a watch shows the first Binding: the next binds are in flight.
    async def kill_on_first_bind() -> None:
        async with watch.Watch() as w:  # closes its own client and the response
            async for event in w.stream(core.list_namespaced_pod, ns, timeout_seconds=60):
                if event["object"].spec.node_name:
                    os.kill(fairshare.handles.extender_pid, signal.SIGKILL)
                    return
        raise AssertionError("no pod was bound within 60s")

    killer = asyncio.create_task(kill_on_first_bind())
    await asyncio.sleep(0.3)  # the watch is open
    await asyncio.gather(
        *(
            core.create_namespaced_pod(ns, pod(f"half-{i}", annotations=HALF, node_selector=sel))
            for i in range(halves)
        )
    )
    await asyncio.wait_for(killer, 65)
    killed_at = len(await bound(api, ns))

    def consistent(pods: list[client.V1Pod]) -> None:
        for p in pods:
            has = ANN_DEVICES in (p.metadata.annotations or {})
            assert has == bool(p.spec.node_name), (
                f"{p.metadata.name}: nodeName={p.spec.node_name!r} annotation={has}"
            )

    await asyncio.sleep(1)
    consistent(await pods_of(api, ns))
    after_kill = len(await bound(api, ns))

    await asyncio.to_thread(fairshare.restart_extender)

    async def all_bound() -> list[client.V1Pod] | None:
        pods = await bound(api, ns)
        return pods if len(pods) == halves else None

    pods = await wait_for(all_bound, timeout=60, what=f"all {halves} halves bound after restart")
    consistent(await pods_of(api, ns))
    full = {d: 1.0 for d in range(gpus)}
    assert device_load(pods) == full
    # Nothing leaked (all of them fit) and nothing doubled (one more does not).
    await core.create_namespaced_pod(ns, pod("half-x", annotations=HALF, node_selector=sel))
    await stays_pending(api, ns, "half-x")
    assert device_load(await bound(api, ns)) == full
    FAULT_SUMMARY.append(
        f"extender SIGKILLed at its first bind of {halves} half-GPU pods ({killed_at} bound "
        f"right after the kill, {after_kill} 1 s later): every pod bound with its device "
        f"annotation or not at all; after restart {halves} halves on {gpus} GPUs, none "
        "leaked or doubled"
    )
