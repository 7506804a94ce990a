"""Where each pod group (gang) stands and why it waits: for ``fairshare status`` /
``explain``, the extender's status page, its metrics and its Events.

Every judgement is the one the extender's filter makes on the same state. A group is
``running`` (``min_count`` members bound), ``planned`` (the extender holds a plan; binds
wait until every needed member is there) or ``waiting`` with a ``reason``.
``actionable`` marks a reason the group's owner can act on (members missing, no size, a
group that can never fit), which gets an Event; waiting for room or for the gate gets
none. ``held_gpus``: what a group that is not running holds (bound members, its plan's
reservations).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from fairshare import cluster_shares, fairness, gate
from fairshare.config.schema import FairShareConfig
from fairshare.gangs.identity import (
    ANN_MIN_MEMBERS,
    PODGROUP_GROUP,
    PODGROUP_VERSION,
    GroupKey,
    annotated_min_count,
    group_of,
)
from fairshare.gangs.plan import (
    RESERVATION_PREFIX,
    Gang,
    GangPlan,
    Refusal,
    annotated_topology_key,
    domains_of,
    gang_gate,
    gang_of,
    plan_gang,
    release,
    reserve,
)
from fairshare.gangs.waiting import groups_for
from fairshare.placement import PodRequest, filter_nodes
from fairshare.resources import MILLI_GPU
from fairshare.state.cluster import ClusterState

__all__ = [
    "REASON_GANG",
    "GroupStatus",
    "LivePlanView",
    "group_statuses",
    "never_whole",
]

REASON_GANG: Final = "FairShareGang"
"""The Event reason on a group's pods when it waits for something its owner can change."""

FITS_NOW: Final = "fits whole now: the next member's filter plans it"


@dataclass(frozen=True)
class LivePlanView:
    """What the extender's live plan of a group says (``ganging.LivePlan``)."""

    nodes: Mapping[str, str]
    """Planned node per member uid."""
    arrived: int
    """Members that reached bind."""
    needed: int
    """Members that must reach bind before the group binds."""
    complete: bool


