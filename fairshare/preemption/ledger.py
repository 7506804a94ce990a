"""The reclaim planner's working figures and its search for victims on one node.
``Ledger`` holds one planning round (usage gained and lost, pods chosen, one-node copies,
the tenant tree, the pod groups); ``victims_on`` finds a minimal set of victim units (a
pod, or a pod group whole) whose eviction makes room on one node, keeping every victim's
tenant at or above its guarantee (and its fair share, toward fair share); ``node_cost``
ranks the nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from fairshare import fairness
from fairshare.placement import PodRequest
from fairshare.preemption import nodesim
from fairshare.state.cluster import BoundPod, ClusterState

TOL: Final = 1e-6
"""Tolerance on kernel amounts (integral units: milli-GPU, millicores, bytes)."""

Unit = tuple[BoundPod, ...]
"""What one eviction decision takes: a lone pod, or every bound member of its group."""
Key = tuple[float, str, int, float, str]
"""A unit's preference (``preference``): the lowest goes first."""
Cost = tuple[int, int, tuple[Key, ...], str]
"""(pods evicted, units, unit preferences, node): the lowest wins."""


@dataclass
class Ledger:
    """Working figures of one planning round."""

    state: ClusterState
    guaranteed: dict[str, dict[int, float]]
    removed: dict[str, list[float]]
    gained: dict[str, list[float]]
    released: set[str]
    sims: dict[str, ClusterState]
    by_node: dict[str, list[BoundPod]]
    levels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Tree of tenants: tenant -> (tenant, parent, ..., top); absent = (tenant,)."""
    members: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Tree of tenants: tenant -> its subtree (itself first); absent = (tenant,)."""
    units: Mapping[str, tuple[BoundPod, ...]] = field(default_factory=dict)
    """A grouped bound pod -> every bound member of its group not already leaving."""
    group_of: Mapping[str, str] = field(default_factory=dict)
    """A grouped bound pod -> its group's name."""

    def unit_of(self, pod: BoundPod) -> tuple[BoundPod, ...]:
        """What evicting ``pod`` evicts: its whole group, or the pod alone."""
        return self.units.get(pod.uid, (pod,))

    def levels_of(self, tenant: str) -> tuple[str, ...]:
        return self.levels.get(tenant, (tenant,))

    def members_of(self, tenant: str) -> tuple[str, ...]:
        return self.members.get(tenant, (tenant,))

    def level_usage(self, level: str) -> list[float]:
        """What ``level``'s whole subtree holds, with this round's gains and evictions."""
        used = self.usage(level)
        for member in self.members_of(level)[1:]:
            for k, v in enumerate(self.usage(member)):
                used[k] += v
        return used

    def beneficiary_level(self, tenant: str, req: PodRequest) -> str | None:
        """The nearest level (the tenant, then its ancestors) under its guarantee for
        ``req``, or None."""
        for level in self.levels_of(tenant):
            if self.under_guarantee(level, req, base=self.level_usage(level)):
                return level
        return None

    def usage(self, tenant: str) -> list[float]:
        used = self.state.usage_of(tenant)
        for extra, sign in ((self.gained.get(tenant), 1.0), (self.removed.get(tenant), -1.0)):
            for k, v in enumerate(extra or ()):
                used[k] += sign * v
        return used

    def sim(self, node: str) -> ClusterState:
        if node not in self.sims:
            self.sims[node] = nodesim.node_copy(self.state, self.state.node_index[node])
        return self.sims[node]

    def under_guarantee(self, tenant: str, req: PodRequest, *, base: Sequence[float]) -> bool:
        g = self.guaranteed.get(tenant, {})
        asked = [c for c in g if req.row[c] > 0]
        return bool(asked) and all(base[c] + req.row[c] <= g[c] + TOL for c in asked)

    def keeps_guarantee(
        self, pod: BoundPod, extra: Sequence[BoundPod], *, gain: PodRequest | None = None
    ) -> bool:
        """Evicting ``pod`` (after ``extra``) keeps its tenant and every ancestor of it at
        or above their guarantees (an ancestor's counts its whole subtree, including the
        pod ``gain`` the eviction is for when that pod's tenant is in it)."""
        assert pod.tenant is not None
        for level in self.levels_of(pod.tenant):
            inside = self.members_of(level)
            used = self.level_usage(level)
            if gain is not None and gain.tenant in inside:
                used = [u + v for u, v in zip(used, gain.row, strict=True)]
            for other in extra:
                if other.tenant in inside:
                    used = [u - v for u, v in zip(used, other.row, strict=True)]
            g = self.guaranteed.get(level, {})
            if not all(used[c] - pod.row[c] >= g[c] - TOL for c in g if pod.row[c] > 0):
                return False
        return True

    def keeps_fair_share(
        self,
        pod: BoundPod,
        extra: Sequence[BoundPod],
        *,
        beneficiary: str,
        share_of: Callable[[str, Sequence[float]], float],
        fair: Mapping[str, fairness.FairShare],
    ) -> bool:
        """Evicting ``pod`` (after ``extra``) keeps its tenant and each of its ancestors
        that is not also the beneficiary's at or above their fair shares."""
        assert pod.tenant is not None
        shared = set(self.levels_of(beneficiary))
        for level in self.levels_of(pod.tenant):
            if level in shared:
                break  # from here up the transfer stays inside the level
            inside = self.members_of(level)
            used = self.level_usage(level)
            for other in [*extra, pod]:
                if other.tenant in inside:
                    used = [u - v for u, v in zip(used, other.row, strict=True)]
            floor = fair[level].share if level in fair else 0.0
            if share_of(level, used) < floor * (1 - fairness.EPS) - fairness.EPS:
                return False
        return True

    def add(self, table: dict[str, list[float]], tenant: str, row: Sequence[float]) -> None:
        acc = table.setdefault(tenant, [0.0] * self.state.n_res)
        for k, v in enumerate(row):
            acc[k] += v


