"""Fairness with memory (``usageHistory``) on the real control plane: the extender's
leader keeps the tenants' usage history in ConfigMap ``fairshare-usage-history``, shows
it in ``/status.json``, and reads it back after a restart, decayed over the gap and
nothing added; the history changes who the gate lets go first; a wrong half-life is
refused by the config guard with a clear message."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from typing import Any, NamedTuple

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    CONFIG_HEAD,
    FairshareDev,
    dev_module,
    gpu_pod_manifest,
    unique,
    wait_for,
)

pytestmark = pytest.mark.e2e

CONFIGMAP = "fairshare-usage-history"
GPU = "nvidia.com/gpu"
MILLI = 1000
"""The history's GPU unit: milli-GPU (times seconds)."""
HALF_LIFE = "1m"
"""The shortest half-life the config takes: over a restart's gap of a few seconds the
history loses several percent, far more than the read-back's slack."""
READ_BACK_SLACK = 0.25
"""Seconds of a tenant's usage a new leader may fold in between decaying the history it
read back and its first record (two clock readings with no await in between)."""
ON_RECORD = 8 * MILLI * 10.0
"""The GPU history (milli-GPU-seconds, decayed) of 8 GPUs held for 10 s: a record that
holds at least that is a leader's write 30 s into its history. The write at its first
look, when it read a record back, holds a fraction of a second at most."""


