"""``yieldBand`` on the real control plane.

Two nodes of 8 GPUs. Tenant a holds 9 GPUs, b 7 (the cluster is full); then a asks for 3
more (of a higher priority, so kube-scheduler tries them first; they never preempt) and,
a moment later, b for 5: nothing fits, both wait. A third 8-GPU node joins, so both are
owed 12 of 24 and both are below that.

Without the band (0, the default) the gate has nothing to say below the fair share: a's
pods, first in kube-scheduler's queue, are placed as they come, and no FailedScheduling
event of a's mentions the band. With ``yieldBand: 1`` a's pods wait while b, further
behind its share (7 of 12 against a's 9 of 12), has pods that fit: kube-scheduler tries
a's pods first and its FailedScheduling event on one of them carries the band's own
reason ("tenant a near its fair share (... yieldBand 1) while b waits"), which nothing
but the band writes. Either way both end at 12.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from .conftest import (
    CONFIG_HEAD,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    unique,
    wait_event,
    wait_for,
)
from .test_fairshare_scheduling import POOL, bound, create_pods, pod_manifest

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
async def fresh_extender(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender: no pending pods of earlier tests in its queue."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


async def _events(api: client.ApiClient, namespace: str) -> list[str]:
    core = client.CoreV1Api(api)
    found = await core.list_namespaced_event(namespace)
    return [e.message or "" for e in found.items if e.reason == "FailedScheduling"]


@pytest.mark.parametrize("band", [0, 1], ids=["off", "band-1"])
async def test_below_the_fair_share_the_band_lets_the_tenant_further_behind_go_first(
    band: int,
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    a, b = unique("yb-a"), unique("yb-b")
    option = f"yieldBand: {band}\n"
    await fairshare.set_config(api, CONFIG_HEAD + option + f"tenants:\n- name: {a}\n- name: {b}\n")
    pool = unique("yb")
    for k in (1, 2):
        await make_gpu_node(f"{pool}-{k}", gpus=8, labels={POOL: pool})
    ns_a, ns_b = await tenant_namespace(a), await tenant_namespace(b)

    async def held(ns: str, n: int) -> bool:
        return len(await bound(api, ns)) == n

    await create_pods(api, ns_a, [pod_manifest(f"a-{i}", pool, gpus=1) for i in range(9)])
    await create_pods(api, ns_b, [pod_manifest(f"b-{i}", pool, gpus=1) for i in range(7)])
    await wait_for(lambda: held(ns_a, 9), timeout=60, what=f"{a}'s 9 pods bound")
    await wait_for(lambda: held(ns_b, 7), timeout=60, what=f"{b}'s 7 pods bound")

    # a's next pods go first in kube-scheduler's queue (priority), without preempting.
    first = unique("yb-first")
    await client.SchedulingV1Api(api).create_priority_class(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": first},
            "value": 1000,
            "preemptionPolicy": "Never",
        }
    )
    try:
        await _contend(api, fairshare, pool, ns_a, ns_b, first)
        await make_gpu_node(f"{pool}-3", gpus=8, labels={POOL: pool})

        async def both_at_12() -> bool:
            na, nb = len(await bound(api, ns_a)), len(await bound(api, ns_b))
            return na == 12 and nb == 12

        await wait_for(both_at_12, timeout=90, what=f"{a} and {b} at 12 GPUs each")
    finally:
        await client.SchedulingV1Api(api).delete_priority_class(first)
    if band:
        # Only the band writes this reason: below the fair share the gate is silent
        # without it. kube-scheduler tried a's pods first, while b had pods that fit.
        async def band_reason() -> str | None:
            return next((m for m in await _events(api, ns_a) if "yieldBand" in m), None)

        what = f"a FailedScheduling event of {a}'s with the band's reason"
        m = await wait_for(band_reason, timeout=15, what=what)
        assert f"tenant {a} near its fair share (" in m and "yieldBand 1)" in m, m
        assert f"while {b} waits" in m, m
    else:
        assert not [m for m in await _events(api, ns_a) if "yieldBand" in m]


async def _contend(
    api: client.ApiClient,
    fairshare: FairshareDev,
    pool: str,
    ns_a: str,
    ns_b: str,
    priority_class: str,
) -> None:
    """a's 3 more pods (of ``priority_class``), then b's 5, all tried and refused by
    kube-scheduler (the cluster is full) and seen by the extender; returns past
    kube-scheduler's backoff, so the next node moves them all to its active queue
    together, where a's come first."""
    more_a = [pod_manifest(f"a-{i}", pool, gpus=1) for i in range(9, 12)]
    more_b = [pod_manifest(f"b-{i}", pool, gpus=1) for i in range(7, 12)]
    for pod in more_a + more_b:
        # The next node starts tainted (not-ready or unreachable until kwok reports it
        # Ready): without this, kube-scheduler's own taint filter refuses every pod when
        # the node appears, and b's pods count as unschedulable by kube-scheduler
        # (holding no one) until it asks the extender about them again, after a's, which
        # then pass: no band to see (a race of the test, seen in about 1 run in 10).
        pod["spec"].setdefault("tolerations", []).extend(
            {"key": key, "operator": "Exists", "effect": "NoSchedule"}
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        )
    for pod in more_a:
        pod["spec"]["priorityClassName"] = priority_class

    async def priority_class_admitted() -> bool:
        # The Priority admission plugin learns new PriorityClasses through an informer:
        # a pod created at once may be refused ("no PriorityClass with name ...").
        try:
            await client.CoreV1Api(api).create_namespaced_pod(ns_a, more_a[0], dry_run="All")
        except client.exceptions.ApiException as exc:
            if exc.status == 403 and "PriorityClass" in str(exc.body):
                return False
            raise
        return True

    await wait_for(priority_class_admitted, timeout=30, what=f"PriorityClass {priority_class}")
    await create_pods(api, ns_a, more_a)
    await asyncio.sleep(1)  # a's pods are the older ones
    await create_pods(api, ns_b, more_b)
    waiting = [(ns_a, f"a-{i}") for i in range(9, 12)] + [(ns_b, f"b-{i}") for i in range(7, 12)]
    for ns, name in waiting:
        await wait_event(api, ns, involved_name=name, reason="FailedScheduling")
    names = {f"{ns}/{name}" for ns, name in waiting}

    async def extender_sees_all() -> bool:
        status = await asyncio.to_thread(fairshare.extender_status)
        return names <= {p["pod"] for p in status["pendingPods"] + status["heldPods"]}

    # The extender's pod watch has every waiting pod (and its demand: b's fitting pods).
    await wait_for(extender_sees_all, timeout=60, what=f"the extender to see {sorted(names)}")
    await asyncio.sleep(2.5)  # past kube-scheduler's backoff (podMaxBackoffSeconds 2)
