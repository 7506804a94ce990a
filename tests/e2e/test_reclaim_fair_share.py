"""Reclaim toward fair share on the real control plane (opt-in `reclaimToFairShare`).

Three tenants weighted 1:1:2 each create 60 one-GPU pods, interleaved, over about three
seconds, onto 80 empty GPUs (10 kwok nodes of 8): the first arrivals fill the cluster
about evenly, far from the fair 20/20/40, and nothing changes until pods finish. The
reclaimer, with `reclaimToFairShare: true`, evicts the youngest pods of the tenants above
their fair share until the allocation is 20/20/40, and stops there.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import pytest
from kubernetes_asyncio import client

from . import test_reclaim
from .conftest import CONFIG_HEAD, FairshareDev, unique, wait_for
from .test_reclaim import POOL, MakeNode, Reclaimer, TenantNamespace, gpu_pod, metric_sum, running

pytestmark = pytest.mark.e2e

start_reclaimer_fixture = test_reclaim.start_reclaimer


async def test_a_burst_converges_to_fair_shares_by_reclaim(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
    start_reclaimer_fixture: Callable[[str], Reclaimer],
):
    core = client.CoreV1Api(api)
    a, b, c = unique("fs-a"), unique("fs-b"), unique("fs-c")
    config = CONFIG_HEAD + (
        "reclaimToFairShare: true\n"
        f"tenants:\n- {{name: {a}, weight: 1}}\n- {{name: {b}, weight: 1}}\n"
        f"- {{name: {c}, weight: 2}}\n"
    )
    await fairshare.set_config(api, config)
    pool = unique("fs")
    await asyncio.gather(
        *(make_gpu_node(f"{pool}-{k}", gpus=8, labels={POOL: pool}) for k in range(10))
    )
    namespaces = {t: await tenant_namespace(t) for t in (a, b, c)}
    for k in range(60):
        await asyncio.gather(
            *(core.create_namespaced_pod(ns, gpu_pod(f"p-{k}", pool)) for ns in namespaces.values())
        )
        await asyncio.sleep(0.05)

    async def counts() -> dict[str, int]:
        return {t: len(await running(api, ns)) for t, ns in namespaces.items()}

    async def full() -> bool:
        return sum((await counts()).values()) == 80

    await wait_for(full, timeout=120, what="80 running pods")
    await asyncio.sleep(3)
    before = await counts()
    sys.stderr.write(f"\n[e2e] burst without reclaim: {before}\n")
    assert before[c] < 40  # first come, first served: far from c's fair 40

    rec = start_reclaimer_fixture(config)
    t0 = time.monotonic()
    await wait_for(lambda: asyncio.to_thread(rec.ready), timeout=30, what="reclaimer ready")

    async def fair() -> bool:
        return await counts() == {a: 20, b: 20, c: 40}

    try:
        await wait_for(fair, timeout=120, what="20/20/40")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {await counts()}\nreclaimer log:\n{rec.tail()}") from None
    took = time.monotonic() - t0
    evicted = metric_sum(rec.port, "fairshare_reclaim_evictions_total", outcome="evicted")
    sys.stderr.write(
        f"[e2e] reclaim to fair share: 20/20/40 in {took:.1f}s, {evicted:g} evictions\n"
    )
    # Exactly what a and b held above their fair shares, and no loop afterwards.
    assert evicted == (before[a] - 20) + (before[b] - 20)
    await asyncio.sleep(4)
    assert await counts() == {a: 20, b: 20, c: 40}
    assert metric_sum(rec.port, "fairshare_reclaim_evictions_total", outcome="evicted") == evicted
    reclaimed = await core.list_namespaced_event(namespaces[a], field_selector="reason=Reclaimed")
    assert any("fair share" in (e.message or "") for e in reclaimed.items)
