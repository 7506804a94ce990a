"""The rules a victim of kube-scheduler's preemption must pass, on one node's victims:
``protect_guaranteed`` (no victim takes its tenant, or an ancestor, below its
``guaranteed`` amounts) and ``fair_share_victims`` (under the ``preemption`` policy, a pod
of the preemptor's own tenant goes when it has lower priority, another tenant's only
while that tenant stays at or above its fair share). ``proposal`` applies them; the
reclaim planner keeps the same floors (``ledger.Ledger``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fairshare import cluster_shares, fairness, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest
from fairshare.state.cluster import ClusterState

EPS = 1e-9


# -- the guarantee veto --------------------------------------------------------------------


@dataclass(frozen=True)
class Victim:
    """A proposed victim: its UID, tenant (None if unknown) and kernel row."""

    uid: str
    tenant: str | None
    row: tuple[float, ...]


def protect_guaranteed(
    victims: Sequence[Victim],
    *,
    usage: Mapping[str, Sequence[float]],
    guaranteed: Mapping[str, Mapping[int, float]],
    preemptor_tenant: str | None,
    preemptor_row: Sequence[float],
    ancestors: Mapping[str, Sequence[str]] | None = None,
) -> tuple[str, ...]:
    """UIDs of the victims that may be evicted on one node.

    Walk the victims in the order kube-scheduler sent them; a victim of tenant t is kept
    when, on every resource column r that the victim holds (``row[r] > 0``) and that t
    guarantees, t's usage after evicting it and the victims of t already kept is still
    at least ``guaranteed[r]``:

        usage_t[r] - Σ kept_t[r] - victim[r] + (preemptor[r] if preemptor is in t)
            >= guaranteed_t[r]

    Otherwise the victim is dropped. The preemptor's own demand counts for its tenant, so
    a tenant may replace its own pods. Victims whose tenant has no guarantee, and pods
    whose tenant cannot be told, are kept: the veto only protects guarantees it can
    prove. Resources that the victim does not hold cannot fall by evicting it, so a
    tenant already under its guarantee on CPU can still lose a GPU-only pod if its GPU
    usage stays at or above the GPU guarantee.

    In a tree of tenants, ``ancestors`` maps a tenant to its parent, grandparent, ...;
    each of them is a level whose guarantee is protected too, with ``usage`` of the level
    being its whole subtree's (the preemptor counts for every level it belongs to).
    """
    up = ancestors or {}
    taken: dict[str, list[float]] = {}
    kept: list[str] = []
    pre_levels = (
        () if preemptor_tenant is None else (preemptor_tenant, *up.get(preemptor_tenant, ()))
    )
    for v in victims:
        if v.tenant is None:
            kept.append(v.uid)
            continue
        levels = [lv for lv in (v.tenant, *up.get(v.tenant, ())) if guaranteed.get(lv)]
        ok = True
        for level in levels:
            floor = guaranteed[level]
            have = usage.get(level, ())
            gone = taken.get(level, [0.0] * len(v.row))
            for col, minimum in floor.items():
                if col >= len(v.row) or v.row[col] <= 0:
                    continue
                after = (have[col] if col < len(have) else 0.0) - gone[col] - v.row[col]
                if level in pre_levels and col < len(preemptor_row):
                    after += preemptor_row[col]
                if after < minimum - EPS * max(1.0, minimum):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            for level in levels:
                gone = taken.setdefault(level, [0.0] * len(v.row))
                for k, x in enumerate(v.row):
                    gone[k] += x
            kept.append(v.uid)
    return tuple(kept)


def guarantees(state: ClusterState, config: FairShareConfig) -> dict[str, dict[int, float]]:
    """Each tenant's ``guaranteed`` amounts as kernel column -> amount (tenants with one)."""
    return {
        t.name: cluster_shares.kernel_amounts(state, t.guaranteed_amounts())
        for t in config.tenants
        if t.guaranteed
    }


def guaranteed_usage(
    state: ClusterState, config: FairShareConfig, guaranteed: Mapping[str, object]
) -> tuple[dict[str, list[float]], dict[str, tuple[str, ...]] | None]:
    """Usage per guaranteed tenant (its subtree's in a tree) and each tenant's ancestors."""
    if not config.is_hierarchical():
        return {t: state.usage_of(t) for t in guaranteed}, None
    usage = {t: cluster_shares.subtree_usage(state, config, t) for t in guaranteed}
    ancestors = {t.name: tuple(a.name for a in config.ancestors(t.name)) for t in config.tenants}
    return usage, ancestors


# -- the fair-share rule --------------------------------------------------------------------


@dataclass(frozen=True)
class Level:
    """One level of a victim's tenant (the tenant itself, then each ancestor): its usage
    (its subtree's), fair share and current weighted dominant share."""

    name: str
    usage: tuple[float, ...]
    fair_share: float
    share: float
    """The level's weighted dominant share now."""


@dataclass(frozen=True)
class FairPreemption:
    """What the fair-share rule needs to know (``fair_share_victims``)."""

    preemptor_tenant: str
    preemptor_levels: tuple[str, ...]
    """The preemptor's tenant and its ancestors."""
    preemptor_over: bool
    """Would the preemptor's tenant (or an ancestor) be above its fair share with the pod?"""
    levels: Mapping[str, tuple[Level, ...]]
    """Per tenant, its levels, nearest first."""
    share_of: Callable[[str, Sequence[float]], float]
    """The weighted dominant share of a level holding the given usage."""
    within: str = "LowerPriority"
    others: str = "AboveFairShare"


@dataclass(frozen=True)
class Judged:
    """The victims fairshare allows on one node, and why others were refused."""

    uids: tuple[str, ...]
    refused: tuple[tuple[str, str], ...] = ()
    """(victim uid, reason) of each proposed victim fairshare did not allow."""


