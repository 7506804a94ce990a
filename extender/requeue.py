"""Held pods move as soon as the fair-share gate lifts.

kube-scheduler keeps a pod an extender refused in its unschedulable pool (plugin
``Extender``, no queueing hint). Most cluster events move it, but not every event that
lifts the gate (a pending pod of the waiting tenant deleted, kube-scheduler's own verdict
that the waiting pod cannot run), and the pool is flushed only after 5 minutes; an update
of the held pod itself does move it. So the leader judges again, after any change, each
pod the gate refused at its last filter (``Feedback.gated``) and annotates one the gate
would now let through with ``fairshare.io/requeued-at``: once until kube-scheduler asks
about it again, at most ``BATCH`` pods per round.

kube-scheduler retries pods DynamicResources refused for want of devices on a
ResourceSlice or DeviceClass change, but not on a claim's deletion (v1.36), which is how
the devices of a pod whose bind failed after PreBind come free. So once an allocated
claim is seen deleted while such pods wait, the leader annotates fairshare's own
DeviceClass ``requeue.fairshare.io`` (it selects no device), once per pod per claim.

``lifted`` and ``dra_refused`` are the decisions (pure); ``Requeuer`` is the adapter.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Final

from kubernetes_asyncio import client

import serving
from extender.feedback import Feedback
from extender.leader import call_raw
from extender.snapshot import Snapshot
from fairshare.config.schema import FairShareConfig
from fairshare.errors import FairshareError
from fairshare.gate import GateDecision, check_fair_gate, shape_key
from fairshare.placement import PodRequest
from fairshare.preemption import holds
from fairshare.resources import ANN_REQUEUED, REQUEUE_DEVICE_CLASS

log = logging.getLogger("fairshare.extender.requeue")

PERIOD: Final = 0.5
"""Seconds between two looks at the gate (only after a change of the queue or cluster)."""
BATCH: Final = 200
"""Most pods nudged in one round (the rest in the next)."""

Patch = Callable[[str, str, dict[str, Any]], Awaitable[None]]
"""``patch(namespace, name, merge_patch_body)``."""
Ring = Callable[[dict[str, Any]], Awaitable[None]]
"""``ring(merge_patch_body)``: patch fairshare's DeviceClass ``REQUEUE_DEVICE_CLASS``."""


def lifted(snap: Snapshot, feedback: Feedback, config: FairShareConfig) -> list[PodRequest]:
    """The pending pods the gate refused at their last filter and would let through now,
    not yet nudged since. Pods of one tenant and shape share one gate check; waiting pod
    groups count as the filter counts them (``snap.groups``)."""
    state = snap.state
    queue, fair, groups = snap.queue, snap.fair, snap.groups
    held = holds.gate_held(snap.holds)
    judged: dict[tuple[Any, ...], GateDecision | None] = {}
    out = []
    for uid in sorted(feedback.gated - feedback.requeued):
        req = snap.pending.get(uid)
        if req is None or uid in state.pods:
            continue
        key = (req.tenant, shape_key(req))
        if key not in judged:
            judged[key] = check_fair_gate(
                state, config=config, req=req, pending=queue, fair=fair, groups=groups, held=held
            )
        gate = judged[key]
        if gate is None or gate.allowed:
            out.append(req)
    return out


def dra_refused(snap: Snapshot, feedback: Feedback, rung: Mapping[str, int]) -> list[PodRequest]:
    """The pending pods DynamicResources refused for want of free devices (their
    ``PodScheduled`` verdict) not requeued since the last allocated claim was seen
    deleted: ``rung`` has, per pod, the ``dra_released`` count it was last requeued at."""
    released = feedback.dra_released
    out = []
    for uid in sorted(feedback.dra_refused):
        req = snap.pending.get(uid)
        if req is not None and rung.get(uid, 0) < released:
            out.append(req)
    return out


def requeue_patch(now: dt.datetime) -> dict[str, Any]:
    """The merge patch that requeues a held pod: a new ``fairshare.io/requeued-at``."""
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"metadata": {"annotations": {ANN_REQUEUED: stamp}}}