@dataclass(frozen=True)
class GroupStatus:
    key: GroupKey
    tenant: str | None
    min_count: int | None
    min_source: str
    """``PodGroup``, ``annotation`` or "" (unknown)."""
    members: int
    """Members that exist (not finished)."""
    bound: int
    state: str
    """``running``, ``planned`` or ``waiting``."""
    reason: str
    waiting_for: str | None = None
    """The tenant the group yields to at the fair-share gate."""
    actionable: bool = False
    held_gpus: float = 0.0
    pending: tuple[str, ...] = ()
    """Uids of the members not bound yet."""
    planned: Mapping[str, str] | None = None
    """Planned node per member name (``planned`` only)."""
    misfit: tuple[str, Mapping[str, str]] | None = None
    """When the group does not fit whole: the first member (``ns/name``) that fits no node
    beside the members placed before it, and why not, per node."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "group": str(self.key),
            "tenant": self.tenant,
            "minCount": self.min_count,
            "minCountFrom": self.min_source or None,
            "members": self.members,
            "bound": self.bound,
            "state": self.state,
            "reason": self.reason,
            "heldGpus": round(self.held_gpus, 3),
            "actionable": self.actionable,
        }
        if self.waiting_for is not None:
            out["waitingFor"] = self.waiting_for
        if self.planned is not None:
            out["planned"] = dict(sorted(self.planned.items()))
        if self.misfit is not None:
            out["misfit"] = {
                "member": self.misfit[0],
                "nodes": dict(sorted(self.misfit[1].items())),
            }
        return out


def _name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


def _held_gpus(state: ClusterState, uids: Collection[str]) -> float:
    col = state.gpu_col
    milli = 0.0
    for uid in uids:
        for key in (uid, RESERVATION_PREFIX + uid):
            bp = state.pods.get(key)
            if bp is not None and col < len(bp.row):
                milli += bp.row[col]
    return milli / MILLI_GPU


def group_statuses(
    *,
    config: FairShareConfig,
    state: ClusterState,
    pods: Mapping[str, Mapping[str, Any]],
    pending: Mapping[str, PodRequest],
    podgroups: Mapping[GroupKey, int | None] | None = None,
    plans: Mapping[GroupKey, LivePlanView] | None = None,
    judge: bool = True,
    fair: Mapping[str, fairness.FairShare] | None = None,
) -> list[GroupStatus]:
    """Every group among ``pods`` (uid -> pod, the non-finished ones), sorted by key.

    ``podgroups``: ``spec.minMember`` per group that has a PodGroup (None: it has one
    without a positive ``minMember``); a group missing here is sized by its annotation.
    ``plans``: the extender's live plans. ``judge``: False skips the gate and the plan
    (the cheap figures for metrics: state, members, held GPUs)."""
    members: dict[GroupKey, list[str]] = {}
    for uid, pod in pods.items():
        key = group_of(pod)
        if key is not None:
            members.setdefault(key, []).append(uid)
    if not members:
        return []
    sizes = podgroups or {}
    live = plans or {}
    queue = list(pending.values())
    if judge and fair is None:
        fair = cluster_shares.fair_shares_for(
            state, config, cluster_shares.demand_rows(state, queue)
        )
    # other tenants' waiting groups count at the gate as the extender counts them
    groups = groups_for(config, state, pods, pending, fair=fair, sizes=sizes) if judge else None
    out = []
    for key in sorted(members):
        uids = members[key]
        out.append(
            _one(
                key,
                uids,
                config=config,
                state=state,
                pods=pods,
                pending=pending,
                queue=queue,
                sizes=sizes,
                plan=live.get(key),
                judge=judge,
                fair=fair,
                groups=groups,
            )
        )
    return out


def _one(
    key: GroupKey,
    uids: Sequence[str],
    *,
    config: FairShareConfig,
    state: ClusterState,
    pods: Mapping[str, Mapping[str, Any]],
    pending: Mapping[str, PodRequest],
    queue: Sequence[PodRequest],
    sizes: Mapping[GroupKey, int | None],
    plan: LivePlanView | None,
    judge: bool,
    fair: Mapping[str, fairness.FairShare] | None,
    groups: gate.GroupFits | None = None,
) -> GroupStatus:
    bound = [u for u in uids if u in state.pods]
    waiting = tuple(sorted(u for u in uids if u not in state.pods))
    tenant = next((state.pods[u].tenant for u in bound if state.pods[u].tenant), None)
    if tenant is None:
        tenant = next((pending[u].tenant for u in waiting if u in pending), None)
    if key in sizes:
        n, source = sizes[key], "PodGroup"
    else:
        n = next((m for u in uids if (m := annotated_min_count(pods[u]))), None)
        source = "annotation" if n is not None else ""
    base = GroupStatus(
        key=key,
        tenant=tenant,
        min_count=n,
        min_source=source,
        members=len(uids),
        bound=len(bound),
        state="waiting",
        reason="",
        pending=waiting,
    )
    if n is not None and len(bound) >= n:
        return replace(base, state="running")
    held = _held_gpus(state, uids)
    if plan is not None:
        by_name = {_name(pods[u]) or u: node for u, node in plan.nodes.items() if u in pods}
        reason = (
            f"planned; {plan.arrived} of {plan.needed} members reached bind, the group "
            "binds whole once all have"
        )
        return replace(
            base,
            state="planned",
            reason=reason,
            held_gpus=held,
            planned=by_name,
        )
    if n is None:
        if key in sizes:
            reason = f"gang {key}: its PodGroup has no positive spec.minMember"
        else:
            reason = (
                f"gang {key}: no PodGroup {PODGROUP_GROUP}/{PODGROUP_VERSION} "
                f"{key} and no {ANN_MIN_MEMBERS} annotation on its pods"
            )
        return replace(
            base,
            state="waiting",
            reason=reason,
            actionable=True,
            held_gpus=held,
        )
    # the annotated topology key (a native PodGroup's constraint is not read here)
    topology = next((t for u in uids if (t := annotated_topology_key(pods[u]))), None)
    gang = gang_of(
        key,
        n,
        pods={u: pods[u] for u in uids},
        pending=pending,
        bound=bound,
        topology_key=topology,
    )
    if gang.members < n:
        reason = (
            f"gang {key} has {gang.members} of its {n} members; it holds nothing until all exist"
        )
        return replace(
            base,
            state="waiting",
            reason=reason,
            actionable=True,
            held_gpus=held,
        )
    if not judge:
        return replace(base, held_gpus=held)
    decision = gang_gate(state, config, gang, pending=queue, fair=fair, groups=groups)
    if decision is not None and not decision.allowed:
        return replace(
            base,
            state="waiting",
            reason=f"gang {gang.describe()}: {decision.reason}",
            waiting_for=decision.waiting_for,
            held_gpus=held,
        )
    first = gang.waiting[0] if gang.waiting else None
    rows = state.eligible_rows(first.constraints) if first is not None else None
    planned = plan_gang(state, gang, rows=rows)
    if isinstance(planned, Refusal):
        never = never_whole(state, gang, rows)
        reason = planned.reason + (f"; {never}" if never else "")
        return replace(
            base,
            state="waiting",
            reason=reason,
            actionable=bool(never),
            held_gpus=held,
            misfit=misfit(state, gang, rows),
        )
    return replace(base, reason=FITS_NOW, held_gpus=held)


MISFIT_MAX_MEMBERS: Final = 64
"""Groups with more waiting members are not searched for their first misfit."""


def misfit(
    state: ClusterState, gang: Gang, rows: Sequence[int] | None
) -> tuple[str, dict[str, str]] | None:
    """The first member, in the order ``plan_gang`` places them, that fits no node once the
    members before it are placed, with each node's reason; None when every member fits
    (the group falls short elsewhere) or the group is too large to search. The state is
    left as it was."""
    order = sorted(gang.waiting, key=lambda p: (-p.gpu_count, -sum(p.row), p.name, p.uid))
    if not order or len(order) > MISFIT_MAX_MEMBERS:
        return None
    before: GangPlan | None = None
    for k in range(1, len(order) + 1):
        prefix = replace(gang, min_count=k, bound=(), waiting=tuple(order[:k]))
        got = plan_gang(state, prefix, rows=rows)
        if isinstance(got, Refusal):
            break
        before = got
    else:
        return None
    req = order[k - 1]
    if before is not None:
        reserve(state, before)
    try:
        fr = filter_nodes(state, req, rows=rows, explain=True)
        why = {f.node: f.reason for f in fr.failed}
    finally:
        if before is not None:
            release(state, before)
    return f"{req.namespace}/{req.name}", why


def never_whole(state: ClusterState, gang: Gang, rows: Sequence[int] | None) -> str:
    """Why the group could never be placed whole as the nodes are ("" if it might): a
    member that fits no node even empty, or a group asking more of a resource than the
    nodes its members may use have in all."""
    for req in gang.waiting:
        if not gate.pod_fits_drained(state, req):
            return f"{req.namespace}/{req.name} fits no node even empty: it can never run"
    n_res = state.n_res
    chosen = range(len(state.nodes)) if rows is None else rows
    total = [0.0] * n_res
    for i in chosen:
        for k in range(n_res):
            total[k] += state.capacity[i * n_res + k]
    demand = gang.demand_row()
    for k, v in enumerate(demand[:n_res]):
        if v > total[k] + 1e-9:
            name = state.index.names[k] if k < len(state.index.names) else str(k)
            return (
                f"the group asks more {name} than the nodes its members may use have in all: "
                "it can never run as it is"
            )
    if gang.topology_key is not None:
        return _never_in_domain(state, gang, gang.topology_key, chosen, demand)
    return ""


def _never_in_domain(
    state: ClusterState,
    gang: Gang,
    key: str,
    rows: Sequence[int],
    demand: Sequence[float],
) -> str:
    """Why no domain of node label ``key`` among ``rows`` could ever hold the group
    ("" if one might)."""
    domains, _ = domains_of(state, key, rows)
    if not domains:
        return f"no node its members may use has the label {key}: it can never run as it is"
    n_res = state.n_res
    for members in domains.values():
        total = [0.0] * n_res
        for i in members:
            for k in range(n_res):
                total[k] += state.capacity[i * n_res + k]
        if all(v <= total[k] + 1e-9 for k, v in enumerate(demand[:n_res])):
            return ""
    return (
        f"the group asks more than any one domain of {key} has in all ({len(domains)} "
        "domain(s) its members may use): it can never run as it is"
    )
