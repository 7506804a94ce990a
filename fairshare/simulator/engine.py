"""The simulation loop: admission, the pending queue, and each pod placed by the pipeline.

Simulated time is a number; randomness comes only from a seed. Admission rejects a pod
that would take its tenant over its ``limit``; pending pods are tried in creation order
through ``pipeline.place`` under ``policy``: ``ours`` (terms, gate, ``--pick-in-filter``'s
node choice) or the controls ``bestfit`` and ``fgd`` (Weng et al.; ties by ``tie_rank``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from fairshare import (
    cluster_shares,
    eligibility,
    fairness,
    limits,
    pipeline,
    quantities,
    resources,
    tenancy,
)
from fairshare.config.schema import FairShareConfig
from fairshare.gate import GateDecision
from fairshare.placement import (
    FilterResult,
    PodRequest,
    ScoreContext,
    Scored,
    Scorer,
    WorkloadMix,
    build_scorer,
    candidates,
    fgd_raw,
    score_bestfit,
    score_context,
)
from fairshare.resources import ResourceIndex
from fairshare.simulator.failures import FleetState
from fairshare.state.cluster import LABEL_GPU_PRODUCT, BoundPod

Policy = Literal["ours", "bestfit", "fgd"]
POLICIES: tuple[str, ...] = ("ours", "bestfit", "fgd")


@dataclass
class TenantCounters:
    running: int = 0
    pending: int = 0
    rejected: int = 0
    completed: int = 0
    failed: int = 0


@dataclass
class Outcome:
    """What happened to one submitted pod."""

    uid: str
    status: str  # "pending", "running", "rejected", "failed", "completed"
    node: str | None = None
    reason: str = ""


@dataclass
class Simulation:
    """One cluster, one config, one policy; feed it nodes and pods, then run passes."""

    config: FairShareConfig
    policy: Policy = "ours"
    seed: int = 0
    mix: WorkloadMix | None = None
    state: FleetState = field(init=False)
    scorer: Scorer = field(init=False)
    pods: dict[str, PodRequest] = field(default_factory=dict)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    pending: dict[str, PodRequest] = field(default_factory=dict)  # uid → request, in order
    counters: dict[str, TenantCounters] = field(default_factory=dict)
    admitted: dict[str, list[float]] = field(default_factory=dict)  # running + pending rows
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    last_reason: dict[str, str] = field(default_factory=dict)
    # The controls' tie-break: node row -> rank, lowest rank wins among equal integer
    # scores (None: node order). The reference simulator prefixes every node name with a
    # seeded random permutation index before kube-scheduler takes the smallest name.
    tie_rank: Sequence[int] | None = None
    _fair: dict[str, fairness.FairShare] | None = field(default=None, init=False)
    _ctx: ScoreContext | None = field(default=None, init=False)
    created: dict[str, int] = field(default_factory=dict, init=False)
    """Pod uid -> its place in the queue (creation order; ``requeue`` may move it)."""
    _next_place: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from {', '.join(POLICIES)}")
        self.state = FleetState(ResourceIndex(self.config.resource_names()))
        declared = self.config.capacity_amounts() or {}
        self.state.declare_capacity(cluster_shares.kernel_amounts(self.state, declared))
        self.scorer = build_scorer(self.config.scoring.weights())
        self._mig = self.config.mig_fractions()
        self._limits = {
            t.name: t.limit_amounts() for t in self.config.tenants if t.limit is not None
        }
        self._weights = tenancy.tenant_weights(self.config)
        for name in self._weights:
            self.counters.setdefault(name, TenantCounters())

    # -- inputs ------------------------------------------------------------------

    @property
    def index(self) -> ResourceIndex:
        return self.state.index

    def add_node(
        self,
        name: str,
        allocatable: Mapping[str, Fraction],
        labels: Mapping[str, str],
        *,
        taints: Sequence[eligibility.Taint] = (),
    ) -> None:
        """A node; ``taints`` (key, value, effect) keep pods without a toleration off it."""
        self.state.add_node(name, allocatable, labels=labels, taints=taints)
        self._ctx = None
        self._fair = None  # the fair allocation divides the capacity, which just grew

    def request_for(self, pod: Mapping[str, Any], *, uid: str) -> PodRequest:
        """Turn a pod object into a PodRequest (tenant resolved, demand computed)."""
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace", "default")
        res = tenancy.resolve_tenant(ns, self.namespace_labels.get(ns, {}), self.config)
        demand = resources.pod_demand(pod, mig=self._mig)
        # Counted as the extender and the webhook count it (a GPU-memory request is a share
        # of the largest device until it is placed).
        largest = max((n.device_memory for n in self.state.nodes), default=0) or None
        counted = resources.counted_demand(demand, largest)
        models = resources.gpu_models(meta.get("annotations"))
        spec = pod.get("spec")
        constraints = eligibility.parse_node_constraints(spec if isinstance(spec, Mapping) else {})
        if not models and demand.gpu.count:
            # As the extender reads it (``objects.pod_request``): a GPU pod whose node
            # selector or required affinity pins the GPU product is model-restricted.
            models = constraints.pinned_values(LABEL_GPU_PRODUCT) or models
        return PodRequest(
            uid=uid,
            name=meta.get("name", uid),
            namespace=ns,
            tenant=res.tenant,
            demand=demand,
            row=tuple(self.index.kernel_vector(counted.amounts)),
            gpu_models=models,
            constraints=constraints,
        )

    def submit(self, req: PodRequest) -> Outcome:
        """Admit (or reject) a pod and queue it as pending."""
        t = req.tenant
        if t is not None:
            self.counters.setdefault(t, TenantCounters())
            reason = self._over_limit(req)
            if reason:
                self.counters[t].rejected += 1
                out = Outcome(req.uid, "rejected", reason=reason)
                self.outcomes[req.uid] = out
                return out
            row = self.admitted.setdefault(t, [0.0] * self.index.width)
            for k, v in enumerate(req.row):
                row[k] += v
            self.counters[t].pending += 1
        self.pods[req.uid] = req
        self.pending[req.uid] = req
        self.created[req.uid] = self._next_place
        self._next_place += 1
        self._fair = None
        out = Outcome(req.uid, "pending")
        self.outcomes[req.uid] = out
        return out

    def _over_limit(self, req: PodRequest) -> str:
        """Why ``req`` is refused at admission: its tenant's limit, or an ancestor's
        (counting the ancestor's whole subtree, ``limits.check_limits``), over what the
        tenants were admitted; "" when it fits them all."""
        assert req.tenant is not None
        demand = req.demand
        if demand.gpu.memory is not None and self.index.has(resources.GPU):
            # a GPU-memory request counts as the share its row holds
            gpus = self.index.amounts(req.row)[resources.GPU]
            demand = dataclasses.replace(demand, amounts={**demand.amounts, resources.GPU: gpus})
        width = self.index.width

        def admitted(members: Sequence[str]) -> dict[str, Fraction]:
            row = [0.0] * width
            for member in members:
                for k, v in enumerate(self.admitted.get(member, ())):
                    row[k] += v
            return self.index.amounts(row)

        decision = limits.check_limits(
            self.config, req.tenant, demand, admitted, limits=self._limits.get
        )
        if not decision.insufficient:
            return ""
        item = decision.insufficient[0]
        return (
            f"{item.level} {item.tenant}: {item.resource} "
            f"{item.used + item.requested} would exceed limit {item.limit}"
        )

    # -- fairness ------------------------------------------------------------------

    def capacity(self) -> list[float]:
        return self.state.total_capacity()

    def fair_shares(self) -> dict[str, fairness.FairShare]:
        """Fair allocation over admitted demand (running + pending), cached until it changes."""
        if self._fair is None:
            self._fair = cluster_shares.fair_shares_for(self.state, self.config, self.admitted)
        return self._fair

    def current_shares(self) -> dict[str, float]:
        return cluster_shares.current_shares(self.state, self.config)

    def _gate(self, req: PodRequest) -> GateDecision | None:
        if req.tenant is None or self.policy != "ours":
            return None
        return pipeline.gate(
            self.state,
            config=self.config,
            req=req,
            pending=list(self.pending.values()),
            fair=self.fair_shares(),
        )

    # -- placing -------------------------------------------------------------------

    def _context(self) -> ScoreContext:
        if self._ctx is None:
            self._ctx = score_context(self.state, self.mix)
        return self._ctx

    def _score(self, req: PodRequest, fr: FilterResult) -> Scored:
        """The policy's choice among the fitting rows of ``fr``, scored 1 (the devices
        are the pipeline's device choice, whatever the policy)."""
        ctx = self._context()
        if self.policy == "ours":
            # The node the extender itself would choose (``--pick-in-filter``): scores
            # rounded to ``choice_levels`` (exact for some whole-GPU pods), ties to the
            # first node of one fixed random order (``tie_rank`` here, drawn from the
            # seed; a hash of the node name in the extender).
            rank = self.tie_rank
            pick, scored = pipeline.pick(
                self.state,
                req,
                fr.fits,
                scorer=self.scorer,
                ctx=ctx,
                rank=(lambda i: i) if rank is None else rank.__getitem__,
            )
            return scored if pick is None else Scored({pick: 1.0}, {})
        mask_fits = fr.fits
        mask = candidates(self.state, mask_fits)
        if self.policy == "bestfit":
            out, _ = score_bestfit(self.state, req, mask, ctx)
            ints = {i: int(100 * out[i]) for i in mask_fits}
        else:
            delta, _ = fgd_raw(self.state, req, mask, ctx)
            ints = {i: int(100.0 / (1.0 + math.exp(-delta[i] / 1000.0))) for i in mask_fits}
        # Ties go to the node ranked first by ``tie_rank`` (node order without it): a
        # fixed order for the whole run, as in the reference simulator, whose patched
        # kube-scheduler takes the smallest node name among equal scores, names that
        # carry a seeded random permutation prefix. With a fresh random pick per
        # decision (stock kube-scheduler) FGD measured 89.6 % on openb seed 42 against
        # the paper's 95.2 %: a fixed order makes the integer scores pack (docs/simulator/openb.md).
        top = max(ints.values())
        tied = [i for i in mask_fits if ints[i] == top]
        rank = self.tie_rank
        pick = tied[0] if rank is None else min(tied, key=rank.__getitem__)
        return Scored({pick: 1.0}, {})

    def _choose(self, req: PodRequest, fr: FilterResult) -> int:
        """The row the policy chooses among the fitting rows of ``fr``: the one it
        scored, or the best of several (ties to the smaller node name)."""
        scored = self._score(req, fr)
        if len(scored.scores) == 1:
            return next(iter(scored.scores))
        best = scored.best([n.name for n in self.state.nodes])
        assert best is not None
        return best

    def _device_mix(self) -> WorkloadMix | None:
        """The mix whose fragmentation term proposes a shared pod's device: the run's
        (as the extender's bind takes it); none under ``bestfit``, whose devices are
        best fit."""
        return None if self.policy == "bestfit" else self.mix

    def try_place(self, uid: str) -> Outcome:
        """One scheduling attempt for a pending pod (``pipeline.place``); binds it when
        it can."""
        req = self.pods[uid]
        got = pipeline.place(
            self.state,
            req,
            self.state.eligible_rows(req.constraints),  # None: every node
            judge=self._gate,
            chooser=self._choose,
            mix=self._device_mix(),
        )
        if isinstance(got, pipeline.Waiting):
            self.last_reason[uid] = got.reason
            return self.outcomes[uid]
        return self.bind(uid, got)

    def bind_planned(
        self,
        uid: str,
        node: str,
        row: tuple[float, ...],
        devs: Sequence[tuple[int, float]],
        *,
        mig: tuple[str, int] | None = None,
    ) -> Outcome:
        """Bind a pending pod to ``node`` holding ``row`` and devices ``devs`` (or MIG
        slices ``mig``): the bind of a planned gang member (``fairshare.gangs.Placement``)."""
        choice = pipeline.DeviceChoice(row, tuple(devs), mig)
        i = self.state.node_index[node]
        return self.bind(uid, pipeline.plan(self.state, self.pods[uid], i, choice))

    def bind(self, uid: str, plan: pipeline.Plan) -> Outcome:
        """Bind a pending pod as ``plan`` says: the end of ``try_place`` and of
        ``bind_planned``."""
        req = self.pods[uid]
        self._readmit(req.tenant, plan.row, req.row)
        self.state.bind(
            uid=uid,
            node=plan.node,
            row=plan.row,
            devices=plan.devices,
            tenant=req.tenant,
            name=req.name,
            group=plan.group,
            mig=plan.mig,
        )
        return self._running(uid, plan.node)

    def _readmit(self, tenant: str | None, now: Sequence[float], before: Sequence[float]) -> None:
        """A pod bound with another row than it was admitted with: move the tenant's
        admitted demand by the difference (the fair allocation is then stale)."""
        if tenant is None or tuple(now) == tuple(before):
            return
        admitted = self.admitted[tenant]
        for k, (a, b) in enumerate(zip(now, before, strict=True)):
            admitted[k] += a - b
        self._fair = None

    def _running(self, uid: str, node: str) -> Outcome:
        """A pending pod now bound to ``node``: counted running, its outcome recorded."""
        tenant = self.pods[uid].tenant
        del self.pending[uid]
        if tenant is not None:
            c = self.counters[tenant]
            c.pending -= 1
            c.running += 1
        out = Outcome(uid, "running", node=node)
        self.outcomes[uid] = out
        self.last_reason.pop(uid, None)
        return out

    def fail(self, uid: str) -> None:
        """Give up on a pending pod (trace protocol: a pod that fits nowhere)."""
        req = self.pods[uid]
        del self.pending[uid]
        if req.tenant is not None:
            c = self.counters[req.tenant]
            c.pending -= 1
            c.failed += 1
            row = self.admitted[req.tenant]
            for k, v in enumerate(req.row):
                row[k] -= v
        self._fair = None
        self.outcomes[uid] = Outcome(uid, "failed", reason=self.last_reason.get(uid, ""))

    def complete(self, uid: str) -> None:
        """A running pod ends: free its resources."""
        req = self.pods[uid]
        bound = self.state.unbind(uid)
        held = bound.row if bound is not None else req.row
        if req.tenant is not None:
            c = self.counters[req.tenant]
            c.running -= 1
            c.completed += 1
            row = self.admitted[req.tenant]
            for k, v in enumerate(held):
                row[k] -= v
        self._fair = None
        self.outcomes[uid] = Outcome(uid, "completed")

    def requeue(self, uid: str, *, keep_position: bool, reason: str = "lost") -> BoundPod | None:
        """A running pod is lost (its GPU failed): free what it held and queue it again,
        at its original place in the queue (``keep_position``) or at the back. Returns
        what it held (None when it was not bound)."""
        req = self.pods[uid]
        bound = self.state.unbind(uid)
        if bound is None:
            return None
        # Admitted with the row it was bound with (``_readmit``); pending, it asks for
        # its request's row again.
        self._readmit(req.tenant, req.row, bound.row)
        if req.tenant is not None:
            c = self.counters[req.tenant]
            c.running -= 1
            c.pending += 1
        if keep_position:
            self.pending[uid] = req
            order = self.created
            self.pending = dict(sorted(self.pending.items(), key=lambda kv: order[kv[0]]))
        else:
            self.created[uid] = self._next_place
            self._next_place += 1
            self.pending[uid] = req
        self._fair = None
        self._ctx = None
        out = Outcome(uid, "pending", reason=reason)
        self.outcomes[uid] = out
        return bound

    def schedule_pass(self) -> list[str]:
        """Try every pending pod once, in creation order; returns the uids placed."""
        placed = []
        for uid in list(self.pending):
            if self.try_place(uid).status == "running":
                placed.append(uid)
        return placed

    def run_until_stable(self, *, max_passes: int = 10_000) -> int:
        """Repeat passes until one places nothing; returns the number of passes."""
        for n in range(1, max_passes + 1):
            if not self.schedule_pass():
                return n
        return max_passes

    # -- figures -------------------------------------------------------------------

    def gpu_allocation_ratio(self) -> float:
        g = self.state.gpu_col
        cap = self.capacity()[g]
        if cap <= 0:
            return 0.0
        return (cap - self.state.total_free()[g]) / cap

    def gpus(self) -> float:
        return self.capacity()[self.state.gpu_col] / 1000.0

    def allocated_amounts(self, tenant: str) -> dict[str, str]:
        amounts = self.index.amounts(self.state.usage_of(tenant))
        return {k: _fmt_amount(k, v) for k, v in amounts.items() if v}


def _fmt_amount(name: str, v: Fraction) -> str:
    return quantities.format_quantity(v, quantities.quantity_kind(name))


def requests_pod(
    *,
    name: str,
    namespace: str,
    requests: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A minimal pod object with one container, as the scenario loader builds them."""
    return {
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {"containers": [{"name": "main", "resources": {"requests": dict(requests)}}]},
    }


def summarize_tenants(sim: Simulation) -> dict[str, dict[str, Any]]:
    """Per-tenant figures for the report (shares rounded to 4 places)."""
    shares = sim.current_shares()
    fair = sim.fair_shares()
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(sim.counters):
        c = sim.counters[name]
        out[name] = {
            "running": c.running,
            "pending": c.pending,
            "rejected": c.rejected,
            "failed": c.failed,
            "completed": c.completed,
            "dominantShare": round(shares.get(name, 0.0), 4),
            "fairShare": round(fair[name].share, 4) if name in fair else 0.0,
            "allocated": sim.allocated_amounts(name),
        }
    return out


def jain_over(sim: Simulation, names: Sequence[str]) -> float:
    """Jain's index over each tenant's share ÷ its fair share (tenants with demand)."""
    shares, fair = sim.current_shares(), sim.fair_shares()
    vals = [shares.get(n, 0.0) / fair[n].share for n in names if n in fair and fair[n].share > 0]
    return fairness.jain_index(vals)