def _same_tenant(rule: FairPreemption, tenant: str | None) -> bool:
    return tenant == rule.preemptor_tenant


def fair_share_victims(
    victims: Sequence[Victim],
    rule: FairPreemption,
    *,
    kept_by_guarantee: Sequence[str],
) -> Judged:
    """Which of ``victims`` (one node's, as kube-scheduler proposed them) may go.

    * A pod of the preemptor's own tenant: when ``within`` is ``LowerPriority`` (the
      default; kube-scheduler proposes only lower-priority pods), else never.
    * A pod of another tenant, when ``others`` is ``AboveFairShare`` (the default): only
      while each level of its tenant that the preemptor's tenant is not inside is above
      its fair share now, stays at or above its guarantee, and does not fall below its
      fair share while the preemptor's tenant rises above its own (all victims of the
      node of that tenant counted together). ``Any``: kube-scheduler's choice stands
      (guarantees still protected); ``Never``: never.
    * ``kept_by_guarantee``: what ``protect_guaranteed`` left; a victim it dropped stays
      refused.
    """
    allowed_by_guarantee = set(kept_by_guarantee)
    kept: list[str] = []
    refused: list[tuple[str, str]] = []
    taken: dict[str, list[float]] = {}
    for v in victims:
        if v.uid not in allowed_by_guarantee:
            refused.append((v.uid, f"tenant {v.tenant} would fall below its guarantee"))
            continue
        if v.tenant is None:
            kept.append(v.uid)  # a pod fairshare cannot place in a tenant: not judged
            continue
        if _same_tenant(rule, v.tenant):
            if rule.within == "Never":
                refused.append((v.uid, "preemption within a tenant is off (withinTenant: Never)"))
            else:
                kept.append(v.uid)
            continue
        if rule.others == "Any":
            kept.append(v.uid)
            continue
        if rule.others == "Never":
            refused.append((v.uid, "preemption across tenants is off (otherTenants: Never)"))
            continue
        why = _refuse_other(v, rule, taken)
        if why:
            refused.append((v.uid, why))
            continue
        for level in rule.levels.get(v.tenant, ()):
            gone = taken.setdefault(level.name, [0.0] * len(v.row))
            for k, x in enumerate(v.row):
                gone[k] += x
        kept.append(v.uid)
    return Judged(tuple(kept), tuple(refused))


def _refuse_other(v: Victim, rule: FairPreemption, taken: Mapping[str, Sequence[float]]) -> str:
    """Why ``v`` (of another tenant) may not go, or "" (see ``fair_share_victims``)."""
    shared = set(rule.preemptor_levels)
    for level in rule.levels.get(v.tenant or "", ()):
        if level.name in shared:
            break  # from here up the pod only moves inside the level
        if level.share <= level.fair_share * (1 + EPS) + EPS:
            return (
                f"tenant {level.name} is not above its fair share "
                f"({level.share:.2f} <= {level.fair_share:.2f})"
            )
        gone = taken.get(level.name, ())
        after = [
            u - (gone[k] if k < len(gone) else 0.0) - (v.row[k] if k < len(v.row) else 0.0)
            for k, u in enumerate(level.usage)
        ]
        share_after = rule.share_of(level.name, after)
        if share_after < level.fair_share * (1 - EPS) - EPS and rule.preemptor_over:
            return (
                f"tenant {level.name} would fall below its fair share "
                f"({share_after:.2f} < {level.fair_share:.2f}) while tenant "
                f"{rule.preemptor_tenant} rises above its own"
            )
    return ""


def fair_rule(
    state: ClusterState,
    config: FairShareConfig,
    pre: PodRequest,
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None,
) -> FairPreemption:
    """The figures ``fair_share_victims`` judges by: every tenant's levels
    (usage over its subtree, fair share, share now), and whether the preemptor's tenant
    (or an ancestor) would be above its fair share with the pod."""
    assert pre.tenant is not None
    policy = config.preemption
    if fair is None:
        queue = [p for p in pending if p.uid != pre.uid] + [pre]
        rows = cluster_shares.demand_rows(state, queue)
        fair = cluster_shares.fair_shares_for(state, config, rows)
    weights = tenancy.tenant_weights(config)

    def share_of(level: str, used: Sequence[float]) -> float:
        return cluster_shares.dominant_share(state, config, level, used, weights)

    def chain(tenant: str) -> tuple[str, ...]:
        return (tenant, *(a.name for a in config.ancestors(tenant)))

    tree = config.is_hierarchical()
    names = set(state.tenant_usage) | {t.name for t in config.tenants}
    levels: dict[str, tuple[Level, ...]] = {}
    for tenant in sorted(names):
        out = []
        for level in chain(tenant):
            used = (
                cluster_shares.subtree_usage(state, config, level)
                if tree
                else state.usage_of(level)
            )
            share = fair[level].share if level in fair else 0.0
            out.append(Level(level, tuple(used), share, share_of(level, used)))
        levels[tenant] = tuple(out)
    over = False
    for level in chain(pre.tenant):
        used = cluster_shares.subtree_usage(state, config, level) if tree else state.usage_of(level)
        after = [u + (pre.row[k] if k < len(pre.row) else 0.0) for k, u in enumerate(used)]
        floor = fair[level].share if level in fair else 0.0
        if share_of(level, after) > floor * (1 + fairness.EPS) + fairness.EPS:
            over = True
    return FairPreemption(
        preemptor_tenant=pre.tenant,
        preemptor_levels=chain(pre.tenant),
        preemptor_over=over,
        levels=levels,
        share_of=share_of,
        within=policy.within_tenant,
        others=policy.other_tenants,
    )
