"""Quarantine of failed GPU nodes (``health.quarantine``), on the real control plane.

Four kwok nodes of 4 GPUs. A pod group of two 4-GPU members runs on ``-0`` and ``-1``
(the only nodes of its pool), a CPU pod beside it on ``-0``, another on ``-2``. Node
``-3`` was cordoned by hand, with a fatal GPU signal, before the quarantine was enabled.
Then, with ``enabled: true`` and ``maxNodes: 1``:

* a NoSchedule taint ``nvidia.com/gpu-xid-error`` on ``-0``: fairshare cordons and marks
  it, records an Event on it, and drains it: the CPU pod and both members of the pod group
  (the one on ``-1`` too: the group goes whole) are evicted, with Events saying why; a pod
  a PodDisruptionBudget protects stays (a Warning Event says so) until the budget goes;
* a condition ``SysLogsGPUFallenOff=True`` on ``-2`` within the window: not cordoned, its
  pod keeps running, the circuit breaker is open (``/quarantine.json``, the metric
  ``fairshare_quarantine_breaker_open``, an Event on the node);
* the taint on ``-0`` removed: fairshare uncordons it (the label goes, the time stays);
* ``-3``, cordoned by hand, stays cordoned throughout, even once its signal clears.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import sys
from typing import Any

import pytest
from kubernetes_asyncio import client

from .conftest import (
    CONFIG_HEAD,
    GPU,
    PAUSE_IMAGE,
    POOL,
    STATE_DIR,
    FairshareDev,
    MakeNode,
    cluster_module,
    dev_module,
    unique,
    wait_event,
    wait_for,
)

pytestmark = pytest.mark.e2e

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
MIN_MEMBERS = "fairshare.io/gang-min-members"
XID_TAINT = "nvidia.com/gpu-xid-error"
QUARANTINE_LABEL = "fairshare.io/quarantine"
QUARANTINED_AT = "fairshare.io/quarantined-at"
BREAKER_METRIC = "fairshare_quarantine_breaker_open"
# The gang recovery (health.recoverGangs) would evict the gang member off the failed node
# as soon as the node turns fatal, before the drain does: off here, so that this test
# sees the quarantine's own gang-whole drain (tests/e2e/test_gang_recovery.py tests the
# recovery).
QUARANTINE_CONFIG = (
    "health:\n  recoverGangs: false\n  quarantine:\n    enabled: true\n    maxNodes: 1\n"
    "    maxFraction: 1.0\n    window: 1h\n"
)


@pytest.fixture(autouse=True)
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender (no plans or pending pods of earlier tests)."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


def quarantine_status(fairshare: FairshareDev) -> dict[str, Any]:
    """The extender's ``GET /quarantine.json``."""
    h = fairshare.handles
    ctx = ssl.create_default_context(cafile=h.ca("extender"))
    code, body = cluster_module().http_get(h.url("extender", "/quarantine.json"), ctx)
    assert code == 200, f"/quarantine.json answered {code}: {body[:200]}"
    data: dict[str, Any] = json.loads(body)
    return data


def pod(name: str, *, gpus: int, selector: dict[str, str], group: str | None = None) -> Any:
    meta: dict[str, Any] = {"name": name}
    if group:
        meta["labels"] = {GROUP_LABEL: group}
        meta["annotations"] = {MIN_MEMBERS: "2"}
    limits = {"cpu": "100m", "memory": "128Mi"}
    if gpus:
        limits[GPU] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            "nodeSelector": selector,
            "terminationGracePeriodSeconds": 0,
        },
    }


