"""A pod group recovers whole after a hardware fault, and its tenant is not charged for
the run the fault took (``health.recoverGangs``, ``health.forgiveFaults``), on the real
control plane.

An Indexed Job of two 4-GPU members (the coscheduling label and
``fairshare.io/gang-min-members: "2"``) runs on two kwok nodes of 4 GPUs. The node of
one member is tainted as NVSentinel taints a node with a fatal GPU error
(``nvidia.com/gpu-error=fatal:NoExecute``); kube-controller-manager's taint eviction
deletes that member and the Job controller recreates it.

* With a spare node: the extender evicts the other member (a ``HardwareRecovery``
  Event), the Job recreates it, and the group is bound whole again on the two healthy
  nodes: no pod of the lost run is left bound. ``fairshare_gangs_recovered_total``
  counts it and ``fairshare explain`` names the loss on a recreated member.
* Without one (the recreated group cannot fit): the tenant's usage history, which held
  the run, drops back near nothing once the lost run is forgiven.
* With the tenant's newer pod waiting for room when the fault frees a node: the
  restarted group goes first (the newer pod is held), so it is bound whole.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from kubernetes_asyncio import client

from .conftest import (
    CONFIG_HEAD,
    GPU,
    PAUSE_IMAGE,
    POOL,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    dev_module,
    unique,
    wait_event,
    wait_for,
)

pytestmark = pytest.mark.e2e

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
MIN_MEMBERS = "fairshare.io/gang-min-members"
KWOK_RUN_FOR = "pod-complete.stage.kwok.x-k8s.io/delay"
FATAL = {"key": "nvidia.com/gpu-error", "value": "fatal", "effect": "NoExecute"}
"""The taint NVSentinel's fault quarantine documents for a fatal GPU error."""


@pytest.fixture(autouse=True)
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender (no plans, losses or pending pods of earlier tests)."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


