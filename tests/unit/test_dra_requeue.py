"""Pods kube-scheduler's DynamicResources refused for want of free devices are requeued
when an allocated claim is deleted (``extender.requeue``).

The case: tenant a's pod asks ``nvidia.com/gpu`` served from DRA (KEP-5004); its bind
reaches the extender after PreBind wrote its generated claim, allocated, and the gate
judged again at bind holds a. Meanwhile kube-scheduler tried b's pod and found no free
device (a's allocation in flight). kube-scheduler's Unreserve deletes a's claim still
allocated, an event DynamicResources does not retry its pods on: without the extender's
ring (an annotation of fairshare's DeviceClass, a DeviceClass update) b waits for the
5-minute flush. The messages are kube-scheduler v1.36's, as it wrote them on the local
control plane.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import logging
from typing import Any

import pytest

from extender import requeue
from fairshare import dra, verdicts
from fairshare.resources import ANN_REQUEUED, REQUEUE_DEVICE_CLASS
from tests import nvidia_dra as nv
from tests.extender_side import Side
from tests.unit.test_dra_capacity import (
    CLASSES,
    CONFIG,
    DRA_VERDICT,
    dra_node,
    generated_claim,
    kep5004_pod,
)
from tests.unit.test_state_objects import pod


def refused(p: dict[str, Any], message: str = DRA_VERDICT) -> dict[str, Any]:
    out = copy.deepcopy(p)
    out["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    return out


def cluster() -> Side:
    """A DRA node n1 of 4 GPUs: a holds 3; a's 4th pod is in its binding cycle with its
    generated claim allocated (PreBind wrote it); b's pod waits."""
    tr = Side(lambda: CONFIG)
    tr.on_resync(dra.KIND_DEVICE_CLASS, [CLASSES[nv.GPU_CLASS]])
    tr.on_resync(dra.KIND_SLICE, [nv.resource_slice("n1", 4)])
    tr.on_resync("Node", [dra_node("n1")])
    bound = [kep5004_pod(f"a{k}", "a", 1) for k in range(3)]
    tr.on_resync(dra.KIND_CLAIM, [generated_claim("a3", "a", 1)])
    tr.on_resync(
        "Pod",
        [
            *bound,
            pod("a3", ns="a", gpu=1, phase="Pending"),
            pod("b0", ns="b", gpu=1, phase="Pending"),
        ],
    )
    return tr


class Calls:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[Any] = []
        self.fail = fail

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.calls.append((namespace, name, body))

    async def ring(self, body: dict[str, Any]) -> None:
        self.calls.append(body)
        if self.fail is not None:
            raise self.fail


def requeuer(tr: Side, rings: Calls, patches: Calls) -> requeue.Requeuer:
    synced = asyncio.Event()
    synced.set()
    return requeue.Requeuer(
        snapshot=tr.reading, feedback=tr.feedback, config=lambda: CONFIG,
        patch=patches.patch, synced=synced, is_leader=lambda: True, ring=rings.ring,
    )  # fmt: skip


def test_dra_capacity_verdicts_are_told():
    assert verdicts.refused_for_dra_devices(DRA_VERDICT)
    fit = DRA_VERDICT.replace("cannot allocate all claims", "cannot fit resource")
    assert verdicts.refused_for_dra_devices(fit)
    mixed = (
        "0/5 nodes are available: 1 cannot allocate all claims, 4 node(s) didn't match "
        "Pod's node affinity/selector. still not schedulable, preemption: 0/5 nodes are "
        "available: 5 Preemption is not helpful for scheduling."
    )
    assert verdicts.refused_for_dra_devices(mixed)
    assert not verdicts.refused_for_dra_devices(
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    )
    gated = "0/1 nodes are available: 1 tenant a above its fair share (1.00 > 0.75) while b waits."
    assert not verdicts.refused_for_dra_devices(gated)
    assert not verdicts.refused_for_dra_devices("")


def test_the_tracker_counts_allocated_claims_deleted_and_dra_refused_pods():
    tr = cluster()
    assert tr.dra_released == 0 and tr.dra_refused == set()
    tr.on_event("Pod", "MODIFIED", refused(pod("b0", ns="b", gpu=1, phase="Pending")))
    assert tr.dra_refused == {"uid-b0"} and tr.pending["uid-b0"].waiting
    # a's bind is refused: kube-scheduler's Unreserve deletes the claim, still allocated.
    tr.on_event(dra.KIND_CLAIM, "DELETED", generated_claim("a3", "a", 1))
    assert tr.dra_released == 1
    # The usual end of a claim: the resourceclaim controller deallocates it, then it goes.
    claim = generated_claim("x", "a", 1)
    tr.on_event(dra.KIND_CLAIM, "ADDED", claim)
    del claim["status"]
    tr.on_event(dra.KIND_CLAIM, "MODIFIED", claim)
    tr.on_event(dra.KIND_CLAIM, "DELETED", claim)
    assert tr.dra_released == 1  # kube-scheduler saw the deallocation itself
    # One deleted while the watch was away (a relist without it).
    tr.on_event(dra.KIND_CLAIM, "ADDED", generated_claim("y", "a", 1))
    tr.on_resync(dra.KIND_CLAIM, [])
    assert tr.dra_released == 2
    # A verdict of another kind, or a bound pod, is no longer DRA-refused.
    tr.on_event("Pod", "MODIFIED", refused(pod("b0", ns="b", gpu=1, phase="Pending"), "x"))
    assert tr.dra_refused == set()
    tr.on_event("Pod", "MODIFIED", refused(pod("b0", ns="b", gpu=1, phase="Pending")))
    tr.on_event("Pod", "MODIFIED", refused(kep5004_pod("b0", "b", 1)))
    assert tr.dra_refused == set() and "uid-b0" not in tr.pending


