"""Held pods move as soon as the fair-share gate lifts.

kube-scheduler keeps a pod that an extender refused in its unschedulable pool under the
fake plugin name ``Extender`` (``findNodesThatFitPod``, pkg/scheduler/schedule_one.go,
v1.36), registered for every cluster event with no queueing hint, so any Pod, Node,
volume, claim or DeviceClass event moves such a pod to the backoff queue. Most events
that lift the gate are of that kind (a bind, a pod finishing), but not all: a pending pod
of the waiting tenant being deleted moves nobody (``deletePodFromSchedulingQueue`` only
requeues others for a nominated or waiting pod), and neither does kube-scheduler's own
verdict that the waiting pod cannot run (fairshare then stops counting it as waiting:
``ExtenderTracker.verdicts``). Without another event the held pods would wait for the
unschedulable pool's flush (``podMaxInUnschedulablePodsDuration``, 5 minutes).

An update of the held pod itself is such an event (``PriorityQueue.Update``: an
unschedulable pod whose update changes more than its status is judged by the queueing
hints of its rejectors; ``Extender`` has none, so it is requeued after its backoff). So
the leader watches the gate: after any change of the queue or the cluster, each pod the
gate refused at its last filter (``ExtenderTracker.gated``) is judged again, and one the
gate would now let through gets the annotation ``fairshare.io/requeued-at`` (a merge
patch; the time of the nudge). Each pod is nudged at most once until kube-scheduler asks
about it again (``ExtenderTracker.requeued``, cleared by its next filter), at most
``BATCH`` pods per round.

``lifted`` is the decision (pure over the tracker); ``Requeuer`` the adapter.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import serving
from fairshare import fairness, gating, reclaim
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest
from fairshare.resources import ANN_REQUEUED
from scheduler_plugin.tracking import ExtenderTracker

log = logging.getLogger("fairshare.extender.requeue")

PERIOD: Final = 0.5
"""Seconds between two looks at the gate (only after a change of the queue or cluster)."""
BATCH: Final = 200
"""Most pods nudged in one round (the rest in the next)."""

Patch = Callable[[str, str, dict[str, Any]], Awaitable[None]]
"""``patch(namespace, name, merge_patch_body)``."""


def lifted(
    tracker: ExtenderTracker,
    config: FairShareConfig,
    groups: gating.GroupFits | None = None,
) -> list[PodRequest]:
    """The pending pods the gate refused at their last filter and would let through now,
    not yet nudged since (oldest uid order is not meaningful: the order of ``gated``
    is the tracker's). Pods of one tenant and shape share one gate check. ``groups``:
    how waiting pod groups count at the gate, as the filter counts them."""
    state = tracker.state
    queue = tracker.pending_queue()
    fair = tracker.fair_shares(config)
    held = reclaim.gate_held(tracker.room_holds())
    judged: dict[tuple[Any, ...], fairness.GateDecision | None] = {}
    out = []
    for uid in sorted(tracker.gated - tracker.requeued):
        req = tracker.pending.get(uid)
        if req is None or uid in state.pods:
            continue
        key = (req.tenant, gating.shape_key(req))
        if key not in judged:
            judged[key] = gating.check_fair_gate(
                state, config=config, req=req, pending=queue, fair=fair, groups=groups, held=held
            )
        gate = judged[key]
        if gate is None or gate.allowed:
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
        tracker: ExtenderTracker,
        config: Callable[[], FairShareConfig],
        patch: Patch,
        synced: asyncio.Event,
        is_leader: Callable[[], bool],
        on_nudge: Callable[[int], None] | None = None,
        groups: Callable[[FairShareConfig], gating.GroupFits | None] | None = None,
    ) -> None:
        self.tracker, self.config, self.patch = tracker, config, patch
        self.synced, self.is_leader, self.on_nudge = synced, is_leader, on_nudge
        self.groups = groups
        self._seen: tuple[Any, ...] | None = None

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
        """One look at the gate; returns how many pods were nudged."""
        t, config = self.tracker, self.config()
        key = (t.queue_version, t.state.version, id(config), len(t.gated - t.requeued))
        if key == self._seen:
            return 0
        self._seen = key
        groups = self.groups(config) if self.groups is not None else None
        pods = lifted(t, config, groups)[:BATCH]
        if not pods:
            return 0
        body = requeue_patch(dt.datetime.now(dt.UTC))
        for req in pods:
            t.requeued.add(req.uid)

        async def one(req: PodRequest) -> bool:
            try:
                await self.patch(req.namespace, req.name, body)
                return True
            except Exception as exc:  # a pod deleted meanwhile, an API hiccup
                log.info("requeueing %s/%s: %s", req.namespace, req.name, exc)
                t.requeued.discard(req.uid)
                return False

        done = sum(await asyncio.gather(*(one(req) for req in pods)))
        if done:
            log.info("gate lifted: requeued %d held pod(s)", done)
            if self.on_nudge is not None:
                self.on_nudge(done)
        self._seen = None if done < len(pods) else self._seen
        return done


def api_patch(api_client: Any) -> Patch:
    """A ``Patch`` over kubernetes_asyncio (merge patch of a pod's metadata)."""
    from kubernetes_asyncio import client

    from fairshare.errors import FairshareError
    from scheduler_plugin.leader import call_raw

    core: Any = client.CoreV1Api(api_client)

    async def patch(namespace: str, name: str, body: dict[str, Any]) -> None:
        status, data = await call_raw(
            core.patch_namespaced_pod(
                name, namespace, body,
                _content_type="application/merge-patch+json", _preload_content=False,
            )
        )  # fmt: skip
        if not 200 <= status < 300:
            raise FairshareError(f"HTTP {status}: {data.get('message', '')}")

    return patch