class Requeuer:
    """The leader's loop that nudges held pods whose gate lifted (module docstring)."""

    def __init__(
        self,
        *,
        snapshot: Callable[[FairShareConfig], AbstractContextManager[Snapshot]],
        feedback: Feedback,
        config: Callable[[], FairShareConfig],
        patch: Patch,
        synced: asyncio.Event,
        is_leader: Callable[[], bool],
        on_nudge: Callable[[int], None] | None = None,
        ring: Ring | None = None,
    ) -> None:
        self.snapshot, self.feedback, self.config = snapshot, feedback, config
        self.patch, self.synced, self.is_leader = patch, synced, is_leader
        self.on_nudge, self.ring = on_nudge, ring
        self._seen: tuple[Any, ...] | None = None
        self._rung: dict[str, int] = {}
        """Per pod DynamicResources refused, the ``dra_released`` count it was requeued at."""

    def background(self) -> Callable[[Any], AsyncIterator[None]]:
        return serving.background_task(self.run, "requeue-held-pods")

    async def run(self) -> None:
        await self.synced.wait()
        while True:
            await asyncio.sleep(PERIOD)
            if not self.is_leader():
                self._seen = None
                continue
            try:
                await self.round()
            except Exception:
                log.exception("requeueing held pods failed")

    async def round(self) -> int:
        """One look at the gate (and at the pods DynamicResources refused: ``ring_round``);
        returns how many held pods were nudged."""
        fb, config = self.feedback, self.config()
        with self.snapshot(config) as snap:
            key = (snap.version, len(fb.gated - fb.requeued), fb.dra_released)
            if key == self._seen:
                return 0
            self._seen = key
            rung = self._ring_pods(snap)
            pods = lifted(snap, fb, config)[:BATCH]
        await self._ring(rung)
        if not pods:
            return 0
        body = requeue_patch(dt.datetime.now(dt.UTC))
        for req in pods:
            fb.requeued.add(req.uid)

        async def one(req: PodRequest) -> bool:
            try:
                await self.patch(req.namespace, req.name, body)
                return True
            except Exception as exc:  # a pod deleted meanwhile, an API hiccup
                log.info("requeueing %s/%s: %s", req.namespace, req.name, exc)
                fb.requeued.discard(req.uid)
                return False

        done = sum(await asyncio.gather(*(one(req) for req in pods)))
        if done:
            log.info("gate lifted: requeued %d held pod(s)", done)
            if self.on_nudge is not None:
                self.on_nudge(done)
        self._seen = None if done < len(pods) else self._seen
        return done

    async def ring_round(self) -> int:
        """Requeue the pods DynamicResources refused that an allocated claim's deletion
        may let through (module docstring): one annotation of fairshare's DeviceClass.
        Returns how many such pods there were (0: no ring)."""
        with self.snapshot(self.config()) as snap:
            pods = self._ring_pods(snap)
        return await self._ring(pods)

    def _ring_pods(self, snap: Snapshot) -> list[PodRequest]:
        """The pods to requeue through the DeviceClass now (each marked as rung)."""
        for uid in [u for u in self._rung if u not in snap.pending]:
            del self._rung[uid]
        if self.ring is None:
            return []
        pods = dra_refused(snap, self.feedback, self._rung)
        for req in pods:  # once per pod and deleted claim, answered or not
            self._rung[req.uid] = self.feedback.dra_released
        return pods

    async def _ring(self, pods: list[PodRequest]) -> int:
        if not pods or self.ring is None:
            return 0
        try:
            await self.ring(requeue_patch(dt.datetime.now(dt.UTC)))
        except Exception as exc:  # no such DeviceClass, no right to patch it, an API hiccup
            log.warning(
                "requeueing %d pod(s) DynamicResources refused through DeviceClass %s: %s "
                "(kube-scheduler retries them on its own later)",
                len(pods), REQUEUE_DEVICE_CLASS, exc,
            )  # fmt: skip
            return 0
        log.info(
            "allocated ResourceClaim deleted: requeued %d pod(s) DynamicResources refused (%s)",
            len(pods),
            ", ".join(f"{r.namespace}/{r.name}" for r in pods[:5]),
        )
        return len(pods)


MERGE_PATCH: Final = {"_content_type": "application/merge-patch+json", "_preload_content": False}
"""kubernetes_asyncio keywords of a raw merge patch (answered through ``leader.call_raw``)."""


async def _merge_patch(call: Awaitable[Any]) -> None:
    """Await a raw merge-patch call; a non-2xx answer raises ``FairshareError``."""

    status, data = await call_raw(call)
    if not 200 <= status < 300:
        raise FairshareError(f"HTTP {status}: {data.get('message', '')}")


def api_patch(api_client: Any) -> Patch:
    """A ``Patch`` over kubernetes_asyncio (merge patch of a pod's metadata)."""

    core: Any = client.CoreV1Api(api_client)

    async def patch(namespace: str, name: str, body: dict[str, Any]) -> None:
        await _merge_patch(core.patch_namespaced_pod(name, namespace, body, **MERGE_PATCH))

    return patch


def api_ring(api_client: Any) -> Ring:
    """A ``Ring`` over kubernetes_asyncio (merge patch of the DeviceClass's metadata)."""

    v1: Any = client.ResourceV1Api(api_client)

    async def ring(body: dict[str, Any]) -> None:
        await _merge_patch(v1.patch_device_class(REQUEUE_DEVICE_CLASS, body, **MERGE_PATCH))

    return ring
