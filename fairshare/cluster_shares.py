"""The fair-share figures of a ``ClusterState``: what a tenant and its subtree hold, a
tenant's weighted dominant share now or if it held a given row, the fair allocation over
bound plus pending demand, and config amounts in kernel units. The gate, reclaim, the
extender's verbs, the views and the simulator all read shares through these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

from fairshare import fairness, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.podrequest import PodRequest
from fairshare.resources import to_kernel_units
from fairshare.state.cluster import ClusterState


def subtree_usage(state: ClusterState, config: FairShareConfig, tenant: str) -> list[float]:
    """What the bound pods of ``tenant`` and of every tenant below it hold (kernel units)."""
    row = state.usage_of(tenant)
    for member in config.subtree(tenant)[1:]:
        for k, v in enumerate(state.usage_of(member)):
            row[k] += v
    return row


def usage_after(state: ClusterState, tenant: str, row: Sequence[float]) -> list[float]:
    """What ``tenant`` holds once ``row`` is added (a new list)."""
    after = state.usage_of(tenant)
    for k, v in enumerate(row):
        after[k] += v
    return after


def dominant_share(
    state: ClusterState,
    config: FairShareConfig,
    tenant: str,
    used: Sequence[float],
    weights: Mapping[str, float] | None = None,
) -> float:
    """``tenant``'s weighted dominant share if it held ``used`` (kernel units), against
    the cluster's capacity and the config's resource weights: the one place a single
    tenant's share is measured (with ``usage_after`` for its share after a pod; a
    tenant missing from the weights weighs 1). ``weights``:
    ``tenancy.tenant_weights(config)``, passed when the caller has them."""
    return fairness.dominant_shares(
        used={tenant: list(used)},
        capacity=state.total_capacity(),
        res_weights=config.resource_weights(),
        tenant_weights=tenancy.tenant_weights(config) if weights is None else weights,
    )[tenant]


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


def fair_fractions(
    shares: Mapping[str, float], fair: Mapping[str, fairness.FairShare]
) -> dict[str, float]:
    """Each tenant's share as a fraction of its own fair share (inf without one): the
    order of tenants in the yield band."""
    return {
        u: s / fair[u].share if u in fair and fair[u].share > 0 else math.inf
        for u, s in shares.items()
    }


def kernel_amounts(state: ClusterState, amounts: Mapping[str, Fraction]) -> dict[int, float]:
    """Per-column amounts (guaranteed, limit) in kernel units; unknown resources dropped."""
    idx = state.index
    return {
        idx.column(name): to_kernel_units(name, amount)
        for name, amount in amounts.items()
        if idx.has(name)
    }


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
