"""Two extender replicas behind one address, the leader killed mid-burst (issue 13, item 5).

Two `fairshare extender --lease ...` processes (the dev extender's certificate) behind the
TCP round-robin proxy of test_replicas.py; kube-scheduler is restarted with the proxy as
its extender URL for the test and given the dev extender back afterwards. The proxy is
blind to leadership (worse than the Service, which selects the leader's pod): half the new
connections reach the follower, which must refuse (filter 503, bind Error, then closes the
connection) so kube-scheduler retries.

40 fractional pods (0.5 and 0.25 GPU) on 2 nodes of 4 GPUs (15 GPUs asked for 8): 12 (4.5
GPUs) at once; once some are bound the leader is SIGKILLed (or, second case, SIGTERMed:
it stops deciding, lets its binds land and releases the Lease), and the other 28 are
created at once during the failover. Then:

* no device above 100 % (the shares per device index from `fairshare.io/gpu-devices`);
* every pod bound or explained (a FailedScheduling event that is a decision, not a
  follower's refusal);
* the other replica took over and bound pods itself: counted on its own
  ``fairshare_extender_requests_total{verb="bind",outcome="ok"}`` (a follower answers
  ``not_leader``, so it is 0 before the kill), less the binds its log says it refused or
  failed; the old leader's in-flight binds that land after the kill are not counted;
* the failover time (kill -> the other replica holds the Lease and leads) is printed and
  put in the end-of-run summary. Without the election (`ELECT = False`) the two replicas
  decide independently.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    CONFIG_HEAD,
    FAULT_SUMMARY,
    STATE_DIR,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    cluster_module,
    dev_module,
    unique,
    wait_for,
)
from .test_faults import ANN_DEVICES, ANN_FRACTION, POOL, pod
from .test_replicas import RoundRobinProxy

pytestmark = pytest.mark.e2e

PODS = 40
FIRST_WAVE = 12  # 6 x 0.25 + 6 x 0.5 = 4.5 of the 8 GPUs
NODES, GPUS = 2, 4
ELECT = True
# Short timings keep the test quick; the failover time scales with --lease-duration.
TIMINGS = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5")
LEADER_METRIC = "fairshare_extender_leader"
LEADER_LABEL = "fairshare.io/extender-leader"
# FailedScheduling messages of a refused or failed call, not a decision: a follower's
# refusal (kube-scheduler does not read a non-200 body: "failed filter with extender at
# URL ..., code 503"), or the killed leader's connection.
REFUSALS = ("not the leader", "with extender at URL", "connection", "EOF")


# What a replica logs for a bind call it answered (outcome "ok") without binding the pod.
UNBOUND_LOG = re.compile(r"bind refused: |binding \S+ to \S+ failed: ")


def replica_log(i: int) -> Path:
    return Path(dev_module().Layout(STATE_DIR).logs) / f"fairshare-extender-replica-{i}.log"


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def unbound_in_log(path: Path, start: int) -> int:
    """Bind calls the replica answered without a bind, in its log from byte ``start``."""
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    return sum(1 for line in text.splitlines() if UNBOUND_LOG.search(line))


def binds_answered(port: int) -> float:
    """The replica's own count of bind calls it answered as the leader (outcome ``ok``:
    not a follower's ``not_leader`` refusal, not an error)."""
    return extender_metric(port, "fairshare_extender_requests_total", verb="bind", outcome="ok")