async def recorded(api: client.ApiClient) -> dict[str, Any] | None:
    dev = dev_module()
    try:
        cm = await client.CoreV1Api(api).read_namespaced_config_map(CONFIGMAP, dev.SYSTEM_NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    data: dict[str, Any] = json.loads((cm.data or {}).get("history.json") or "{}")
    return data


def gpu_history(data: dict[str, Any] | None, tenant: str) -> float:
    """``tenant``'s GPU history in a record (0 without one)."""
    held = ((data or {}).get("tenants") or {}).get(tenant) or {}
    return float(held.get(GPU, 0.0))


class Night(NamedTuple):
    """What ``a_alone_at_night`` made."""

    a: str
    b: str
    node: str
    namespace: str  # a's


async def a_alone_at_night(
    api: client.ApiClient,
    fairshare: FairshareDev,
    make_gpu_node: Any,
    tenant_namespace: Any,
    prefix: str,
    *,
    policy: str,
) -> Night:
    """The night of the day scenario, on the control plane: no history recorded yet,
    tenants a and b, and tenant a's 8-GPU pod ``night`` bound on a node of its own; then
    the config turns ``usageHistory`` on (``policy``), so the history starts with a
    holding that node."""
    dev = dev_module()
    core = client.CoreV1Api(api)
    try:
        await core.delete_namespaced_config_map(CONFIGMAP, dev.SYSTEM_NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise
    a, b = unique(f"{prefix}-a"), unique(f"{prefix}-b")
    tenants = f"tenants:\n- name: {a}\n- name: {b}\n"
    await fairshare.set_config(api, CONFIG_HEAD + tenants)
    node = unique(f"{prefix}-node")
    await make_gpu_node(node, gpus=8)
    ns = await tenant_namespace(a)
    await core.create_namespaced_pod(ns, gpu_pod_manifest("night", 8, node=node))

    async def bound() -> bool:
        pod = await core.read_namespaced_pod("night", ns)
        return bool(pod.spec.node_name)

    await wait_for(bound, timeout=60, what="tenant a's pod to be bound")
    await fairshare.set_config(api, CONFIG_HEAD + f"usageHistory: {{{policy}}}\n" + tenants)
    return Night(a, b, node, ns)


def assert_read_back_decayed(
    before: dict[str, Any], after: dict[str, Any], tenant: str, gpus: int
) -> float:
    """``after``, a new leader's first write, holds ``tenant``'s GPU history of ``before``
    (the last write before the new leader took over) decayed over the gap between the
    two records' own times (``at``) with the recorded half-life, and nothing added for the
    gap, in which ``tenant`` held ``gpus`` GPUs. Returns the gap.

    The new leader reads the record back, decays it to its clock and at once (no await
    in between) folds in the tracker's usage up to its first record's time: a fraction
    of a second of ``gpus`` at most (``READ_BACK_SLACK``). The band is checked to leave
    out both the record not decayed and the gap's usage added."""
    half_life = before["halfLifeSeconds"]
    assert after["halfLifeSeconds"] == half_life
    kept = before["tenants"][tenant][GPU]
    gap = after["at"] - before["at"]
    decay = 0.5 ** (gap / half_life)
    expected = kept * decay
    slack = expected * 1e-3 + gpus * MILLI * READ_BACK_SLACK
    low, high = expected - slack, expected + slack
    not_decayed = kept
    gap_usage_added = expected + gpus * MILLI * (1.0 - decay) * half_life / math.log(2.0)
    assert high < min(not_decayed, gap_usage_added), (
        f"a gap of {gap:.2f}s is too short to tell the read-back from no decay: "
        f"band [{low:.0f}, {high:.0f}], not decayed {not_decayed:.0f}, "
        f"with the gap's usage {gap_usage_added:.0f}"
    )
    got = after["tenants"][tenant][GPU]
    assert low <= got <= high, (
        f"{tenant}'s GPU history read back {got:.0f}, expected {expected:.0f} +- {slack:.0f} "
        f"({kept:.0f} decayed over {gap:.2f}s with a half-life of {half_life:g}s; "
        f"not decayed: {not_decayed:.0f}, with the gap's usage: {gap_usage_added:.0f})"
    )
    return float(gap)


async def test_a_wrong_half_life_is_refused_with_a_clear_message(
    api: client.ApiClient, fairshare: FairshareDev
) -> None:
    dev = dev_module()
    bad = CONFIG_HEAD + "usageHistory: {halfLife: 0s}\ntenants: []\n"
    with pytest.raises(ApiException) as refused:
        await client.CoreV1Api(api).patch_namespaced_config_map(
            dev.CONFIGMAP, dev.SYSTEM_NAMESPACE, {"data": {dev.CONFIG_KEY: bad}}
        )
    assert refused.value.status == 400
    message = json.loads(refused.value.body)["message"]
    assert 'usageHistory.halfLife: must be at least 1m, got "0s"' in message


async def test_the_history_is_kept_shown_and_survives_an_extender_restart(
    api: client.ApiClient,
    fairshare: FairshareDev,
    make_gpu_node: Any,
    tenant_namespace: Any,
) -> None:
    a = (
        await a_alone_at_night(
            api, fairshare, make_gpu_node, tenant_namespace, "uh", policy=f"halfLife: {HALF_LIFE}"
        )
    ).a

    async def accrued() -> dict[str, Any] | None:
        data = await recorded(api)
        return data if gpu_history(data, a) >= ON_RECORD else None

    # Written every 30 s by the leader: the second write holds a's GPU-seconds.
    before = await wait_for(accrued, timeout=90, what="the leader to persist a's history")
    status = await asyncio.to_thread(fairshare.extender_status)
    shown = status["usageHistory"]["tenants"][a]
    assert shown["usageShare"] > 0 and shown["weightFactor"] == 1.0  # alone: no over-use

    # The old process writes again 30 s after `before` at the earliest, and is stopped
    # within 15 s of the call: `before` is the record the new one reads back.
    since = time.time() - before["at"]
    assert since < 10, f"the restart came {since:.1f}s after the record it should read back"
    await asyncio.to_thread(fairshare.restart_extender)

    async def rewritten() -> dict[str, Any] | None:
        data = await recorded(api)
        return data if data and data.get("at", 0) > before["at"] else None

    # The new process writes at its first look: what it read back, decayed over the gap,
    # with nothing added for it (a's pod ran on, but what ran then is not known to it).
    # (Started afresh, its first write would hold no tenant: a fresh history only starts
    # its clock at the first look.)
    after = await wait_for(rewritten, timeout=60, what="the restarted leader to write")
    gap = assert_read_back_decayed(before, after, a, gpus=8)
    print(
        f"\n[usage history restart] a's decayed GPU history {before['tenants'][a][GPU]:.0f} "
        f"-> {after['tenants'][a][GPU]:.0f} over {gap:.2f}s (half-life {HALF_LIFE})"
    )
    status = await asyncio.to_thread(fairshare.extender_status)
    assert status["usageHistory"]["tenants"][a]["usageShare"] > 0
    # `fairshare status` reads the recorded history too, as a new leader would.
    cli = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "fairshare_cli", "status", "-o", "json",
         "--kubeconfig", str(fairshare.cluster.kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    rows = {r["tenant"]: r for r in json.loads(cli.stdout)["usageHistory"]}
    assert rows[a]["usageShare"] > 0 and rows[a]["weightFactor"] == 1.0


OPEN = "fairshare-e2e/open"


async def test_the_history_lets_the_tenant_that_used_less_go_first(
    api: client.ApiClient,
    fairshare: FairshareDev,
    make_gpu_node: Any,
    tenant_namespace: Any,
) -> None:
    """The morning of the day scenario: a held all 8 GPUs of the node since the history
    began; its night pod ends and a and b, of equal weights, each want all 8 GPUs (8
    one-GPU pods each, a's created first). Without history the gate splits them 4 and 4.
    With it, a's share of the history (U about 1) is over its weighted share (W = 1/2),
    so a's weight gets the factor's floor, 0.25 (strength 20 keeps it there while U stays
    above 0.575): a's fair share is 8 × 0.25 / 1.25 = 1.6 GPUs and b's 6.4, so the gate
    lets a's first pod through, holds a's next ones while b goes first, and lets a second
    one of a's through only once b holds 6 and a holds the lower share: 2 and 6."""
    # A fresh extender: no pending pods of earlier tests counted as demand.
    await asyncio.to_thread(fairshare.restart_extender)
    policy = "halfLife: 10m, strength: 20, minWeightFactor: 0.25"
    night = await a_alone_at_night(
        api, fairshare, make_gpu_node, tenant_namespace, "uhd", policy=policy
    )
    a, b, node = night.a, night.b, night.node
    core = client.CoreV1Api(api)
    namespaces = {a: night.namespace, b: await tenant_namespace(b)}

    async def on_record() -> bool:
        return gpu_history(await recorded(api), a) >= ON_RECORD

    # The night on record (the leader's second write, 30 s into the history): a's share
    # of it is about 1 and decays slowly enough for the morning's decisions.
    await wait_for(on_record, timeout=90, what="the leader to persist a's history")

    # The morning's pods wait for the label OPEN, which the node does not have yet: the
    # extender counts them all as demand, and they become runnable all at once.
    names: set[str] = set()
    for t in (a, b):
        for i in range(8):
            pod = gpu_pod_manifest(f"day-{i}", 1)
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node, OPEN: "yes"}
            await core.create_namespaced_pod(namespaces[t], pod)
            names.add(f"{namespaces[t]}/day-{i}")

    async def factor_at_floor() -> bool:
        status = await asyncio.to_thread(fairshare.extender_status)
        seen = {p["pod"] for p in status["pendingPods"] + status["heldPods"]}
        judged = (status.get("usageHistory") or {}).get("tenants") or {}
        a_now = judged.get(a) or {}
        return names <= seen and a_now.get("weightFactor") == 0.25

    await wait_for(
        factor_at_floor, timeout=60, what="the extender to see the 16 pods and lower a's weight"
    )
    await core.delete_namespaced_pod("night", night.namespace, grace_period_seconds=0)

    async def node_free() -> bool:
        status = await asyncio.to_thread(fairshare.extender_status)
        row = next(n for n in status["nodes"] if n["name"] == node)
        return not any(d["holders"] for d in row["devices"])

    await wait_for(node_free, timeout=60, what="the extender to see the night pod gone")
    await core.patch_node(node, {"metadata": {"labels": {OPEN: "yes"}}})

    async def node_full() -> dict[str, int] | None:
        counts = {}
        for t, ns in namespaces.items():
            pods = (await core.list_namespaced_pod(ns)).items
            counts[t] = sum(1 for p in pods if p.metadata.name != "night" and p.spec.node_name)
        return counts if sum(counts.values()) == 8 else None

    # Once the 8 GPUs are taken nothing else can bind: the split is final.
    counts = await wait_for(node_full, timeout=120, what="the morning's pods to fill the node")
    assert counts == {a: 2, b: 6}, f"one-GPU pods bound per tenant: {counts}"

    async def held_for_b() -> list[str]:
        events = await core.list_namespaced_event(
            night.namespace, field_selector="reason=FailedScheduling"
        )
        reason = f"tenant {a} above its fair share"
        return [
            m for e in events.items if reason in (m := e.message or "") and f"while {b} waits" in m
        ]

    # kube-scheduler reported the gate's reason: a's pods waited for b.
    await wait_for(
        held_for_b, timeout=30, what="a FailedScheduling event of a's pods waiting for b"
    )
