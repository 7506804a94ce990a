"""One tenant must not freeze the others, on the real control plane (issue 31, items 1-3).

* A tenant's pods that kube-scheduler can never place (a required pod affinity on a label
  no pod carries) hold nobody back: kube-scheduler's own verdict in their ``PodScheduled``
  condition says so, and the other tenant takes every GPU.
* Pods the gate held move as soon as the gate lifts (the requeue annotation), not at
  kube-scheduler's 5-minute flush of unschedulable pods.
* Preemption respects fair shares: with both tenants at their fair share, a high-priority
  pod displaces its own tenant's low-priority pod, not the other tenant's; with another
  tenant above its fair share, one of that tenant's, not one of a third tenant at its fair
  share. In both cases the pods are laid out so that kube-scheduler's own choice of
  victim (the lower-priority pod that started last) is a pod fairshare must spare.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

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
from .test_fairshare_scheduling import POOL, bound, create_pods, pod_manifest, pods_of

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_extender")]


def config(*tenants: str, extra: str = "") -> str:
    return CONFIG_HEAD + extra + "tenants:\n" + "".join(f"- name: {t}\n" for t in tenants)


def affinity_pod(name: str, pool: str, gpus: int) -> dict[str, Any]:
    """A pod that must run beside a pod labelled ``fairshare-e2e/partner`` (none exists)."""
    pod = pod_manifest(name, pool, gpus=gpus)
    pod["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"fairshare-e2e/partner": "nobody"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    return pod


async def test_unplaceable_pods_of_one_tenant_leave_the_gpus_to_the_other(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
) -> None:
    a, b = unique("ti-a"), unique("ti-b")
    await fairshare.set_config(api, config(a, b))
    pool = unique("ti")
    for k in range(2):
        await make_gpu_node(f"{pool}-{k}", gpus=4, labels={POOL: pool})
    ns_a, ns_b = await tenant_namespace(a), await tenant_namespace(b)

    await create_pods(api, ns_b, [affinity_pod(f"b-{i}", pool, 1) for i in range(4)])
    started = time.monotonic()
    await create_pods(api, ns_a, [pod_manifest(f"a-{i}", pool, gpus=1) for i in range(8)])

    async def a_has_all() -> bool:
        return len(await bound(api, ns_a)) == 8

    await wait_for(a_has_all, timeout=30, what=f"tenant {a}'s 8 pods bound on 8 GPUs")
    took = time.monotonic() - started
    assert not await bound(api, ns_b), "b's pods cannot run anywhere, yet one was bound"
    # kube-scheduler's own verdict stands on b's pods, and fairshare shows it.
    for p in await pods_of(api, ns_b):
        cond = next(c for c in p.status.conditions or [] if c.type == "PodScheduled")
        assert cond.reason == "Unschedulable" and "pod affinity" in cond.message
    status = fairshare.extender_status()
    pending = {e["pod"]: e for e in status.get("pendingPods", [])}
    entry = pending[f"{ns_b}/b-0"]
    assert entry["reason"].startswith("unschedulable by kube-scheduler"), entry
    print(f"\n{a}: 8/8 GPUs {took:.1f}s after its pods were created; b pending")


async def test_held_pods_bind_within_seconds_once_the_waiting_pod_goes(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
) -> None:
    """holdForBlockedTenants: a's 2 pods above its fair share wait for b's blocked 4-GPU
    pod; b gives up (deletes it). Nothing else happens in the cluster, so only fairshare's
    requeue can bring a's pods back before kube-scheduler's 5-minute flush."""
    a, b = unique("tr-a"), unique("tr-b")
    await fairshare.set_config(api, config(a, b, extra="holdForBlockedTenants: true\n"))
    node = unique("tr")
    await make_gpu_node(node, gpus=8, labels={POOL: node})
    ns_a, ns_b = await tenant_namespace(a), await tenant_namespace(b)
    await create_pods(api, ns_a, [pod_manifest(f"a-{i}", node, gpus=1) for i in range(6)])

    async def a_has(n: int) -> bool:
        return len(await bound(api, ns_a)) == n

    await wait_for(lambda: a_has(6), timeout=60, what=f"tenant {a}'s first 6 pods bound")
    await create_pods(api, ns_b, [pod_manifest("b-big", node, gpus=4)])

    async def extender_sees_b() -> bool:
        status = await asyncio.to_thread(fairshare.extender_status)
        return any(e["pod"] == f"{ns_b}/b-big" for e in status.get("pendingPods", []))

    await wait_for(extender_sees_b, timeout=20, what="the extender's view of b's pending pod")
    await create_pods(api, ns_a, [pod_manifest(f"a-{i}", node, gpus=1) for i in (6, 7)])
    for name in ("a-6", "a-7"):
        await wait_event(
            api, ns_a, involved_name=name, reason="FailedScheduling", contains=f"while {b} waits"
        )
    await asyncio.sleep(2)  # both held pods back in kube-scheduler's unschedulable pool
    assert len(await bound(api, ns_a)) == 6
    await client.CoreV1Api(api).delete_namespaced_pod("b-big", ns_b, grace_period_seconds=0)
    gone = time.monotonic()
    await wait_for(lambda: a_has(8), timeout=10, what=f"{a}'s held pods bound within 10 s")
    took = time.monotonic() - gone
    pods = {p.metadata.name: p for p in await pods_of(api, ns_a)}
    assert "fairshare.io/requeued-at" in (pods["a-6"].metadata.annotations or {})
    print(f"\nheld pods bound {took:.1f}s after the waiting pod was deleted")


@pytest.fixture
async def priorities(api: client.ApiClient) -> AsyncIterator[tuple[str, str]]:
    low, high = unique("ti-low"), unique("ti-high")
    sched = client.SchedulingV1Api(api)
    for name, value in ((low, 10), (high, 1000)):
        await sched.create_priority_class(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )
    yield low, high
    for name in (low, high):
        await sched.delete_priority_class(name)


def with_priority(pod: dict[str, Any], priority_class: str) -> dict[str, Any]:
    pod["spec"]["priorityClassName"] = priority_class
    return pod


START_GAP = 2.5
"""Seconds between the last start of the older pods and the creation of the newer ones:
``status.startTime`` has a resolution of 1 s, and kube-scheduler orders victims by it."""


async def run_pinned(
    api: client.ApiClient, pods: dict[str, list[dict[str, Any]]]
) -> dict[str, client.V1Pod]:
    """Create ``pods`` (namespace -> manifests) and return them by name once every one is
    bound and has its ``status.startTime``."""
    for namespace, manifests in pods.items():
        await create_pods(api, namespace, manifests)

    async def running() -> dict[str, client.V1Pod] | None:
        out: dict[str, client.V1Pod] = {}
        for namespace, manifests in pods.items():
            listed = {p.metadata.name: p for p in await pods_of(api, namespace)}
            for m in manifests:
                p = listed.get(m["metadata"]["name"])
                if p is None or not p.spec.node_name or not p.status.start_time:
                    return None
                out[p.metadata.name] = p
        return out

    n = sum(len(m) for m in pods.values())
    return await wait_for(running, timeout=60, what=f"{n} low-priority pods running")


@pytest.mark.parametrize("b_above", [False, True], ids=["both-at-fair-share", "b-above"])
async def test_preemption_takes_from_the_own_tenant_or_a_tenant_above_its_fair_share(
    b_above: bool,
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
    priorities: tuple[str, str],
) -> None:
    """kube-scheduler alone evicts, on each node, the lower-priority pod that started last
    (equal priorities), and picks the node whose victim started last. Each case pins pods
    to nodes so that kube-scheduler's victim is one fairshare must spare:

    * both-at-fair-share: a and b run 2 low-priority pods on each node, b's started after
      a's. kube-scheduler would evict one of b's (at its fair share); fairshare evicts one
      of a's own low-priority pods instead, on the node a's high-priority pod goes to.
    * b-above: b runs 6 pods (4 on node 0, 2 on node 1), above its fair share; c runs 2
      on node 1, started after all of b's, at its fair share. kube-scheduler would evict
      one of c's (node 1 holds the newest victim); fairshare evicts one of b's, on node 0.
    """
    low, high = priorities
    a, b, c = unique("tp-a"), unique("tp-b"), unique("tp-c")
    tenants = (a, b, c) if b_above else (a, b)
    await fairshare.set_config(api, config(*tenants))
    pool = unique("tp")
    nodes = [f"{pool}-{k}" for k in range(2)]
    for node in nodes:
        await make_gpu_node(node, gpus=4, labels={POOL: pool})
    ns = {t: await tenant_namespace(t) for t in tenants}

    def pinned(name: str, node: str) -> dict[str, Any]:
        pod = pod_manifest(name, pool, gpus=1, node_selector={"kubernetes.io/hostname": node})
        return with_priority(pod, low)

    if b_above:
        older = {ns[b]: [pinned(f"b-{i}", nodes[i // 4]) for i in range(6)]}
        newer = {ns[c]: [pinned(f"c-{i}", nodes[1]) for i in range(2)]}
    else:
        older = {ns[a]: [pinned(f"a-{i}", nodes[i % 2]) for i in range(4)]}
        newer = {ns[b]: [pinned(f"b-{i}", nodes[i % 2]) for i in range(4)]}
    old = await run_pinned(api, older)
    await asyncio.sleep(START_GAP)
    new = await run_pinned(api, newer)
    # The layout kube-scheduler's own choice depends on: the newer pods started later.
    last_old = max(p.status.start_time for p in old.values())
    first_new = min(p.status.start_time for p in new.values())
    assert first_new > last_old, (first_new, last_old)

    await create_pods(api, ns[a], [with_priority(pod_manifest("a-high", pool, gpus=1), high)])

    async def high_node() -> str | None:
        pods = {p.metadata.name: p for p in await pods_of(api, ns[a])}
        return pods["a-high"].spec.node_name if "a-high" in pods else None

    node = await wait_for(high_node, timeout=60, what="a's high-priority pod bound by preemption")
    await asyncio.sleep(1)
    live: dict[str, set[str]] = {}
    for t in tenants:
        pods = await pods_of(api, ns[t])
        live[t] = {p.metadata.name for p in pods if not p.metadata.deletion_timestamp}
    gone = sorted((set(old) | set(new)) - set().union(*live.values()))
    where = {name: (old | new)[name].spec.node_name for name in gone}
    if b_above:
        # b held 6 of 8 GPUs, above its fair share: one of its pods on node 0 made room;
        # c's pods, the newest, kube-scheduler's own victims, stay.
        assert live[c] == {"c-0", "c-1"}, f"c (at its fair share) lost a pod: {where}"
        assert len(where) == 1 and where[gone[0]] == nodes[0] == node, (where, node)
        assert gone[0].startswith("b-") and live[a] == {"a-high"}, (where, live)
    else:
        # Both at their fair share: a's own low-priority pod made room; b kept its 4.
        assert live[b] == set(new), f"b (at its fair share) lost a pod: {where}"
        assert len(where) == 1 and gone[0].startswith("a-") and where[gone[0]] == node, (
            where,
            node,
        )
        assert len(live[a]) == 4 and "a-high" in live[a]
