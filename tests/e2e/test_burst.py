"""A burst of pods through the real apiserver, webhook, kube-scheduler and extender.

Issue 8, load: "the extender under a burst of 5,000 pods on the kwok cluster: every pod
bound or explained". BURST_PODS (default 5000) pods in three tenant namespaces are
created as fast as the apiserver takes them, onto BURST_NODES (default 600) kwok nodes of
8 GPUs: whole-GPU pods (1 or 2 GPUs), half-GPU pods (annotation) and a few that ask for
16 GPUs, which no node has. The test then waits until nothing changes any more and
checks, pod by pod:

* bound: on a burst node, with `fairshare.io/gpu-devices` for fractional pods, and no
  node over 8 GPUs, no device over 100 % (whole pods and shares added up per device);
* not bound: `PodScheduled=False` with reason `Unschedulable` and a message from the
  scheduler or the extender (the "explanation"); the 16-GPU pods must be among these;
* nothing else (no pod stuck without a decision, no create lost).

It runs last in the e2e suite (it loads the cluster) and prints its figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from .conftest import (
    ANN_DEVICES,
    ANN_FRACTION,
    CONFIG_HEAD,
    FAULT_SUMMARY,
    GPU,
    PAUSE_IMAGE,
    FairshareDev,
    gpu_node_manifest,
    unique,
    wait_for,
)

pytestmark = pytest.mark.e2e

PODS = int(os.environ.get("BURST_PODS", "5000"))
NODES = int(os.environ.get("BURST_NODES", "600"))
POOL = "fairshare-e2e/burst"
TENANTS = {"burst-a": 1, "burst-b": 1, "burst-c": 2}
CONCURRENCY = 40


def burst_pods(n: int, seed: int = 7) -> list[tuple[str, str, dict[str, Any]]]:
    """(tenant, kind, manifest): 55 % 1 GPU, 10 % 2 GPUs, 34 % half a GPU, 1 % 16 GPUs."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tenant = rng.choice(sorted(TENANTS))
        r = rng.random()
        limits = {"cpu": "100m", "memory": "128Mi"}
        annotations: dict[str, str] = {}
        if r < 0.55:
            kind, limits[GPU] = "gpu1", "1"
        elif r < 0.65:
            kind, limits[GPU] = "gpu2", "2"
        elif r < 0.99:
            kind, annotations[ANN_FRACTION] = "half", "0.5"
        else:
            kind, limits[GPU] = "gpu16", "16"
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"b-{i:05d}", "annotations": annotations},
            "spec": {
                "containers": [
                    {"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}
                ],
                "nodeSelector": {POOL: "true"},
                "terminationGracePeriodSeconds": 0,
            },
        }
        out.append((tenant, kind, manifest))
    return out


async def bounded(coros: list[Any], limit: int = CONCURRENCY) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def create_retrying(core: client.CoreV1Api, ns: str, body: dict[str, Any]) -> str:
    """Create one pod; retry what the apiserver answers as overloaded. Returns "created" or
    the refusal (a refusal is an explanation too, and is reported)."""
    for attempt in range(20):
        try:
            await core.create_namespaced_pod(ns, body)
            return "created"
        except ApiException as exc:
            if exc.status == 409:
                return "created"
            if exc.status in (429, 500, 503, 504):
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            return f"{exc.status} {exc.reason}"
    return "gave up after 20 attempts"


def device_load(pods: list[dict[str, Any]], node_gpus: int) -> tuple[dict[str, int], list[str]]:
    """GPUs per node (whole pods) and the devices over 100 %, from the bound pods."""
    whole: Counter[str] = Counter()
    shares: dict[tuple[str, int], float] = defaultdict(float)
    for p in pods:
        node = p["spec"]["nodeName"]
        ann = p["metadata"].get("annotations") or {}
        limits = p["spec"]["containers"][0].get("resources", {}).get("limits") or {}
        gpus = int(limits.get(GPU) or 0)
        whole[node] += gpus
        for part in filter(None, ann.get(ANN_DEVICES, "").split(",")):
            dev, _, milli = part.partition(":")
            shares[(node, int(dev))] += float(milli or 1000) / 1000
    over = [f"{n}/{d}: {v:.2f}" for (n, d), v in shares.items() if v > 1 + 1e-9]
    over += [f"{n}: {g} GPUs" for n, g in whole.items() if g > node_gpus]
    return dict(whole), over


