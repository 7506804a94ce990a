"""Fairness with memory (``usageHistory``) on the real control plane: the extender's
leader keeps the tenants' usage history in ConfigMap ``fairshare-usage-history``, shows
it in ``/status.json``, and reads it back after a restart; a wrong half-life is refused
by the config guard with a clear message."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

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


async def a_alone_at_night(
    api: client.ApiClient,
    fairshare: FairshareDev,
    make_gpu_node: Any,
    tenant_namespace: Any,
    prefix: str,
) -> str:
    """The night of the day scenario, on the control plane: no history recorded yet, a
    config with ``usageHistory`` (1 h) and tenants a and b, and tenant a's 8-GPU pod
    ``night`` bound on a node of its own. Returns a's name."""
    dev = dev_module()
    core = client.CoreV1Api(api)
    try:
        await core.delete_namespaced_config_map(CONFIGMAP, dev.SYSTEM_NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise
    a, b = unique(f"{prefix}-a"), unique(f"{prefix}-b")
    await fairshare.set_config(
        api,
        CONFIG_HEAD + f"usageHistory: {{halfLife: 1h}}\ntenants:\n- name: {a}\n- name: {b}\n",
    )
    node = unique(f"{prefix}-node")
    await make_gpu_node(node, gpus=8)
    ns = await tenant_namespace(a)
    await core.create_namespaced_pod(ns, gpu_pod_manifest("night", 8, node=node))

    async def bound() -> bool:
        pod = await core.read_namespaced_pod("night", ns)
        return bool(pod.spec.node_name)

    await wait_for(bound, timeout=60, what="tenant a's pod to be bound")
    return a


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
    a = await a_alone_at_night(api, fairshare, make_gpu_node, tenant_namespace, "uh")

    async def accrued() -> dict[str, Any] | None:
        data = await recorded(api)
        held = ((data or {}).get("tenants") or {}).get(a) or {}
        return data if held.get(GPU, 0) > 0 else None

    # Written every 30 s by the leader: the second write holds a's GPU-seconds.
    before = await wait_for(accrued, timeout=90, what="the leader to persist a's history")
    kept = before["tenants"][a][GPU]
    status = await asyncio.to_thread(fairshare.extender_status)
    shown = status["usageHistory"]["tenants"][a]
    assert shown["usageShare"] > 0 and shown["weightFactor"] == 1.0  # alone: no over-use

    await asyncio.to_thread(fairshare.restart_extender)

    async def rewritten() -> dict[str, Any] | None:
        data = await recorded(api)
        return data if data and data.get("at", 0) > before["at"] else None

    # The new process writes at its first look: what it read back, decayed over the gap.
    # (Started afresh, its first write would hold no tenant: a fresh history only starts
    # its clock at the first look.)
    after = await wait_for(rewritten, timeout=60, what="the restarted leader to write")
    gap = after["at"] - before["at"]
    assert after["tenants"][a][GPU] >= kept * 0.5 ** (gap / 3600.0) * 0.999
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