def preference(unit: Unit, over: Mapping[str, float], ages: Mapping[str, float]) -> Key:
    """Victim preference: most over-share tenant, then smaller units (a lone pod before
    a group), then youngest (a group: its youngest member), then uid."""
    tenant = unit[0].tenant or ""
    youngest = max(ages.get(p.uid, -math.inf) for p in unit)
    return (-over.get(tenant, 0.0), tenant, len(unit), -youngest, min(p.uid for p in unit))


def node_cost(
    units: Sequence[Unit], node: str, over: Mapping[str, float], ages: Mapping[str, float]
) -> Cost:
    """Fewest pods evicted, then fewest units (one job lost rather than two), then the
    victims compared from the least preferred up (the node whose worst victim is the most
    over-share tenant's wins: one young pod of that tenant does not make a node whose
    other victims are of a tenant less over-share win), then node name. Without groups
    this is the per-pod order: fewest victims, then preference, then node."""
    keys = tuple(sorted((preference(u, over, ages) for u in units), reverse=True))
    return (sum(len(u) for u in units), len(units), keys, node)


def group_units(
    state: ClusterState, groups: Mapping[str, str], releasing: frozenset[str]
) -> dict[str, Unit]:
    """Each grouped bound pod -> its group's bound members (not already leaving), in a
    fixed order (node, uid)."""
    by_group: dict[str, list[BoundPod]] = {}
    for uid, name in groups.items():
        pod = state.pods.get(uid)
        if pod is not None and uid not in releasing:
            by_group.setdefault(name, []).append(pod)
    out: dict[str, Unit] = {}
    for members in by_group.values():
        unit = tuple(sorted(members, key=lambda p: (p.node, p.uid)))
        for p in unit:
            out[p.uid] = unit
    return out


def victims_on(
    led: Ledger,
    req: PodRequest,
    node: str,
    *,
    level: str,
    over: Mapping[str, float],
    ages: Mapping[str, float],
    blocked: frozenset[str],
    skip: frozenset[str],
    fair_floor: tuple[Callable[[str, Sequence[float]], float], Mapping[str, fairness.FairShare]]
    | None = None,
) -> tuple[list[Unit] | None, bool]:
    """A minimal set of victim units with a member on ``node`` (None if none frees a
    place there); and whether the cool-down ruled out a victim that would otherwise have
    been considered. Victims are outside the subtree of ``level`` (the level under its
    guarantee: the beneficiary's tenant or an ancestor), so a guarantee shared by
    siblings never moves pods among them. A unit is a lone pod or a whole group: its
    members on ``node`` free room here, and all of them count against their tenant's
    guarantee (and fair share)."""
    inside = led.members_of(level)
    pool: list[Unit] = []
    seen: set[str] = set()
    cooled = False
    for pod in led.by_node.get(node, ()):
        if pod.tenant is None or pod.tenant in inside:
            continue
        if pod.uid in skip or pod.uid in led.released:
            continue
        if pod.tenant in blocked:
            cooled = True
            continue
        unit = led.unit_of(pod)
        if unit[0].uid in seen:
            continue
        seen.add(unit[0].uid)
        if any(
            m.tenant is None or m.tenant in inside or m.uid in skip or m.uid in led.released
            for m in unit
        ):
            continue  # a member is protected (or not a victim): the group stays whole
        if any(m.tenant in blocked for m in unit):
            cooled = True
            continue
        pool.append(unit)
    pool.sort(key=lambda u: preference(u, over, ages))
    base = led.sim(node)
    trial = nodesim.clone(base)
    chosen: list[Unit] = []
    gone: list[BoundPod] = []
    for unit in pool:
        after = list(gone)
        for m in unit:
            if not led.keeps_guarantee(m, after, gain=req):
                break
            if fair_floor is not None and not led.keeps_fair_share(
                m, after, beneficiary=req.tenant or "", share_of=fair_floor[0], fair=fair_floor[1]
            ):
                break
            after.append(m)
        else:
            chosen.append(unit)
            gone = after
            for m in unit:
                if m.node == node:
                    nodesim.release(trial, m)
            if nodesim.fits(trial, req):
                break
    else:
        return None, cooled
    # Prune: put back (latest first) every unit the place does not need.
    for unit in list(reversed(chosen)):
        rest = [u for u in chosen if u is not unit]
        sim = nodesim.clone(base)
        for u in rest:
            for m in u:
                if m.node == node:
                    nodesim.release(sim, m)
        if nodesim.fits(sim, req):
            chosen = rest
    return chosen, cooled