async def test_a_burst_of_pods_is_bound_or_explained(
    api: client.ApiClient, fairshare: FairshareDev
):
    core = client.CoreV1Api(api)
    tenants = "".join(f"- name: {t}\n  weight: {w}\n" for t, w in TENANTS.items())
    await fairshare.set_config(api, CONFIG_HEAD + "tenants:\n" + tenants)
    run = unique("burst")
    namespaces: dict[str, str] = {}
    node_names = [f"{run}-n{i:04d}" for i in range(NODES)]
    t_start = time.monotonic()
    try:
        for tenant in TENANTS:
            ns = await core.create_namespace(
                {
                    "metadata": {
                        "generateName": f"{tenant}-",
                        "labels": {"fairshare.io/tenant": tenant},
                    }
                }
            )
            namespaces[tenant] = ns.metadata.name
        await bounded(
            [core.create_node(gpu_node_manifest(n, 8, labels={POOL: "true"})) for n in node_names]
        )

        async def nodes_ready() -> bool:
            nodes = (await core.list_node(label_selector=f"{POOL}=true")).items
            ready = [
                n
                for n in nodes
                if n.metadata.name.startswith(run)
                and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            ]
            return len(ready) == NODES

        await wait_for(nodes_ready, timeout=300, what=f"{NODES} burst nodes Ready", interval=2)
        t_nodes = time.monotonic()
        for ns in namespaces.values():  # pods need the default ServiceAccount

            async def has_sa(ns: str = ns) -> bool:
                try:
                    await core.read_namespaced_service_account("default", ns)
                except ApiException:
                    return False
                return True

            await wait_for(has_sa, timeout=60, what=f"ServiceAccount default in {ns}")

        pods = burst_pods(PODS)
        kinds = {m["metadata"]["name"]: k for _, k, m in pods}
        results = await bounded([create_retrying(core, namespaces[t], m) for t, _, m in pods])
        t_created = time.monotonic()
        refused = Counter(r for r in results if r != "created")
        created = sum(r == "created" for r in results)

        async def snapshot() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for ns in namespaces.values():  # raw JSON: thousands of typed models are slow
                resp = await core.list_namespaced_pod(ns, _preload_content=False)
                out += json.loads(await resp.read())["items"]
            return out

        def scheduled(p: dict[str, Any]) -> dict[str, Any] | None:
            conds = (p.get("status") or {}).get("conditions") or []
            return next((c for c in conds if c.get("type") == "PodScheduled"), None)

        def decided(p: dict[str, Any]) -> bool:
            if p["spec"].get("nodeName"):
                return True
            cond = scheduled(p)
            return (
                cond is not None
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            )

        # Settled: every pod decided and no new binding for 15 s (bounded at 15 min).
        last = (-1, time.monotonic())
        deadline = time.monotonic() + 900
        while True:
            listing = await snapshot()
            n_bound = sum(bool(p["spec"].get("nodeName")) for p in listing)
            now = time.monotonic()
            if n_bound != last[0]:
                last = (n_bound, now)
            if all(decided(p) for p in listing) and now - last[1] >= 15:
                break
            assert now < deadline, (
                f"not settled after 15 min: {n_bound} bound, "
                f"{sum(not decided(p) for p in listing)} undecided"
            )
            await asyncio.sleep(3)
        t_settled = last[1]

        def name(p: dict[str, Any]) -> str:
            return str(p["metadata"]["name"])

        bound_pods = [p for p in listing if p["spec"].get("nodeName")]
        waiting = [p for p in listing if not p["spec"].get("nodeName")]
        assert len(listing) == created, f"{created} created, {len(listing)} listed"
        assert all(p["spec"]["nodeName"].startswith(run) for p in bound_pods)
        for p in bound_pods:
            if kinds[name(p)] == "half":
                ann = p["metadata"].get("annotations") or {}
                assert ANN_DEVICES in ann, f"{name(p)}: fractional pod without devices"
        _, over = device_load(bound_pods, 8)
        assert not over, f"over capacity: {over[:10]}"
        reasons: Counter[str] = Counter()
        for p in waiting:
            cond = scheduled(p) or {}
            assert cond.get("message"), f"{name(p)}: Unschedulable without a message"
            reasons[_reason(cond["message"])] += 1
        big = [p for p in listing if kinds[name(p)] == "gpu16"]
        assert big and all(not p["spec"].get("nodeName") for p in big)

        span = t_settled - t_created if t_settled > t_created else 0.0
        rate = len(bound_pods) / (t_settled - t_nodes) if t_settled > t_nodes else 0.0
        by_kind = Counter(kinds[name(p)] for p in bound_pods)
        FAULT_SUMMARY.append(
            f"burst: {PODS} pods onto {NODES} kwok nodes ({NODES * 8} GPUs): "
            f"{created} created in {t_created - t_nodes:.0f}s"
            + (f" ({dict(refused)} refused at admission)" if refused else "")
            + f", {len(bound_pods)} bound {dict(by_kind)}, {len(waiting)} unschedulable "
            f"with a reason {dict(reasons)}; settled {span:.0f}s after the last create "
            f"({rate:.1f} pods/s from the first create); no device over 100 %, no node "
            f"over 8 GPUs; total {time.monotonic() - t_start:.0f}s"
        )
    finally:
        # One DELETE per pod (a deletecollection of thousands outlives the apiserver's
        # request timeout), then the namespaces and nodes.
        for ns in namespaces.values():
            resp = await core.list_namespaced_pod(ns, _preload_content=False)
            names = [p["metadata"]["name"] for p in json.loads(await resp.read())["items"]]
            await bounded([_delete_pod(core, ns, n) for n in names])
            await _delete(lambda ns=ns: core.delete_namespace(ns))
        await bounded([_delete(lambda n=n: core.delete_node(n)) for n in node_names])

        async def pods_gone() -> bool:
            for ns in namespaces.values():
                try:
                    if (await core.list_namespaced_pod(ns, limit=1)).items:
                        return False
                except ApiException:
                    pass
            return True

        await wait_for(pods_gone, timeout=300, what="the burst pods to be deleted", interval=2)


async def _delete_pod(core: client.CoreV1Api, ns: str, name: str) -> None:
    await _delete(lambda: core.delete_namespaced_pod(name, ns, grace_period_seconds=0))


async def _delete(call: Callable[[], Awaitable[Any]]) -> None:
    """Run a delete; gone already (404) is fine, an overloaded apiserver is retried."""
    for attempt in range(10):
        try:
            await call()
            return
        except ApiException as exc:
            if exc.status == 404:
                return
            if exc.status not in (429, 500, 503, 504) or attempt == 9:
                raise
        await asyncio.sleep(0.5 * (attempt + 1))


def _reason(message: str) -> str:
    """A short class for an Unschedulable message (for the summary line)."""
    low = message.lower()
    if "fair share" in low:
        return "fair share"
    if "insufficient" in low or "no node" in low or "gpu" in low:
        return "capacity"
    return message[:60]
