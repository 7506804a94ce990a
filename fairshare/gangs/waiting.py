"""Pod groups as waiting work at the fair-share gate: one rule for extender and simulator.

A group counts once, as a whole, by one of ``RULES`` (``RULE`` is the one in use):

* ``pod``: each member alone;
* ``whole``: the group fits whole now (``gangs.plan_gang`` against the free room);
* ``kept``: it fits whole in the free room plus what the tenants above its tenant hold;
* ``owed``: it fits whole now, or starting it keeps its tenant within its fair share;
* ``near``: as ``owed``, but a group that does not fit now counts only once half the GPUs
  it needs are free on its nodes.

Under every rule a group counts only with all ``min_count`` members present and if it
could run whole on its nodes emptied, and its members are never also counted one by one.
A running group's later members count like any pod.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

from fairshare import cluster_shares, fairness, gate, verdicts
from fairshare.config.schema import FairShareConfig
from fairshare.gangs.identity import GroupKey, annotated_min_count, group_of
from fairshare.gangs.plan import (
    RESERVATION_PREFIX,
    Gang,
    Refusal,
    gang_from,
    plan_gang,
    topology_key,
)
from fairshare.placement import PodRequest
from fairshare.state.cluster import ClusterState

Rule = Literal["pod", "whole", "kept", "owed", "near"]
RULES: Final[tuple[Rule, ...]] = ("pod", "whole", "kept", "owed", "near")
RULE: Final[Rule] = "owed"
"""The rule in use: on the Philly replay it keeps the tenants as near their fair GPU-time
as judging pod by pod did (``whole`` and ``near`` leave far less room free but let the
large tenants take the small tenants' share); docs/simulator/philly.md."""

Lookup = Callable[[str], Gang | None]
"""The group of a waiting pod by uid (None: the pod is in no group)."""


_GROUP_REFUSAL: Final = re.compile(r"gang \S+/\S+[ :]")


def is_group_refusal(message: str) -> bool:
    """Is kube-scheduler's ``PodScheduled`` verdict ``message`` only the extender's
    refusal of the pod's group (``gang ns/name has 2 of its 3 members ...``, ``gang
    ns/name (...) does not fit whole: ...``)? Such a member still waits with its group:
    the group, judged whole here, decides whether it holds anyone back."""
    reasons = verdicts.verdict_reasons(message)
    return bool(reasons) and all(_GROUP_REFUSAL.match(r) for r in reasons or ())


def group_fits(
    config: FairShareConfig,
    lookup: Lookup,
    *,
    fair: Mapping[str, fairness.FairShare] | None,
    rule: Rule = RULE,
) -> gate.GroupFits | None:
    """The ``groups`` argument of ``gate.check_fair_gate`` for ``rule`` (None for
    ``pod``: every member judged alone)."""
    if rule == "pod":
        return None
    answers: dict[GroupKey, bool] = {}

    def fits(state: ClusterState, p: PodRequest) -> bool | None:
        gang = lookup(p.uid)
        if gang is None or gang.running:
            return None
        got = answers.get(gang.key)
        if got is None:
            got = answers[gang.key] = counts(state, config, gang, fair=fair, rule=rule)
        return got

    return fits


def counts(
    state: ClusterState,
    config: FairShareConfig,
    gang: Gang,
    *,
    fair: Mapping[str, fairness.FairShare] | None,
    rule: Rule = RULE,
) -> bool:
    """Does the waiting group ``gang`` count as work that could run now (so that the
    tenants above its tenant are held back for it)? ``rule``: see the module."""
    if gang.members < gang.min_count or not gang.waiting or gang.running:
        return False
    if rule == "pod":
        return any(gate.pod_fits_somewhere(state, p) for p in gang.waiting)
    if not fits_whole(state.drained(), gang):
        return False  # can never run whole on its nodes
    if rule == "whole":
        return fits_whole(state, gang)
    if rule == "kept":
        return fits_whole(kept_room(state, config, gang.tenant), gang)
    if fits_whole(state, gang):
        return True
    if rule == "near":
        rows = state.eligible_rows(gang.waiting[0].constraints)
        return owed(state, config, gang, fair) and not _too_few_gpus(state, gang, rows, 0.5)
    return owed(state, config, gang, fair)


def group_row(gang: Gang) -> tuple[float, ...]:
    """What the group must get to start: the ``needed`` members it needs (largest GPU
    demand first, as the plan places them), summed: ``min_count`` × the member's demand
    for a group of one shape."""
    order = sorted(gang.waiting, key=lambda p: (-p.gpu_count, -sum(p.row), p.name, p.uid))
    width = max((len(p.row) for p in order), default=0)
    total = [0.0] * width
    for p in order[: gang.needed]:
        for k, v in enumerate(p.row):
            total[k] += v
    return tuple(total)


def owed(
    state: ClusterState,
    config: FairShareConfig,
    gang: Gang,
    fair: Mapping[str, fairness.FairShare] | None,
) -> bool:
    """Would the group, started whole, keep its tenant within its fair share?"""
    t = gang.tenant
    if t is None or not fair or t not in fair:
        return False
    share = cluster_shares.dominant_share(
        state, config, t, cluster_shares.usage_after(state, t, group_row(gang))
    )
    return share <= fair[t].share + fairness.EPS


def _shapes(gang: Gang) -> tuple[frozenset[tuple[object, int]], int, str | None]:
    shapes = frozenset(Counter(p.shape for p in gang.waiting).items())
    return shapes, gang.needed, gang.topology_key


def _probe(state: ClusterState) -> ClusterState:
    """A twin of ``state`` to plan on (kept while ``state`` does not change)."""
    held: dict[str, ClusterState] = state.memo("gangs.waiting.twin")
    got = held.get("twin")
    if got is None:
        got = held["twin"] = state.twin()
    return got


def fits_whole(state: ClusterState, gang: Gang) -> bool:
    """Would ``gangs.plan_gang`` place the group now (on the nodes its first member may
    use)? Asked once per group shape and state; ``state`` is left as it was, versions
    included (the plan is tried on a twin)."""
    if any(RESERVATION_PREFIX + p.uid in state.pods for p in gang.waiting):
        return True  # planned: its room is held in the state (``plan.reserve``)
    memo: dict[tuple[frozenset[tuple[object, int]], int, str | None], bool] = state.memo(
        "gangs.waiting.fits"
    )
    key = _shapes(gang)
    got = memo.get(key)
    if got is None:
        rows = state.eligible_rows(gang.waiting[0].constraints) if gang.waiting else None
        if _too_few_gpus(state, gang, rows):
            got = memo[key] = False  # the plan would refuse it (and cost a search)
        else:
            twin = _probe(state)
            got = memo[key] = not isinstance(plan_gang(twin, gang, rows=rows), Refusal)
    return got


def _too_few_gpus(
    state: ClusterState, gang: Gang, rows: Sequence[int] | None, part: float = 1.0
) -> bool:
    """Fewer free GPUs on the group's nodes than ``part`` of what its ``needed``
    smallest members ask."""
    g, width = state.gpu_col, state.n_res
    asks = sorted(p.row[g] for p in gang.waiting if len(p.row) > g)
    want = part * sum(asks[: gang.needed])
    if want <= 0:
        return False
    free = state.free
    have = sum(
        max(0.0, free[i * width + g]) for i in (range(state.n_nodes) if rows is None else rows)
    )
    return have + 1e-6 < want


def kept_room(state: ClusterState, config: FairShareConfig, tenant: str | None) -> ClusterState:
    """The state with the pods of every tenant whose share is above ``tenant``'s taken
    off: the room the gate keeps for a group of ``tenant`` while it waits."""
    if tenant is None:
        return state
    shares = cluster_shares.current_shares(state, config)
    mine = shares.get(tenant, 0.0)
    above = frozenset(u for u, s in shares.items() if u != tenant and s > mine + fairness.EPS)
    held: dict[frozenset[str], ClusterState] = state.memo("gangs.waiting.kept")
    got = held.get(above)
    if got is None:
        got = held[above] = state.twin()
        for uid, pod in list(got.pods.items()):
            if pod.tenant in above:
                got.unbind(uid)
    return got


def groups_for(
    config: FairShareConfig,
    state: ClusterState,
    pods: Mapping[str, Mapping[str, Any]],
    pending: Mapping[str, PodRequest],
    *,
    fair: Mapping[str, fairness.FairShare] | None,
    sizes: Mapping[GroupKey, int | None] | None = None,
    rule: Rule = RULE,
) -> gate.GroupFits | None:
    """``group_fits`` over known pods (uid -> pod): each group sized by ``sizes`` (its
    PodGroup's ``min_count``; None there: a PodGroup without one, which the extender
    refuses) else its pods' annotation, with its pods' topology key annotation. For the
    views (status, explain) that judge the gate as the extender's filter does."""
    by: dict[GroupKey, list[str]] = {}
    for uid, pod in pods.items():
        g = group_of(pod)
        if g is not None:
            by.setdefault(g, []).append(uid)
    members = {uid: (g, tuple(uids)) for g, uids in by.items() for uid in uids}
    known = sizes or {}

    def size(key: GroupKey, uid: str) -> int | None:
        if key in known:
            return known[key]
        return annotated_min_count(pods.get(uid) or {})

    def topology(key: GroupKey, uid: str) -> str | None:
        return topology_key(None, pods.get(uid) or {})

    lookup = lookup_over(members, pending, state.pods, size, topology)
    return group_fits(config, lookup, fair=fair, rule=rule)


def lookup_over(
    members: Mapping[str, tuple[GroupKey, Sequence[str]]],
    pending: Mapping[str, PodRequest],
    bound: Mapping[str, object],
    size: Callable[[GroupKey, str], int | None] | None = None,
    topology: Callable[[GroupKey, str], str | None] | None = None,
) -> Lookup:
    """A ``Lookup`` over known groups: pod uid -> (its group, the uids of all the group's
    known pods). ``size(group, a member's uid)``: the group's ``min_count`` (None: not
    known, as when the extender finds no PodGroup and no annotation: such a group is
    refused, and counts as nothing); without it, the count of its pods. ``topology``: the
    group's topology key (``gangs.topology_key``), so it counts only where its plan would
    place it, inside one domain."""
    made: dict[GroupKey, Gang] = {}

    def lookup(uid: str) -> Gang | None:
        entry = members.get(uid)
        if entry is None:
            return None
        key, uids = entry
        gang = made.get(key)
        if gang is None:
            n = len(uids) if size is None else size(key, uid)
            if n is None:
                n = len(uids) + 1  # not known: planned as a group missing a member
            topo = topology(key, uid) if topology is not None else None
            gang = made[key] = gang_from(
                key, n, uids, pending=pending, bound=bound, topology_key=topo
            )
        return gang

    return lookup
