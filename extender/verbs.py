"""The extender's four verbs as pure functions of ``(args, view, config)``, ``view`` the
cache's ``Snapshot``. ``bind_decision`` decides a bind whole (a retried bind, devices and
Binding body, the shared GPU, the gate again); the app assumes it before the POST. A pod
whose resources cannot be read fails every candidate as unresolvable at filter and scores
0 at prioritize; prioritize maps a [0, 1] score to ``round(10 * s)`` in 0..10.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from types import MappingProxyType
from typing import Any, NamedTuple

from extender import wire
from extender.snapshot import Snapshot, request_for
from fairshare import pipeline, resources
from fairshare.config.schema import FairShareConfig
from fairshare.gate import GateDecision
from fairshare.placement import (
    PodRequest,
    ScoreContext,
    Scorer,
    WorkloadMix,
    build_scorer,
    fit_rows,
    node_rank,
    score_context,
)
from fairshare.preemption import holds, proposal, victims
from fairshare.resources import ANN_GPU_DEVICES, ANN_GPU_GROUP
from fairshare.state import objects
from fairshare.state.cluster import BoundPod, ClusterState

NamespaceLabels = Mapping[str, Mapping[str, str]]
_EMPTY: Mapping[str, Any] = MappingProxyType({})


Reading = PodRequest | resources.DemandError | None
"""The app's reading of the pod in a call (the cache reads each pod version once), or
why it cannot be read; None: the verb reads the pod itself."""


def reading(
    view: Snapshot, pod: Mapping[str, Any], config: FairShareConfig, given: Reading
) -> PodRequest:
    """The pod in a call as a ``PodRequest``: ``given``, else read over ``view``."""
    if isinstance(given, resources.DemandError):
        raise given
    return given if given is not None else view.request(pod, config)


# -- filter ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FilterAnswer:
    """Filter's answer, with the pod as read and the gate's decision (None: the gate did
    not apply, or the pod could not be read), which the adapter counts for the
    gated-pods gauge."""

    result: wire.ExtenderFilterResult
    req: PodRequest | None = None
    gate: GateDecision | None = None


def filter_answer(
    args: wire.ExtenderArgs,
    view: Snapshot,
    config: FairShareConfig,
    *,
    pick: bool = False,
    req: Reading = None,
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
    mix, context = (view.mix, view.context) if pick else (None, None)
    try:
        req = reading(view, args.pod, config, req)
    except resources.DemandError as exc:
        reason = f"pod resources cannot be read: {exc}"
        return FilterAnswer(filter_result_of(args, (), {}, dict.fromkeys(names, reason)))
    state = view.state
    out = pipeline.filter_pod(
        state,
        config=config,
        req=req,
        names=names,
        pending=view.queue,
        fair=view.fair,
        groups=view.groups,
        held=holds.gate_held(view.holds) if view.holds else None,
    )
    passing: Sequence[str] = out.passing
    picked = pick and len(passing) > 1
    if picked:
        passing = (pick_best(state, config, req, passing, mix=mix, context=context),)
    # ``out.passing`` is ``names`` (the NodeNames sent) less the failed ones, in order.
    echo = passing if args.node_names is not None and not picked else None
    result = filter_result_of(args, passing, out.failed, out.unresolvable, echo)
    return FilterAnswer(result, req, out.gate)


def filter_result(
    args: wire.ExtenderArgs, view: Snapshot, config: FairShareConfig, *, pick: bool = False
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


def filter_result_of(
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
    args: wire.ExtenderArgs, view: Snapshot, config: FairShareConfig, req: Reading = None
) -> tuple[Sequence[str], Sequence[int]]:
    """``HostPriorityList``'s hosts and their 0..10 scores, in the order given (the
    adapter writes them with ``wire.dumps_scores``, ``wire.encode_scores`` as objects).

    Nodes that do not fit (or are unknown) score 0, and so does every node when the pod
    cannot be read. The view's mix feeds the fragmentation term, its context (which only
    changes with the node set and the mix) the normalisers.
    """
    names = args.candidate_names()
    try:
        req = reading(view, args.pod, config, req)
    except resources.DemandError:
        return names, [0] * len(names)
    ints, _ = node_scores(view.state, config, req, names, mix=view.mix, context=view.context)
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
    fitted = fit_rows(state, req, pipeline.candidate_rows(state, names))
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


@dataclass(frozen=True, slots=True)
class PreemptAnswer:
    """Preempt's answer, with the preemptor as read (None: unreadable) and, when
    fairshare refused or changed victims, what it did (``note``, else "")."""

    result: wire.ExtenderPreemptionResult
    preemptor: PodRequest | None = None
    note: str = ""


def preempt_result(
    args: wire.ExtenderPreemptionArgs,
    view: Snapshot,
    config: FairShareConfig,
    pods: Mapping[str, Mapping[str, Any]] = _EMPTY,
) -> wire.ExtenderPreemptionResult:
    """``preempt_answer``'s wire answer alone."""
    return preempt_answer(args, view, config, pods).result


