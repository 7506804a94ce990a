"""The fair-share gate over a ClusterState: one implementation for extender and simulator.

Pure: no network, no clock. Must not import aiohttp, kubernetes_asyncio or
prometheus_client.

``check_fair_gate`` computes, for a pod of tenant t:

* every tenant's current weighted dominant share (from the pods bound in the state);
* t's share after the pod;
* the fair allocation by progressive filling over demand = bound + pending pods
  (``fairness.fair_allocation``), unless the caller passes one it has cached;
* ``fairness.check_gate`` against the tenants with a lower (or equal, smaller-named)
  share that have a pending pod fitting some node now.

A pod that keeps its tenant within its fair share is never gated (returns None).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

from fairshare import fairness, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest, filter_nodes
from fairshare.resources import to_kernel_units
from fairshare.state.cluster import ClusterState


def subtree_usage(state: ClusterState, config: FairShareConfig, tenant: str) -> list[float]:
    """What the bound pods of ``tenant`` and of every tenant below it hold (kernel units)."""
    row = state.usage_of(tenant)
    for member in config.subtree(tenant)[1:]:
        for k, v in enumerate(state.usage_of(member)):
            row[k] += v
    return row


def current_shares(state: ClusterState, config: FairShareConfig) -> dict[str, float]:
    """Weighted dominant share of every configured or active tenant (bound pods only).

    In a tree of tenants, a tenant with children holds what its subtree holds."""
    weights = tenancy.tenant_weights(config)
    names = sorted(set(weights) | set(state.tenant_usage))
    tree = config.is_hierarchical()
    return fairness.dominant_shares(
        used={n: subtree_usage(state, config, n) if tree else state.usage_of(n) for n in names},
        capacity=state.total_capacity(),
        res_weights=config.resource_weights(),
        tenant_weights=weights,
    )


def kernel_amounts(state: ClusterState, amounts: Mapping[str, Fraction]) -> dict[int, float]:
    """Per-column amounts (guaranteed, limit) in kernel units; unknown resources dropped."""
    idx = state.index
    return {
        idx.column(name): to_kernel_units(name, amount)
        for name, amount in amounts.items()
        if idx.has(name)
    }


def fair_shares_for(
    state: ClusterState,
    config: FairShareConfig,
    admitted: Mapping[str, Sequence[float]],
) -> dict[str, fairness.FairShare]:
    """Fair allocation for the given per-tenant demand rows (bound + pending)."""
    demands = []
    width = state.n_res
    for t in config.tenants:
        row = admitted.get(t.name, [0.0] * width)
        g = kernel_amounts(state, t.guaranteed_amounts())
        lim = kernel_amounts(state, t.limit_amounts() or {})
        demands.append(fairness.TenantDemand(t.name, t.weight, tuple(row), g, lim, t.parent))
    for name in sorted(set(admitted) - {t.name for t in config.tenants}):
        demands.append(fairness.TenantDemand(name, 1.0, tuple(admitted[name]), {}, {}))
    return fairness.fair_allocation(
        demands, capacity=state.total_capacity(), res_weights=config.resource_weights()
    )


def demand_rows(state: ClusterState, queue: Iterable[PodRequest]) -> dict[str, list[float]]:
    """Per-tenant demand: what bound pods hold plus the pending ``queue``."""
    width = state.n_res
    admitted: dict[str, list[float]] = {t: list(u) for t, u in state.tenant_usage.items()}
    for p in queue:
        if p.tenant is not None and p.uid not in state.pods:
            row = admitted.setdefault(p.tenant, [0.0] * width)
            for k, v in enumerate(p.row):
                row[k] += v
    return admitted


ShapeKey = tuple[object, ...]
"""What decides whether a pending pod fits now: kernel row, GPU demand (count, share or
memory), allowed GPU models and node constraints. Two pods with one key fit alike."""


def shape_key(p: PodRequest) -> ShapeKey:
    return (p.row, p.demand.gpu, p.gpu_models, p.constraints)


def pod_fits_somewhere(state: ClusterState, p: PodRequest) -> bool:
    """Does some node pass ``p``'s node constraints and fit it now?"""
    rows = state.eligible_rows(p.constraints)
    if rows is not None and not rows:
        return False
    return bool(filter_nodes(state, p, rows=rows, explain=False).fits)


def has_fitting_pending(
    state: ClusterState,
    tenant: str,
    queue: Iterable[PodRequest],
    *,
    memo: dict[ShapeKey, bool] | None = None,
) -> bool:
    """Does ``tenant`` have a pod waiting that could run on some node now?

    A pod counts when it waits (no scheduling gate, and a scheduler that calls the
    extender: ``PodRequest.waiting``) and some node passes both its node constraints
    (node selector, required node affinity, taints vs tolerations: ``eligibility``) and
    the fit (resources, GPU devices, GPU health and model: ``filter_nodes``). Every
    distinct shape (``shape_key``) of the tenant's waiting pods is probed at most once,
    in queue order, until one fits: the answer per shape goes in ``memo``, which
    ``check_fair_gate`` keeps per state version (``ClusterState.memo``), across tenants
    and decisions; a shape that fits nowhere is also remembered across binds (they only
    take room) until a node changes or room is given back (``room_version``).
    """
    known = {} if memo is None else memo
    no_fit = state.memo("gating.shape_fits_nowhere", growing_only=True)
    for p in queue:
        if p.tenant != tenant or not p.waiting or p.uid in state.pods:
            continue
        key = shape_key(p)
        if key in no_fit:
            continue
        fits = known.get(key)
        if fits is None:
            fits = known[key] = pod_fits_somewhere(state, p)
            if not fits:
                no_fit[key] = True
        if fits:
            return True
    return False


def check_fair_gate(
    state: ClusterState,
    *,
    config: FairShareConfig,
    req: PodRequest,
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None = None,
) -> fairness.GateDecision | None:
    """The gate's decision for ``req``; None when it does not apply.

    ``pending`` is every pod waiting to be placed (``req`` is counted once whether or
    not it is listed). ``fair`` may be passed when the caller caches the allocation.
    """
    t = req.tenant
    if t is None:
        return None
    weights = tenancy.tenant_weights(config)
    after = state.usage_of(t)
    for k, v in enumerate(req.row):
        after[k] += v
    share_after = fairness.dominant_shares(
        used={t: after},
        capacity=state.total_capacity(),
        res_weights=config.resource_weights(),
        tenant_weights=weights,
    )[t]
    queue = list(pending)
    if all(p.uid != req.uid for p in queue):
        queue.append(req)
    if fair is None:
        fair = fair_shares_for(state, config, demand_rows(state, queue))
    mine_fair = fair.get(t)
    fair_share = mine_fair.share if mine_fair else 0.0
    if share_after <= fair_share * (1 + fairness.EPS) + fairness.EPS:
        return None
    shares = current_shares(state, config)
    mine = shares.get(t, 0.0)
    memo: dict[ShapeKey, bool] = state.memo("gating.shape_fits")  # until the state changes
    contenders = [
        fairness.Contender(
            u, fairness.CurrentShare(s), has_fitting_pending(state, u, queue, memo=memo)
        )
        for u, s in sorted(shares.items())
        if u != t and s < mine + fairness.EPS
    ]
    return fairness.check_gate(
        tenant=t,
        current_share=fairness.CurrentShare(mine),
        share_after=fairness.ShareAfter(share_after),
        fair_share=fair_share,
        contenders=contenders,
    )
