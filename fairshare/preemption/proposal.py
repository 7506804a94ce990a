"""kube-scheduler's preemption proposal judged node by node: the ``/preempt`` verb's core.

The extender may answer a subset of the proposed nodes and, per node, any pods that run
there (``HTTPExtender.convertToVictims``). ``allowed_victims`` applies the rules of
``victims``, puts pods of the preemptor's own tenant in place of refused victims, keeps
pod groups whole, and drops a node whose victims no longer make room.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairshare import gangs, resources
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest, fits_after_release
from fairshare.preemption.victims import (
    FairPreemption,
    Victim,
    fair_share_victims,
    guaranteed_usage,
    guarantees,
    protect_guaranteed,
)
from fairshare.state.cluster import ClusterState

Read = Callable[[Mapping[str, Any]], PodRequest]
"""A victim's pod as kube-scheduler sent it -> its ``PodRequest``; raises
``resources.DemandError``."""


# -- one proposal, node by node ------------------------------------------------------------


@dataclass(frozen=True)
class Allowed:
    """The victims fairshare allows per node (a node absent: none), in node order, and
    what it changed, one note each (for an Event on the preemptor)."""

    nodes: Mapping[str, tuple[str, ...]]
    notes: tuple[str, ...] = ()

    def note(self) -> str:
        """The notes as one text: the first five, and how many more."""
        more = len(self.notes) - 5
        return "; ".join(self.notes[:5]) + (f" (and {more} more)" if more > 0 else "")


def allowed_victims(
    state: ClusterState,
    config: FairShareConfig,
    proposed: Mapping[str, Sequence[str]],
    *,
    preemptor: PodRequest | None,
    priority: int,
    rule: FairPreemption | None,
    sent: Mapping[str, Mapping[str, Any]],
    known: Mapping[str, Mapping[str, Any]],
    read: Read,
) -> Allowed:
    """The victims of ``proposed`` (node -> victim uids, as kube-scheduler proposed them)
    that may go, per node.

    Per node: victims whose eviction would take their tenant below ``guaranteed`` are
    dropped (``protect_guaranteed``), and so are, with a ``rule`` (``fair_rule``, for a
    preemptor of a known tenant), victims of other tenants at or below their fair share
    (``fair_share_victims``). In the place of refused victims come pods of the
    preemptor's own tenant on that node of lower priority than ``priority`` (lowest
    first, then newest), while the preemptor still lacks room; then victims are spared
    again (other tenants' first) while the preemptor keeps its room. A node where what is
    left no longer makes room for the pod is dropped (evicting them would be for
    nothing), and so is a node left without victims. ``preemptor`` None: its resources
    could not be read (the guarantees are judged, the room is not). ``sent``: the
    victims' pods as kube-scheduler sent them (read by ``read`` when not bound);
    ``known``: every known pod (priorities, ages, pod groups).

    Pod groups (``gangs.group_of``) are victims whole or not at all: a job that loses one
    member is lost. kube-scheduler evicts the victims of the one node it picks, and only
    pods running on that node (``HTTPExtender.convertToVictims`` fails the whole
    preemption on a victim found elsewhere), so a group with a bound member on another
    node is never offered (the reclaimer evicts groups across nodes); a group all of whose
    bound members run on the node is offered with every one of them; a group that the
    rules above would split (one member refused, e.g. the group as a whole would take its
    tenant below its guarantee) is spared whole, and the node judged again without it.
    """
    pre = preemptor
    pre_tenant, pre_row = (pre.tenant, pre.row) if pre is not None else (None, ())
    guaranteed = guarantees(state, config)
    usage, ancestors = guaranteed_usage(state, config, guaranteed)
    out: dict[str, tuple[str, ...]] = {}
    notes: list[str] = []
    groups = _victim_groups(state, proposed, sent, known)
    for node, asked in sorted(proposed.items()):
        uids = _whole_groups(state, node, asked, groups, notes)
        while True:
            victims = _victims(uids, sent, state=state, read=read)
            kept = protect_guaranteed(
                victims,
                usage=usage,
                guaranteed=guaranteed,
                preemptor_tenant=pre_tenant,
                preemptor_row=pre_row,
                ancestors=ancestors,
            )
            refused: tuple[tuple[str, str], ...] = ()
            if rule is not None:
                judged = fair_share_victims(victims, rule, kept_by_guarantee=kept)
                kept, refused = judged.uids, judged.refused
                own_first = rule.within != "Never" and rule.others != "Any"
                if pre is not None and len(kept) < len(victims) and own_first:
                    kept = _substitute(state, pre, node, kept, known, priority)
            going = {groups.of[u] for u in kept if u in groups.of}
            split = {groups.of[u] for u in uids if u in groups.of and u not in kept} & going
            if not split:
                break
            # A refused member spares its whole group: judge the node again without it.
            uids = [u for u in uids if groups.of.get(u) not in split]
            notes += [f"pod group {k} on {node}: a member may not go, so none goes"
                      for k in sorted(split)]  # fmt: skip
        notes += [f"{_victim_name(state, u)} on {node}: {why}" for u, why in refused]
        if not kept:
            continue
        if set(kept) != set(asked) and not _room_left(state, pre, node, kept):
            continue
        out[node] = tuple(kept)
    return Allowed(out, tuple(notes))


def _victims(
    uids: Sequence[str], sent: Mapping[str, Mapping[str, Any]], *, state: ClusterState, read: Read
) -> list[Victim]:
    """The proposed victims as the rules judge them: a bound pod by its ledger row, any
    other by reading the pod kube-scheduler sent (``read``; the view's reader keeps the
    readings of the pods kube-scheduler schedules, not of its victims)."""
    out = []
    for uid in uids:
        bound = state.pods.get(uid)
        if bound is not None:
            out.append(Victim(uid, bound.tenant, bound.row))
            continue
        pod = sent.get(uid)
        try:
            if pod is None:
                raise resources.DemandError("unknown pod")
            req = read(pod)
            out.append(Victim(uid, req.tenant, req.row))
        except resources.DemandError:
            out.append(Victim(uid, None, ()))
    return out


# -- substitutes, room and pod groups ------------------------------------------------------


def _substitute(
    state: ClusterState,
    pre: PodRequest,
    node: str,
    kept: Sequence[str],
    pods: Mapping[str, Mapping[str, Any]],
    priority: int,
) -> tuple[str, ...]:
    """``kept`` with pods of the preemptor's own tenant on ``node`` of lower priority added
    (lowest priority first, then newest) until the preemptor fits, then victims spared
    again while it still fits: other tenants' first, then its own in reverse."""
    i = state.node_index.get(node)
    if i is None:
        return tuple(kept)
    own = [
        bp
        for bp in state.pods.values()
        if bp.node == node and bp.tenant == pre.tenant and bp.uid not in kept
        and bp.uid in pods and pod_priority(pods[bp.uid]) < priority
        and gangs.group_of(pods[bp.uid]) is None  # a group goes whole: never one member
    ]  # fmt: skip
    own.sort(key=lambda bp: (pod_priority(pods[bp.uid]), _neg(_created(pods[bp.uid])), bp.uid))
    chosen = list(kept)

    def fits(uids: Sequence[str]) -> bool:
        released = [p for p in map(state.pods.get, uids) if p is not None]
        return fits_after_release(state, pre, i, released)

    for bp in own:
        if fits(chosen):
            break
        chosen.append(bp.uid)
    if not fits(chosen):
        return tuple(kept)
    others = [u for u in chosen if u in state.pods and state.pods[u].tenant != pre.tenant]
    mine = [u for u in reversed(chosen) if u not in others]
    for uid in [*others, *mine]:
        rest = [u for u in chosen if u != uid]
        if rest and fits(rest):
            chosen = rest
    return tuple(chosen)


def _room_left(state: ClusterState, pre: PodRequest | None, node: str, kept: Sequence[str]) -> bool:
    """Do the ``kept`` victims still free enough on ``node`` for the preemptor?

    Judged on fairshare's own ledger (resource columns and GPU devices). A preemptor whose
    resources cannot be read, or a node the state does not know, cannot be judged: the
    answer is then yes (kube-scheduler's own dry run stands).
    """
    i = state.node_index.get(node)
    if pre is None or i is None:
        return True
    released = [p for p in map(state.pods.get, kept) if p is not None]
    return fits_after_release(state, pre, i, released)


def pod_priority(pod: Mapping[str, Any]) -> int:
    """``spec.priority`` (set by the Priority admission plugin; 0 when absent)."""
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _created(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    stamp = meta.get("creationTimestamp") if isinstance(meta, Mapping) else None
    return stamp if isinstance(stamp, str) else ""


def _neg(stamp: str) -> tuple[int, ...]:
    """An RFC 3339 UTC stamp's sort key reversed (newest first)."""
    return tuple(-ord(c) for c in stamp)


def _victim_name(state: ClusterState, uid: str) -> str:
    held = state.pods.get(uid)
    return f"pod {held.name or uid} of tenant {held.tenant}" if held else f"pod {uid}"


@dataclass(frozen=True)
class _Groups:
    """The pod groups among the proposed victims: victim or member uid -> group, and each
    group's bound members (empty when no victim is in a group)."""

    of: Mapping[str, gangs.GroupKey] = field(default_factory=dict)
    members: Mapping[gangs.GroupKey, tuple[str, ...]] = field(default_factory=dict)


def _victim_groups(
    state: ClusterState,
    proposed: Mapping[str, Sequence[str]],
    sent: Mapping[str, Mapping[str, Any]],
    known: Mapping[str, Mapping[str, Any]],
) -> _Groups:
    """Which proposed victims are in a pod group, and every bound member of those groups
    (the known pods are scanned only when some victim is in a group)."""
    of: dict[str, gangs.GroupKey] = {}
    for uids in proposed.values():
        for uid in uids:
            pod = sent.get(uid) or known.get(uid)
            key = gangs.group_of(pod) if pod is not None else None
            if key is not None:
                of[uid] = key
    if not of:
        return _Groups()
    wanted = set(of.values())
    members: dict[gangs.GroupKey, list[str]] = {k: [] for k in wanted}
    for uid, pod in known.items():
        if uid in state.pods and (key := gangs.group_of(pod)) in wanted:
            assert key is not None
            members[key].append(uid)
            of[uid] = key
    return _Groups(of, {k: tuple(sorted(v)) for k, v in members.items()})


def _whole_groups(
    state: ClusterState,
    node: str,
    uids: Sequence[str],
    groups: _Groups,
    notes: list[str],
) -> list[str]:
    """``uids`` (one node's proposed victims) with each group in them made whole: its
    bound members on ``node`` added, or, when one runs on another node, the group left
    out (kube-scheduler evicts on one node only)."""
    if not groups.of:
        return list(uids)
    out: list[str] = []
    spared: set[gangs.GroupKey] = set()
    added: set[str] = set(uids)
    for uid in uids:
        key = groups.of.get(uid)
        if key is None:
            out.append(uid)
            continue
        if key in spared:
            continue
        members = groups.members.get(key, ())
        elsewhere = sorted({state.pods[u].node for u in members if state.pods[u].node != node})
        if elsewhere:
            spared.add(key)
            notes.append(
                f"pod group {key} on {node}: it also runs on {', '.join(elsewhere)}, and a "
                "preemption evicts on one node only; the group is evicted whole or not at all"
            )
            continue
        out.append(uid)
        for m in members:
            if m not in added:
                added.add(m)
                out.append(m)
    return [u for u in out if groups.of.get(u) not in spared]
