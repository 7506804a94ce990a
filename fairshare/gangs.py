"""Pod groups (gangs): one model of a group and the all-or-nothing plan of its members.

Pure: no network, no clock. A gang is a set of pods that are useless until ``min_count``
of them run (a distributed training job). The extender plans every member that is not
bound yet at once, against the capacity and GPU devices of the ``ClusterState``, and
keeps the plan as reservations in that state (``reserve``), so the filter of any other
pod sees the room as taken; ``scheduler_plugin.ganging`` is the adapter around it.

Conventions read (``../shared/GANGS.md``):

* scheduler-plugins coscheduling (Kubeflow Trainer, the training operator): the pod label
  ``scheduling.x-k8s.io/pod-group: <name>`` and a ``scheduling.x-k8s.io/v1alpha1``
  PodGroup ``<name>`` in the pod's namespace whose ``spec.minMember`` is ``min_count``;
* without that PodGroup, the annotation ``fairshare.io/gang-min-members: "<n>"`` on the
  members (fairshare's own fallback, for clusters without the coscheduling CRD);
* Kubernetes' native pod groups (v1.36, alpha: gates ``GenericWorkload`` and
  ``GangScheduling``, API ``scheduling.k8s.io/v1alpha2``): the pod's immutable
  ``spec.schedulingGroup.podGroupName`` names a ``PodGroup`` in its namespace whose
  ``spec.schedulingPolicy.gang.minCount`` is ``min_count`` (a ``basic`` policy: no gang,
  ``min_count`` 1). kube-scheduler's pod-group cycle then calls the extender once per
  member with tentative placements it does not report; the plan made at the first
  member's filter answers each member with its planned node, so those calls agree with
  each other (no device or quota counted twice), and binding starts only once the whole
  group is permitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fairshare import fairness, gating
from fairshare.config.schema import FairShareConfig
from fairshare.placement import (
    PodRequest,
    choose_devices,
    filter_nodes,
    mig_row,
    mig_use,
)
from fairshare.state.cluster import ClusterState

POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
"""The coscheduling convention's pod label: the name of the pod's PodGroup."""
ANN_MIN_MEMBERS: Final = "fairshare.io/gang-min-members"
"""fairshare's fallback when no PodGroup object exists: the group's ``min_count``."""
PODGROUP_GROUP: Final = "scheduling.x-k8s.io"
PODGROUP_VERSION: Final = "v1alpha1"
PODGROUP_PLURAL: Final = "podgroups"
NATIVE_GROUP: Final = "scheduling.k8s.io"
"""The native PodGroup's API group (``v1alpha2`` in v1.36; ``NATIVE_VERSION``)."""
NATIVE_VERSION: Final = "v1alpha2"
RESERVATION_PREFIX: Final = "gang-reservation/"
"""The uid prefix of a planned member's reservation in the ``ClusterState``."""


@dataclass(frozen=True, order=True)
class GroupKey:
    namespace: str
    name: str
    native: bool = False
    """A native ``scheduling.k8s.io`` PodGroup (else the coscheduling convention)."""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def api(self) -> tuple[str, str, str]:
        """(group, version, plural) of the PodGroup object that sizes this group."""
        if self.native:
            return (NATIVE_GROUP, NATIVE_VERSION, PODGROUP_PLURAL)
        return (PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL)


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def group_of(pod: Mapping[str, Any]) -> GroupKey | None:
    """The pod's group in its namespace, or None: the native ``spec.schedulingGroup
    .podGroupName`` first, else the label ``scheduling.x-k8s.io/pod-group``."""
    meta = _meta(pod)
    spec = pod.get("spec")
    sched = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    native = sched.get("podGroupName") if isinstance(sched, Mapping) else None
    if isinstance(native, str) and native:
        return GroupKey(str(meta.get("namespace") or "default"), native, native=True)
    labels = meta.get("labels")
    name = labels.get(POD_GROUP_LABEL) if isinstance(labels, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    return GroupKey(str(meta.get("namespace") or "default"), name)


def _positive(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            return None
    return value if isinstance(value, int) and value > 0 else None


def annotated_min_count(pod: Mapping[str, Any]) -> int | None:
    """``fairshare.io/gang-min-members`` as a positive int (None: absent or not one)."""
    ann = _meta(pod).get("annotations")
    return _positive(ann.get(ANN_MIN_MEMBERS)) if isinstance(ann, Mapping) else None


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
            text = gating.describe_request(p)
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
) -> Gang:
    """The group ``key`` from the known pods (uid -> pod), the pending requests and the
    uids of the bound pods. A member that is neither (unreadable) is left out."""
    members = [uid for uid, pod in pods.items() if group_of(pod) == key]
    return gang_from(key, min_count, members, pending=pending, bound=bound)


def gang_from(
    key: GroupKey,
    min_count: int,
    members: Iterable[str],
    *,
    pending: Mapping[str, PodRequest],
    bound: Collection[str],
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
    return Gang(key, min_count, tenant, done, tuple(waiting))


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
    fr = filter_nodes(state, req, rows=rows, explain=False)
    if not fr.fits:
        fr = filter_nodes(state, req, rows=rows, explain=True)
        reasons = sorted({f.reason for f in fr.failed})
        return "; ".join(reasons[:3]) or "no candidate node"
    i = pick(req, fr.fits)
    milli = fr.gpu_milli.get(i, 0.0)
    slices = mig_use(state, req, i)
    node = state.nodes[i].name
    if slices is not None:
        return Placement(req.uid, req.name, node, req.tenant, mig_row(state, req, i, slices),
                         mig=slices)  # fmt: skip
    devices = choose_devices(state, req, i, milli=milli)
    if req.demand.wants_gpu and len(devices) < req.gpu_count:
        return f"no {req.gpu_count} device(s) with room on {node}"
    row = req.row_on(state.gpu_col, milli) if req.demand.wants_gpu else req.row
    return Placement(req.uid, req.name, node, req.tenant, row, devices)


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
    one by one once the group runs)."""
    if gang.members < gang.min_count:
        return Refusal(
            f"gang {gang.key} has {gang.members} of its {gang.min_count} members; "
            "it holds nothing until all exist"
        )
    choose = pick or best_fit(state)
    order = sorted(gang.waiting, key=lambda p: (-p.gpu_count, -sum(p.row), p.name, p.uid))
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
    if len(placed) < gang.needed:
        return Refusal(
            f"gang {gang.describe()} does not fit whole: {len(placed)} of {gang.needed} "
            f"members placed, {missing[0]}"
            + (f" (and {len(missing) - 1} more)" * (len(missing) > 1))
        )
    return GangPlan(gang.key, tuple(placed))


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
) -> fairness.GateDecision | None:
    """The fair-share gate for the whole group: ``gating.check_fair_gate`` with one
    request of the waiting members' summed demand (the members themselves left out of
    ``pending``). A group is indivisible, so a tenant still below its fair share before
    the group may start it even when the whole group takes it past that share (two
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
    decision = gating.check_fair_gate(state, config=config, req=whole, pending=queue, fair=fair)
    if decision is None or decision.allowed:
        return decision
    share_now = gating.current_shares(state, config).get(gang.tenant, 0.0)
    fair_share = fair[gang.tenant].share if fair and gang.tenant in fair else 0.0
    if share_now + fairness.EPS < fair_share:
        return None
    return decision