def extender_metric(port: int, name: str, **labels: str) -> float:
    import ssl

    dev = dev_module()
    layout = dev.Layout(STATE_DIR)
    ctx = ssl.create_default_context(cafile=str(layout.certs("extender") / "ca.crt"))
    _, body = cluster_module().http_get(f"https://127.0.0.1:{port}/metrics", ctx)
    total = 0.0
    for line in body.splitlines():
        if (
            line.startswith(name)
            and line[len(name) : len(name) + 1] in (" ", "{")
            and all(f'{k}="{v}"' in line for k, v in labels.items())
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextlib.asynccontextmanager
async def extender_replicas(
    lease: str, label_pods: list[str]
) -> AsyncIterator[tuple[list[int], list[int], str]]:
    """(ports, pids, proxy URL): two elected extenders behind a round-robin proxy that
    kube-scheduler calls, replica i labelling the pod `label_pods[i]` while it leads (as
    in the manifests, where it is its own pod); everything undone on exit."""
    dev, mod = dev_module(), cluster_module()
    ports: list[int] = []
    while len(ports) < 2:
        port = mod.free_port()
        if port not in ports:
            ports.append(port)
    pids: list[int] = []
    proxy = RoundRobinProxy(ports)
    election = ("--lease", f"{dev.SYSTEM_NAMESPACE}/{lease}", *TIMINGS) if ELECT else ()
    try:
        for i, port in enumerate(ports):
            args = (
                (*election, "--identity", f"replica-{i}", "--leader-label-pod", label_pods[i])
                if ELECT
                else ()
            )
            pids.append(
                await asyncio.to_thread(
                    dev.start_extra_extender,
                    STATE_DIR,
                    port,
                    extra_args=args,
                    name=f"extender-replica-{i}",
                )
            )
        proxy_port = await proxy.start()
        url = f"https://127.0.0.1:{proxy_port}"
        await asyncio.to_thread(dev.set_scheduler_extender_url, STATE_DIR, url)
        yield ports, pids, url
    finally:
        await asyncio.to_thread(dev.set_scheduler_extender_url, STATE_DIR, None)
        await proxy.close()
        for pid in pids:
            await asyncio.to_thread(dev.stop_server, "extender-replica", pid)


async def lease_holder(api: client.ApiClient, lease: str) -> str | None:
    try:
        obj = await client.CoordinationV1Api(api).read_namespaced_lease(
            lease, dev_module().SYSTEM_NAMESPACE
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj.spec.holder_identity


def stand_in_pod(name: str) -> dict[str, Any]:
    """A pod no scheduler places: what a replica labels instead of its own pod here."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "fairshare-e2e-nobody",
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


async def leader_labels(api: client.ApiClient, names: list[str]) -> list[str | None]:
    core = client.CoreV1Api(api)
    out = []
    for name in names:
        p = await core.read_namespaced_pod(name, dev_module().SYSTEM_NAMESPACE)
        out.append((p.metadata.labels or {}).get(LEADER_LABEL))
    return out


def device_loads(pods: list[client.V1Pod]) -> dict[tuple[str, int], float]:
    from fairshare.state.objects import parse_gpu_devices

    load: dict[tuple[str, int], float] = {}
    for p in pods:
        text = (p.metadata.annotations or {}).get(ANN_DEVICES)
        assert text, f"bound pod {p.metadata.name} has no {ANN_DEVICES}"
        for dev, milli in parse_gpu_devices(text):
            key = (p.spec.node_name, int(dev))
            load[key] = load.get(key, 0.0) + float(milli) / 1000
    return load


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
async def test_two_extender_replicas_fail_over_without_double_booking(
    sig: signal.Signals,
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    make_gpu_node: MakeNode,
):
    tenant = unique("ha")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    pool = unique("ha")
    for i in range(NODES):
        await make_gpu_node(f"{pool}-{i}", gpus=GPUS, labels={POOL: pool})
    ns = await tenant_namespace(tenant)
    core = client.CoreV1Api(api)
    lease = unique("extender-lease")
    fractions = ["0.5" if i % 2 else "0.25" for i in range(PODS)]

    async def bound() -> list[client.V1Pod]:
        return [p for p in (await core.list_namespaced_pod(ns)).items if p.spec.node_name]

    system = dev_module().SYSTEM_NAMESPACE
    stand_ins = [f"{lease}-{i}" for i in range(2)]
    for name in stand_ins:
        await core.create_namespaced_pod(system, stand_in_pod(name))
    label_pods = [f"{system}/{name}" for name in stand_ins]
    # Where this run's lines start in each replica's log (the files are appended to).
    log_start = [log_size(replica_log(i)) for i in range(2)]
    try:
        async with extender_replicas(lease, label_pods) as (ports, pids, _url):
            identity_pid = {f"replica-{i}": (pid, port) for i, (pid, port) in
                            enumerate(zip(pids, ports, strict=True))}  # fmt: skip
            if ELECT:
                holder = await wait_for(
                    lambda: lease_holder(api, lease), timeout=30, what="a leader"
                )
            else:
                holder = "replica-0"
            leader_pid, _ = identity_pid[holder]
            (other,) = [k for k in identity_pid if k != holder]
            _, other_port = identity_pid[other]
            lead_i, other_i = int(holder[-1]), int(other[-1])
            if ELECT:  # the leader labels its pod (the Service selects it), the other not

                async def labelled_leader() -> bool:
                    labels = await leader_labels(api, stand_ins)
                    return labels[lead_i] == "true" and labels[other_i] is None

                await wait_for(labelled_leader, timeout=20, what="the leader's pod label")

            async def create(first: int, last: int) -> None:
                await asyncio.gather(
                    *(
                        core.create_namespaced_pod(
                            ns,
                            pod(
                                f"frac-{i}",
                                annotations={ANN_FRACTION: fractions[i]},
                                node_selector={POOL: pool},
                            ),
                        )
                        for i in range(first, last)
                    )
                )

            # The first wave asks less than the nodes hold, so room is left for the replica
            # that takes over even when every pod of the wave is bound before the kill
            # lands (with fast binds they can all finish between two polls).
            await create(0, FIRST_WAVE)

            async def some_bound() -> int:
                n = len(await bound())
                return n if n >= 6 else 0

            at_kill = await wait_for(some_bound, timeout=90, what="the first binds")
            # The follower has bound nothing: it refused every bind (not_leader).
            follower_before = await asyncio.to_thread(binds_answered, other_port)
            os.kill(leader_pid, sig)  # SIGTERM: it stops deciding and releases the Lease
            killed = time.monotonic()
            await create(FIRST_WAVE, PODS)  # the rest of the burst, during the failover

            async def took_over() -> float | None:
                if ELECT and await lease_holder(api, lease) != other:
                    return None
                leads = await asyncio.to_thread(extender_metric, other_port, LEADER_METRIC)
                return time.monotonic() - killed if leads == 1 else None

            failover = await wait_for(took_over, timeout=60, what=f"{other} to lead")
            if ELECT:

                async def relabelled() -> bool:
                    labels = await leader_labels(api, stand_ins)
                    # A killed leader cannot drop its label (its pod would be gone or
                    # unready in a cluster); a stopped one drops it before it releases.
                    old_ok = sig == signal.SIGKILL or labels[lead_i] is None
                    return labels[other_i] == "true" and old_ok

                await wait_for(relabelled, timeout=20, what="the new leader's pod label")

            # Settle: everything that fits is bound, the rest keeps being refused.
            settled: list[int] = []

            async def quiet() -> bool:
                settled.append(len(await bound()))
                return len(settled) >= 12 and len(set(settled[-12:])) == 1

            await wait_for(quiet, timeout=120, what="binding to settle", interval=0.5)
            pods = (await core.list_namespaced_pod(ns)).items
            done = [p for p in pods if p.spec.node_name]
            after_kill = len(done) - at_kill
            # Binds made by the new leader itself: its own count of bind calls answered
            # as the leader, less those its log says it refused or whose POST failed.
            answered = await asyncio.to_thread(binds_answered, other_port)
            unbound = unbound_in_log(replica_log(other_i), log_start[other_i])
            new_leader_binds = int(answered) - unbound
    finally:
        with contextlib.suppress(ApiException):
            await client.CoordinationV1Api(api).delete_namespaced_lease(lease, system)
        for name in stand_ins:
            with contextlib.suppress(ApiException):
                await core.delete_namespaced_pod(name, system, grace_period_seconds=0)

    loads = device_loads(done)
    over = {k: v for k, v in loads.items() if v > 1.0 + 1e-9}
    assert not over, f"devices above 100 %: {over}"
    assert len(loads) <= NODES * GPUS
    assert follower_before == 0, f"{other} bound {follower_before:.0f} pods as a follower"
    # The old leader's in-flight binds that land after the kill are in `after_kill`, not
    # here: only what the replica that took over bound itself.
    assert new_leader_binds > 0, (
        f"{other} bound nothing after it took over ({answered:.0f} bind calls answered, "
        f"{unbound} of them refused or failed); {after_kill} pods bound after the first "
        f"{at_kill}, by the old leader"
    )
    assert new_leader_binds <= after_kill, (new_leader_binds, after_kill)

    # Every pod that is not bound is explained by a decision (not a follower's refusal).
    events = (await core.list_namespaced_event(ns, field_selector="reason=FailedScheduling")).items
    reasons: dict[str, list[str]] = {}
    for e in events:
        reasons.setdefault(e.involved_object.name, []).append(e.message or "")
    unexplained = []
    for p in pods:
        if p.spec.node_name:
            continue
        decided = [
            m for m in reasons.get(p.metadata.name, [])
            if not any(r in m for r in REFUSALS)
        ]  # fmt: skip
        if not decided:
            unexplained.append((p.metadata.name, reasons.get(p.metadata.name)))
    assert not unexplained, unexplained
    asked = sum(float(f) for f in fractions)
    got = sum(loads.values())
    print(
        f"\n[extender replicas, leader {sig.name}] {PODS} fractional pods ({asked:g} GPUs asked, "
        f"{NODES * GPUS} GPUs): {len(done)} bound ({got:g} GPUs, {at_kill} before the "
        f"leader was killed, {after_kill} after), {len(pods) - len(done)} pending with a "
        f"FailedScheduling reason; failover {failover:.1f}s with {' '.join(TIMINGS)} "
        f"({new_leader_binds} bound by the new leader); max device load "
        f"{max(loads.values()):.2f}"
    )
    FAULT_SUMMARY.append(
        f"2 extender replicas (Lease election, {' '.join(TIMINGS)}) behind a round-robin "
        f"proxy, leader {sig.name} after {at_kill} of {PODS} fractional binds: failover "
        f"{failover:.1f}s; {len(done)} bound, no device above 100 %, the rest explained"
    )


def test_module_timings_are_safe() -> None:
    from extender.leader import timing_error

    values = dict(zip(TIMINGS[::2], (float(v) for v in TIMINGS[1::2]), strict=True))
    assert (
        timing_error(
            values["--lease-duration"], values["--renew-deadline"], values["--retry-period"]
        )
        is None
    )
