"""What kube-scheduler told the extender about its pods, kept beside the cache (a sink of
Pod and ResourceClaim events, applied to the pending queue when a snapshot is taken): the
``PodScheduled`` verdicts (a pod found unschedulable for a reason fairshare does not check
stops counting as waiting until it is asked about again), the pods the gate refused at
their last filter, the pods the requeuer nudged, the victims the preempt verb answered,
and the pods DynamicResources refused for want of devices.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairshare import dra, eligibility, gangs, verdicts
from fairshare.gate import GateDecision
from fairshare.placement import PodRequest
from fairshare.state import objects
from fairshare.state.cluster import ClusterState

REMEMBERED = 256
"""How many preemptors' victims to remember."""


def _claim_key(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _allocated(claim: Mapping[str, Any]) -> bool:
    status = claim.get("status")
    return isinstance(status, Mapping) and isinstance(status.get("allocation"), Mapping)


@dataclass
class Feedback:
    """kube-scheduler's side of each pending pod (module docstring)."""

    verdicts: dict[str, str] = field(default_factory=dict)
    """Pending pods with a verdict fairshare does not check, and its message."""
    gated: set[str] = field(default_factory=set)
    """Pending pods whose last filter the fair-share gate refused (``note_filter``)."""
    requeued: set[str] = field(default_factory=set)
    """Gated pods the requeuer nudged since their last filter (``extender.requeue``)."""
    preempted: OrderedDict[str, dict[str, tuple[str, ...]]] = field(default_factory=OrderedDict)
    """Per preemptor, the victims the preempt verb last answered, by node."""
    dra_refused: set[str] = field(default_factory=set)
    """Pending pods DynamicResources found no free devices for."""
    dra_released: int = 0
    """Counts ResourceClaims seen deleted while still allocated (their devices came free
    with no deallocation, which DynamicResources does not retry its pods on)."""
    version: int = 0
    """Counts changes of the verdicts (the snapshot's queue depends on them)."""
    _messages: dict[str, str | None] = field(default_factory=dict, repr=False)
    """Each known pending pod's current ``PodScheduled`` message (None: none)."""
    _asked: dict[str, str | None] = field(default_factory=dict, repr=False)
    """Per pod, the verdict it carried when kube-scheduler last asked the extender about
    it: that verdict is older than the ask, so it no longer stops the pod from waiting."""
    _answers: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)
    """Per pod, the failure texts the extender's filter last answered."""
    _dra_gpus: dict[str, bool] = field(default_factory=dict, repr=False)
    _allocated: set[str] = field(default_factory=set, repr=False)
    """ResourceClaims known to be allocated."""

    # -- a sink beside the cache --------------------------------------------------------

    def on_resync(self, kind: str, objects_: list[dict[str, Any]]) -> None:
        if kind == "Pod":
            listed = {objects.pod_uid(p) for p in objects_}
            for uid in [u for u in self._messages if u not in listed]:
                self.forget(uid)
            for pod in objects_:
                self._pod(pod)
        elif kind == dra.KIND_CLAIM:
            listed = {_claim_key(c) for c in objects_}
            if self._allocated - listed:
                self.dra_released += 1  # deleted allocated while the watch was away
            self._allocated = {_claim_key(c) for c in objects_ if _allocated(c)}

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        if kind == "Pod":
            if event_type == "DELETED":
                self.forget(objects.pod_uid(obj))
            else:
                self._pod(obj)
        elif kind == dra.KIND_CLAIM:
            key = _claim_key(obj)
            if event_type == "DELETED":
                if _allocated(obj) or key in self._allocated:
                    self.dra_released += 1
                self._allocated.discard(key)
            elif _allocated(obj):
                self._allocated.add(key)
            else:
                self._allocated.discard(key)

    def _pod(self, pod: dict[str, Any]) -> None:
        uid = objects.pod_uid(pod)
        if not uid:
            return
        if objects.is_terminal(pod):
            self.forget(uid)
            return
        bound = objects.is_bound(pod)
        if bound:
            self.gated.discard(uid)
        self._dra_gpus[uid] = dra.asks_gpus_without_claims(pod)
        message = None if bound else objects.unschedulable_message(pod)
        self._messages[uid] = message
        self._judge(uid, message)

    def forget(self, uid: str) -> None:
        """Pod ``uid`` is gone (deleted or finished)."""
        for held in (self._messages, self._dra_gpus, self._asked):
            held.pop(uid, None)
        self._answers.pop(uid, None)
        self.gated.discard(uid)
        self.requeued.discard(uid)
        self.preempted.pop(uid, None)
        self.dra_refused.discard(uid)
        if self.verdicts.pop(uid, None) is not None:
            self.version += 1

    # -- verdicts -----------------------------------------------------------------------

    def _judge(self, uid: str, message: str | None) -> None:
        if message is not None and verdicts.refused_for_dra_devices(message):
            self.dra_refused.add(uid)
        else:
            self.dra_refused.discard(uid)
        if message is None:
            self._asked.pop(uid, None)
            self._set(uid, None)
        elif uid in self._asked and self._asked[uid] == message:
            return  # kube-scheduler asked the extender since it wrote this verdict
        elif verdicts.rejected_by_kube_scheduler(
            message, self._answers.get(uid, ()), dra_gpus_checked=self._dra_gpus.get(uid, False)
        ):
            self._asked.pop(uid, None)
            self._set(uid, message)
        else:
            self._set(uid, None)

    def _set(self, uid: str, message: str | None) -> None:
        if message is None:
            if self.verdicts.pop(uid, None) is None:
                return
        elif self.verdicts.get(uid) == message:
            return
        else:
            self.verdicts[uid] = message
        self.version += 1

    def remember(self, pod: dict[str, Any], uid: str | None = None) -> None:
        """Take in a pod seen in a scheduler call before its watch event."""
        if (uid if uid is not None else objects.pod_uid(pod)) not in self._messages:
            self._pod(pod)

    def apply(self, req: PodRequest, spec: Mapping[str, Any], served: frozenset[str]) -> PodRequest:
        """``req`` (the cache's reading) with ``waiting`` and ``unschedulable`` as the
        pod's verdict says (``spec``: the pod's; ``served``: the schedulers the extender
        serves). A refusal of the pod's group by the extender itself keeps the member
        waiting with its group (``gangs.waiting``); its message stays for the views."""
        message = self.verdicts.get(req.uid, "")
        if message and not gangs.waiting.is_group_refusal(message):
            if req.unschedulable == message and not req.waiting:
                return req
            return dataclasses.replace(req, waiting=False, unschedulable=message)
        if req.unschedulable == message:
            return req
        waiting = eligibility.is_waiting(spec, served)
        return dataclasses.replace(req, waiting=waiting, unschedulable=message)

    def note_asked(self, uid: str, answers: Iterable[str] = ()) -> None:
        """kube-scheduler asked the extender's filter about pod ``uid``: its plugins passed
        some node, so its last verdict no longer says it cannot run. ``answers``: the
        failure texts the filter gave (a verdict that carries one was fairshare's)."""
        if uid not in self._messages:
            return
        self._asked[uid] = self._messages[uid]
        texts = frozenset(answers)
        if texts:
            self._answers[uid] = texts
        else:
            self._answers.pop(uid, None)
        self._set(uid, None)

    # -- the gate and preemption --------------------------------------------------------

    def note_filter(
        self, req: PodRequest, gate: GateDecision | None, pending: Mapping[str, Any]
    ) -> None:
        """Remember whether the fair-share gate refused ``req`` at this filter."""
        self.requeued.discard(req.uid)
        if gate is not None and not gate.allowed and req.uid in pending:
            self.gated.add(req.uid)
        else:
            self.gated.discard(req.uid)

    def gated_by_tenant(self, pending: Mapping[str, PodRequest]) -> dict[str, int]:
        """Pending pods per tenant that the gate refused at their last filter."""
        out: dict[str, int] = {}
        for uid in self.gated:
            req = pending.get(uid)
            if req is not None and req.tenant is not None:
                out[req.tenant] = out.get(req.tenant, 0) + 1
        return out

    def note_preempted(self, uid: str, victims: Mapping[str, Sequence[str]]) -> None:
        """Remember the victims the preempt verb answered for preemptor ``uid``."""
        self.preempted[uid] = {node: tuple(v) for node, v in victims.items()}
        self.preempted.move_to_end(uid)
        while len(self.preempted) > REMEMBERED:
            self.preempted.popitem(last=False)

    def victims_pending(self, uid: str, node: str, state: ClusterState) -> tuple[str, ...]:
        """The victims answered for preemptor ``uid`` on ``node`` that ``state`` still
        holds there (their DELETED event has not arrived yet)."""
        held = state.pods
        return tuple(
            v
            for v in self.preempted.get(uid, {}).get(node, ())
            if v in held and held[v].node == node
        )