def indexed_job(name: str, pool: str) -> dict[str, Any]:
    """Two 4-GPU members, one pod group, recreated by the Job controller when lost."""
    limits = {"cpu": "100m", "memory": "128Mi", GPU: "4"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 20,
            "template": {
                "metadata": {
                    "labels": {GROUP_LABEL: name},
                    # kwok completes Job pods at once unless told to run them longer.
                    "annotations": {MIN_MEMBERS: "2", KWOK_RUN_FOR: "1h"},
                },
                "spec": {
                    "containers": [
                        {"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}
                    ],
                    "nodeSelector": {POOL: pool},
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


async def job_pods(api: client.ApiClient, namespace: str, job: str) -> list[Any]:
    pods = await client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
    )
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


async def bound(api: client.ApiClient, namespace: str, job: str) -> dict[str, str]:
    """uid -> node of the job's live bound pods."""
    return {uid: node for uid, (_, node) in (await bound_pods(api, namespace, job)).items()}


async def bound_pods(api: client.ApiClient, namespace: str, job: str) -> dict[str, tuple[str, str]]:
    """uid -> (name, node) of the job's live bound pods."""
    return {
        p.metadata.uid: (p.metadata.name, p.spec.node_name)
        for p in await job_pods(api, namespace, job)
        if p.spec.node_name and p.status.phase not in ("Failed", "Succeeded")
    }


async def start_job(api: client.ApiClient, namespace: str, job: str, pool: str) -> dict[str, str]:
    await client.BatchV1Api(api).create_namespaced_job(namespace, indexed_job(job, pool))
    got: dict[str, str] = {}

    async def whole() -> bool:
        got.clear()
        got.update(await bound(api, namespace, job))
        return len(got) == 2

    await wait_for(whole, timeout=90, what=f"job {namespace}/{job} bound whole")
    return dict(got)


async def taint(api: client.ApiClient, node: str) -> None:
    await client.CoreV1Api(api).patch_node(node, {"spec": {"taints": [FATAL]}})


def recovered_total(fairshare: FairshareDev) -> float:
    try:
        return fairshare.metric("extender", "fairshare_gangs_recovered_total")
    except Exception:
        return 0.0


async def test_a_gang_member_lost_to_a_fatal_gpu_taint_restarts_the_gang_whole(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
) -> None:
    a = unique("hw")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {a}\n")
    ns = await tenant_namespace(a)
    pool = unique("hwpool")
    nodes = [unique("hw") for _ in range(2)]
    for n in nodes:
        await make_gpu_node(n, gpus=4, cpu="16", memory="64Gi", labels={POOL: pool})
    before = await asyncio.to_thread(recovered_total, fairshare)
    first = await start_job(api, ns, "train", pool)
    names = await bound_pods(api, ns, "train")
    spare = unique("hw-spare")
    await make_gpu_node(spare, gpus=4, cpu="16", memory="64Gi", labels={POOL: pool})

    broken = sorted(first.values())[0]
    await taint(api, broken)

    seen: dict[str, str] = {}

    async def whole_again() -> bool:
        seen.clear()
        seen.update(await bound(api, ns, "train"))
        return len(seen) == 2 and not set(seen) & set(first)

    try:
        await wait_for(whole_again, timeout=120, what="the job bound whole by new pods")
    except AssertionError:
        raise AssertionError(
            f"the job did not restart whole: bound now {seen}, of the lost run "
            f"{sorted(set(seen) & set(first))} still bound (first run: {first})"
        ) from None
    assert broken not in seen.values()
    assert sorted(seen.values()) == sorted({*nodes, spare} - {broken})
    # The member on the healthy node was evicted for the group, and told why.
    healthy = next(name for name, node in names.values() if node != broken)
    await wait_event(api, ns, involved_name=healthy, reason="HardwareRecovery", contains=broken)

    async def counted() -> bool:
        return await asyncio.to_thread(recovered_total, fairshare) >= before + 1

    await wait_for(counted, timeout=20, what="fairshare_gangs_recovered_total to count it")

    # fairshare explain names the loss on a recreated member.
    pod = sorted(p.metadata.name for p in await job_pods(api, ns, "train"))[0]
    dev = dev_module()
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "fairshare_cli", "explain", f"{ns}/{pod}", "-o", "json",
         "--kubeconfig", str(fairshare.cluster.kubeconfig),
         "--config-namespace", dev.SYSTEM_NAMESPACE],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    hw = report.get("hardware")
    assert hw is not None, report
    assert hw["role"] == "replaces" and hw["gang"] is True
    assert broken in hw["reason"]


async def test_the_run_lost_to_hardware_is_not_charged_to_the_tenant(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
) -> None:
    a, b = unique("hwa"), unique("hwb")
    tenants = f"tenants:\n- name: {a}\n- name: {b}\n"
    await fairshare.set_config(api, CONFIG_HEAD + "usageHistory: {halfLife: 10m}\n" + tenants)
    ns = await tenant_namespace(a)
    pool = unique("hwpool")
    nodes = [unique("hw") for _ in range(2)]
    for n in nodes:
        await make_gpu_node(n, gpus=4, cpu="16", memory="64Gi", labels={POOL: pool})
    # b wants GPUs too, so that a's history is judged (a tenant without demand is not).
    await make_gpu_node(unique("hw-b"), gpus=1, cpu="4", memory="8Gi", labels={POOL: pool + "b"})
    first = await start_job(api, ns, "train", pool)

    def usage_share() -> float:
        status = fairshare.extender_status()
        tenants_ = (status.get("usageHistory") or {}).get("tenants") or {}
        return float((tenants_.get(a) or {}).get("usageShare", 0.0))

    held: list[float] = []

    async def charged() -> bool:
        held.append(await asyncio.to_thread(usage_share))
        return held[-1] > 0.05

    await wait_for(charged, timeout=60, what=f"tenant {a}'s history to hold its run")
    await asyncio.sleep(15)  # the run goes on: ~15 s of 8 GPUs more in the history
    peak = await asyncio.to_thread(usage_share)
    broken = sorted(first.values())[0]
    await taint(api, broken)

    async def lost_run_gone() -> bool:
        return not set(await bound(api, ns, "train")) & set(first)

    await wait_for(lost_run_gone, timeout=60, what="the lost run's pods gone")
    await asyncio.sleep(12)  # two history steps at least (every 5 s)
    after = await asyncio.to_thread(usage_share)
    # Nothing of the new run is bound (one healthy node cannot hold both members), so a
    # forgiven history holds a few seconds of slack at most; the run charged would leave
    # it near its peak (a 10-minute half-life decays 12 s by 1.4 %).
    print(f"\n[gang recovery] tenant {a}'s usage share {peak:.4f} at the loss, {after:.4f} after")
    assert not await bound(api, ns, "train")
    assert after < 0.25 * peak, (
        f"tenant {a}'s usage share is {after:.4f} after the loss, {peak:.4f} at its peak: "
        "the lost run was charged"
    )


async def test_the_restarted_gang_keeps_its_place_ahead_of_the_tenants_newer_pod(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
) -> None:
    """Tenant a's job runs on both nodes of its pool; a's newer 4-GPU pod ``late`` waits
    for room. The fault frees the job's healthy node at once (its member is evicted) and
    a spare node joins, but the Job controller recreates the members only after its
    back-off: without the hold, ``late`` takes the freed node first and the restarted job
    cannot fit whole. With it, the job is bound whole and ``late`` still waits."""
    a = unique("hwq")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {a}\n")
    ns = await tenant_namespace(a)
    pool = unique("hwpool")
    nodes = [unique("hwq") for _ in range(2)]
    for n in nodes:
        await make_gpu_node(n, gpus=4, cpu="16", memory="64Gi", labels={POOL: pool})
    first = await start_job(api, ns, "train", pool)
    core = client.CoreV1Api(api)
    limits = {"cpu": "100m", "memory": "128Mi", GPU: "4"}
    late = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "late"},
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": {POOL: pool},
            "terminationGracePeriodSeconds": 0,
        },
    }
    await core.create_namespaced_pod(ns, late)
    await asyncio.sleep(2)  # kube-scheduler has tried it: no room
    assert not (await core.read_namespaced_pod("late", ns)).spec.node_name

    broken = sorted(first.values())[0]
    await taint(api, broken)
    await make_gpu_node(unique("hwq-spare"), gpus=4, cpu="16", memory="64Gi", labels={POOL: pool})
    seen: dict[str, str] = {}
    late_node: list[str | None] = []

    async def whole_again() -> bool:
        seen.clear()
        seen.update(await bound(api, ns, "train"))
        late_node.append((await core.read_namespaced_pod("late", ns)).spec.node_name)
        return len(seen) == 2 and not set(seen) & set(first)

    try:
        await wait_for(whole_again, timeout=120, what="the job bound whole by new pods")
    except AssertionError:
        raise AssertionError(
            f"the restarted job did not get its place back: bound now {seen}; "
            f"a's newer pod late is on {late_node[-1] if late_node else None}"
        ) from None
    assert late_node[-1] is None, f"late was bound to {late_node[-1]} ahead of the job"
    # The hold told kube-scheduler why late waits.
    await wait_event(
        api,
        ns,
        involved_name="late",
        reason="FailedScheduling",
        contains="restarts after a hardware fault",
    )
