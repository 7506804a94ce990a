"""Gangs in the extender: all or nothing at filter and at bind (``fairshare.gangs``).

kube-scheduler schedules a group's pods one by one and binds them concurrently; this
keeps the group whole around it:

* **Filter.** The first member's filter judges the whole group: its ``min_count``, the
  gate for its whole demand, and a node for every member not bound yet (inside one
  topology domain when it has a key). A group that cannot be placed whole is refused for
  every member and holds nothing; a placed one becomes a plan whose room is reserved in
  the cache, and each member's filter answers its planned node only.
* **Bind.** A member's bind is held until the members still needed have reached bind,
  then all are bound; a held bind is refused after ``BIND_WAIT`` seconds (under
  kube-scheduler's 5 s ``httpTimeout``), and the plan keeps its room.
* **Expiry.** A plan untouched for ``PLAN_IDLE`` seconds, an incomplete one older than
  ``PLAN_MAX``, or one with a deleted member is dropped and its room released; its held
  binds are refused.
* **Told.** A refusal its owner can act on gets a ``FairShareGang`` Event on the pending
  members, once per reason every ``TELL_EVERY`` seconds.

Pods outside a group, and members of a running group, go the ordinary way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare import gangs
from fairshare.config.schema import FairShareConfig
from fairshare.gangs.podgroups import FetchPodGroup, PodGroupReader
from fairshare.gate import GateDecision
from fairshare.placement import PodRequest
from fairshare.state import objects

log = logging.getLogger("fairshare.extender.gangs")

PLAN_IDLE = 15.0
"""Seconds a plan lives with no member's filter or bind (kube-scheduler's longest pod
backoff is 10 s, so a member in backoff comes back before its plan goes)."""
PLAN_MAX = 60.0
"""Seconds an incomplete plan lives at most, however often it is touched."""
BIND_WAIT = 4.0
"""Seconds a member's bind is held for the rest of its group (``httpTimeout`` is 5 s)."""
TELL_EVERY = 300.0
"""Seconds before the same reason is told again on a group's pods (an Event each time)."""

Member = tuple[str, str, str]
"""(namespace, name, uid) of a group's member."""
OnWait = Callable[[gangs.GroupKey, Sequence[Member], str], None]
"""Told that a group waits for something its owner can change: the members not bound
yet and the text (``events.gang_recorder`` writes it as an Event on each)."""

TakeSnapshot = Callable[[], AbstractContextManager[Snapshot]]
"""The cache's snapshot now, for a ``with`` block (``ExtenderDeps.reading``)."""
PodGroupFacts = tuple[
    Mapping[gangs.GroupKey, int | None], Mapping[gangs.GroupKey, Mapping[str, Any] | None]
]
"""What was read of PodGroups: their sizes, and the objects (for topology keys)."""


class Room(Protocol):
    """Where a plan's room is held (the cache: ``Cache.reserve`` / ``Cache.release``)."""

    def reserve(self, plan: gangs.GangPlan) -> None: ...

    def release(self, plan: gangs.GangPlan, uids: tuple[str, ...] | None = None) -> None: ...


BindNow = Callable[[wire.ExtenderBindingArgs, Callable[[], None]], Awaitable[dict[str, Any]]]
"""The extender's own bind of one pod (``ExtenderBindingResult`` JSON), with a callable
run under the bind lock just before the bind is decided (it releases the reservation)."""


@dataclass
class LivePlan:
    plan: gangs.GangPlan
    gang: gangs.Gang
    created: float
    touched: float
    done: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: dict[str, wire.ExtenderBindingArgs] = field(default_factory=dict)
    in_call: set[str] = field(default_factory=set)
    binds: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    complete: bool = False
    dropped: str = ""


