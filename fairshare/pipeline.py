"""Placing one pod: fit → gate → score → device choice → plan, for extender and simulator.

Both place pods through these stages, so that a decision cannot differ between them. The
simulator runs the chain in one go (``place``); the extender runs it across
kube-scheduler's calls, which choose the node in between: filter is ``fit`` and ``gate``
(``--pick-in-filter`` adds ``choose``), prioritize ``score``, bind ``fit`` and ``plan_on``
on the chosen node. A ``Plan`` is what the simulator binds and the extender's bind writes.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress

from fairshare import fairness
from fairshare.config.schema import FairShareConfig
from fairshare.gate import GateDecision, GroupFits, HeldOff, check_fair_gate
from fairshare.placement import (
    FilterResult,
    PodRequest,
    ScoreContext,
    Scored,
    Scorer,
    WorkloadMix,
    choice_levels,
    choose_devices,
    choose_level,
    fgd_device,
    filter_nodes,
    fit_rows,
    mig_row,
    mig_use,
    row_failure,
)
from fairshare.state.cluster import ClusterState
from fairshare.state.objects import share_group

Devices = tuple[tuple[int, float], ...]
"""(device index, milli-GPU) pairs a pod takes on its node."""
Rank = Callable[[int], int]
"""A node row's place in the order that breaks ties between equal scores (lowest first)."""

NO_FIT = "no node fits"
"""Why ``place`` leaves a pod waiting when no candidate row fits it."""


# -- fit ---------------------------------------------------------------------------------


def fit(
    state: ClusterState,
    req: PodRequest,
    rows: Sequence[int] | None = None,
    *,
    explain: bool = False,
) -> FilterResult:
    """The rows of ``rows`` (every node: None) that can take ``req`` now, in that order,
    each with the milli-GPU per device the pod takes there (``FilterResult.gpu_milli``: a
    GPU-memory request's share depends on the node's device memory, a MIG pod's on the
    slice); with ``explain``, why each other row cannot (``placement.filter_nodes``)."""
    return filter_nodes(state, req, rows=rows, explain=explain)


# -- gate --------------------------------------------------------------------------------


gate = check_fair_gate
"""The fair-share gate's decision for a pod against the pending pods (None: it does not
apply): ``fairshare.gate.check_fair_gate`` itself. Asked only once ``fit`` found a row:
a pod that fits nowhere waits anyway."""


# -- score -------------------------------------------------------------------------------


def score(
    state: ClusterState,
    req: PodRequest,
    fits: Sequence[int],
    *,
    scorer: Scorer,
    ctx: ScoreContext,
) -> Scored:
    """The scorer's [0, 1] score of each fitting row (a row listed twice counts twice)."""
    return scorer(state, req, fits, ctx)


def choose(
    scores: Mapping[int, float],
    order: Sequence[int],
    rank: Rank,
    req: PodRequest,
    mix: WorkloadMix | None,
) -> int | None:
    """The row fairshare itself chooses among ``order``: the highest score rounded to
    ``choice_levels(req, mix)`` levels, ties to the lowest ``rank``; None when no row of
    ``order`` is scored."""
    return choose_level(scores, order, rank, choice_levels(req, mix))


def pick(
    state: ClusterState,
    req: PodRequest,
    fits: Sequence[int],
    *,
    scorer: Scorer,
    ctx: ScoreContext,
    rank: Rank,
) -> tuple[int | None, Scored]:
    """``score`` then ``choose``: the chosen row of ``fits`` (None: ``fits`` is empty) and
    the scores it was chosen by."""
    scored = score(state, req, fits, scorer=scorer, ctx=ctx)
    return choose(scored.scores, fits, rank, req, ctx.mix), scored


# -- device choice -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceChoice:
    """What a pod takes on its node: the kernel row it holds there, and its devices or
    its MIG slices (profile, count)."""

    row: tuple[float, ...]
    devices: Devices = ()
    mig: tuple[str, int] | None = None


def fragmentation_device(
    state: ClusterState, req: PodRequest, i: int, mix: WorkloadMix | None
) -> int:
    """The device the fragmentation term proposes for a pod taking a share of one device
    on row ``i`` (``placement.fgd_device`` against ``mix``: what the term's
    ``placement.fgd_raw`` proposes there); -1 without a mix or for any other pod."""
    if mix is None or not req.demand.gpu.is_fractional:
        return -1
    return fgd_device(state, req, i, mix)


