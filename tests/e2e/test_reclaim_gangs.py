"""Reclaim evicts whole gangs only, on the real control plane.

Two kwok nodes of 4 GPUs. Tenant A (no guarantee) runs a gang of three 2-GPU members
(the coscheduling label and ``fairshare.io/gang-min-members: "3"``; the extender's plan
puts two members on one node and the third on the other) and two lone 1-GPU pods beside
the third member: all 8 GPUs. Tenant B (guaranteed 4) asks for a 2-GPU pod, then for
another.

* First pod: per pod, the cheapest room is one gang member (one victim), which would
  leave A's job with 2 of its 3 members, lost. By whole groups, the two lone pods (2
  pods) cost less than the gang (3 pods): they go, and the gang runs on untouched.
* Second pod: only the gang frees 2 GPUs on one node: all three members are evicted (on
  both nodes), as one decision: one ``ReclaimedFor`` Event on B's pod naming the group.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from . import test_reclaim
from .conftest import (
    CONFIG_HEAD,
    GPU,
    PAUSE_IMAGE,
    POOL,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    unique,
    wait_event,
    wait_for,
)
from .test_reclaim import Reclaimer, metric_sum, running

pytestmark = pytest.mark.e2e

start_reclaimer_fixture = test_reclaim.start_reclaimer
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
MIN_MEMBERS = "fairshare.io/gang-min-members"
MEMBERS = {f"job-{k}" for k in range(3)}


@pytest.fixture(autouse=True)
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender (no plans or pending pods of earlier tests)."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


def gpu_pod(name: str, pool: str, gpus: int, group: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if group:
        meta["labels"] = {GROUP_LABEL: group}
        meta["annotations"] = {MIN_MEMBERS: "3"}
    limits = {"cpu": "100m", "memory": "128Mi", GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": {POOL: pool},
            "terminationGracePeriodSeconds": 0,
        },
    }


async def test_reclaim_evicts_whole_gangs_only(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
    start_reclaimer_fixture: Callable[[str], Reclaimer],
):
    core = client.CoreV1Api(api)
    a, b = unique("rg-a"), unique("rg-b")
    config = CONFIG_HEAD + f'tenants:\n- name: {a}\n- name: {b}\n  guaranteed:\n    {GPU}: "4"\n'
    await fairshare.set_config(api, config)
    pool = unique("rg")
    await asyncio.gather(
        *(make_gpu_node(f"{pool}-{k}", gpus=4, labels={POOL: pool}) for k in range(2))
    )
    ns_a, ns_b = await tenant_namespace(a), await tenant_namespace(b)

    for name in sorted(MEMBERS):
        await core.create_namespaced_pod(ns_a, gpu_pod(name, pool, 2, group="job"))

    async def names_running(ns: str) -> set[str]:
        return {p.metadata.name for p in await running(api, ns)}

    async def gang_runs() -> bool:
        return await names_running(ns_a) >= MEMBERS

    await wait_for(gang_runs, timeout=90, what=f"{a}'s gang running whole")
    for k in range(2):
        await core.create_namespaced_pod(ns_a, gpu_pod(f"lone-{k}", pool, 1))

    async def a_full() -> bool:
        return len(await names_running(ns_a)) == 5

    await wait_for(a_full, timeout=60, what=f"{a} holding all 8 GPUs")
    where = {p.metadata.name: p.spec.node_name for p in await running(api, ns_a)}
    sys.stderr.write(f"\n[e2e] reclaim of gangs: {a} runs {where}\n")

    rec = start_reclaimer_fixture(config)
    await wait_for(lambda: asyncio.to_thread(rec.ready), timeout=30, what="reclaimer ready")

    # B's first 2-GPU pod: the lone pods go, the gang stays whole.
    await core.create_namespaced_pod(ns_b, gpu_pod("b-0", pool, 2))

    async def b_runs(n: int) -> bool:
        return len(await names_running(ns_b)) == n

    try:
        await wait_for(lambda: b_runs(1), timeout=60, what=f"{b}'s first pod running")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nreclaimer log:\n{rec.tail()}") from None
    left = await names_running(ns_a)
    assert left >= MEMBERS, f"the gang lost members: {sorted(left)}\n{rec.tail()}"
    assert left == MEMBERS
    await asyncio.sleep(3)  # no more evictions: B has its pod
    assert await names_running(ns_a) == MEMBERS
    assert metric_sum(rec.port, "fairshare_reclaim_evictions_total", outcome="evicted") == 2

    # B's second 2-GPU pod (B up to its guarantee of 4): the whole gang goes, on both nodes.
    await core.create_namespaced_pod(ns_b, gpu_pod("b-1", pool, 2))
    try:
        await wait_for(lambda: b_runs(2), timeout=60, what=f"{b}'s second pod running")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nreclaimer log:\n{rec.tail()}") from None

    async def gang_gone() -> bool:
        return not (await names_running(ns_a)) & MEMBERS

    await wait_for(gang_gone, timeout=30, what="every member of the gang evicted")
    reclaimed = await core.list_namespaced_event(ns_a, field_selector="reason=Reclaimed")
    victims = {e.involved_object.name for e in reclaimed.items}
    assert victims == MEMBERS | {"lone-0", "lone-1"}
    assert all(
        f"pod group {ns_a}/job" in (e.message or "")
        for e in reclaimed.items
        if e.involved_object.name in MEMBERS
    )
    made_room = await wait_event(
        api, ns_b, involved_name="b-1", reason="ReclaimedFor", contains=f"pod group {ns_a}/job"
    )
    assert "3 pods" in (made_room.message or "")
    assert metric_sum(rec.port, "fairshare_reclaim_evictions_total", outcome="evicted") == 5
    assert "evicted pod group" in rec.log.read_text()