async def test_quarantine_cordons_drains_trips_and_uncordons(
    api: client.ApiClient, make_gpu_node: MakeNode, namespace: str, fairshare: FairshareDev
) -> None:
    core = client.CoreV1Api(api)
    pool = unique("qr")
    gang_pool = f"{pool}-gang"
    names = [f"{pool}-{k}" for k in range(4)]
    await asyncio.gather(
        *(
            make_gpu_node(n, gpus=4, labels={POOL: gang_pool if k < 2 else pool})
            for k, n in enumerate(names)
        )
    )
    # Cordoned by hand, with a fatal signal, before the quarantine was on.
    await core.patch_node(
        names[3],
        {"spec": {"unschedulable": True, "taints": [{"key": XID_TAINT, "effect": "NoSchedule"}]}},
    )
    for k in range(2):
        await core.create_namespaced_pod(
            namespace, pod(f"job-{k}", gpus=4, selector={POOL: gang_pool}, group="job")
        )
    await core.create_namespaced_pod(
        namespace, pod("lone-0", gpus=0, selector={"kubernetes.io/hostname": names[0]})
    )
    await core.create_namespaced_pod(
        namespace, pod("lone-2", gpus=0, selector={"kubernetes.io/hostname": names[2]})
    )
    # A pod a PodDisruptionBudget protects, on node 0: the drain waits for it, never forces.
    guarded = pod("guarded", gpus=0, selector={"kubernetes.io/hostname": names[0]})
    guarded["metadata"]["labels"] = {"app": "guarded"}
    await core.create_namespaced_pod(namespace, guarded)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(namespace, pdb)

    async def running() -> dict[str, str]:
        pods = (await core.list_namespaced_pod(namespace)).items
        return {
            p.metadata.name: p.spec.node_name
            for p in pods
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        }

    async def all_run() -> dict[str, str] | None:
        now = await running()
        return now if len(now) == 5 else None

    where = await wait_for(all_run, timeout=90, what="the pod group and the lone pods running")
    assert {where["job-0"], where["job-1"]} == {names[0], names[1]}, where
    sys.stderr.write(f"\n[e2e] quarantine: pods on {where}\n")

    await fairshare.set_config(api, CONFIG_HEAD + "tenants: []\n" + QUARANTINE_CONFIG)

    # 1. A fatal taint on node 0: cordoned, marked, drained (the pod group whole).
    await core.patch_node(names[0], {"spec": {"taints": [{"key": XID_TAINT, "value": "79",
                                                          "effect": "NoSchedule"}]}})  # fmt: skip

    async def node(name: str) -> client.V1Node:
        return await core.read_node(name)

    async def quarantined() -> bool:
        n = await node(names[0])
        return (
            bool(n.spec.unschedulable)
            and (n.metadata.labels or {}).get(QUARANTINE_LABEL) == "cordoned"
        )

    await wait_for(quarantined, timeout=30, what=f"{names[0]} cordoned by the quarantine")
    await wait_event(
        api, "default", involved_name=names[0], reason="FairShareQuarantined", contains=XID_TAINT
    )

    async def drained() -> bool:
        return set(await running()) == {"lone-2", "guarded"}

    await wait_for(drained, timeout=60, what=f"{names[0]} drained, the pod group whole")
    await wait_event(
        api, namespace, involved_name="guarded", reason="FairShareQuarantineDrainBlocked",
        contains="PodDisruptionBudget",
    )  # fmt: skip
    await asyncio.sleep(6)  # more than a round: the budget still holds, nothing forced
    assert "guarded" in await running()
    await client.PolicyV1Api(api).delete_namespaced_pod_disruption_budget("guarded", namespace)

    async def guarded_gone() -> bool:
        return set(await running()) == {"lone-2"}

    await wait_for(guarded_gone, timeout=60, what="the guarded pod evicted once its budget went")
    await wait_event(
        api, namespace, involved_name="lone-0", reason="FairShareNodeQuarantined",
        contains=names[0],
    )  # fmt: skip
    member_off_node = "job-1" if where["job-1"] == names[1] else "job-0"
    await wait_event(
        api, namespace, involved_name=member_off_node, reason="FairShareNodeQuarantined",
        contains="pod group job goes whole",
    )  # fmt: skip
    assert not (await node(names[1])).spec.unschedulable

    # 2. A second node fails within the window: the breaker holds it back.
    fallen = {"type": "SysLogsGPUFallenOff", "status": "True", "reason": "XID79",
              "message": "GPU has fallen off the bus"}  # fmt: skip
    await core.patch_node_status(names[2], {"status": {"conditions": [fallen]}})

    async def breaker_open() -> dict[str, Any] | None:
        status = await asyncio.to_thread(quarantine_status, fairshare)
        breaker = status.get("breaker") or {}
        return status if breaker.get("open") and names[2] in breaker.get("heldBack", []) else None

    status = await wait_for(breaker_open, timeout=30, what="the circuit breaker open")
    sys.stderr.write(f"[e2e] quarantine: {json.dumps(status['breaker'])}\n")
    assert status["breaker"]["used"] == [names[0]]
    assert await asyncio.to_thread(fairshare.metric, "extender", BREAKER_METRIC) == 1
    await wait_event(
        api, "default", involved_name=names[2], reason="FairShareQuarantineBreakerOpen"
    )
    await asyncio.sleep(6)  # more than one round: still not cordoned, its pod still runs
    assert not (await node(names[2])).spec.unschedulable
    assert "lone-2" in await running()

    # 3. Node 0's signal clears: uncordoned, the label gone, the time kept (the window).
    await core.patch_node(names[0], {"spec": {"taints": None}})

    async def lifted() -> bool:
        n = await node(names[0])
        labels = n.metadata.labels or {}
        return not n.spec.unschedulable and QUARANTINE_LABEL not in labels

    await wait_for(lifted, timeout=30, what=f"{names[0]} uncordoned once its signal cleared")
    assert QUARANTINED_AT in ((await node(names[0])).metadata.annotations or {})
    await wait_event(api, "default", involved_name=names[0], reason="FairShareQuarantineLifted")
    # Still within the window: node 2 stays held back.
    assert not (await node(names[2])).spec.unschedulable

    # 4. The node cordoned by hand stays cordoned, unmarked, even once its signal clears.
    hand = await node(names[3])
    assert hand.spec.unschedulable and QUARANTINE_LABEL not in (hand.metadata.labels or {})
    await core.patch_node(names[3], {"spec": {"taints": None}})
    await asyncio.sleep(6)
    hand = await node(names[3])
    assert hand.spec.unschedulable, f"{names[3]}, cordoned by hand, was uncordoned"
    assert QUARANTINE_LABEL not in (hand.metadata.labels or {})


