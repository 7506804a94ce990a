"""Pod groups (gangs): one model of a group and the all-or-nothing plan of its members.

``plan_gang`` places every member not bound yet at once, against the capacity and GPU
devices of the ``ClusterState``; ``reserve`` keeps the plan as reservations in that state,
so any other pod's filter sees the room as taken (``extender.ganging`` is the adapter).
Under Kubernetes' native pod groups kube-scheduler calls the extender once per member
with tentative placements; the plan made at the first member's filter answers each member
with its planned node, so those calls agree. A group with a topology key (a node label)
is placed inside one domain of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fairshare import cluster_shares, fairness, gate, pipeline
from fairshare.config.schema import FairShareConfig
from fairshare.gangs.identity import ANN_TOPOLOGY_KEY, GroupKey, _meta, _positive, group_of
from fairshare.placement import (
    PodRequest,
)
from fairshare.state.cluster import ClusterState

RESERVATION_PREFIX: Final = "gang-reservation/"
"""The uid prefix of a planned member's reservation in the ``ClusterState``."""


def podgroup_min_count(podgroup: Mapping[str, Any]) -> int | None:
    """A PodGroup's ``min_count`` (None: absent or not positive): a coscheduling
    PodGroup's ``spec.minMember``; a native one's ``spec.schedulingPolicy.gang.minCount``
    (its ``basic`` policy: 1, each pod on its own)."""
    spec = podgroup.get("spec")
    if not isinstance(spec, Mapping):
        return None
    policy = spec.get("schedulingPolicy")
    if isinstance(policy, Mapping):
        gang = policy.get("gang")
        if isinstance(gang, Mapping):
            return _positive(gang.get("minCount"))
        return 1 if isinstance(policy.get("basic"), Mapping) else None
    return _positive(spec.get("minMember"))


def annotated_topology_key(pod: Mapping[str, Any]) -> str | None:
    """``fairshare.io/gang-topology-key`` (None: absent or empty)."""
    ann = _meta(pod).get("annotations")
    key = ann.get(ANN_TOPOLOGY_KEY) if isinstance(ann, Mapping) else None
    return (key.strip() or None) if isinstance(key, str) else None


def podgroup_topology_key(podgroup: Mapping[str, Any] | None) -> str | None:
    """A native PodGroup's ``spec.schedulingConstraints.topology[0].key`` (the API allows
    one constraint), None without one."""
    spec = podgroup.get("spec") if isinstance(podgroup, Mapping) else None
    cons = spec.get("schedulingConstraints") if isinstance(spec, Mapping) else None
    topo = cons.get("topology") if isinstance(cons, Mapping) else None
    first = topo[0] if isinstance(topo, list) and topo else None
    key = first.get("key") if isinstance(first, Mapping) else None
    return key if isinstance(key, str) and key else None


