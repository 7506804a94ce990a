"""Reclaim on the real control plane: `fairshare reclaimer` gives a tenant its guarantee back.

Tenant A borrows all 32 GPUs of 4 kwok nodes; tenant B (guaranteed 16) submits 16 one-GPU
pods. The reclaimer, a subprocess leader-elected through a Lease, evicts A's youngest pods
through the Eviction API; the real kube-scheduler (with the fairshare extender) places B's
pods. A PodDisruptionBudget protects A's four youngest pods: their evictions are refused
(429), other victims are chosen, and B's pods carry a `ReclaimBlocked` Event saying so.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
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
    cluster_module,
    dev_module,
    unique,
    wait_for,
)

pytestmark = pytest.mark.e2e

RESTORE_DEADLINE = 60.0


def gpu_pod(name: str, pool: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": PAUSE_IMAGE,
                    "resources": {"limits": {"cpu": "100m", "memory": "128Mi", GPU: "1"}},
                }
            ],
            "nodeSelector": {POOL: pool},
            "terminationGracePeriodSeconds": 0,
        },
    }


async def running(api: client.ApiClient, namespace: str) -> list[client.V1Pod]:
    pods = await client.CoreV1Api(api).list_namespaced_pod(namespace)
    return [
        p
        for p in pods.items
        if p.spec.node_name
        and p.status.phase == "Running"
        and p.metadata.deletion_timestamp is None
    ]


def metric_sum(port: int, name: str, **labels: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in body.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Reclaimer:
    """`fairshare reclaimer` as a subprocess against the test cluster."""

    def __init__(self, kubeconfig: Path, config_file: Path, lease: str, log: Path) -> None:
        self.port = int(cluster_module().free_port())
        self.log = log
        self.lease = lease  # NAMESPACE/NAME, renewed at the start of every round
        exe = Path(sys.executable).with_name("fairshare")
        argv = [
            str(exe) if exe.exists() else sys.executable,
            *([] if exe.exists() else ["-m", "fairshare_cli"]),
            "reclaimer",
            f"--config={config_file}",
            f"--kubeconfig={kubeconfig}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            "--interval=1",
            "--cooldown=60",
            "--max-evictions-per-minute=40",
            f"--lease={lease}",
            "--identity=e2e-reclaimer",
            "--log-level=INFO",
        ]
        self._out = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"reclaimer exited {self.proc.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text().splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


@pytest.fixture
def start_reclaimer(
    fairshare: FairshareDev, tmp_path: Path
) -> Iterator[Callable[[str], Reclaimer]]:
    started: list[Reclaimer] = []
    dev = dev_module()

    def start(config_text: str) -> Reclaimer:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(config_text)
        lease = f"{dev.SYSTEM_NAMESPACE}/{unique('reclaimer')}"
        log = tmp_path / f"reclaimer-{len(started)}.log"
        r = Reclaimer(fairshare.cluster.kubeconfig, cfg, lease, log)
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


@pytest.fixture
async def pdb_cleanup(api: client.ApiClient) -> AsyncIterator[list[tuple[str, str]]]:
    made: list[tuple[str, str]] = []
    yield made
    for ns, name in made:
        try:
            await client.PolicyV1Api(api).delete_namespaced_pod_disruption_budget(name, ns)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


async def test_reclaim_restores_guarantee_and_honours_pdb(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
    start_reclaimer: Callable[[str], Reclaimer],
    pdb_cleanup: list[tuple[str, str]],
):
    core = client.CoreV1Api(api)
    a, b = unique("rec-a"), unique("rec-b")
    config = CONFIG_HEAD + (
        f'tenants:\n- name: {a}\n  guaranteed:\n    {GPU}: "8"\n'
        f'- name: {b}\n  guaranteed:\n    {GPU}: "16"\n'
    )
    await fairshare.set_config(api, config)
    pool = unique("rec")
    await asyncio.gather(
        *(make_gpu_node(f"{pool}-{k}", gpus=8, labels={POOL: pool}) for k in range(4))
    )
    ns_a, ns_b = await tenant_namespace(a), await tenant_namespace(b)

    # A borrows everything: 28 pods, then (a second later, so they are the youngest) 4 pods
    # a PodDisruptionBudget protects.
    await asyncio.gather(
        *(core.create_namespaced_pod(ns_a, gpu_pod(f"a-{k}", pool)) for k in range(28))
    )
    await asyncio.sleep(1.2)
    protected = [f"a-pdb-{k}" for k in range(4)]
    await asyncio.gather(
        *(core.create_namespaced_pod(ns_a, gpu_pod(n, pool, {"pdb": "yes"})) for n in protected)
    )
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "a-protected"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"pdb": "yes"}}},
    }
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(ns_a, pdb)
    pdb_cleanup.append((ns_a, "a-protected"))

    async def a_full() -> bool:
        return len(await running(api, ns_a)) == 32

    await wait_for(a_full, timeout=90, what=f"32 running pods of {a}")

    rec = start_reclaimer(config)
    await wait_for(lambda: asyncio.to_thread(rec.ready), timeout=30, what="reclaimer ready")

    t0 = time.monotonic()
    await asyncio.gather(
        *(core.create_namespaced_pod(ns_b, gpu_pod(f"b-{k}", pool)) for k in range(16))
    )

    async def b_restored() -> bool:
        return len(await running(api, ns_b)) == 16

    try:
        await wait_for(b_restored, timeout=RESTORE_DEADLINE, what=f"16 running pods of {b}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nreclaimer log:\n{rec.tail()}") from None
    restore = time.monotonic() - t0
    sys.stderr.write(f"\n[e2e] reclaim: {b} got 16 GPUs back in {restore:.1f}s\n")

    # A keeps its guarantee (8) and in fact its fair half; the PDB pods were never evicted.
    left = {p.metadata.name for p in await running(api, ns_a)}
    assert len(left) >= 8
    assert len(left) == 16
    assert set(protected) <= left
    # The refusal was explained on a pod of B; the victims got their Event.
    blocked = []
    for k in range(16):
        events = await core.list_namespaced_event(
            ns_b, field_selector=f"involvedObject.name=b-{k},reason=ReclaimBlocked"
        )
        blocked += [e.message for e in events.items]
    assert blocked and all("PodDisruptionBudget" in m for m in blocked), blocked
    reclaimed = await core.list_namespaced_event(ns_a, field_selector="reason=Reclaimed")
    victims = {e.involved_object.name for e in reclaimed.items if b in (e.message or "")}
    assert len(victims) == 16 and not victims & set(protected)
    made_room = await core.list_namespaced_event(ns_b, field_selector="reason=ReclaimedFor")
    assert len(made_room.items) == 16

    # No loop: nothing more is evicted once B is whole, and the restore time is exported.
    evicted = metric_sum(rec.port, "fairshare_reclaim_evictions_total", outcome="evicted")
    assert evicted == 16
    await asyncio.sleep(4)
    assert metric_sum(rec.port, "fairshare_reclaim_evictions_total", outcome="evicted") == 16
    assert metric_sum(rec.port, "fairshare_reclaim_evictions_total", outcome="blocked") >= 1

    async def restored_metric() -> float:
        return await asyncio.to_thread(
            metric_sum, rec.port, "fairshare_reclaim_guarantee_restore_seconds_count", tenant=b
        )

    await wait_for(restored_metric, timeout=10, what="the restore-time metric")
    seconds = metric_sum(rec.port, "fairshare_reclaim_guarantee_restore_seconds_sum", tenant=b)
    sys.stderr.write(
        f"[e2e] reclaim: fairshare_reclaim_guarantee_restore_seconds = {seconds:.1f}\n"
    )
    assert 0 < seconds <= RESTORE_DEADLINE
    assert re.search(r"evicted .* for ", rec.log.read_text())