# -- only the elected leader acts ------------------------------------------------------------

# Short timings keep the failover quick (as in test_extender_replicas.py).
TIMINGS = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5")


def replica_get(port: int, path: str) -> str:
    dev = dev_module()
    ctx = ssl.create_default_context(cafile=str(dev.Layout(STATE_DIR).certs("extender") / "ca.crt"))
    code, body = cluster_module().http_get(f"https://127.0.0.1:{port}{path}", ctx)
    assert code == 200, f"{path} on {port} answered {code}"
    return str(body)


def replica_metric(port: int, name: str, **labels: str) -> float:
    total = 0.0
    for line in replica_get(port, "/metrics").splitlines():
        if (
            line.startswith(name)
            and line[len(name) : len(name) + 1] in (" ", "{")
            and all(f'{k}="{v}"' in line for k, v in labels.items())
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def replica_state(port: int) -> str:
    return str(json.loads(replica_get(port, "/quarantine.json"))["state"])


async def test_only_the_leader_quarantines_and_a_new_leader_lifts(
    api: client.ApiClient, make_gpu_node: MakeNode, fairshare: FairshareDev
) -> None:
    """Two elected extender replicas read a config with the quarantine on (their own
    ConfigMap; the dev extender keeps the quarantine off): one cordons the failed node,
    the other stands by; the leader is killed, the signal clears, and the new leader
    uncordons the node the old one cordoned (the mark is on the node, not in memory)."""
    dev, mod = dev_module(), cluster_module()
    core = client.CoreV1Api(api)
    cm_name, lease = unique("qr-config"), unique("qr-lease")
    config_text = CONFIG_HEAD + "tenants: []\n" + QUARANTINE_CONFIG
    await core.create_namespaced_config_map(
        dev.SYSTEM_NAMESPACE,
        {"metadata": {"name": cm_name}, "data": {dev.CONFIG_KEY: config_text}},
    )
    pool = unique("ql")
    names = [f"{pool}-{k}" for k in range(2)]
    await asyncio.gather(*(make_gpu_node(n, gpus=4, labels={POOL: pool}) for n in names))
    ports: list[int] = []
    while len(ports) < 2:
        port = mod.free_port()
        if port not in ports:
            ports.append(port)
    pids: list[int] = []
    try:
        for i, port in enumerate(ports):
            args = (
                "--lease", f"{dev.SYSTEM_NAMESPACE}/{lease}", *TIMINGS,
                "--identity", f"replica-{i}",
                f"--configmap={dev.SYSTEM_NAMESPACE}/{cm_name}",
            )  # fmt: skip
            pids.append(
                await asyncio.to_thread(
                    dev.start_extra_extender, STATE_DIR, port, extra_args=args,
                    name=f"quarantine-replica-{i}",
                )
            )  # fmt: skip

        async def one_active() -> list[str] | None:
            states = [await asyncio.to_thread(replica_state, p) for p in ports]
            return states if sorted(states) == ["active", "standby"] else None

        states = await wait_for(one_active, timeout=30, what="one replica leading")
        leader = states.index("active")
        follower = 1 - leader

        await core.patch_node(
            names[0], {"spec": {"taints": [{"key": XID_TAINT, "effect": "NoSchedule"}]}}
        )

        async def cordoned() -> bool:
            n = await core.read_node(names[0])
            return bool(n.spec.unschedulable)

        await wait_for(cordoned, timeout=30, what=f"{names[0]} cordoned by the leader")
        done = {"action": "cordon", "outcome": "done"}
        cordon_metric = "fairshare_quarantine_actions_total"
        assert await asyncio.to_thread(replica_metric, ports[leader], cordon_metric, **done) == 1
        assert await asyncio.to_thread(replica_metric, ports[follower], cordon_metric, **done) == 0
        assert await asyncio.to_thread(replica_state, ports[follower]) == "standby"

        os.kill(pids[leader], signal.SIGKILL)
        await core.patch_node(names[0], {"spec": {"taints": None}})

        async def lifted() -> bool:
            n = await core.read_node(names[0])
            return not n.spec.unschedulable and QUARANTINE_LABEL not in (n.metadata.labels or {})

        await wait_for(lifted, timeout=45, what=f"the new leader to uncordon {names[0]}")
        assert await asyncio.to_thread(replica_state, ports[follower]) == "active"
        undone = {"action": "uncordon", "outcome": "done"}
        assert (
            await asyncio.to_thread(replica_metric, ports[follower], cordon_metric, **undone) == 1
        )
    finally:
        for pid in pids:
            await asyncio.to_thread(dev.stop_server, "extender-replica", pid)
        await core.delete_namespaced_config_map(cm_name, dev.SYSTEM_NAMESPACE)