@dataclass
class GangCoordinator:
    """The live plans of the extender (one decision-maker: the leader)."""

    room: Room
    fetch: FetchPodGroup | None = None
    clock: Callable[[], float] = time.monotonic
    plans: dict[gangs.GroupKey, LivePlan] = field(default_factory=dict)
    member_of: dict[str, gangs.GroupKey] = field(default_factory=dict)
    _podgroups: PodGroupReader = field(default_factory=PodGroupReader)
    on_wait: OnWait | None = None
    _told: dict[gangs.GroupKey, tuple[str, float]] = field(default_factory=dict)
    _facts: tuple[int, PodGroupFacts] | None = field(default=None, repr=False)
    on_gate: Callable[[PodRequest, GateDecision | None], None] | None = None
    """Told the gate's decision for a member whose group was judged (the app's feedback)."""

    def podgroup_facts(self) -> PodGroupFacts:
        """What was read of PodGroups, the same value until another read (a snapshot's
        gate rule for waiting groups is made from it)."""
        version = self._podgroups.version
        if self._facts is None or self._facts[0] != version:
            self._facts = (version, (self.sizes(), self._podgroups.objects()))
        return self._facts[1]

    # -- what is known, for the status page and metrics -------------------------------

    def sizes(self) -> dict[gangs.GroupKey, int | None]:
        """``spec.minMember`` of every PodGroup read lately (None: it has none)."""
        return self._podgroups.min_counts()

    def plan_views(self) -> dict[gangs.GroupKey, gangs.status.LivePlanView]:
        """The live plans as ``gangs.status`` reads them."""
        return {
            key: gangs.status.LivePlanView(
                nodes={p.uid: p.node for p in live.plan.placements},
                arrived=len(live.arrived),
                needed=live.gang.needed,
                complete=live.complete,
            )
            for key, live in self.plans.items()
            if not live.dropped
        }

    def statuses(
        self, config: FairShareConfig, snap: Snapshot, *, judge: bool = True
    ) -> list[gangs.status.GroupStatus]:
        """Every group the snapshot knows, with the live plans (``gangs.status``)."""
        return gangs.status.group_statuses(
            config=config,
            state=snap.state,
            pods=snap.gang_pods,
            pending=snap.pending,
            podgroups=self.sizes(),
            plans=self.plan_views(),
            judge=judge,
            fair=snap.fair if judge else None,
        )

    def _tell(self, key: gangs.GroupKey, reason: str, hint: str, snap: Snapshot) -> None:
        """Tell the group's owner why it waits (an Event on its pending members), once
        per reason every ``TELL_EVERY`` seconds."""
        if self.on_wait is None:
            return
        now = self.clock()
        last = self._told.get(key)
        if last is not None and last[0] == reason and now - last[1] < TELL_EVERY:
            return
        if len(self._told) > 4096:
            self._told = {k: v for k, v in self._told.items() if now - v[1] < TELL_EVERY}
        self._told[key] = (reason, now)
        members = []
        for uid, pod in snap.gang_pods.items():
            if uid not in snap.state.pods and gangs.group_of(pod) == key:
                meta = pod.get("metadata") or {}
                members.append((str(meta.get("namespace") or ""), str(meta.get("name")), uid))
        if members:
            self.on_wait(key, sorted(members), f"{reason}. {hint}")

    # -- group facts -------------------------------------------------------------------

    async def min_count(self, key: gangs.GroupKey, pod: Mapping[str, Any]) -> int | str:
        """The group's ``min_count``, or why it cannot be known."""
        if self.fetch is not None:
            try:
                obj = await self._podgroups.read(key, self.fetch, now=self.clock())
            except Exception as exc:
                return f"gang {key}: its PodGroup cannot be read: {exc}"
            if obj is not None:
                n = gangs.podgroup_min_count(obj)
                if n is None:
                    field_ = (
                        "spec.schedulingPolicy.gang.minCount" if key.native else "spec.minMember"
                    )
                    return f"gang {key}: its PodGroup has no positive {field_}"
                return n
        n = gangs.annotated_min_count(pod)
        if n is None:
            group, version, _ = key.api
            return (
                f"gang {key}: no PodGroup {group}/{version} "
                f"{key} and no {gangs.ANN_MIN_MEMBERS} annotation on the pod"
            )
        return n

    def topology_key(self, key: gangs.GroupKey, pod: Mapping[str, Any]) -> str | None:
        """The group's topology key (``gangs.topology_key``): its native PodGroup's
        constraint, as ``min_count`` read it last, else the pod's annotation."""
        return gangs.topology_key(self._podgroups.last(key), pod)

    # -- plans -------------------------------------------------------------------------

    def _drop(self, key: gangs.GroupKey, why: str) -> None:
        live = self.plans.pop(key, None)
        if live is None:
            return
        self.room.release(live.plan)
        for p in live.plan.placements:
            if self.member_of.get(p.uid) == key:
                del self.member_of[p.uid]
        live.dropped = why
        live.done.set()
        if not live.complete:
            log.info("gang %s: plan dropped: %s", key, why)

    def expire(self, snap: Snapshot) -> None:
        """Drop the plans that are over (see the module's text)."""
        now = self.clock()
        for key, live in list(self.plans.items()):
            uids = [p.uid for p in live.plan.placements]
            if live.complete:
                if all(u in live.binds and live.binds[u].done() for u in uids):
                    self._drop(key, "bound")
                elif now - live.touched > PLAN_IDLE:
                    self._drop(key, f"members not bound within {PLAN_IDLE:g}s of the group")
                continue
            gone = [u for u in uids if u not in snap.gang_pods]
            if gone:
                self._drop(key, f"member {gone[0]} was deleted")
            elif now - live.touched > PLAN_IDLE:
                self._drop(key, f"no member used it for {PLAN_IDLE:g}s")
            elif now - live.created > PLAN_MAX:
                self._drop(key, f"not complete after {PLAN_MAX:g}s")

    # -- filter ------------------------------------------------------------------------

    async def filter(
        self, args: wire.ExtenderArgs, config: FairShareConfig, snapshot: TakeSnapshot
    ) -> verbs.FilterAnswer | None:
        """The filter answer for a member of a group (None: not a gang's business), with
        the gate's decision when the group was judged. Plans that are over are dropped
        first, whatever the pod (their room is then free for it)."""
        if self.plans:
            with snapshot() as snap:
                self.expire(snap)
        key = gangs.group_of(args.pod)
        if key is None:
            return None
        uid = objects.pod_uid(args.pod)
        names = args.candidate_names()
        live = self.plans.get(key)
        if live is None:
            n = await self.min_count(key, args.pod)
            if isinstance(n, str):
                with snapshot() as snap:
                    self._tell(
                        key,
                        n,
                        (
                            f"Create PodGroup {key} ({gangs.NATIVE_GROUP}/{gangs.NATIVE_VERSION}) "
                            "with spec.schedulingPolicy.gang.minCount"
                            if key.native
                            else f"Create PodGroup {key} ({gangs.PODGROUP_GROUP}/"
                            f"{gangs.PODGROUP_VERSION}) with spec.minMember, or give its pods "
                            f"the {gangs.ANN_MIN_MEMBERS} annotation"
                        ),
                        snap,
                    )
                return verbs.FilterAnswer(_refuse(args, names, n, unresolvable=True))
            live_or_answer = self._plan(args, key, n, config, names, snapshot)
            if not isinstance(live_or_answer, LivePlan):
                return live_or_answer
            live = live_or_answer
        live.touched = self.clock()
        node = live.plan.node_of(uid)
        if node is None:
            if live.complete:
                return None
            return verbs.FilterAnswer(
                _refuse(
                    args,
                    names,
                    f"gang {key} is being placed without this pod (planned before it was "
                    "seen); it is placed once the group is",
                )
            )
        if node not in names:
            self._drop(key, f"kube-scheduler passed no planned node {node} for {uid}")
            return verbs.FilterAnswer(
                _refuse(
                    args,
                    names,
                    f"gang {key}: this member's planned node {node} is not among the nodes "
                    "kube-scheduler passed; the group is planned again",
                )
            )
        why = f"gang {key} placed this member on {node}"
        failed = {n: why for n in names if n != node}
        return verbs.FilterAnswer(verbs.filter_result_of(args, (node,), failed, {}))

    def _plan(
        self,
        args: wire.ExtenderArgs,
        key: gangs.GroupKey,
        min_count: int,
        config: FairShareConfig,
        names: tuple[str, ...],
        snapshot: TakeSnapshot,
    ) -> LivePlan | verbs.FilterAnswer | None:
        """Judge the group on a snapshot (``plan_group``), given back before its room is
        reserved in the cache."""
        with snapshot() as snap:
            decided = plan_group(
                snap, config, key, min_count, args.pod, names, self.topology_key(key, args.pod)
            )
            if decided is not None and decided.tell is not None:
                self._tell(key, *decided.tell, snap)
        if decided is None:
            return None
        if decided.req is not None and self.on_gate is not None and decided.judged:
            self.on_gate(decided.req, decided.gate)
        if isinstance(decided.planned, gangs.Refusal):
            return verbs.FilterAnswer(
                _refuse(args, names, decided.reason, unresolvable=decided.unresolvable)
            )
        planned = decided.planned
        self.room.reserve(planned)
        now = self.clock()
        live = LivePlan(planned, decided.gang, created=now, touched=now)
        self.plans[key] = live
        for p in planned.placements:
            self.member_of[p.uid] = key
        log.info(
            "gang %s: planned %s",
            key,
            ", ".join(f"{p.name} on {p.node}" for p in planned.placements),
        )
        return live

    # -- bind --------------------------------------------------------------------------

    async def bind(
        self, args: wire.ExtenderBindingArgs, bind_now: BindNow, snapshot: TakeSnapshot
    ) -> dict[str, Any] | None:
        """The bind answer for a planned member (None: not a planned member)."""
        if self.plans:
            with snapshot() as snap:
                self.expire(snap)
        key = self.member_of.get(args.pod_uid)
        live = self.plans.get(key) if key is not None else None
        if key is None or live is None:
            return None
        uid = args.pod_uid
        planned = live.plan.node_of(uid)
        if planned != args.node:
            self._drop(key, f"kube-scheduler bound {args.pod_name} to {args.node}, not {planned}")
            return _bind_error(f"gang {key}: {args.pod_name} was planned on {planned}")
        live.touched = self.clock()
        live.arrived[uid] = args
        if not live.complete and len(live.arrived) >= live.gang.needed:
            live.complete = True
            live.done.set()
            for other, held in list(live.arrived.items()):
                if other != uid and other not in live.in_call:
                    self._start_bind(live, held, bind_now)  # reached bind before, refused
        if not live.complete:
            live.in_call.add(uid)
            try:
                await asyncio.wait_for(live.done.wait(), BIND_WAIT)
            except TimeoutError:
                pass
            finally:
                live.in_call.discard(uid)
            if live.dropped and not live.complete:
                return _bind_error(f"gang {key}: {live.dropped}")
            if not live.complete:
                return _bind_error(
                    f"gang {key}: {len(live.arrived)} of {live.gang.needed} members have "
                    f"reached bind; held {BIND_WAIT:g}s, the group binds whole once all have"
                )
        return await asyncio.shield(self._start_bind(live, args, bind_now))

    def _start_bind(
        self, live: LivePlan, args: wire.ExtenderBindingArgs, bind_now: BindNow
    ) -> asyncio.Future[dict[str, Any]]:
        """The bind of one member, started once (a second caller awaits the same)."""
        held = live.binds.get(args.pod_uid)
        if held is not None:
            return held
        placement = next(p for p in live.plan.placements if p.uid == args.pod_uid)

        def release() -> None:
            self.room.release(live.plan, (placement.uid,))

        async def run() -> dict[str, Any]:
            out = await bind_now(args, release)
            if out.get("Error"):
                log.warning(
                    "gang %s: member %s not bound: %s", live.plan.key, args.pod_name, out["Error"]
                )
            return out

        task = asyncio.ensure_future(run())
        live.binds[args.pod_uid] = task
        return task