def topology_key(podgroup: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> str | None:
    """The group's topology key: its native PodGroup's constraint, else ``pod``'s
    annotation (None: the group may spread over any nodes)."""
    return podgroup_topology_key(podgroup) or annotated_topology_key(pod)


@dataclass(frozen=True)
class Gang:
    """A group as the extender sees it now."""

    key: GroupKey
    min_count: int
    tenant: str | None
    bound: tuple[str, ...]
    """Uids of members already bound to a node."""
    waiting: tuple[PodRequest, ...]
    """Members not bound yet whose resources could be read, by name."""
    topology_key: str | None = None
    """A node label: every member lands in one domain of it (None: anywhere)."""

    @property
    def members(self) -> int:
        return len(self.bound) + len(self.waiting)

    @property
    def needed(self) -> int:
        """How many waiting members must be placed for the group to reach ``min_count``."""
        return max(0, self.min_count - len(self.bound))

    @property
    def running(self) -> bool:
        """``min_count`` members are bound: later members are placed one by one."""
        return len(self.bound) >= self.min_count

    def demand_row(self) -> tuple[float, ...]:
        """The kernel row of every waiting member together."""
        width = max((len(p.row) for p in self.waiting), default=0)
        total = [0.0] * width
        for p in self.waiting:
            for k, v in enumerate(p.row):
                total[k] += v
        return tuple(total)

    def describe(self) -> str:
        """``ns/name (3 × nvidia.com/gpu 2)``: the group and its members' shape."""
        shapes: dict[str, int] = {}
        for p in self.waiting:
            text = gate.describe_request(p)
            shape = text[text.find("(") + 1 : -1] if "(" in text else text
            shapes[shape] = shapes.get(shape, 0) + 1
        parts = ", ".join(f"{k} × {s}" for s, k in shapes.items()) or "no waiting members"
        return f"{self.key} ({parts})"


def gang_of(
    key: GroupKey,
    min_count: int,
    *,
    pods: Mapping[str, Mapping[str, Any]],
    pending: Mapping[str, PodRequest],
    bound: Collection[str],
    topology_key: str | None = None,
) -> Gang:
    """The group ``key`` from the known pods (uid -> pod), the pending requests and the
    uids of the bound pods. A member that is neither (unreadable) is left out."""
    members = [uid for uid, pod in pods.items() if group_of(pod) == key]
    return gang_from(
        key, min_count, members, pending=pending, bound=bound, topology_key=topology_key
    )


def gang_from(
    key: GroupKey,
    min_count: int,
    members: Iterable[str],
    *,
    pending: Mapping[str, PodRequest],
    bound: Collection[str],
    topology_key: str | None = None,
) -> Gang:
    """The group ``key`` from the uids of its members (found by whatever index the caller
    keeps: ``gang_of`` scans the pods, the simulator knows its jobs' pods)."""
    members = list(members)
    done = tuple(sorted(uid for uid in members if uid in bound))
    waiting = sorted(
        (pending[uid] for uid in members if uid in pending and uid not in bound),
        key=lambda p: (p.name, p.uid),
    )
    tenant = next((p.tenant for p in waiting if p.tenant is not None), None)
    return Gang(key, min_count, tenant, done, tuple(waiting), topology_key)


@dataclass(frozen=True)
class Placement:
    """One member's planned node and what it takes there."""

    uid: str
    name: str
    node: str
    tenant: str | None
    row: tuple[float, ...]
    devices: tuple[tuple[int, float], ...] = ()
    mig: tuple[str, int] | None = None

    @property
    def reservation(self) -> str:
        return RESERVATION_PREFIX + self.uid


@dataclass(frozen=True)
class GangPlan:
    key: GroupKey
    placements: tuple[Placement, ...]

    def node_of(self, uid: str) -> str | None:
        return next((p.node for p in self.placements if p.uid == uid), None)


@dataclass(frozen=True)
class Refusal:
    reason: str


Pick = Callable[[PodRequest, Sequence[int]], int]
"""Choose one node row of the fitting rows (not empty) for a member."""


def best_fit(state: ClusterState) -> Pick:
    """The fitting row with the fewest free GPUs (packs a group, leaving whole nodes
    for the next one); ties to the first row given."""
    col, width = state.gpu_col, state.n_res  # for one plan: no node or resource changes

    def pick(_req: PodRequest, rows: Sequence[int]) -> int:
        free = state.free
        return min(rows, key=lambda i: free[i * width + col])

    return pick


def _place(
    state: ClusterState, req: PodRequest, rows: Sequence[int] | None, pick: Pick
) -> Placement | str:
    # The failure texts are built only when no node fits (they would cost more than the
    # fit itself on every member of a large group).
    fr = pipeline.fit(state, req, rows)
    if not fr.fits:
        fr = pipeline.fit(state, req, rows, explain=True)
        reasons = sorted({f.reason for f in fr.failed})
        return "; ".join(reasons[:3]) or "no candidate node"
    i = pick(req, fr.fits)
    # The pipeline's device choice without the fragmentation hint: a group is packed by
    # ``pick``, and its shared GPUs are settled when each member binds.
    got = pipeline.device_choice(state, req, i, milli=fr.gpu_milli.get(i, 0.0), mix=None)
    node = state.nodes[i].name
    if isinstance(got, str):
        return f"{got} on {node}"
    return Placement(req.uid, req.name, node, req.tenant, got.row, got.devices, got.mig)


def plan_gang(
    state: ClusterState,
    gang: Gang,
    *,
    rows: Sequence[int] | None = None,
    pick: Pick | None = None,
) -> GangPlan | Refusal:
    """Place every waiting member at once (largest GPU demand first), each against what
    the members before it took; the state is left as it was.

    ``rows``: the candidate node rows (all nodes when None). Refused when the group has
    fewer than ``min_count`` members, or when fewer than ``gang.needed`` members fit;
    members beyond ``needed`` that do not fit are left out of the plan (they are placed
    one by one once the group runs). A group with a ``topology_key`` is placed inside one
    domain of it (``_plan_in_domain``)."""
    if gang.members < gang.min_count:
        return Refusal(
            f"gang {gang.key} has {gang.members} of its {gang.min_count} members; "
            "it holds nothing until all exist"
        )
    choose = pick or best_fit(state)
    order = sorted(gang.waiting, key=lambda p: (-p.gpu_count, -sum(p.row), p.name, p.uid))
    if gang.topology_key is not None:
        return _plan_in_domain(state, gang, order, rows, choose, gang.topology_key)
    placed, missing = _place_all(state, order, rows, choose)
    if len(placed) < gang.needed:
        return Refusal(
            f"gang {gang.describe()} does not fit whole: {_short(gang, placed, missing)}"
        )
    return GangPlan(gang.key, tuple(placed))


def _place_all(
    state: ClusterState, order: Sequence[PodRequest], rows: Sequence[int] | None, choose: Pick
) -> tuple[list[Placement], list[str]]:
    """Each member in ``order`` against what those before it took: the placements and,
    for the members that fit nowhere, ``ns/name: why``. The state is left as it was."""
    placed: list[Placement] = []
    missing: list[str] = []
    try:
        for req in order:
            got = _place(state, req, rows, choose)
            if isinstance(got, str):
                missing.append(f"{req.namespace}/{req.name}: {got}")
                continue
            _hold(state, got)
            placed.append(got)
    finally:
        for p in placed:
            state.unbind(p.reservation)
    return placed, missing


def _short(gang: Gang, placed: Sequence[Placement], missing: Sequence[str]) -> str:
    return f"{len(placed)} of {gang.needed} members placed, {missing[0]}" + (
        f" (and {len(missing) - 1} more)" * (len(missing) > 1)
    )


DOMAINS_SHOWN: Final = 4
"""Domains a refusal describes one by one (the rest are counted)."""


def domains_of(
    state: ClusterState, key: str, rows: Sequence[int] | None
) -> tuple[dict[str, list[int]], int]:
    """The candidate rows by their value of node label ``key`` (a domain), and how many
    candidate rows have no such label (they are in no domain)."""
    out: dict[str, list[int]] = {}
    unlabelled = 0
    nodes = state.nodes
    for i in range(state.n_nodes) if rows is None else rows:
        value = nodes[i].labels.get(key)
        if value is None:
            unlabelled += 1
        else:
            out.setdefault(value, []).append(i)
    return out, unlabelled


def _gpu_floor(gang: Gang, order: Sequence[PodRequest]) -> float:
    """Milli-GPU the group takes at least, whatever nodes it gets: the ``needed``
    smallest whole or fractional GPU requests (MIG and memory requests count 0)."""
    takes = sorted(
        float(p.demand.gpu.total) * 1000 if p.demand.gpu.source in ("device", "fraction") else 0
        for p in order
    )
    return sum(takes[: gang.needed])


def _plan_in_domain(
    state: ClusterState,
    gang: Gang,
    order: Sequence[PodRequest],
    rows: Sequence[int] | None,
    choose: Pick,
    key: str,
) -> GangPlan | Refusal:
    """Every needed member inside one domain of node label ``key``. A group with bound
    members stays in their domain. Otherwise the domains are tried best-fit first: the
    fewest free GPUs, then the fewest GPUs, then the fewest nodes (a small domain that
    holds the group is used before a large one, which stays whole for a group that needs
    it; kube-scheduler's own placement score, MostAllocated over the placement, leans the
    same way), and the first the group fits whole in is the plan."""
    domains, unlabelled = domains_of(state, key, rows)
    head = f"gang {gang.describe()} does not fit whole in one domain of node label {key}"
    where = {state.pods[u].node for u in gang.bound if u in state.pods}
    if where:
        held = {state.nodes[i].labels.get(key) for i in state.rows_of(sorted(where)) if i >= 0}
        if len(held) != 1 or None in held:
            shown = ", ".join(sorted(str(v) for v in held if v is not None)) or "none"
            return Refusal(
                f"{head}: its bound members are on nodes of {len(held)} domains "
                f"({shown}{', and without the label' * (None in held)})"
            )
        (value,) = held
        assert value is not None
        domains = {value: domains.get(value, [])}
    if not any(domains.values()):
        count = state.n_nodes if rows is None else len(rows)
        return Refusal(
            f"{head}: none of the {count} candidate node(s) has that label"
            if not where
            else f"{head}: no candidate node is in the domain of its bound members"
        )
    col, width = state.gpu_col, state.n_res
    free, cap = state.free, state.capacity

    def gpus(values: Sequence[float], i_rows: Sequence[int]) -> float:
        return sum(values[i * width + col] for i in i_rows) if col >= 0 else 0.0

    ranked = sorted(
        domains.items(),
        key=lambda kv: (gpus(free, kv[1]), gpus(cap, kv[1]), len(kv[1]), kv[0]),
    )
    floor = _gpu_floor(gang, order)
    failed: list[str] = []
    for value, i_rows in ranked:
        room = gpus(free, i_rows)
        if room + 1e-9 < floor:
            failed.append(
                f"{key}={value}: {room / 1000:g} free GPU on {len(i_rows)} node(s), "
                f"the group needs {floor / 1000:g}"
            )
            continue
        placed, missing = _place_all(state, order, i_rows, choose)
        if len(placed) >= gang.needed:
            return GangPlan(gang.key, tuple(placed))
        failed.append(f"{key}={value}: {_short(gang, placed, missing)}")
    more = len(failed) - DOMAINS_SHOWN
    text = "; ".join(failed[:DOMAINS_SHOWN]) + (f"; and {more} more domain(s)" * (more > 0))
    if unlabelled and not where:
        text += f"; {unlabelled} candidate node(s) without the label"
    return Refusal(f"{head}: {text}")


def _hold(state: ClusterState, p: Placement) -> None:
    state.bind(
        uid=p.reservation,
        node=p.node,
        row=p.row,
        devices=p.devices,
        tenant=p.tenant,
        name=f"{p.name} (gang reservation)",
        mig=p.mig,
    )


def reserve(state: ClusterState, plan: GangPlan) -> None:
    """Hold the plan's room in the state (as bound pods of uid ``RESERVATION_PREFIX`` +
    member uid) until ``release``; every filter then sees it as taken."""
    done: list[Placement] = []
    try:
        for p in plan.placements:
            _hold(state, p)
            done.append(p)
    except Exception:
        for p in done:
            state.unbind(p.reservation)
        raise


def release(state: ClusterState, plan: GangPlan, uids: Iterable[str] | None = None) -> None:
    """Give back the reservations of ``uids`` (every member of the plan when None)."""
    wanted = None if uids is None else set(uids)
    for p in plan.placements:
        if wanted is None or p.uid in wanted:
            state.unbind(p.reservation)


def is_reservation(uid: str) -> bool:
    return uid.startswith(RESERVATION_PREFIX)


def gang_gate(
    state: ClusterState,
    config: FairShareConfig,
    gang: Gang,
    *,
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None,
    groups: gate.GroupFits | None = None,
) -> gate.GateDecision | None:
    """The fair-share gate for the whole group: ``gate.check_fair_gate`` with one
    request of the waiting members' summed demand (the members themselves left out of
    ``pending``; ``groups``: how other tenants' waiting groups count, ``gangs.waiting``).
    A group is indivisible, so a tenant still below its fair share before the group
    may start it even when the whole group takes it past that share (two
    tenants whose groups each exceed their share would otherwise hold each other back
    forever): the gate then answers None."""
    if gang.tenant is None or not gang.waiting:
        return None
    first = gang.waiting[0]
    whole = dataclasses.replace(
        first, uid=f"gang:{gang.key}", name=f"gang {gang.key.name}", row=gang.demand_row()
    )
    members = {p.uid for p in gang.waiting}
    queue = [p for p in pending if p.uid not in members]
    decision = gate.check_fair_gate(
        state, config=config, req=whole, pending=queue, fair=fair, groups=groups
    )
    if decision is None or decision.allowed:
        return decision
    share_now = cluster_shares.current_shares(state, config).get(gang.tenant, 0.0)
    fair_share = fair[gang.tenant].share if fair and gang.tenant in fair else 0.0
    if share_now + fairness.EPS < fair_share:
        return None
    return decision