def test_fairshares_device_class_is_not_counted():
    tr = cluster()
    ours = nv.device_class(REQUEUE_DEVICE_CLASS)
    ours["spec"]["selectors"] = [{"cel": {"expression": "false"}}]
    before = (dict(tr.device_classes), tr.state.version)
    tr.on_event(dra.KIND_DEVICE_CLASS, "MODIFIED", ours)
    assert (dict(tr.device_classes), tr.state.version) == before
    tr.on_resync(dra.KIND_DEVICE_CLASS, [CLASSES[nv.GPU_CLASS], ours])
    assert set(tr.device_classes) == {nv.GPU_CLASS}


async def test_a_dra_refused_pod_is_requeued_once_per_allocated_claim_deleted():
    tr = cluster()
    rings, patches = Calls(), Calls()
    rq = requeuer(tr, rings, patches)
    b0 = refused(pod("b0", ns="b", gpu=1, phase="Pending"))
    tr.on_event("Pod", "MODIFIED", b0)
    await rq.round()
    assert rings.calls == []  # a's claim still holds the device: nothing to retry for
    tr.on_event(dra.KIND_CLAIM, "DELETED", generated_claim("a3", "a", 1))
    await rq.round()
    (body,) = rings.calls
    stamp = body["metadata"]["annotations"][ANN_REQUEUED]
    assert dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
    assert patches.calls == []  # b's own update would not move it: no hint of DRA's for it
    # Once per deleted claim: other changes, the same verdict written again, ring no more.
    tr.on_event("Pod", "ADDED", pod("c0", ns="b", gpu=1, phase="Pending"))
    tr.on_event("Pod", "MODIFIED", b0)
    await rq.round()
    assert len(rings.calls) == 1
    # Another allocated claim deleted: b is requeued again.
    tr.on_event(dra.KIND_CLAIM, "ADDED", generated_claim("a4", "a", 1))
    tr.on_event(dra.KIND_CLAIM, "DELETED", generated_claim("a4", "a", 1))
    await rq.round()
    assert len(rings.calls) == 2
    # b bound: nobody left to requeue.
    tr.on_event("Pod", "MODIFIED", kep5004_pod("b0", "b", 1))
    tr.on_event(dra.KIND_CLAIM, "ADDED", generated_claim("a5", "a", 1))
    tr.on_event(dra.KIND_CLAIM, "DELETED", generated_claim("a5", "a", 1))
    await rq.round()
    assert len(rings.calls) == 2


async def test_a_verdict_seen_after_the_claims_deletion_is_requeued_too():
    """kube-scheduler writes the verdict from its own goroutine: the extender may see the
    claim go first."""
    tr = cluster()
    rings = Calls()
    rq = requeuer(tr, rings, Calls())
    tr.on_event(dra.KIND_CLAIM, "DELETED", generated_claim("a3", "a", 1))
    await rq.round()
    assert rings.calls == []  # nobody DRA-refused yet
    tr.on_event("Pod", "MODIFIED", refused(pod("b0", ns="b", gpu=1, phase="Pending")))
    await rq.round()
    assert len(rings.calls) == 1


async def test_no_ring_without_a_deleted_allocated_claim():
    tr = cluster()
    rings = Calls()
    rq = requeuer(tr, rings, Calls())
    tr.on_event("Pod", "MODIFIED", refused(pod("b0", ns="b", gpu=1, phase="Pending")))
    a3 = generated_claim("a3", "a", 1)
    del a3["status"]
    tr.on_event(dra.KIND_CLAIM, "MODIFIED", a3)  # deallocated: kube-scheduler retries b itself
    tr.on_event(dra.KIND_CLAIM, "DELETED", a3)
    await rq.round()
    assert rings.calls == [] and tr.dra_released == 0


async def test_a_failed_ring_is_logged_and_not_repeated(caplog: pytest.LogCaptureFixture):
    tr = cluster()
    rings = Calls(fail=RuntimeError("HTTP 404: deviceclasses not found"))
    rq = requeuer(tr, rings, Calls())
    tr.on_event("Pod", "MODIFIED", refused(pod("b0", ns="b", gpu=1, phase="Pending")))
    tr.on_event(dra.KIND_CLAIM, "DELETED", generated_claim("a3", "a", 1))
    with caplog.at_level(logging.WARNING, logger="fairshare.extender.requeue"):
        await rq.round()
    assert len(rings.calls) == 1
    assert REQUEUE_DEVICE_CLASS in caplog.text and "HTTP 404" in caplog.text
    tr.on_event("Pod", "ADDED", pod("c0", ns="b", gpu=1, phase="Pending"))
    await rq.round()
    assert len(rings.calls) == 1  # not at every change of the queue