def device_choice(
    state: ClusterState,
    req: PodRequest,
    i: int,
    *,
    milli: float,
    mix: WorkloadMix | None,
) -> DeviceChoice | str:
    """What ``req`` takes on row ``i``, where ``fit`` gave it ``milli`` per device: MIG
    slices where it runs on them (``mig_use``; the device plugin picks the slice), else
    ``choose_devices`` with the fragmentation term's device as the hint for a share of
    one device (``fragmentation_device``; None for ``mix``: the fullest device that
    holds it). A GPU-memory pod holds its share of this node's device, not of the
    largest one it was counted against while pending. Why not, when the devices are
    not there."""
    slices = mig_use(state, req, i)
    if slices is not None:
        return DeviceChoice(mig_row(state, req, i, slices), (), slices)
    hint = fragmentation_device(state, req, i, mix)
    devices = choose_devices(state, req, i, milli=milli, hint=hint)
    if not req.demand.wants_gpu:
        return DeviceChoice(req.row, devices)
    if len(devices) < req.gpu_count:
        return f"no {req.gpu_count} device(s) with room"
    return DeviceChoice(req.row_on(state.gpu_col, milli), devices)


# -- plan --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """Where a pod goes and what it takes there: what the simulator binds and what the
    extender's bind writes into the Binding (``ClusterState.bind``'s arguments)."""

    node: str
    node_row: int
    row: tuple[float, ...]
    """The kernel row the pod holds on the node."""
    devices: Devices = ()
    mig: tuple[str, int] | None = None
    """(MIG profile, slices) the pod takes instead of devices."""
    group: str = ""
    """The shared GPU a fractional pod takes a share of ("" otherwise)."""
    new_group: bool = False
    """The pod is the first of its shared GPU."""


def plan(state: ClusterState, req: PodRequest, i: int, choice: DeviceChoice) -> Plan:
    """``choice`` on row ``i`` as a ``Plan``: the shared GPU of the pods already on its
    one device share, or a new one (``objects.share_group``)."""
    node = state.nodes[i].name
    group, new = (
        ("", False) if choice.mig is not None else share_group(state, req, node, choice.devices)
    )
    return Plan(node, i, choice.row, choice.devices, choice.mig, group, new)


def plan_on(
    state: ClusterState,
    req: PodRequest,
    i: int,
    *,
    milli: float,
    mix: WorkloadMix | None,
) -> Plan | str:
    """``device_choice`` then ``plan`` on row ``i``; why not, when the devices are not
    there."""
    choice = device_choice(state, req, i, milli=milli, mix=mix)
    if isinstance(choice, str):
        return choice
    return plan(state, req, i, choice)


# -- the chain in one go -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why ``place`` placed nothing: no row fits (``NO_FIT``), the gate holds the pod
    (``gate``), or the chosen node has no devices for it."""

    reason: str
    gate: GateDecision | None = None


def place(
    state: ClusterState,
    req: PodRequest,
    rows: Sequence[int] | None,
    *,
    judge: Callable[[PodRequest], GateDecision | None],
    chooser: Callable[[PodRequest, FilterResult], int],
    mix: WorkloadMix | None,
) -> Plan | Waiting:
    """The whole chain for ``req`` over candidate ``rows`` (every node: None): ``fit``,
    the gate (``judge``: ``gate`` with the caller's queue and fair allocation), the node
    (``chooser`` of the fitting rows: ``pick``, or another policy's choice), and
    ``plan_on`` that node with ``mix`` for the device hint."""
    fr = fit(state, req, rows)
    if not fr.fits:
        return Waiting(NO_FIT)
    decision = judge(req)
    if decision is not None and not decision.allowed:
        return Waiting(decision.reason, decision)
    best = chooser(req, fr)
    got = plan_on(state, req, best, milli=fr.gpu_milli.get(best, 0.0), mix=mix)
    if isinstance(got, str):
        return Waiting(f"node {state.nodes[best].name}: {got}")
    return got


# -- the filter over kube-scheduler's candidates ------------------------------------------
#
# The extender's filter is the first two stages (fit, gate) over the nodes kube-scheduler
# passed, plus the room reclaim holds for other pods. Its fit is ``fit`` over the candidate
# rows, or, when one kernel call decides every candidate (no MIG, GPU-memory or GPU-model
# request), ``placement.fit_rows`` in one pass; ``NodeFailure.unresolvable`` decides
# between ``FailedNodes`` and ``FailedAndUnresolvableNodes``. A node the state does not
# know (informer lag) fails with ``UNKNOWN_NODE``.


UNKNOWN_NODE = "node not known to fairshare yet (its informer has not caught up)"


@dataclass(frozen=True)
class FilterOutcome:
    """The filter verdict for one pod over the candidate names (in input order)."""

    passing: tuple[str, ...]
    failed: Mapping[str, str] = field(default_factory=dict)
    unresolvable: Mapping[str, str] = field(default_factory=dict)
    gate: GateDecision | None = None
    gpu_milli: Mapping[str, float] = field(default_factory=dict)


