"""`fairshare extender --pick-in-filter` under the real kube-scheduler: filter answers only
the node prioritize scores highest, kube-scheduler binds the pod there without calling
prioritize (one feasible node: it skips scoring)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from .conftest import (
    CONFIG_HEAD,
    POOL,
    FairshareDev,
    MakeNode,
    gpu_pod_manifest,
    unique,
    wait_pod,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
async def picking(fairshare: FairshareDev) -> AsyncIterator[FairshareDev]:
    await asyncio.to_thread(fairshare.restart_extender, "--pick-in-filter")
    try:
        yield fairshare
    finally:
        await asyncio.to_thread(fairshare.restart_extender)


async def post_extender(dev: FairshareDev, path: str, body: dict[str, Any]) -> Any:
    ctx = dev.handles.client_context("extender")
    async with (
        aiohttp.ClientSession() as http,
        http.post(dev.handles.url("extender", path), json=body, ssl=ctx) as r,
    ):
        assert r.status == 200, await r.text()
        return await r.json()


async def verb_calls(dev: FairshareDev, verb: str) -> float:
    ctx = dev.handles.client_context("extender")
    async with (
        aiohttp.ClientSession() as http,
        http.get(dev.handles.url("extender", "/metrics"), ssl=ctx) as r,
    ):
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("fairshare_extender_requests_total{") and f'verb="{verb}"' in line
    )


async def test_pod_lands_on_prioritize_s_best_node_without_a_prioritize_call(
    api: client.ApiClient, make_gpu_node: MakeNode, namespace: str, picking: FairshareDev
):
    # Packing alone: the node the pod fills most scores highest (the 2-GPU node), where
    # kube-scheduler's own least-allocated scoring would lean to the emptiest.
    scoring = "scoring:\n  packing: 1\n  fragmentation: 0\n"
    await picking.set_config(api, CONFIG_HEAD + "tenants: []\n" + scoring)
    pool = unique("pick")
    nodes = [f"{pool}-{g}" for g in (8, 4, 2)]
    for name, gpus in zip(nodes, (8, 4, 2), strict=True):
        await make_gpu_node(name, gpus=gpus, labels={POOL: pool})
    pod = gpu_pod_manifest("p", 2)
    pod["spec"]["nodeSelector"] = {POOL: pool}
    # What prioritize says for this pod and these nodes, asked of the running extender.
    probe = {"Pod": pod | {"metadata": {"name": "p", "namespace": namespace}}}
    scores = await post_extender(picking, "/prioritize", probe | {"NodeNames": nodes})
    by_node = {s["Host"]: s["Score"] for s in scores}
    # The expected best, independent of what the extender says: the 2-GPU node, which the
    # 2-GPU pod fills (no GPU left over; the CPU and memory left are the same everywhere).
    expected = f"{pool}-2"
    best = max(by_node, key=by_node.__getitem__)
    assert sorted(by_node.values()).count(by_node[best]) == 1, by_node  # a unique best
    assert best == expected, by_node
    filters_before = await verb_calls(picking, "filter")
    prioritizes_before = await verb_calls(picking, "prioritize")

    await client.CoreV1Api(api).create_namespaced_pod(namespace, pod)
    bound = await wait_pod(api, namespace, "p", lambda p: bool(p.spec.node_name), what="bound")

    assert bound.spec.node_name == expected, by_node
    assert await verb_calls(picking, "filter") > filters_before
    assert await verb_calls(picking, "prioritize") == prioritizes_before