def preempt_answer(
    args: wire.ExtenderPreemptionArgs,
    view: Snapshot,
    config: FairShareConfig,
    pods: Mapping[str, Mapping[str, Any]] = _EMPTY,
    req: Reading = None,
) -> PreemptAnswer:
    """The proposed victims fairshare allows, per node (``proposal.allowed_victims``:
    the guarantees, the config's ``preemption`` policy, substitutes, pod groups).

    The app gives the known pods (``pods``: priorities, ages, pod groups); the view the
    fair allocation (when it has none, one over the bound pods, the pending ones and the
    preemptor); the preemptor is read by the view's reader, as filter and prioritize read
    it, and a victim kube-scheduler sent that is not bound by ``request_for``. A node's
    PDB violations are answered as sent (at most one per victim) when its victims are a
    subset of those proposed, else 0. ``note`` says what fairshare changed (for an Event
    on the pod).
    """
    state = view.state
    labels = view.namespace_labels
    known = pods
    pre: PodRequest | None
    try:
        pre = reading(view, args.pod, config, req)
    except resources.DemandError:
        pre = None
    full = {
        str((p.get("metadata") or {}).get("uid", "")): p
        for v in (args.node_name_to_victims or {}).values()
        for p in v.pods
    }
    rule = None
    if pre is not None and pre.tenant is not None:
        rule = victims.fair_rule(state, config, pre, view.queue, view.fair)
    proposed = args.meta_victims()
    allowed = proposal.allowed_victims(
        state,
        config,
        {node: meta.pod_uids for node, meta in proposed.items()},
        preemptor=pre,
        priority=proposal.pod_priority(args.pod),
        rule=rule,
        sent=full,
        known=known,
        read=partial(request_for, state=state, config=config, namespace_labels=labels),
    )
    result: dict[str, wire.MetaVictims] = {}
    for node, kept in allowed.nodes.items():
        meta = proposed[node]
        pdb = meta.num_pdb_violations if set(kept) <= set(meta.pod_uids) else 0
        result[node] = wire.MetaVictims(kept, min(pdb, len(kept)))
    answer = wire.ExtenderPreemptionResult(result)
    if pre is None or not allowed.notes:
        return PreemptAnswer(answer, pre)
    return PreemptAnswer(answer, pre, allowed.note())


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


def bind_plan(args: wire.ExtenderBindingArgs, view: Snapshot) -> BindPlan:
    """The pipeline's plan for the pod on ``args.node`` (``pipeline.fit`` there, then
    ``pipeline.plan_on``), with its annotations and the Binding body.

    The pod is looked up in ``view.pending`` (by UID, else namespace/name). Refused, with
    the reason in ``error``: an unknown pod or node, or a node that cannot take the pod
    now (a device would be oversubscribed). A fractional pod takes the fragmentation
    term's device when the view has a mix, else the fullest device that still holds it,
    and the shared GPU (``ANN_GPU_GROUP``) of the pods already on that device, or a new
    one.
    """
    state, mix = view.state, view.mix
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
    gate: GateDecision | None = None

    def result(self) -> dict[str, Any]:
        """``ExtenderBindingResult`` as JSON for an answer given at once."""
        return wire.ExtenderBindingResult(self.error).encode()


def bind_decision(
    args: wire.ExtenderBindingArgs,
    view: Snapshot,
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
            pending=view.queue,
            fair=view.fair,
            groups=view.groups,
            held=holds.gate_held(view.holds),
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