def filter_pod(
    state: ClusterState,
    *,
    config: FairShareConfig,
    req: PodRequest,
    names: Sequence[str],
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None = None,
    groups: GroupFits | None = None,
    held: HeldOff | None = None,
) -> FilterOutcome:
    """Fit ``req`` against the candidate ``names``, then apply the fair-share gate
    (``groups``: how waiting pod groups count there, ``fairshare.gangs.waiting``) and the
    room reclaim holds (``held``: the holds in force as the gate takes them,
    ``preemption.holds.gate_held``; room held for another tenant's pod fails in
    ``FailedNodes`` with the hold as reason)."""
    out = _filter_rows(
        state, config=config, req=req, names=names, pending=pending, fair=fair, groups=groups,
        held=held,
    )  # fmt: skip
    if out is None:
        out = _filter_names(
            state, config=config, req=req, names=names, pending=pending, fair=fair,
            groups=groups, held=held,
        )  # fmt: skip
    if held is not None and out.passing:
        return _keep_off_held_room(state, req, out, held)
    return out


def _keep_off_held_room(
    state: ClusterState, req: PodRequest, out: FilterOutcome, held: HeldOff
) -> FilterOutcome:
    """``out`` less the passing nodes the holds keep ``req`` off (failed with the reason)."""
    rows = [state.node_index[n] for n in dict.fromkeys(out.passing) if n in state.node_index]
    off = held(state, req, rows)
    if not off:
        return out
    kept_off = {state.nodes[i].name: reason for i, reason in off.items()}
    passing = tuple(n for n in out.passing if n not in kept_off)
    milli = {n: out.gpu_milli[n] for n in passing}
    return FilterOutcome(passing, {**out.failed, **kept_off}, out.unresolvable, out.gate, milli)


def _filter_names(
    state: ClusterState,
    *,
    config: FairShareConfig,
    req: PodRequest,
    names: Sequence[str],
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None,
    groups: GroupFits | None = None,
    held: HeldOff | None = None,
) -> FilterOutcome:
    """``filter_pod`` by the pipeline's ``fit`` over the known rows (every kind of pod)."""
    found = list(map(state.node_index.get, names))
    rows = [i for i in found if i is not None]
    fr = fit(state, req, rows, explain=True)
    nodes, milli = state.nodes, fr.gpu_milli
    fits = {nodes[i].name: milli.get(i, 0.0) for i in fr.fits}
    failed: dict[str, str] = {}
    if len(rows) < len(found):
        failed = {n: UNKNOWN_NODE for n, i in zip(names, found, strict=True) if i is None}
    unresolvable: dict[str, str] = {}
    for f in fr.failed:
        (unresolvable if f.unresolvable else failed)[f.node] = f.reason
    decision = None
    if fits:
        decision = gate(
            state, config=config, req=req, pending=pending, fair=fair, groups=groups, held=held
        )
        if decision is not None and not decision.allowed:
            failed.update(dict.fromkeys(fits, decision.reason))
            fits = {}
    passing = tuple(filter(fits.__contains__, names))
    return FilterOutcome(passing, failed, unresolvable, decision, fits)


def _filter_rows(
    state: ClusterState,
    *,
    config: FairShareConfig,
    req: PodRequest,
    names: Sequence[str],
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None,
    groups: GroupFits | None = None,
    held: HeldOff | None = None,
) -> FilterOutcome | None:
    """``filter_pod`` in one kernel pass over the candidates (``placement.fit_rows``);
    None when that cannot decide (MIG, GPU-memory or GPU-model requests)."""
    fitted = fit_rows(state, req, candidate_rows(state, names))
    if fitted is None:
        return None
    passing = tuple(compress(names, fitted.ok))
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if fitted.n_fit < len(names):
        ok = fitted.ok.tobytes()
        k = ok.find(0)
        while k >= 0:
            if fitted.codes[k] == NOT_A_NODE:
                failed[names[k]] = UNKNOWN_NODE
            else:
                f = row_failure(state, req, fitted, k)
                (unresolvable if f.unresolvable else failed)[f.node] = f.reason
            k = ok.find(0, k + 1)
    decision = None
    if passing:
        decision = gate(
            state, config=config, req=req, pending=pending, fair=fair, groups=groups, held=held
        )
        if decision is not None and not decision.allowed:
            failed.update(dict.fromkeys(passing, decision.reason))
            return FilterOutcome((), failed, unresolvable, decision, {})
    milli = _Uniform(passing, fitted.gpu_milli)
    return FilterOutcome(passing, failed, unresolvable, decision, milli)


def candidate_rows(state: ClusterState, names: Sequence[str]) -> array[int]:
    """The state's row of each name (int32), ``-1`` for a node it does not know."""
    return state.rows_of(names)


NOT_A_NODE = -2
"""``fit_rows``' code of a candidate the state does not know."""


class _Uniform(Mapping[str, float]):
    """``FilterOutcome.gpu_milli`` when every passing node takes the same per-device
    share: the mapping without building it per node."""

    def __init__(self, names: Sequence[str], milli: float) -> None:
        self._names, self._milli = names, milli

    @cached_property
    def _keys(self) -> frozenset[str]:
        return frozenset(self._names)

    def __getitem__(self, name: str) -> float:
        if name not in self._keys:
            raise KeyError(name)
        return self._milli

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(self._names))

    def __len__(self) -> int:
        return len(self._keys)
