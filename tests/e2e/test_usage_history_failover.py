"""Fairness with memory (``usageHistory``) across a leader failover, on the real control
plane: two extender replicas elect a leader through a Lease (the replicas, proxy and
timings of test_extender_replicas.py); the leader keeps the tenants' history, writes it
to ConfigMap ``fairshare-usage-history`` and exports it on ``/metrics``; it is killed
(SIGKILL: no release, no last write); the other replica takes the Lease over, reads the
history back, decays it over the gap and goes on keeping it.

The dev extender would keep writing the same ConfigMap (it leads alone, without
``--lease``): for the test it is restarted as a follower of a Lease held for an hour by
nobody, and restarted as it was afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import time
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    STATE_DIR,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    cluster_module,
    dev_module,
    unique,
    wait_for,
)
from .test_extender_replicas import (
    LEADER_METRIC,
    extender_metric,
    extender_replicas,
    lease_holder,
    stand_in_pod,
)
from .test_usage_history import (
    GPU,
    HALF_LIFE,
    ON_RECORD,
    a_alone_at_night,
    assert_read_back_decayed,
    gpu_history,
    recorded,
)

pytestmark = pytest.mark.e2e

HISTORY_GAUGE = "fairshare_tenant_history_usage_share"


def replica_status(port: int) -> dict[str, Any]:
    """A replica's ``/status.json`` (the dev extender's CA)."""
    import ssl

    layout = dev_module().Layout(STATE_DIR)
    ctx = ssl.create_default_context(cafile=str(layout.certs("extender") / "ca.crt"))
    code, body = cluster_module().http_get(f"https://127.0.0.1:{port}/status.json", ctx)
    assert code == 200, body[:200]
    data: dict[str, Any] = json.loads(body)
    return data


def parked_lease(name: str, namespace: str) -> dict[str, Any]:
    """A Lease held by nobody for an hour: a candidate for it stays a follower."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "holderIdentity": "fairshare-e2e-nobody",
            "leaseDurationSeconds": 3600,
            "acquireTime": now,
            "renewTime": now,
        },
    }


async def test_the_history_survives_a_leader_failover(
    api: client.ApiClient,
    fairshare: FairshareDev,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
) -> None:
    dev = dev_module()
    system = dev.SYSTEM_NAMESPACE
    core = client.CoreV1Api(api)
    leases = client.CoordinationV1Api(api)
    policy = f"halfLife: {HALF_LIFE}"
    night = await a_alone_at_night(
        api, fairshare, make_gpu_node, tenant_namespace, "uhf", policy=policy
    )
    a = night.a

    parked, lease = unique("uhf-parked"), unique("uhf-lease")
    stand_ins = [f"{lease}-{i}" for i in range(2)]
    await leases.create_namespaced_lease(system, parked_lease(parked, system))
    try:
        await asyncio.to_thread(fairshare.restart_extender, "--lease", f"{system}/{parked}")
        for name in stand_ins:
            await core.create_namespaced_pod(system, stand_in_pod(name))
        label_pods = [f"{system}/{name}" for name in stand_ins]
        started = time.time()
        async with extender_replicas(lease, label_pods) as (ports, pids, _url):
            holder = await wait_for(lambda: lease_holder(api, lease), timeout=30, what="a leader")
            lead_i = int(holder[-1])
            other_i = 1 - lead_i

            async def written_by_leader() -> dict[str, Any] | None:
                data = await recorded(api)
                fresh = data is not None and data.get("at", 0) > started
                return data if fresh and gpu_history(data, a) >= ON_RECORD else None

            # The leader writes at its first look and every 30 s after; its first write
            # holds what it read back (the dev extender's record of no tenant yet) and a
            # fraction of a second of a's usage, its second one 30 s of it.
            before = await wait_for(
                written_by_leader, timeout=90, what="the leader to persist a's history"
            )
            kept = before["tenants"][a][GPU]
            shown = await asyncio.to_thread(extender_metric, ports[lead_i], HISTORY_GAUGE, tenant=a)
            assert shown > 0
            # A follower keeps no history: no series, no status.
            assert await asyncio.to_thread(
                extender_metric, ports[other_i], HISTORY_GAUGE, tenant=a
            ) == 0.0  # fmt: skip
            assert not (await asyncio.to_thread(replica_status, ports[other_i])).get("usageHistory")

            os.kill(pids[lead_i], signal.SIGKILL)
            killed = time.time()
            # It would have written again 30 s after `before` at the earliest: `before` is
            # the record the new leader reads back.
            assert killed - before["at"] < 25, "the kill came too late after the record"

            async def took_over() -> bool:
                if await lease_holder(api, lease) != f"replica-{other_i}":
                    return False
                leads = await asyncio.to_thread(extender_metric, ports[other_i], LEADER_METRIC)
                return leads == 1

            await wait_for(took_over, timeout=60, what=f"replica-{other_i} to lead")
            failover = time.time() - killed

            async def rewritten() -> dict[str, Any] | None:
                data = await recorded(api)
                return data if data and data.get("at", 0) > killed else None

            # Its first write comes at its first look: what it read back, decayed over the
            # gap (a history started afresh would hold no tenant at that first write).
            after = await wait_for(rewritten, timeout=60, what="the new leader to write")
            gap = assert_read_back_decayed(before, after, a, gpus=8)
            status = await asyncio.to_thread(replica_status, ports[other_i])
            assert status["usageHistory"]["tenants"][a]["usageShare"] > 0

            async def exported() -> float | None:
                got = await asyncio.to_thread(
                    extender_metric, ports[other_i], HISTORY_GAUGE, tenant=a
                )
                return got if got > 0 else None

            await wait_for(exported, timeout=20, what="the new leader to export a's history")
            print(
                f"\n[usage history failover] leader replica-{lead_i} SIGKILLed; replica-{other_i} "
                f"led after {failover:.1f}s and wrote the history {after['at'] - killed:.1f}s "
                f"after the kill: a's decayed GPU history {kept:.0f} -> "
                f"{after['tenants'][a][GPU]:.0f} over {gap:.1f}s"
            )
    finally:
        await asyncio.to_thread(fairshare.restart_extender)
        for name in (parked, lease):
            with contextlib.suppress(ApiException):
                await leases.delete_namespaced_lease(name, system)
        for name in stand_ins:
            with contextlib.suppress(ApiException):
                await core.delete_namespaced_pod(name, system, grace_period_seconds=0)
