"""The hold on the room reclaim makes, and the records of what reclaim gave.

The room a plan makes for a pod (``RoomHold``) is written on the pod as annotations
(``hold_annotations``) and read back by the extender (``holds_in_force``), whose filter
and gate keep other tenants' pods off it (``held_off``, ``gate_held``) until the pod binds
or goes or the hold lapses (``HOLD_TIMEOUT``). A pod that got room also records whose pods
went for it and when (``given_annotation``); reclaim toward fair share takes nothing from
the pod's tenant for them while the record counts (no take-back). Times are parameters,
in wall-clock seconds, since another process reads them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from fairshare import gate
from fairshare.placement import PodRequest
from fairshare.preemption import nodesim
from fairshare.preemption.reclaim import ReclaimPlan
from fairshare.state.cluster import ClusterState

ANN_HELD_NODE: Final = "fairshare.io/reclaim-node"
"""Annotation on a beneficiary: the node reclaim freed room on for it."""
ANN_HELD_UNTIL: Final = "fairshare.io/reclaim-until"
"""Annotation on a beneficiary: when its hold lapses (Unix seconds, wall clock)."""
ANN_RECLAIMED_FROM: Final = "fairshare.io/reclaimed-from"
"""Annotation on a beneficiary: the tenants whose pods reclaim evicted for it (sorted,
comma-separated); it stays on the pod for its life (no take-back, ``given_in_force``)."""
ANN_RECLAIMED_AT: Final = "fairshare.io/reclaimed-at"
"""Annotation on a beneficiary: when reclaim last evicted pods for it (Unix seconds, wall
clock); the record counts for ``reclaimTakeBackAfter`` from then."""
HOLD_TIMEOUT: Final = 120.0
"""Seconds a hold lasts when its beneficiary neither binds nor goes: long enough for the
victims' termination (30 s by default) and kube-scheduler's retry of the beneficiary
(a victim's deletion requeues it; its backoff is at most 10 s by default), short enough
that room is not kept for a pod that cannot use it."""


@dataclass(frozen=True)
class RoomHold:
    """Room reclaim made on ``node`` for the pending pod ``req``, until ``until``."""

    req: PodRequest
    node: str
    until: float


def hold_annotations(node: str, until: float) -> dict[str, str]:
    """The annotations that carry a hold on ``node`` until ``until`` to the extender."""
    return {ANN_HELD_NODE: node, ANN_HELD_UNTIL: f"{until:.3f}"}


def hold_of(req: PodRequest, annotations: Mapping[str, object] | None) -> RoomHold | None:
    """The hold a pending pod's annotations carry (None: none, or unreadable)."""
    node = (annotations or {}).get(ANN_HELD_NODE)
    at = hold_until(annotations)
    if not isinstance(node, str) or not node or at is None:
        return None
    return RoomHold(req, node, at)


def hold_until(annotations: Mapping[str, object] | None) -> float | None:
    """When a pod's hold lapses (``ANN_HELD_UNTIL``), or None: no hold, or unreadable."""
    return _unix_seconds(annotations, ANN_HELD_UNTIL)


def holds_in_force(
    uids: Iterable[str],
    pending: Mapping[str, PodRequest],
    annotations: Callable[[str], Mapping[str, object] | None],
    *,
    now: float,
) -> list[RoomHold]:
    """The holds of the pods ``uids`` that are in force at ``now``: each still pending
    (in ``pending``), its annotations (``annotations(uid)``) carrying a hold that has not
    lapsed. A pod deleted, or bound on its hold's node, is no longer pending, so its hold
    is over; the extender adds the holds of pods bound on another node
    (``Cache.room_holds``: ``held_off`` keeps that room for their tenant)."""
    out: list[RoomHold] = []
    for uid in uids:
        req = pending.get(uid)
        hold = hold_of(req, annotations(uid)) if req is not None else None
        if hold is not None and now < hold.until:
            out.append(hold)
    return out


def holds_made(
    plan: ReclaimPlan, pending: Sequence[PodRequest], *, until: float
) -> tuple[RoomHold, ...]:
    """A hold for every pod the plan made room for (``plan.room``), lasting ``until``."""
    rooms = plan.room or {}
    return tuple(RoomHold(p, rooms[p.uid], until) for p in pending if p.uid in rooms)


def gate_held(holds: Sequence[RoomHold]) -> gate.HeldOff | None:
    """The holds in force as the gate takes them (``gate.HeldOff``; None: no hold)."""
    if not holds:
        return None
    return lambda state, req, rows: held_off(state, holds, req, rows)


def held_off(
    state: ClusterState,
    holds: Sequence[RoomHold],
    req: PodRequest,
    rows: Sequence[int],
    *,
    now: float | None = None,
) -> dict[int, str]:
    """Rows of ``rows`` (nodes ``req`` fits now) that holds keep ``req`` off, with the
    reason.

    A hold counts while it has not lapsed (``now < until``; ``now`` None: the caller
    passes only holds in force) and its pod has not bound on its node: a pod that bound
    elsewhere (in room made for another pod of its tenant, say) leaves its room held for
    its tenant until the hold lapses, else other tenants' pods would take the room the
    swap left (two pods of one tenant that swap nodes: the second finds its room
    taken). It binds only pods of other tenants (a tenant's own pods sharing the room
    reclaimed for it is its own business; binding them too would make a tenant's
    beneficiaries wait for each other while victims are still leaving, until the holds
    lapse). As kube-scheduler does for a pod nominated on a node, its pod is counted as
    running there (its devices too when it fits; else, its victims still leaving, its
    request is taken from the free vector down to zero at most), and ``req`` must still
    fit beside it.
    """
    by_node: dict[str, list[RoomHold]] = {}
    for h in holds:
        if (
            (now is None or now < h.until)
            and h.req.uid != req.uid
            and h.req.tenant != req.tenant
            and not _bound_on(state, h)
        ):
            by_node.setdefault(h.node, []).append(h)
    out: dict[int, str] = {}
    if not by_node:
        return out
    for i in rows:
        mine = by_node.get(state.nodes[i].name)
        if not mine:
            continue
        sim = nodesim.node_copy(state, i)
        for h in mine:
            if nodesim.fits(sim, h.req):
                nodesim.reserve(sim, h.req)
            else:
                for k, v in enumerate(h.req.row):
                    sim.free[k] = max(sim.free[k] - v, 0.0)
        if not nodesim.fits(sim, req):
            h = mine[0]
            out[i] = (
                f"room on {h.node} is held by reclaim for pod {h.req.namespace}/"
                f"{h.req.name} (tenant {h.req.tenant}) until it binds, is deleted or "
                f"the hold lapses at {utc(h.until)}"
            )
    return out


# -- the no-take-back records ---------------------------------------------------------------


def given_of(annotations: Mapping[str, object] | None) -> frozenset[str]:
    """The tenants a pod's ``ANN_RECLAIMED_FROM`` names (empty: none, or unreadable)."""
    value = (annotations or {}).get(ANN_RECLAIMED_FROM)
    if not isinstance(value, str):
        return frozenset()
    return frozenset(t for t in (part.strip() for part in value.split(",")) if t)


def given_in_force(
    annotations: Mapping[str, object] | None, *, now: float, keep: float
) -> frozenset[str]:
    """The tenants a pod's record names while it counts: ``keep`` seconds
    (``reclaimTakeBackAfter``) from its ``ANN_RECLAIMED_AT``, wall clock ``now``. A
    record without a readable time counts for nothing, as does any with ``keep`` 0."""
    givers = given_of(annotations)
    if not givers or keep <= 0:
        return frozenset()
    since = _unix_seconds(annotations, ANN_RECLAIMED_AT)
    return givers if since is not None and now - since < keep else frozenset()


@dataclass(frozen=True)
class GivenRoom:
    """A pod that holds room reclaim gave it: no take-back for ``givers`` until ``until``."""

    pod: str
    """NAMESPACE/NAME."""
    tenant: str
    givers: frozenset[str]
    until: float


def given_rooms(
    pods: Iterable[tuple[str, str | None, Mapping[str, object] | None]], *, now: float, keep: float
) -> list[GivenRoom]:
    """The records in force among ``pods`` (NAMESPACE/NAME, tenant, annotations), for
    ``fairshare explain``: which tenant's pods reclaim takes nothing from, for whom, until
    when (``given_in_force``)."""
    out: list[GivenRoom] = []
    for name, tenant, ann in pods:
        givers = given_in_force(ann, now=now, keep=keep)
        at = _unix_seconds(ann, ANN_RECLAIMED_AT)
        if givers and tenant is not None and at is not None:
            out.append(GivenRoom(name, tenant, givers, at + keep))
    return sorted(out, key=lambda g: (g.tenant, g.pod))


def given_annotation(already: frozenset[str], now: frozenset[str], *, at: float) -> dict[str, str]:
    """The record for a pod that had ``already`` and now also gets room from ``now``, at
    wall time ``at`` (empty when nothing is new: the record and its time stay)."""
    if now <= already:
        return {}
    return {ANN_RECLAIMED_FROM: ",".join(sorted(already | now)), ANN_RECLAIMED_AT: f"{at:.3f}"}


def _unix_seconds(annotations: Mapping[str, object] | None, key: str) -> float | None:
    """An annotation holding Unix seconds (``hold_annotations``, ``given_annotation``),
    or None: missing, not a number, or not finite."""
    value = (annotations or {}).get(key)
    if not isinstance(value, str):
        return None
    try:
        at = float(value)
    except ValueError:
        return None
    return at if math.isfinite(at) else None


def _bound_on(state: ClusterState, hold: RoomHold) -> bool:
    """Has the hold's pod bound on the node it holds room on (its hold is over)?"""
    bound = state.pods.get(hold.req.uid)
    return bound is not None and bound.node == hold.node


def utc(at: float) -> str:
    """``at`` (Unix seconds) as an RFC 3339 UTC time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