@dataclass(frozen=True)
class GroupDecision:
    """A group judged at its member's filter: planned, or refused (``reason``; a
    ``tell`` for its owner when the owner can change it)."""

    gang: gangs.Gang
    planned: gangs.GangPlan | gangs.Refusal
    req: PodRequest | None = None
    gate: GateDecision | None = None
    tell: tuple[str, str] | None = None
    unresolvable: bool = False
    judged: bool = False
    """The gate was judged (the group had all its members)."""

    @property
    def reason(self) -> str:
        return self.planned.reason if isinstance(self.planned, gangs.Refusal) else ""


def plan_group(
    snap: Snapshot,
    config: FairShareConfig,
    key: gangs.GroupKey,
    min_count: int,
    pod: Mapping[str, Any],
    names: Sequence[str],
    topology_key: str | None,
) -> GroupDecision | None:
    """The gang verb: group ``key`` judged whole on ``snap`` at the filter of its member
    ``pod`` (``names``: the nodes kube-scheduler passed): the fair-share gate for the
    whole group's demand, then a node for every member not bound yet. None: not the
    group's business (it runs, or the pod could not be read)."""
    state = snap.state
    gang = gangs.gang_of(
        key,
        min_count,
        pods=snap.gang_pods,
        pending=snap.pending,
        bound=state.pods,
        topology_key=topology_key,
    )
    uid = objects.pod_uid(pod)
    if gang.running or all(p.uid != uid for p in gang.waiting):
        return None  # a running group's later members, or an unreadable pod
    req = snap.pending.get(uid)
    gate = None
    if gang.members >= gang.min_count:
        gate = gangs.gang_gate(
            state, config, gang, pending=snap.queue, fair=snap.fair, groups=snap.groups
        )
        if gate is not None and not gate.allowed:
            refused = gangs.Refusal(f"gang {gang.describe()}: {gate.reason}")
            return GroupDecision(gang, refused, req, gate, judged=True)
    rows = [i for i in state.rows_of(names) if i >= 0]
    planned = gangs.plan_gang(state, gang, rows=rows)
    judged = gang.members >= gang.min_count
    if not isinstance(planned, gangs.Refusal):
        return GroupDecision(gang, planned, req, gate, judged=judged)
    missing = gang.members < gang.min_count
    tell = None
    if missing:
        tell = (
            planned.reason,
            "Create the missing members, or lower the group's minimum "
            f"(PodGroup spec.minMember or {gangs.ANN_MIN_MEMBERS})",
        )
    else:
        # on the nodes its members may use at all (kube-scheduler passed only those
        # with room now)
        first = gang.waiting[0].constraints if gang.waiting else None
        allowed = state.eligible_rows(first) if first is not None else None
        never = gangs.status.never_whole(state, gang, allowed)
        if never:
            tell = (
                f"{planned.reason}; {never}",
                "Make the group smaller, or its members' requests fit the nodes",
            )
    return GroupDecision(gang, planned, req, gate, tell, missing, judged)


def _refuse(
    args: wire.ExtenderArgs, names: tuple[str, ...], reason: str, *, unresolvable: bool = False
) -> wire.ExtenderFilterResult:
    every = dict.fromkeys(names, reason)
    if unresolvable:
        return verbs.filter_result_of(args, (), {}, every)
    return verbs.filter_result_of(args, (), every, {})


def _bind_error(reason: str) -> dict[str, Any]:
    return wire.ExtenderBindingResult(reason).encode()
