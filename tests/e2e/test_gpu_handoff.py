"""Handoff "reservation" on the real control plane, with kwok GPU nodes (issue 14).

kwok runs no containers, so the report that a device plugin + `fairshare gpu-reporter`
would make is simulated: the test patches `run.ai/reserve_for_gpu_index: <UUID>` onto the
reservation pod, as the reporter (or run-ai's fake-gpu-operator) does.

* two 0.5 pods on one node share one reservation pod; both pods' NVIDIA_VISIBLE_DEVICES
  come from their ConfigMaps, which hold its UUID (owned by the pods);
* an 8-GPU node holding two reservation pods takes 6 whole-GPU pods, not 7: kube-scheduler
  counts the reservations (its FailedScheduling event says "Insufficient nvidia.com/gpu");
* the reservation pod stays while a sharer lives and goes after the last one, across an
  extender restart in the middle (which also keeps the group: a new 0.5 pod joins it and
  gets the same GPU);
* a report that never comes: a GPUReportTimeout Warning event on the pod, which stays
  bound and waits; a report that comes late still hands the GPU over.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    CONFIG_HEAD,
    FairshareDev,
    gpu_pod_manifest,
    unique,
    wait_event,
    wait_for,
    wait_pod,
    wait_pod_gone,
)

RESERVATION_NS = "fairshare-reservation"
GROUP_LABEL = "runai-gpu-group"
REPORT = "run.ai/reserve_for_gpu_index"
ANN_GROUP = "fairshare.io/gpu-group"
ANN_CM = "fairshare.io/gpu-configmap"
ANN_UUID = "fairshare.io/gpu-uuid"


def half(name: str, node: str, fraction: str = "0.5") -> dict[str, Any]:
    return gpu_pod_manifest(name, 0, node=node, annotations={"fairshare.io/gpu-fraction": fraction})


async def bound(api: client.ApiClient, ns: str, name: str, timeout: float = 60) -> client.V1Pod:
    return await wait_pod(
        api, ns, name, lambda p: bool(p.spec.node_name), timeout=timeout, what="bound"
    )


async def reservations(api: client.ApiClient, group: str) -> list[client.V1Pod]:
    pods = await client.CoreV1Api(api).list_namespaced_pod(
        RESERVATION_NS, label_selector=f"{GROUP_LABEL}={group}"
    )
    return [p for p in pods.items if not p.metadata.deletion_timestamp]


async def one_reservation(api: client.ApiClient, group: str) -> client.V1Pod:
    async def probe() -> client.V1Pod | None:
        found = await reservations(api, group)
        return found[0] if len(found) == 1 else None

    return await wait_for(probe, timeout=30, what=f"the reservation pod of {group}")


async def report(api: client.ApiClient, reservation: client.V1Pod, gpu: str) -> None:
    """What the device plugin + reporter do on a real node."""
    await client.CoreV1Api(api).patch_namespaced_pod(
        reservation.metadata.name,
        RESERVATION_NS,
        {"metadata": {"annotations": {REPORT: gpu}}},
    )


async def handed_gpu(api: client.ApiClient, ns: str, pod: client.V1Pod, timeout: float = 30) -> str:
    """The NVIDIA_VISIBLE_DEVICES the kubelet would resolve for the pod's GPU container."""
    (env,) = [e for e in pod.spec.containers[0].env or [] if e.name == "NVIDIA_VISIBLE_DEVICES"]
    ref = env.value_from.config_map_key_ref
    assert ref.name == pod.metadata.annotations[ANN_CM] and ref.optional is None
    core = client.CoreV1Api(api)

    async def probe() -> client.V1ConfigMap | None:
        try:
            return await core.read_namespaced_config_map(ref.name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    cm = await wait_for(probe, timeout=timeout, what=f"ConfigMap {ns}/{ref.name}")
    (owner,) = cm.metadata.owner_references
    assert (owner.kind, owner.uid) == ("Pod", pod.metadata.uid)
    return str(cm.data[ref.key])


def fake_uuid() -> str:
    return f"GPU-{uuid.uuid4()}"


async def test_two_halves_share_one_reservation_and_whole_gpus_count_it(
    fairshare: FairshareDev, api: client.ApiClient, namespace: str, make_gpu_node: Any
) -> None:
    core = client.CoreV1Api(api)
    node = unique("handoff")
    await make_gpu_node(node, gpus=8)
    for name in ("a", "b"):
        await core.create_namespaced_pod(namespace, half(name, node))
    a, b = [await bound(api, namespace, n) for n in ("a", "b")]
    group = a.metadata.annotations[ANN_GROUP]
    assert b.metadata.annotations[ANN_GROUP] == group
    res = await one_reservation(api, group)
    assert res.spec.node_name == node
    resources = res.spec.containers[0].resources
    assert resources.limits["nvidia.com/gpu"] == resources.requests["nvidia.com/gpu"] == "1"

    gpu = fake_uuid()
    t0 = time.monotonic()
    await report(api, res, gpu)
    assert await handed_gpu(api, namespace, a) == gpu
    assert await handed_gpu(api, namespace, b) == gpu
    after_report = time.monotonic() - t0
    seconds = fairshare.metric("extender", "fairshare_gpu_handoff_seconds_sum")
    count = fairshare.metric("extender", "fairshare_gpu_handoff_seconds_count")
    sys.stderr.write(
        f"\n[e2e] GPU handoff: report -> both ConfigMaps seen by the test {after_report:.3f}s; "
        f"extender bind -> ConfigMap written: mean {seconds / max(count, 1):.3f}s over "
        f"{count:g} pods (includes the simulated report's delay)\n"
    )

    # A second shared GPU on the node: two reservation pods hold two of its 8 GPUs.
    await core.create_namespaced_pod(namespace, half("c", node))
    c = await bound(api, namespace, "c")
    other = c.metadata.annotations[ANN_GROUP]
    assert other != group
    await report(api, await one_reservation(api, other), fake_uuid())

    names = [f"w{i}" for i in range(7)]
    for name in names:
        await core.create_namespaced_pod(namespace, gpu_pod_manifest(name, 1, node=node))

    async def settled() -> list[str] | None:
        pods = [await core.read_namespaced_pod(n, namespace) for n in names]
        placed = [p.metadata.name for p in pods if p.spec.node_name]
        return placed if len(placed) == 6 else None

    placed = await wait_for(settled, timeout=60, what="6 whole-GPU pods bound")
    (left,) = set(names) - set(placed)
    event = await wait_event(
        api, namespace, involved_name=left, reason="FailedScheduling", timeout=30
    )
    # kube-scheduler's own NodeResourcesFit turned the node down (the extender's reason
    # would read "Insufficient nvidia.com/gpu (free ..."): it counts the reservations.
    assert "Insufficient nvidia.com/gpu" in event.message and "(free" not in event.message
    sys.stderr.write(f"\n[e2e] the 7th whole-GPU pod: {event.message}\n")
    await asyncio.sleep(3)  # the scheduler retries every second or two: still 6
    assert not (await core.read_namespaced_pod(left, namespace)).spec.node_name


async def test_reservations_go_with_their_last_sharer_across_an_extender_restart(
    fairshare: FairshareDev, api: client.ApiClient, namespace: str, make_gpu_node: Any
) -> None:
    core = client.CoreV1Api(api)
    node = unique("handoff")
    await make_gpu_node(node, gpus=2)
    for name in ("a", "b"):
        await core.create_namespaced_pod(namespace, half(name, node, "0.25"))
    a, _ = [await bound(api, namespace, n) for n in ("a", "b")]
    group = a.metadata.annotations[ANN_GROUP]
    gpu = fake_uuid()
    await report(api, await one_reservation(api, group), gpu)
    assert await handed_gpu(api, namespace, a) == gpu

    await core.delete_namespaced_pod("a", namespace, grace_period_seconds=0)
    await wait_pod_gone(api, namespace, "a")
    await asyncio.sleep(2)  # a sweep or two: the group still has b
    assert len(await reservations(api, group)) == 1

    await asyncio.to_thread(fairshare.restart_extender)
    assert fairshare.metric("extender", "fairshare_gpu_handoff_seconds_count") == 0
    # The restarted extender rebuilt the group from the annotations: a new quarter joins
    # it (same slot, same reservation) and gets the GPU at once.
    await core.create_namespaced_pod(namespace, half("c", node, "0.25"))
    c = await bound(api, namespace, "c")
    assert c.metadata.annotations[ANN_GROUP] == group
    assert await handed_gpu(api, namespace, c) == gpu
    assert len(await reservations(api, group)) == 1
    took = fairshare.metric("extender", "fairshare_gpu_handoff_seconds_sum")
    sys.stderr.write(f"\n[e2e] GPU handoff, UUID known: bind -> ConfigMap written {took:.3f}s\n")

    for name in ("b", "c"):
        await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    async def gone() -> bool:
        return not await reservations(api, group)

    await wait_for(gone, timeout=30, what=f"the reservation of {group} deleted")


async def test_a_report_that_never_comes_is_explained_and_a_late_one_still_works(
    fairshare: FairshareDev, api: client.ApiClient, namespace: str, make_gpu_node: Any
) -> None:
    await fairshare.set_config(
        api, CONFIG_HEAD + "gpuSharing:\n  reservation:\n    reportTimeoutSeconds: 2\n"
    )
    core = client.CoreV1Api(api)
    node = unique("handoff")
    await make_gpu_node(node, gpus=1)
    await core.create_namespaced_pod(namespace, half("p", node))
    p = await bound(api, namespace, "p")
    event = await wait_event(
        api, namespace, involved_name="p", reason="GPUReportTimeout", timeout=30
    )
    assert event.type == "Warning" and "has not reported a GPU UUID" in event.message
    # Left bound and explained (the kubelet holds its containers until the ConfigMap is
    # there); the report arriving late still hands the GPU over.
    p = await core.read_namespaced_pod("p", namespace)
    assert p.spec.node_name == node and ANN_UUID not in (p.metadata.annotations or {})
    gpu = fake_uuid()
    await report(api, await one_reservation(api, p.metadata.annotations[ANN_GROUP]), gpu)
    assert await handed_gpu(api, namespace, p) == gpu
    await wait_pod(
        api, namespace, "p", lambda x: x.metadata.annotations.get(ANN_UUID) == gpu, timeout=30
    )


async def test_a_lost_reservation_is_surfaced_or_replaced_before_any_pod_got_its_gpu(
    fairshare: FairshareDev, api: client.ApiClient, namespace: str, make_gpu_node: Any
) -> None:
    core = client.CoreV1Api(api)
    node, other = unique("handoff"), unique("handoff")
    await make_gpu_node(node, gpus=1)
    await make_gpu_node(other, gpus=1)
    # Running on its GPU: losing the reservation is a Warning on the pod (it keeps running).
    await core.create_namespaced_pod(namespace, half("run", node))
    run = await bound(api, namespace, "run")
    running = run.metadata.annotations[ANN_GROUP]
    res = await one_reservation(api, running)
    await report(api, res, fake_uuid())
    await handed_gpu(api, namespace, run)
    await core.delete_namespaced_pod(res.metadata.name, RESERVATION_NS, grace_period_seconds=0)
    event = await wait_event(
        api, namespace, involved_name="run", reason="GPUReservationLost", timeout=30
    )
    assert event.type == "Warning"
    assert not await reservations(api, running)  # not recreated: it could be another GPU
    # No new share joins that shared GPU, though a quarter would fit beside "run".
    await core.create_namespaced_pod(namespace, half("late", node, "0.25"))
    await wait_event(api, namespace, involved_name="late", reason="FailedScheduling", timeout=30)
    await asyncio.sleep(3)
    assert not (await core.read_namespaced_pod("late", namespace)).spec.node_name

    # Not yet on a GPU: a lost reservation is simply created again.
    await core.create_namespaced_pod(namespace, half("wait", other, "0.25"))
    wait = await bound(api, namespace, "wait")
    waiting = wait.metadata.annotations[ANN_GROUP]
    first = await one_reservation(api, waiting)
    await core.delete_namespaced_pod(first.metadata.name, RESERVATION_NS, grace_period_seconds=0)

    async def replaced() -> client.V1Pod | None:
        found = await reservations(api, waiting)
        return next((p for p in found if p.metadata.uid != first.metadata.uid), None)

    again = await wait_for(replaced, timeout=60, what=f"a new reservation of {waiting}")
    gpu = fake_uuid()
    await report(api, again, gpu)
    assert await handed_gpu(api, namespace, wait) == gpu
