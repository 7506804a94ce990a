"""The extender's four verbs as pure functions: decoded args + a view → wire answer.

Pure: no network, no clock, no globals. Must not import aiohttp, kubernetes_asyncio or
prometheus_client. The HTTP adapter (``app``) decodes the body with ``wire``, asks the
tracker for its ``ExtenderView`` (one per tracker version), calls one of these, and
encodes; a ``WireFormatError`` from decoding is its 400.

Design choices:

* Every verb is a function of ``(args, view, config)``: the ``ExtenderView`` bundles what
  the tracker knows (the state, the pending pods, namespace labels, the fair allocation,
  the workload mix and score context, the request reader). Every verb reads the
  ``ClusterState`` and never changes it.
* Binding is decided by ``bind_decision`` alone (a retried bind that already went
  through, the devices and Binding body of ``bind_plan``, the pod's shared GPU, the
  fair-share gate judged again); the adapter then, under its one bind lock, accounts
  the pod with ``commit_bind`` (assume) before it POSTs the Binding outside the lock,
  and un-accounts it when the POST fails. Accounting first is what keeps two binds
  from both taking the last share of a device: the second one's decision sees the first.
* A pod whose resources cannot be read is not an extender failure: filter answers every
  candidate as unresolvable with the reason, prioritize gives 0 everywhere. ``Error`` is
  kept for failures of the extender itself (and for binds it refuses).
* Prioritize scores only the nodes it is given, in one scorer call over all of them, and
  maps the core's [0, 1] score to ``round(10 * s)`` clamped to 0..10 (ints, Go int64).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

from extender import filtering, preemption, wire
from fairshare import fairness, gangs, gating, pipeline, reclaim, resources, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.placement import (
    PodRequest,
    ScoreContext,
    Scorer,
    WorkloadMix,
    build_scorer,
    fit_rows,
    fits_after_release,
    node_rank,
    score_context,
)
from fairshare.resources import ANN_GPU_DEVICES, ANN_GPU_GROUP
from fairshare.state import objects
from fairshare.state.cluster import BoundPod, ClusterState

NamespaceLabels = Mapping[str, Mapping[str, str]]
T = TypeVar("T")
Parse = Callable[[Mapping[str, Any]], PodRequest]
"""A pod in a request -> its ``PodRequest`` (``request_for`` with the caller's state,
config and labels, possibly remembered); raises ``resources.DemandError``."""


def request_for(
    pod: Mapping[str, Any],
    *,
    state: ClusterState,
    config: FairShareConfig,
    namespace_labels: NamespaceLabels,
) -> PodRequest:
    """The pod in the request as a ``PodRequest``; raises ``resources.DemandError``."""
    tenant = objects.pod_tenant(pod, config=config, namespace_labels=namespace_labels)
    return objects.pod_request(
        pod,
        config=config,
        tenant=tenant,
        index=state.index,
        device_memory=lambda: objects.largest_device_memory(state),
    )


def _nothing() -> None:
    return None


def _no_holds() -> Sequence[reclaim.RoomHold]:
    return ()


_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Once(Generic[T]):
    """A value computed at its first use and kept (a part of a view that not every verb
    reads, and that costs a pass over the queue: the fair allocation)."""

    __slots__ = ("_made", "_make", "_value")

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._made = False
        self._value: T | None = None

    def __call__(self) -> T:
        if not self._made:
            self._value = self._make()
            self._made = True
            del self._make
        return self._value  # type: ignore[return-value]


class ExtenderView(NamedTuple):
    """What the verbs read, in one immutable value (a named tuple: the tracker makes one
    for every bind, and a tuple is made several times faster than a frozen dataclass):
    the tracker makes one per version of what it holds (``ExtenderTracker.view``) and
    hands the same to every call until it changes.

    ``state`` and ``pending`` (pending pods by uid) are the tracker's own, never changed by
    a verb. ``read`` turns a pod sent by kube-scheduler into its ``PodRequest`` (the
    tracker's per-pod-version reading; None: ``request_for`` over this view). ``fair``,
    ``mix`` and ``context`` give the fair allocation, the workload mix and the score
    context, each computed at its first use and then the same for the view's life (None:
    the verb computes the allocation over ``pending`` itself; no mix; a context over the
    state). ``groups``
    tells how other tenants' waiting pod groups count at the gate; it is asked at each use
    (the PodGroups it sizes groups by are fetched outside the tracker).
    """

    state: ClusterState
    pending: Mapping[str, PodRequest] = _EMPTY
    namespace_labels: NamespaceLabels = _EMPTY
    pods: Mapping[str, Mapping[str, Any]] = _EMPTY
    """Every known pod (priorities, ages and pod groups of preemption victims)."""
    read: Parse | None = None
    fair: Callable[[], Mapping[str, fairness.FairShare] | None] = _nothing
    mix: Callable[[], WorkloadMix | None] = _nothing
    context: Callable[[], ScoreContext | None] = _nothing
    groups: Callable[[], gating.GroupFits | None] = _nothing
    holds: Callable[[], Sequence[reclaim.RoomHold]] = _no_holds
    """The reclaim holds in force when asked (the tracker leaves lapsed ones out)."""

    @classmethod
    def of(
        cls,
        state: ClusterState,
        *,
        pending: Sequence[PodRequest] = (),
        namespace_labels: NamespaceLabels | None = None,
        pods: Mapping[str, Mapping[str, Any]] | None = None,
        read: Parse | None = None,
        fair: Mapping[str, fairness.FairShare] | None = None,
        mix: WorkloadMix | None = None,
        context: ScoreContext | None = None,
        groups: gating.GroupFits | None = None,
        holds: Sequence[reclaim.RoomHold] = (),
    ) -> ExtenderView:
        """A view of fixed parts (a state file, a test): ``pending`` as a queue (the first
        of a uid listed twice counts)."""
        queue: dict[str, PodRequest] = {}
        for p in pending:
            queue.setdefault(p.uid, p)
        return cls(
            state,
            queue,
            namespace_labels if namespace_labels is not None else {},
            pods if pods is not None else {},
            read,
            lambda: fair,
            lambda: mix,
            lambda: context,
            lambda: groups,
            lambda: holds,
        )

    def queue(self) -> list[PodRequest]:
        """The pending pods, in the order they came."""
        return list(self.pending.values())

    def request(self, pod: Mapping[str, Any], config: FairShareConfig) -> PodRequest:
        """The pod in a request as a ``PodRequest``; raises ``resources.DemandError``."""
        if self.read is not None:
            return self.read(pod)
        return request_for(
            pod, state=self.state, config=config, namespace_labels=self.namespace_labels
        )


# -- filter ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FilterAnswer:
    """Filter's answer, with the pod as read and the gate's decision (None: the gate did
    not apply, or the pod could not be read), which the adapter counts for the
    gated-pods gauge."""

    result: wire.ExtenderFilterResult
    req: PodRequest | None = None
    gate: fairness.GateDecision | None = None


def filter_answer(
    args: wire.ExtenderArgs, view: ExtenderView, config: FairShareConfig, *, pick: bool = False
) -> FilterAnswer:
    """``ExtenderFilterResult``: the passing names (or Node objects) echoed back.

    The gate judges the pod against ``view.pending``, with the view's fair allocation
    (computed over the pending pods when the view has none) and its pod groups; the
    view's reclaim holds keep other tenants' pods off room made for a pending pod.

    ``pick`` (``--pick-in-filter``): when more than one node passes, keep only the one
    prioritize would score highest (with the view's mix and score context); the other
    passing nodes are omitted, not failed. kube-scheduler then has one feasible node and
    skips scoring, so prioritize is not called for the pod.
    """
    names = args.candidate_names()
    # Asked whether or not a pick is needed: the mix is rebuilt lazily, when it is asked.
    mix, context = (view.mix(), view.context()) if pick else (None, None)
    try:
        req = view.request(args.pod, config)
    except resources.DemandError as exc:
        reason = f"pod resources cannot be read: {exc}"
        return FilterAnswer(_filter_result(args, (), {}, dict.fromkeys(names, reason)))
    state = view.state
    out = filtering.filter_pod(
        state,
        config=config,
        req=req,
        names=names,
        pending=view.queue(),
        fair=view.fair(),
        groups=view.groups(),
        holds=view.holds(),
    )
    passing: Sequence[str] = out.passing
    picked = pick and len(passing) > 1
    if picked:
        passing = (pick_best(state, config, req, passing, mix=mix, context=context),)
    # ``out.passing`` is ``names`` (the NodeNames sent) less the failed ones, in order.
    echo = passing if args.node_names is not None and not picked else None
    result = _filter_result(args, passing, out.failed, out.unresolvable, echo)
    return FilterAnswer(result, req, out.gate)


def filter_result(
    args: wire.ExtenderArgs, view: ExtenderView, config: FairShareConfig, *, pick: bool = False
) -> wire.ExtenderFilterResult:
    """``filter_answer``'s wire answer alone."""
    return filter_answer(args, view, config, pick=pick).result


def pick_best(
    state: ClusterState,
    config: FairShareConfig,
    req: PodRequest,
    names: Sequence[str],
    *,
    mix: WorkloadMix | None = None,
    context: ScoreContext | None = None,
) -> str:
    """The node of ``names`` (not empty) fairshare itself chooses for ``req``, as the
    simulator's ``ours`` chooses: ``pipeline.choose`` over prioritize's [0, 1] scores
    (the highest rounded to ``choice_levels`` levels, exact for some whole-GPU pods), ties
    to the lowest ``node_rank`` (one fixed random node order).
    """
    ctx = context or score_context(state, mix)
    _ints, raw = node_scores(state, config, req, names, mix=mix, context=ctx)
    order = range(len(names))
    k = pipeline.choose(dict(enumerate(raw)), order, lambda k: node_rank(names[k]), req, ctx.mix)
    return names[k or 0]


def _filter_result(
    args: wire.ExtenderArgs,
    passing: Sequence[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    echo: Sequence[str] | None = None,
) -> wire.ExtenderFilterResult:
    """``echo``: the ``NodeNames`` to answer, when the caller has them (else they are
    the ``NodeNames`` sent that are in ``passing``)."""
    keep = set(passing) if echo is None or args.nodes is not None else set()
    nodes = None
    if args.nodes is not None:
        pairs = zip(args.nodes.items, args.nodes.names(), strict=True)
        items = tuple(n for n, name in pairs if name in keep)
        nodes = wire.NodeList(items, args.nodes.raw)
    names = None
    if echo is not None:
        names = tuple(echo)
    elif args.node_names is not None:
        names = tuple(filter(keep.__contains__, args.node_names))
    # Unresolvable wins over failed (kube-scheduler reads it first).
    failed = {n: r for n, r in failed.items() if n not in unresolvable}
    return wire.ExtenderFilterResult(nodes, names, failed, dict(unresolvable))


# -- prioritize --------------------------------------------------------------------------


def prioritize_scores(
    args: wire.ExtenderArgs, view: ExtenderView, config: FairShareConfig
) -> tuple[Sequence[str], Sequence[int]]:
    """``HostPriorityList``'s hosts and their 0..10 scores, in the order given (the
    adapter writes them with ``wire.dumps_scores``, ``wire.encode_scores`` as objects).

    Nodes that do not fit (or are unknown) score 0, and so does every node when the pod
    cannot be read. The view's mix feeds the fragmentation term, its context (which only
    changes with the node set and the mix) the normalisers.
    """
    names = args.candidate_names()
    try:
        req = view.request(args.pod, config)
    except resources.DemandError:
        return names, [0] * len(names)
    ints, _ = node_scores(view.state, config, req, names, mix=view.mix(), context=view.context())
    return names, ints


def node_scores(
    state: ClusterState,
    config: FairShareConfig,
    req: PodRequest,
    names: Sequence[str],
    *,
    mix: WorkloadMix | None = None,
    context: ScoreContext | None = None,
) -> tuple[Sequence[int], Sequence[float]]:
    """Prioritize's scores of ``names`` for ``req``, in order: the 0..10 ints it answers
    and the [0, 1] scores they were rounded from. Unknown nodes and nodes that do not fit
    score 0 (both). The pipeline's ``fit`` and ``score`` (``_scores_by_filter``), or,
    when one kernel call decides every candidate, the same fit and weighted sum in one
    pass over the candidates (``fit_rows``, ``Scorer.extender``), equal bit for bit."""
    lo, hi = wire.MIN_EXTENDER_PRIORITY, wire.MAX_EXTENDER_PRIORITY
    ctx = context or score_context(state, mix)
    scorer = build_scorer(config.scoring.weights())
    fitted = fit_rows(state, req, filtering.candidate_rows(state, names))
    if fitted is not None:
        fast = scorer.extender(state, req, fitted, ctx, lo=lo, hi=hi)
        if fast is not None:
            return fast
    return _scores_by_filter(state, req, names, scorer, ctx)


def _scores_by_filter(
    state: ClusterState, req: PodRequest, names: Sequence[str], scorer: Scorer, ctx: ScoreContext
) -> tuple[list[int], list[float]]:
    """``node_scores`` by the pipeline's ``fit`` and ``score`` (every pod)."""
    lo, hi = wire.MIN_EXTENDER_PRIORITY, wire.MAX_EXTENDER_PRIORITY
    found = list(map(state.node_index.get, names))
    rows = [i for i in found if i is not None]
    fits = pipeline.fit(state, req, rows).fits
    scored = pipeline.score(state, req, fits, scorer=scorer, ctx=ctx)
    by_row: dict[int | None, int] = {
        i: min(hi, max(lo, int(s))) for i, s in scored.extender_scores().items()
    }
    raw = scored.scores
    ints = list(map(by_row.get, found, repeat(0)))
    return ints, [0.0 if i is None else raw.get(i, 0.0) for i in found]


# -- preempt -----------------------------------------------------------------------------


def _guarantees(state: ClusterState, config: FairShareConfig) -> dict[str, dict[int, float]]:
    return {
        t.name: filtering.kernel_amounts(state, t.guaranteed_amounts())
        for t in config.tenants
        if t.guaranteed
    }


def _levels(
    state: ClusterState, config: FairShareConfig, guaranteed: Mapping[str, object]
) -> tuple[dict[str, list[float]], dict[str, tuple[str, ...]] | None]:
    """Usage per guaranteed tenant (its subtree's in a tree) and each tenant's ancestors."""
    if not config.is_hierarchical():
        return {t: state.usage_of(t) for t in guaranteed}, None
    usage = {t: gating.subtree_usage(state, config, t) for t in guaranteed}
    ancestors = {t.name: tuple(a.name for a in config.ancestors(t.name)) for t in config.tenants}
    return usage, ancestors


def _victims(
    uids: Sequence[str],
    full: Mapping[str, Mapping[str, Any]],
    *,
    state: ClusterState,
    config: FairShareConfig,
    namespace_labels: NamespaceLabels,
) -> list[preemption.Victim]:
    """The proposed victims as the rules judge them: a bound pod by its ledger row, any
    other by reading the pod kube-scheduler sent (``request_for``; the view's reader keeps
    the readings of the pods kube-scheduler schedules, not of its victims)."""
    out = []
    for uid in uids:
        bound = state.pods.get(uid)
        if bound is not None:
            out.append(preemption.Victim(uid, bound.tenant, bound.row))
            continue
        pod = full.get(uid)
        try:
            if pod is None:
                raise resources.DemandError("unknown pod")
            req = request_for(pod, state=state, config=config, namespace_labels=namespace_labels)
            out.append(preemption.Victim(uid, req.tenant, req.row))
        except resources.DemandError:
            out.append(preemption.Victim(uid, None, ()))
    return out


@dataclass(frozen=True, slots=True)
class PreemptAnswer:
    """Preempt's answer, with the preemptor as read (None: unreadable) and, when
    fairshare refused or changed victims, what it did (``note``, else "")."""

    result: wire.ExtenderPreemptionResult
    preemptor: PodRequest | None = None
    note: str = ""


def preempt_result(
    args: wire.ExtenderPreemptionArgs, view: ExtenderView, config: FairShareConfig
) -> wire.ExtenderPreemptionResult:
    """``preempt_answer``'s wire answer alone."""
    return preempt_answer(args, view, config).result


def preempt_answer(
    args: wire.ExtenderPreemptionArgs, view: ExtenderView, config: FairShareConfig
) -> PreemptAnswer:
    """The proposed victims fairshare allows, per node.

    Per node: victims whose eviction would take their tenant below ``guaranteed`` are
    dropped (``preemption.protect_guaranteed``), and so are, under the config's
    ``preemption`` policy, victims of other tenants at or below their fair share
    (``preemption.fair_share_victims``). In the place of refused victims come pods of the
    preemptor's own tenant on that node of lower priority (lowest first, then newest),
    while the preemptor still lacks room; then victims are spared again (other tenants'
    first) while the preemptor keeps its room. A node where what is left no longer makes
    room for the pod is dropped (evicting them would be for nothing), and so is a node
    left without victims. The view gives the known pods (``view.pods``: priorities, ages,
    pod groups) and the fair allocation (when it has none, one over the bound pods, the
    pending ones and the preemptor); the preemptor is read by the view's reader, as filter
    and prioritize read it. ``note`` says what fairshare changed (for an Event on the pod).

    Pod groups (``gangs.group_of``) are victims whole or not at all: a job that loses one
    member is lost. kube-scheduler evicts the victims of the one node it picks, and only
    pods running on that node (``HTTPExtender.convertToVictims`` fails the whole
    preemption on a victim found elsewhere), so a group with a bound member on another
    node is never offered (the reclaimer evicts groups across nodes); a group all of whose
    bound members run on the node is offered with every one of them; a group that the
    rules above would split (one member refused, e.g. the group as a whole would take its
    tenant below its guarantee) is spared whole, and the node judged again without it.
    """
    state = view.state
    labels = view.namespace_labels
    known = view.pods
    pre: PodRequest | None
    try:
        pre = view.request(args.pod, config)
        pre_tenant, pre_row = pre.tenant, pre.row
    except resources.DemandError:
        pre, pre_tenant, pre_row = None, None, ()
    full = {
        str((p.get("metadata") or {}).get("uid", "")): p
        for v in (args.node_name_to_victims or {}).values()
        for p in v.pods
    }
    guaranteed = _guarantees(state, config)
    usage, ancestors = _levels(state, config, guaranteed)
    rule = None
    if pre is not None and pre_tenant is not None:
        rule = _fair_rule(state, config, pre, view.queue(), view.fair())
    pre_priority = _priority(args.pod)
    result: dict[str, wire.MetaVictims] = {}
    notes: list[str] = []
    proposed = args.meta_victims()
    groups = _victim_groups(state, proposed, full, known)
    for node, meta in sorted(proposed.items()):
        uids = _whole_groups(state, node, meta.pod_uids, groups, notes)
        while True:
            victims = _victims(uids, full, state=state, config=config, namespace_labels=labels)
            kept = preemption.protect_guaranteed(
                victims,
                usage=usage,
                guaranteed=guaranteed,
                preemptor_tenant=pre_tenant,
                preemptor_row=pre_row,
                ancestors=ancestors,
            )
            refused: tuple[tuple[str, str], ...] = ()
            if rule is not None:
                judged = preemption.fair_share_victims(victims, rule, kept_by_guarantee=kept)
                kept, refused = judged.uids, judged.refused
                own_first = rule.within != "Never" and rule.others != "Any"
                if pre is not None and len(kept) < len(victims) and own_first:
                    kept = _substitute(state, pre, node, kept, known, pre_priority)
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
        if set(kept) != set(meta.pod_uids) and not _room_left(state, pre, node, kept):
            continue
        pdb = meta.num_pdb_violations if set(kept) <= set(meta.pod_uids) else 0
        result[node] = wire.MetaVictims(tuple(kept), min(pdb, len(kept)))
    answer = wire.ExtenderPreemptionResult(result)
    if pre is None or not notes:
        return PreemptAnswer(answer, pre)
    chosen = "; ".join(notes[:5]) + (f" (and {len(notes) - 5} more)" if len(notes) > 5 else "")
    return PreemptAnswer(answer, pre, chosen)


@dataclass(frozen=True)
class _Groups:
    """The pod groups among the proposed victims: victim or member uid -> group, and each
    group's bound members (empty when no victim is in a group)."""

    of: Mapping[str, gangs.GroupKey] = field(default_factory=dict)
    members: Mapping[gangs.GroupKey, tuple[str, ...]] = field(default_factory=dict)


def _victim_groups(
    state: ClusterState,
    proposed: Mapping[str, wire.MetaVictims],
    full: Mapping[str, Mapping[str, Any]],
    known: Mapping[str, Mapping[str, Any]],
) -> _Groups:
    """Which proposed victims are in a pod group, and every bound member of those groups
    (the known pods are scanned only when some victim is in a group)."""
    of: dict[str, gangs.GroupKey] = {}
    for meta in proposed.values():
        for uid in meta.pod_uids:
            pod = full.get(uid) or known.get(uid)
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


def _priority(pod: Mapping[str, Any]) -> int:
    """``spec.priority`` (set by the Priority admission plugin; 0 when absent)."""
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _created(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    stamp = meta.get("creationTimestamp") if isinstance(meta, Mapping) else None
    return stamp if isinstance(stamp, str) else ""


def _victim_name(state: ClusterState, uid: str) -> str:
    held = state.pods.get(uid)
    return f"pod {held.name or uid} of tenant {held.tenant}" if held else f"pod {uid}"


def _fair_rule(
    state: ClusterState,
    config: FairShareConfig,
    pre: PodRequest,
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None,
) -> preemption.FairPreemption:
    """The figures ``preemption.fair_share_victims`` judges by: every tenant's levels
    (usage over its subtree, fair share, share now), and whether the preemptor's tenant
    (or an ancestor) would be above its fair share with the pod."""
    assert pre.tenant is not None
    policy = config.preemption
    if fair is None:
        queue = [p for p in pending if p.uid != pre.uid] + [pre]
        rows = gating.demand_rows(state, queue)
        fair = gating.fair_shares_for(state, config, rows)
    weights = tenancy.tenant_weights(config)
    capacity = state.total_capacity()
    res_weights = config.resource_weights()

    def share_of(level: str, used: Sequence[float]) -> float:
        return fairness.dominant_shares(
            used={level: list(used)},
            capacity=capacity,
            res_weights=res_weights,
            tenant_weights={level: weights.get(level, 1.0)},
        )[level]

    def chain(tenant: str) -> tuple[str, ...]:
        return (tenant, *(a.name for a in config.ancestors(tenant)))

    tree = config.is_hierarchical()
    names = set(state.tenant_usage) | {t.name for t in config.tenants}
    levels: dict[str, tuple[preemption.Level, ...]] = {}
    for tenant in sorted(names):
        out = []
        for level in chain(tenant):
            used = gating.subtree_usage(state, config, level) if tree else state.usage_of(level)
            share = fair[level].share if level in fair else 0.0
            out.append(preemption.Level(level, tuple(used), share, share_of(level, used)))
        levels[tenant] = tuple(out)
    over = False
    for level in chain(pre.tenant):
        used = gating.subtree_usage(state, config, level) if tree else state.usage_of(level)
        after = [u + (pre.row[k] if k < len(pre.row) else 0.0) for k, u in enumerate(used)]
        floor = fair[level].share if level in fair else 0.0
        if share_of(level, after) > floor * (1 + fairness.EPS) + fairness.EPS:
            over = True
    return preemption.FairPreemption(
        preemptor_tenant=pre.tenant,
        preemptor_levels=chain(pre.tenant),
        preemptor_over=over,
        levels=levels,
        share_of=share_of,
        within=policy.within_tenant,
        others=policy.other_tenants,
    )


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
        and bp.uid in pods and _priority(pods[bp.uid]) < priority
        and gangs.group_of(pods[bp.uid]) is None  # a group goes whole: never one member
    ]  # fmt: skip
    own.sort(key=lambda bp: (_priority(pods[bp.uid]), _neg(_created(pods[bp.uid])), bp.uid))
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


def _neg(stamp: str) -> tuple[int, ...]:
    """An RFC 3339 UTC stamp's sort key reversed (newest first)."""
    return tuple(-ord(c) for c in stamp)


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


# -- bind --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BindPlan:
    """What binding a pod means: devices, annotations, the Binding body; or an error."""

    uid: str
    name: str
    namespace: str
    node: str
    tenant: str | None = None
    row: tuple[float, ...] = ()
    devices: tuple[tuple[int, float], ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    binding: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""
    mig: tuple[str, int] | None = None
    """(MIG profile, slices) the pod takes instead of devices."""
    group: str = ""
    """The shared GPU a fractional pod takes a share of ("" otherwise)."""
    new_group: bool = False
    """The pod is the first of its shared GPU (a handoff must set up the GPU)."""

    def result(self) -> dict[str, Any]:
        """``ExtenderBindingResult`` as JSON (``Error`` empty when the plan is good)."""
        return wire.ExtenderBindingResult(self.error).encode()


def binding_body(
    *, name: str, namespace: str, uid: str, node: str, annotations: Mapping[str, str]
) -> dict[str, Any]:
    """The ``v1/Binding`` to POST to ``/api/v1/namespaces/{ns}/pods/{name}/binding``.

    ``metadata.annotations`` are copied onto the pod in the same write as ``nodeName``;
    ``metadata.uid`` (when known) makes the API server refuse a recreated pod of the
    same name.
    """
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def _find(args: wire.ExtenderBindingArgs, pending: Mapping[str, PodRequest]) -> PodRequest | None:
    """The pod to bind among the pending ones: by UID, else by namespace/name."""
    known = pending.get(args.pod_uid) if args.pod_uid else None
    if known is not None:
        return known
    for p in pending.values():
        if (p.namespace, p.name) == (args.pod_namespace, args.pod_name):
            return p
    return None


def _fail(args: wire.ExtenderBindingArgs, error: str) -> BindPlan:
    return BindPlan(args.pod_uid, args.pod_name, args.pod_namespace, args.node, error=error)


def bind_plan(args: wire.ExtenderBindingArgs, view: ExtenderView) -> BindPlan:
    """The pipeline's plan for the pod on ``args.node`` (``pipeline.fit`` there, then
    ``pipeline.plan_on``), with its annotations and the Binding body.

    The pod is looked up in ``view.pending`` (by UID, else namespace/name). Refused, with
    the reason in ``error``: an unknown pod or node, or a node that cannot take the pod
    now (a device would be oversubscribed). A fractional pod takes the fragmentation
    term's device when the view has a mix, else the fullest device that still holds it,
    and the shared GPU (``ANN_GPU_GROUP``) of the pods already on that device, or a new
    one.
    """
    state, mix = view.state, view.mix()
    req = _find(args, view.pending)
    if req is None:
        return _fail(args, f"pod {args.pod_namespace}/{args.pod_name} is not pending here")
    i = state.node_index.get(args.node)
    if i is None:
        return _fail(args, f"node {args.node} is not known to fairshare")
    if req.uid in state.pods:
        return _fail(args, f"pod {req.namespace}/{req.name} is already bound")
    fr = pipeline.fit(state, req, [i], explain=True)
    if not fr.fits:
        why = fr.failed[0].reason if fr.failed else "does not fit"
        return _fail(args, f"node {args.node} cannot take pod {req.namespace}/{req.name}: {why}")
    plan = pipeline.plan_on(state, req, i, milli=fr.gpu_milli.get(i, 0.0), mix=mix)
    if isinstance(plan, str):
        return _fail(args, f"node {args.node}: {plan}")
    devices = plan.devices
    annotations = {ANN_GPU_DEVICES: objects.format_gpu_devices(devices)} if devices else {}
    if plan.group:
        annotations[ANN_GPU_GROUP] = plan.group
    body = binding_body(
        name=req.name, namespace=req.namespace, uid=req.uid, node=args.node, annotations=annotations
    )
    return BindPlan(
        req.uid,
        req.name,
        req.namespace,
        args.node,
        req.tenant,
        plan.row,
        devices,
        annotations,
        body,
        mig=plan.mig,
        group=plan.group,
        new_group=plan.new_group,
    )


class BindDecision(NamedTuple):
    """What to do with a bind call: answer ``error`` at once (a refusal; "" for a retry of
    a bind that already went through), or account and bind ``plan``.

    ``req`` is the pod's pending reading (the adapter queues it again if the Binding
    POST fails); ``gate`` is the gate's refusal when it held the pod back (the adapter
    counts the pod as gated)."""

    error: str = ""
    plan: BindPlan | None = None
    req: PodRequest | None = None
    gate: fairness.GateDecision | None = None

    def result(self) -> dict[str, Any]:
        """``ExtenderBindingResult`` as JSON for an answer given at once."""
        return wire.ExtenderBindingResult(self.error).encode()


def bind_decision(
    args: wire.ExtenderBindingArgs,
    view: ExtenderView,
    config: FairShareConfig,
    *,
    judge_gate: bool = True,
) -> BindDecision:
    """The whole decision of a bind call, in order:

    * the pod is already bound to ``args.node`` (kube-scheduler retried a bind that went
      through after it timed out): answered as bound;
    * ``bind_plan``'s devices, shared GPU and Binding body, or its refusal;
    * ``judge_gate``: the fair-share gate judged again for a pending pod (kube-scheduler
      filters the next pod while earlier binds run, and those are in the view now). A
      pod group's member is bound with ``judge_gate=False``: the gate was judged for the
      whole group.
    """
    held = view.state.pods.get(args.pod_uid) if args.pod_uid else None
    if held is not None and held.node == args.node:
        return BindDecision()
    plan = bind_plan(args, view)
    if plan.error:
        return BindDecision(plan.error, plan)
    req = view.pending.get(plan.uid)
    if req is not None and judge_gate:
        # ``req`` is in the queue, so the view's fair allocation (over bound + pending)
        # is the one the gate needs.
        gate = pipeline.gate(
            view.state,
            config=config,
            req=req,
            pending=view.queue(),
            fair=view.fair(),
            groups=view.groups(),
            held=reclaim.gate_held(view.holds()),
        )
        if gate is not None and not gate.allowed:
            return BindDecision(gate.reason, None, req, gate)
    return BindDecision("", plan, req)


def commit_bind(state: ClusterState, plan: BindPlan) -> BoundPod:
    """Account the pod of a bind plan on its node (the adapter's assume: before the
    Binding POST, undone by ``ClusterState.unbind`` when the POST fails).

    The pod watch may already have reported the bound pod (with its annotation): a pod
    already accounted on the plan's node is returned as it is. Raises ``StateError`` if
    it is accounted elsewhere, or if the devices no longer have room.
    """
    if plan.error:
        raise ValueError(f"cannot commit a refused bind: {plan.error}")
    held = state.pods.get(plan.uid)
    if held is not None and held.node == plan.node:
        return held
    return state.bind(
        uid=plan.uid,
        node=plan.node,
        row=plan.row,
        devices=plan.devices,
        tenant=plan.tenant,
        name=plan.name,
        mig=plan.mig,
        group=plan.group,
    )
