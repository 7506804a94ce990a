"""Reclaim keeps the room it makes (the hold) on the real control plane.

One kwok node of 4 GPUs: tenant A runs four one-GPU pods, tenant C waits with two
one-GPU pods (created first, so they are ahead in the queue), then tenant B (guaranteed
4) brings one whole-node pod. The reclaimer evicts A's four pods for B and annotates B's
pod with its hold; the extender, freshly started with this code, keeps C's pods off the
room made for B. So B's pod binds there, C's pods stay pending, and nothing of C is
evicted (without the hold C's pods could take the freed GPUs, and reclaim would then
evict them for B).

Then no take-back, across a restart of the reclaimer: the record of who gave room to
whom is on the pods, not in the reclaimer's memory.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from fairshare import reclaim

from . import test_reclaim
from .conftest import (
    CONFIG_HEAD,
    GPU,
    POOL,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    unique,
    wait_for,
)
from .test_reclaim import Reclaimer, gpu_pod, metric_sum, running

pytestmark = pytest.mark.e2e

start_reclaimer_fixture = test_reclaim.start_reclaimer


@pytest.mark.usefixtures("fresh_extender")
async def test_the_room_made_for_a_whole_node_pod_is_kept_for_it(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
    start_reclaimer_fixture: Callable[[str], Reclaimer],
):
    core = client.CoreV1Api(api)
    a, b, c = unique("hold-a"), unique("hold-b"), unique("hold-c")
    config = CONFIG_HEAD + (
        f'tenants:\n- name: {a}\n- name: {b}\n  guaranteed:\n    {GPU}: "4"\n- name: {c}\n'
    )
    await fairshare.set_config(api, config)
    pool = unique("hold")
    node = f"{pool}-0"
    await make_gpu_node(node, gpus=4, labels={POOL: pool})
    ns_a, ns_b, ns_c = [await tenant_namespace(t) for t in (a, b, c)]
    await asyncio.gather(
        *(core.create_namespaced_pod(ns_a, gpu_pod(f"a-{k}", pool)) for k in range(4))
    )

    async def a_full() -> bool:
        return len(await running(api, ns_a)) == 4

    await wait_for(a_full, timeout=60, what=f"4 running pods of {a}")
    for k in range(2):
        await core.create_namespaced_pod(ns_c, gpu_pod(f"c-{k}", pool))
    await asyncio.sleep(1.0)
    rec = start_reclaimer_fixture(config)
    await wait_for(lambda: asyncio.to_thread(rec.ready), timeout=30, what="reclaimer ready")

    t0 = time.monotonic()
    whole = gpu_pod("b-0", pool)
    whole["spec"]["containers"][0]["resources"]["limits"][GPU] = "4"
    await core.create_namespaced_pod(ns_b, whole)

    async def b_running() -> bool:
        return len(await running(api, ns_b)) == 1

    try:
        await wait_for(b_running, timeout=60, what=f"the whole-node pod of {b}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nreclaimer log:\n{rec.tail()}") from None
    sys.stderr.write(f"\n[e2e] reclaim hold: {b}'s 4-GPU pod ran in {time.monotonic() - t0:.1f}s\n")
    b0 = await core.read_namespaced_pod("b-0", ns_b)
    assert b0.spec.node_name == node
    assert (b0.metadata.annotations or {}).get(reclaim.ANN_HELD_NODE) == node
    assert (b0.metadata.annotations or {}).get(reclaim.ANN_RECLAIMED_FROM) == a
    await asyncio.sleep(4)  # a few more reclaim rounds: nothing more is evicted
    assert await running(api, ns_c) == []
    evicted = metric_sum(rec.port, "fairshare_reclaim_evictions_total", outcome="evicted")
    assert evicted == 4, rec.tail()
    assert metric_sum(rec.port, "fairshare_reclaim_evictions_total", tenant=c) == 0
    assert metric_sum(rec.port, "fairshare_reclaim_evictions_total", tenant=a) == 4


@pytest.mark.usefixtures("fresh_extender")
async def test_a_new_reclaimer_does_not_take_back_what_reclaim_gave(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
    start_reclaimer_fixture: Callable[[str], Reclaimer],
):
    """``reclaimToFairShare``, one node of 4 GPUs. The giver runs 4 pods; the receiver
    brings 2 and reclaim evicts 2 of the giver's for them (each records the giver). The
    reclaimer stops; the giver asks for 2 pods again, and a third tenant (guaranteed 2)
    brings a 2-GPU pod. A new reclaimer (no memory of the first, its own cool-down
    empty) evicts the giver's last 2 pods for that guarantee (the giver and the receiver
    are equally above their fair shares of 1 GPU; the smaller name goes first): the
    giver is at 0, below its fair share, the receiver at 2, above. Reclaim toward fair
    share would now evict a receiver's pod for the giver, undoing the first eviction;
    the records on the receiver's pods keep it from doing so."""
    core = client.CoreV1Api(api)
    giver, receiver, third = unique("tb-a"), unique("tb-b"), unique("tb-c")
    config = CONFIG_HEAD + (
        "reclaimToFairShare: true\nyieldBand: 0\n"
        f"tenants:\n- name: {giver}\n- name: {receiver}\n"
        f'- name: {third}\n  guaranteed:\n    {GPU}: "2"\n'
    )
    await fairshare.set_config(api, config)
    pool = unique("takeback")
    await make_gpu_node(f"{pool}-0", gpus=4, labels={POOL: pool})
    ns_g, ns_r, ns_t = [await tenant_namespace(t) for t in (giver, receiver, third)]
    await asyncio.gather(
        *(core.create_namespaced_pod(ns_g, gpu_pod(f"g-{k}", pool)) for k in range(4))
    )

    def count(ns: str, n: int) -> Callable[[], Any]:
        async def check() -> bool:
            return len(await running(api, ns)) == n

        return check

    await wait_for(count(ns_g, 4), timeout=60, what=f"4 running pods of {giver}")
    first = start_reclaimer_fixture(config)
    await wait_for(lambda: asyncio.to_thread(first.ready), timeout=30, what="reclaimer ready")
    for k in range(2):
        await core.create_namespaced_pod(ns_r, gpu_pod(f"r-{k}", pool))
    try:
        await wait_for(count(ns_r, 2), timeout=60, what=f"2 running pods of {receiver}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nreclaimer log:\n{first.tail()}") from None
    for p in await running(api, ns_r):
        assert (p.metadata.annotations or {}).get(reclaim.ANN_RECLAIMED_FROM) == giver
    assert metric_sum(first.port, "fairshare_reclaim_evictions_total", tenant=giver) == 2
    first.stop()

    for k in range(2):
        await core.create_namespaced_pod(ns_g, gpu_pod(f"g-again-{k}", pool))
    pair = gpu_pod("t-0", pool)
    pair["spec"]["containers"][0]["resources"]["limits"][GPU] = "2"
    await core.create_namespaced_pod(ns_t, pair)
    second = start_reclaimer_fixture(config)
    await wait_for(lambda: asyncio.to_thread(second.ready), timeout=30, what="reclaimer ready")
    try:
        await wait_for(count(ns_t, 1), timeout=60, what=f"the guaranteed pod of {third}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nreclaimer log:\n{second.tail()}") from None
    await asyncio.sleep(5)  # several more rounds of the new reclaimer (1 s apart)
    assert len(await running(api, ns_r)) == 2, second.tail()
    assert await running(api, ns_g) == []
    assert metric_sum(second.port, "fairshare_reclaim_evictions_total", tenant=receiver) == 0
    assert metric_sum(second.port, "fairshare_reclaim_evictions_total", tenant=giver) == 2
