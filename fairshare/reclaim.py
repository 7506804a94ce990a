"""Reclaim: which borrowed pods to evict so that a tenant gets its ``guaranteed`` share back.

Pure and deterministic: no network, no clock (``now`` is a parameter), no globals; ties
are broken by name. Must not import aiohttp, kubernetes_asyncio or prometheus_client.
The controller that acts on a plan is ``extender.reclaimer``.

``plan_reclaim`` looks at the pending queue in order. A pending pod ``p`` of tenant ``t``
that is waiting (``PodRequest.waiting``: no scheduling gate, a scheduler that calls the
extender) is a **beneficiary** when

* ``t`` is under its guarantee for ``p``: ``usage_t + p <= guaranteed_t`` on every
  guaranteed column ``p`` requests (and ``p`` requests at least one of them); in a tree
  of tenants, ``t`` or one of its ancestors is (an ancestor's usage is its subtree's),
  and victims are then taken outside that level's subtree;
* ``p`` fits no node now, and fails only for capacity on some node (``filter_nodes``
  failures that are not ``unresolvable``);
* ``t``'s weighted dominant share after ``p`` stays within its fair share (progressive
  filling over bound + pending demand, ``cluster_shares.fair_shares_for``): reclaim never gives
  a tenant more than its fair share.

Victims are bound pods of other tenants, taken only while their tenant (and, in a tree,
each of its ancestors, counting its subtree) stays at or above its own guarantee on
every guaranteed column the victim uses. Preference order:
the most over-share tenant first (weighted dominant share minus fair share, descending),
then the youngest pod (``created``, newest first), then uid. On each node where ``p``
failed for capacity, victims are released in that order on a copy of the node's free
vector and device ledger until ``filter_nodes`` accepts ``p`` there, then pruned (a
victim whose release is not needed is put back). The node needing the fewest victims
wins (ties: the node whose least preferred victim is the most preferred, then the next;
then node name). This is a greedy minimal set, not a global minimum.

Pod groups (gangs, ``fairshare.gangs.group_of``; ``groups`` maps a bound pod to its group)
are victims as whole units: a distributed job that loses one member is lost, so evicting
one member means evicting every bound member of its group, on whatever node, or none.
A unit is taken only while its tenant stays at or above its guarantee with all its
members gone (the group's guaranteed share is protected as a whole); on the node judged,
its members there free room, and its members elsewhere free room on their own nodes
(counted for later beneficiaries of the round). Within a tenant, lone pods are tried
before groups (then the youngest); the node chosen evicts the fewest pods, then the
fewest units, then the least preferred victim being the most preferred it can be (then
the next). Pods outside a group are units of one, so
without groups the choice is exactly the per-pod one above.

Why it cannot loop: a beneficiary only gains up to its guarantee, and a victim's tenant
never drops below its guarantee, so what one reclaim gave can never be reclaimed back,
and a victim's tenant never becomes a beneficiary through our evictions. Toward fair
share (opt-in), fair shares move with demand, so the bound alone does not hold there:
a pod that got room by reclaim records the tenants whose pods went for it
(``ANN_RECLAIMED_FROM``, ``given``), and while it is there, for up to
``reclaimTakeBackAfter``, reclaim toward fair share takes nothing from its tenant for
them (no take-back). On top of that, ``cooldown``
blocks reclaiming from ``t`` for ``u`` within ``cooldown`` seconds of a reclaim from
``u`` for ``t`` (``last_evictions[(victim, beneficiary)]``).

The hold: the room a plan makes for a pod (``ReclaimPlan.room``) is kept for it
(``RoomHold``, ``holds_made``). The reclaimer writes it on the pod as annotations
(``hold_annotations``); the extender reads them back (``hold_of``, ``holds_in_force``)
and its filter keeps other tenants' pods off that room (``held_off``) until the pod
binds or is deleted or the hold lapses (``HOLD_TIMEOUT``). The property test's simulator
calls the same functions.

One file of about 1,100 lines on purpose: the planner, its ledger and the per-node victim
search are one algorithm that keeps the invariants above together; split, each part would
hold only half of what makes it correct. The hold's and the records' annotations (the
last part) are the part that could move out if it grows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from fairshare import cluster_shares, fairness, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.gate import HeldOff, check_fair_gate, gate_floor, goes_first
from fairshare.placement import PodRequest, choose_devices, filter_nodes
from fairshare.state.cluster import BoundPod, ClusterState

TOL: Final = 1e-6
"""Tolerance on kernel amounts (integral units: milli-GPU, millicores, bytes)."""

REASON_RECLAIMED: Final = "Reclaimed"
"""Event reason on a victim: evicted to give another tenant its guaranteed share."""
REASON_MADE_ROOM: Final = "ReclaimedFor"
"""Event reason on a beneficiary: pods were evicted to make room for it."""
WAIT_COOLDOWN: Final = "ReclaimCooldown"
WAIT_FAIR_SHARE: Final = "ReclaimAboveFairShare"
WAIT_NO_VICTIMS: Final = "ReclaimNoVictims"
WAIT_BUDGET: Final = "ReclaimRateLimited"
WAIT_EVICTING: Final = "ReclaimWaitingForEviction"

Pair = tuple[str, str]
"""(victim tenant, beneficiary tenant)."""


@dataclass(frozen=True)
class Eviction:
    """Evict ``victim_uid`` (of ``victim_tenant`` on ``node``) for the pending pod."""

    victim_uid: str
    victim_name: str
    victim_tenant: str
    node: str
    beneficiary_uid: str
    beneficiary_name: str
    beneficiary_namespace: str
    beneficiary_tenant: str
    toward: str = "guarantee"
    """What the beneficiary is brought up to: "guarantee" or "fair share"."""
    group: str = ""
    """The victim's pod group ("" for a lone pod): all its bound members go together."""
    group_size: int = 1
    """How many members of ``group`` this plan evicts (all that are bound)."""

    @property
    def message(self) -> str:
        """Event text for the victim."""
        return self._message() + self._group_note()

    def _group_note(self) -> str:
        if not self.group:
            return ""
        return (
            f"; with all {self.group_size} bound members of its pod group {self.group} "
            "(a gang that loses one member is lost)"
        )

    def _message(self) -> str:
        if self.toward == "fair share":
            return (
                f"evicted from {self.node} to bring tenant {self.beneficiary_tenant} up to its "
                f"fair share (for pod {self.beneficiary_namespace}/{self.beneficiary_name}); "
                f"tenant {self.victim_tenant} stays at or above its own fair share and guarantee"
            )
        return (
            f"evicted from {self.node} to give tenant {self.beneficiary_tenant} its guaranteed "
            f"share (for pod {self.beneficiary_namespace}/{self.beneficiary_name}); tenant "
            f"{self.victim_tenant} stays at or above its own guarantee"
        )


@dataclass(frozen=True)
class Waiting:
    """A pod that qualifies for reclaim but gets none this round, and why."""

    uid: str
    name: str
    namespace: str
    tenant: str
    reason: str
    detail: str


@dataclass(frozen=True)
class ReclaimPlan:
    """What to evict now, who waits (with a reason), and who is under its guarantee."""

    evictions: tuple[Eviction, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    deficits: tuple[str, ...] = ()
    """Tenants under their guarantee with pending pods (restored when they leave this)."""
    room: Mapping[str, str] | None = None
    """Beneficiary uid -> node freed for it (victims chosen now or already leaving)."""

    @property
    def decisions(self) -> tuple[Pair, ...]:
        """Distinct (victim tenant, beneficiary tenant) pairs, sorted."""
        return tuple(sorted({(e.victim_tenant, e.beneficiary_tenant) for e in self.evictions}))

    def givers(self) -> dict[str, frozenset[str]]:
        """Beneficiary uid -> the tenants whose pods this plan evicts for it (what the
        reclaimer records on the pod: ``ANN_RECLAIMED_FROM``)."""
        out: dict[str, set[str]] = {}
        for e in self.evictions:
            out.setdefault(e.beneficiary_uid, set()).add(e.victim_tenant)
        return {uid: frozenset(tenants) for uid, tenants in out.items()}


# -- the per-node simulation --------------------------------------------------------------


def _node_copy(state: ClusterState, i: int) -> ClusterState:
    """A one-node ``ClusterState`` holding row ``i``'s free vector and device ledger."""
    r, d = state.n_res, state.max_dev
    sim = ClusterState(state.index, max_dev=d)
    info = state.nodes[i]
    sim.nodes.append(info)
    sim.node_index[info.name] = 0
    sim.capacity.extend(state.capacity[i * r : (i + 1) * r])
    sim.free.extend(state.free[i * r : (i + 1) * r])
    sim.dev_free.extend(state.dev_free[i * d : (i + 1) * d])
    sim.healthy.append(state.healthy[i])
    sim.node_model.append(state.node_model[i])
    sim.model_ids = dict(state.model_ids)
    return sim


def _clone(sim: ClusterState) -> ClusterState:
    out = _node_copy(sim, 0)
    return out


def _release(sim: ClusterState, pod: BoundPod) -> None:
    for k, v in enumerate(pod.row):
        sim.free[k] += v
    for dev, milli in pod.devices:
        if 0 <= dev < sim.max_dev:
            sim.dev_free[dev] += milli


def _fits(sim: ClusterState, req: PodRequest) -> bool:
    return bool(filter_nodes(sim, req, rows=(0,), explain=False).fits)


def _reserve(sim: ClusterState, req: PodRequest) -> None:
    """Take ``req``'s place on the one-node copy (so the next beneficiary cannot)."""
    res = filter_nodes(sim, req, rows=(0,), explain=False)
    milli = res.gpu_milli.get(0, 0.0)
    row = req.row_on(sim.gpu_col, milli)
    devices = choose_devices(sim, req, 0, milli=milli) if req.demand.wants_gpu else ()
    for k, v in enumerate(row):
        sim.free[k] -= v
    for dev, m in devices:
        sim.dev_free[dev] -= m


# -- the planner ----------------------------------------------------------------------------


@dataclass
class _Ledger:
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
            self.sims[node] = _node_copy(self.state, self.state.node_index[node])
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


def _dominant(
    state: ClusterState, config: FairShareConfig, tenant: str, row: Sequence[float]
) -> float:
    weights = tenancy.tenant_weights(config)
    return fairness.dominant_shares(
        used={tenant: list(row)},
        capacity=state.total_capacity(),
        res_weights=config.resource_weights(),
        tenant_weights={tenant: weights.get(tenant, 1.0)},
    )[tenant]


def plan_reclaim(
    state: ClusterState,
    *,
    config: FairShareConfig,
    pending: Sequence[PodRequest],
    now: float,
    last_evictions: Mapping[Pair, float],
    cooldown: float,
    max_evictions: int,
    created: Mapping[str, float] | None = None,
    releasing: frozenset[str] = frozenset(),
    protected: frozenset[str] = frozenset(),
    node_selectors: Mapping[str, Mapping[str, str]] | None = None,
    groups: Mapping[str, str] | None = None,
    given: Mapping[str, frozenset[str]] | None = None,
) -> ReclaimPlan:
    """The evictions that give under-guarantee tenants room (see the module docstring).

    ``created``: pod uid -> creation time (newest is evicted first; unknown = oldest).
    ``releasing``: bound pods already being evicted or deleted; their room counts as
    free and they are never chosen again. ``protected``: pods not to choose (e.g. a
    PodDisruptionBudget refused their eviction moments ago). At most ``max_evictions``
    victims are returned; pods that would need more wait with ``WAIT_BUDGET``.
    ``node_selectors``: pod uid -> ``spec.nodeSelector``; such a pod is only considered
    for nodes whose labels match. The pod's own ``constraints`` (node selector, required
    node affinity, taints vs tolerations) limit the nodes too, and a pod that is not
    ``waiting`` (scheduling gates, another scheduler) is never a beneficiary.
    ``groups``: pod uid -> the name of its pod group; a bound member is a victim only
    with all its group's other bound members (those not ``releasing``), or not at all.
    ``given``: pod uid -> the tenants whose pods an earlier plan evicted for it, for
    pods still there, bound or pending, and records still in force (``given_in_force``):
    while such a pod of tenant t holds room from u, reclaim toward fair share takes
    nothing from t for u (no take-back, ``_toward_fair_share``).
    """
    if state.n_nodes == 0 or not pending:
        return ReclaimPlan()
    ages = created or {}
    guaranteed = {
        t.name: cluster_shares.kernel_amounts(state, t.guaranteed_amounts())
        for t in config.all_tenants()
    }
    by_node: dict[str, list[BoundPod]] = {}
    for bound in state.pods.values():
        by_node.setdefault(bound.node, []).append(bound)
    led = _Ledger(state, guaranteed, {}, {}, set(), {}, by_node)
    if groups:
        led.group_of = groups
        led.units = _units(state, groups, releasing)
    if config.is_hierarchical():
        names = [t.name for t in config.all_tenants()]
        led.levels = {n: (n, *(a.name for a in config.ancestors(n))) for n in names}
        led.members = {n: config.subtree(n) for n in names}
    for uid in sorted(releasing):
        pod = state.pods.get(uid)
        if pod is not None:
            _release(led.sim(pod.node), pod)
    candidates = [
        p
        for p in pending
        if p.tenant is not None
        and p.waiting
        and p.uid not in state.pods
        and led.beneficiary_level(p.tenant, p) is not None
    ]
    deficits = tuple(sorted({p.tenant for p in candidates if p.tenant is not None}))
    toward_fair = config.reclaim_to_fair_share or any(
        t.reclaim_to_fair_share for t in config.tenants
    )
    if not candidates and not toward_fair:
        return ReclaimPlan(deficits=deficits)
    fair = cluster_shares.fair_shares_for(state, config, cluster_shares.demand_rows(state, pending))
    shares = cluster_shares.current_shares(state, config)
    over = {u: s - (fair[u].share if u in fair else 0.0) for u, s in shares.items()}
    evictions: list[Eviction] = []
    waiting: list[Waiting] = []
    room: dict[str, str] = {}
    for req in candidates:
        t = req.tenant
        assert t is not None
        level = led.beneficiary_level(t, req)
        if level is None:
            continue  # earlier beneficiaries of t already take it to its guarantee
        wait = _plan_one(
            led,
            req,
            level=level,
            rows=_rows_for(state, req, (node_selectors or {}).get(req.uid)),
            config=config,
            fair=fair,
            over=over,
            ages=ages,
            blocked=_blocked_pairs(t, last_evictions, now=now, cooldown=cooldown),
            releasing=releasing | protected,
            budget=max_evictions - len(evictions),
            evictions=evictions,
            room=room,
        )
        if wait is not None:
            waiting.append(Waiting(req.uid, req.name, req.namespace, t, *wait))
    if not toward_fair:
        return ReclaimPlan(tuple(evictions), tuple(waiting), deficits, room)
    _toward_fair_share(
        led,
        pending,
        config=config,
        fair=fair,
        over=over,
        ages=ages,
        now=now,
        last_evictions=last_evictions,
        cooldown=cooldown,
        skip=releasing | protected,
        budget=max_evictions,
        node_selectors=node_selectors,
        evictions=evictions,
        room=room,
        holders=_holders(state, pending, given or {}),
    )
    return ReclaimPlan(tuple(evictions), tuple(waiting), deficits, room)


def _holders(
    state: ClusterState, pending: Sequence[PodRequest], given: Mapping[str, frozenset[str]]
) -> dict[str, set[str]]:
    """Giver tenant u -> the tenants holding a pod (bound, else pending) that got room
    from u by an earlier plan (``given``); pods no longer there count for nothing."""
    tenant_of = {p.uid: p.tenant for p in pending}
    out: dict[str, set[str]] = {}
    for uid, givers in given.items():
        bound = state.pods.get(uid)
        holder = bound.tenant if bound is not None else tenant_of.get(uid)
        if holder is None:
            continue
        for u in givers:
            if u != holder:
                out.setdefault(u, set()).add(holder)
    return out


def _behind_in_band(
    state: ClusterState,
    config: FairShareConfig,
    tenant: str,
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare],
) -> bool:
    """Whether a tenant that goes before ``tenant`` in the gate's band order (a smaller
    fraction of its own fair share, or an equal one and a smaller name:
    ``gate.goes_first``) has a pod waiting, fitting now or not. The gate counts only
    pods that fit now; room that evictions free can make such a pod fit, and the gate
    would then hold ``tenant``'s pod for it. So reclaim does not evict for ``tenant``
    while one waits (it may evict for that tenant instead). The order is strict, so of
    tenants tied (all at zero, say) one is served."""
    fractions = cluster_shares.fair_fractions(cluster_shares.current_shares(state, config), fair)
    mine = fractions.get(tenant, math.inf)
    waiting = {
        p.tenant
        for p in pending
        if p.waiting and p.tenant is not None and p.tenant != tenant and p.uid not in state.pods
    }
    return any(goes_first(u, fractions.get(u, math.inf), tenant, mine) for u in waiting)


def _toward_fair_share(
    led: _Ledger,
    pending: Sequence[PodRequest],
    *,
    config: FairShareConfig,
    fair: Mapping[str, fairness.FairShare],
    over: Mapping[str, float],
    ages: Mapping[str, float],
    now: float,
    last_evictions: Mapping[Pair, float],
    cooldown: float,
    skip: frozenset[str],
    budget: int,
    node_selectors: Mapping[str, Mapping[str, str]] | None,
    evictions: list[Eviction],
    room: dict[str, str],
    holders: Mapping[str, set[str]],
) -> None:
    """Opt-in reclaim toward fair share (``reclaimToFairShare``), after the guarantees.

    A waiting pod of tenant t that fits no node, when t reclaims to fair share and its
    share after the pod stays within its fair share, gets room from tenants above their
    fair share: victims chosen as for guarantees (most over-share, then youngest), each
    keeping its tenant (and its ancestors outside the beneficiary's) at or above their
    fair shares and guarantees. What one such reclaim gave is never reclaimed back: a
    beneficiary gains up to its fair share, a victim keeps at least its own. A pod that
    gets nothing here waits silently (its tenant may simply be at its fair share). With
    ``yieldBand``, a pod in its tenant's band gets nothing while a lower-share tenant has
    a pod that fits now: the gate would hold it for that pod.
    """
    state = led.state
    weights = tenancy.tenant_weights(config)

    def share_of(tenant: str, row: Sequence[float]) -> float:
        return fairness.dominant_shares(
            used={tenant: list(row)},
            capacity=state.total_capacity(),
            res_weights=config.resource_weights(),
            tenant_weights={tenant: weights.get(tenant, 1.0)},
        )[tenant]

    no_take_back = config.take_back_after_seconds() > 0  # the rule is on
    for req in pending:
        t = req.tenant
        if len(evictions) >= budget:
            return
        if (
            t is None
            or not req.waiting
            or req.uid in state.pods
            or req.uid in room
            or not config.reclaims_to_fair_share(t)
        ):
            continue
        after = led.usage(t)
        for k, v in enumerate(req.row):
            after[k] += v
        mine = fair[t].share if t in fair else 0.0
        if share_of(t, after) > mine * (1 + fairness.EPS) + fairness.EPS:
            continue
        if share_of(t, after) > gate_floor(mine, config.yield_band):
            gate = check_fair_gate(state, config=config, req=req, pending=pending, fair=fair)
            if gate is not None and not gate.allowed:
                continue  # in the yield band, it waits for a tenant further behind
            if _behind_in_band(state, config, t, pending, fair):
                continue  # the room evictions free would go to that tenant first
        rows = _rows_for(state, req, (node_selectors or {}).get(req.uid))
        if filter_nodes(state, req, rows=rows, explain=False).fits:
            continue  # the scheduler can place it now
        allowed = {state.nodes[i].name for i in rows}
        freed = next(
            (n for n in sorted(led.sims) if n in allowed and _fits(led.sims[n], req)), None
        )
        if freed is not None:
            _reserve(led.sims[freed], req)
            led.add(led.gained, t, req.row)
            room[req.uid] = freed
            continue
        blocked = _blocked_pairs(t, last_evictions, now=now, cooldown=cooldown)
        if no_take_back:
            given_now = {e.beneficiary_tenant for e in evictions if e.victim_tenant == t}
            blocked = blocked | holders.get(t, set()) | given_now
        failed = filter_nodes(state, req, rows=rows, explain=True).failed
        best: tuple[_Cost, list[_Unit]] | None = None
        for node in sorted(f.node for f in failed if not f.unresolvable):
            found, _ = _victims_on(
                led,
                req,
                node,
                level=t,
                over=over,
                ages=ages,
                blocked=blocked,
                skip=skip,
                fair_floor=(share_of, fair),
            )
            if found is None:
                continue
            cost = _cost(found, node, over, ages)
            if best is None or cost < best[0]:
                best = (cost, found)
        if best is None or best[0][0] > budget - len(evictions):
            continue
        node, chosen = best[0][-1], best[1]
        _take(led, chosen, req, toward="fair share", evictions=evictions)
        sim = led.sim(node)
        _reserve(sim, req)
        led.add(led.gained, t, req.row)
        room[req.uid] = node


def _blocked_pairs(
    beneficiary: str, last: Mapping[Pair, float], *, now: float, cooldown: float
) -> frozenset[str]:
    """Tenants that reclaimed from ``beneficiary`` within the cool-down: not victims now."""
    return frozenset(b for (v, b), at in last.items() if v == beneficiary and now - at < cooldown)


def selector_rows(state: ClusterState, selector: Mapping[str, str] | None) -> tuple[int, ...]:
    """Rows of the nodes whose labels carry every ``selector`` pair (all without one)."""
    if not selector:
        return tuple(range(state.n_nodes))
    return tuple(
        i
        for i, info in enumerate(state.nodes)
        if all(info.labels.get(k) == v for k, v in selector.items())
    )


def _rows_for(
    state: ClusterState, req: PodRequest, selector: Mapping[str, str] | None
) -> tuple[int, ...]:
    """Rows of the nodes the pod may use: ``selector_rows`` and its node constraints."""
    rows = selector_rows(state, selector)
    eligible = state.eligible_rows(req.constraints)
    if eligible is None:
        return rows
    allowed = set(eligible)
    return tuple(i for i in rows if i in allowed)


def _plan_one(
    led: _Ledger,
    req: PodRequest,
    *,
    level: str,
    rows: Sequence[int],
    config: FairShareConfig,
    fair: Mapping[str, fairness.FairShare],
    over: Mapping[str, float],
    ages: Mapping[str, float],
    blocked: frozenset[str],
    releasing: frozenset[str],
    budget: int,
    evictions: list[Eviction],
    room: dict[str, str],
) -> tuple[str, str] | None:
    """Plan for one beneficiary; returns a (reason, detail) when it must wait."""
    state, t = led.state, req.tenant
    assert t is not None
    if filter_nodes(state, req, rows=rows, explain=False).fits:
        return None  # the scheduler can place it now
    allowed = {state.nodes[i].name for i in rows}
    for name in sorted(led.sims):
        if name in allowed and _fits(led.sims[name], req):
            _reserve(led.sims[name], req)
            led.add(led.gained, t, req.row)
            room[req.uid] = name
            return (WAIT_EVICTING, f"room on {name} is being freed")
    after = led.usage(t)
    for k, v in enumerate(req.row):
        after[k] += v
    mine = fair[t].share if t in fair else 0.0
    share_after = _dominant(state, config, t, after)
    if share_after > mine * (1 + fairness.EPS) + fairness.EPS:
        detail = f"share after {share_after:.3f} would exceed fair share {mine:.3f}"
        return (WAIT_FAIR_SHARE, detail)
    if budget <= 0:
        return (WAIT_BUDGET, "the eviction rate limit is reached for now")
    failed = filter_nodes(state, req, rows=rows, explain=True).failed
    nodes = sorted(f.node for f in failed if not f.unresolvable)
    best: tuple[_Cost, list[_Unit]] | None = None
    cooled = False
    for node in nodes:
        found, hit_cooldown = _victims_on(
            led, req, node, level=level, over=over, ages=ages, blocked=blocked, skip=releasing
        )
        cooled = cooled or hit_cooldown
        if found is None:
            continue
        cost = _cost(found, node, over, ages)
        if best is None or cost < best[0]:
            best = (cost, found)
    if best is None:
        if cooled:
            return (WAIT_COOLDOWN, f"victims are of tenants {', '.join(sorted(blocked))}")
        return (
            WAIT_NO_VICTIMS,
            "no node frees a place without taking a tenant below its guarantee",
        )
    node, chosen = best[0][-1], best[1]
    if best[0][0] > budget:
        return (WAIT_BUDGET, f"needs {best[0][0]} eviction(s), {max(budget, 0)} left now")
    _take(led, chosen, req, toward="guarantee", evictions=evictions)
    sim = led.sim(node)
    _reserve(sim, req)
    led.add(led.gained, t, req.row)
    room[req.uid] = node
    return None


_Key = tuple[float, str, int, float, str]
_Unit = tuple[BoundPod, ...]
_Cost = tuple[int, int, tuple[_Key, ...], str]
"""(pods evicted, units, unit preferences, node): the lowest wins."""


def _key(unit: _Unit, over: Mapping[str, float], ages: Mapping[str, float]) -> _Key:
    """Victim preference: most over-share tenant, then smaller units (a lone pod before
    a group), then youngest (a group: its youngest member), then uid."""
    tenant = unit[0].tenant or ""
    youngest = max(ages.get(p.uid, -math.inf) for p in unit)
    return (-over.get(tenant, 0.0), tenant, len(unit), -youngest, min(p.uid for p in unit))


def _cost(
    units: Sequence[_Unit], node: str, over: Mapping[str, float], ages: Mapping[str, float]
) -> _Cost:
    """Fewest pods evicted, then fewest units (one job lost rather than two), then the
    victims compared from the least preferred up (the node whose worst victim is the most
    over-share tenant's wins: one young pod of that tenant does not make a node whose
    other victims are of a tenant less over-share win; seen on the local control plane,
    a guarantee took three pods of a tenant 3 GPUs over its share instead of four of one
    7 over), then node name. Without groups this is the per-pod order: fewest victims,
    then preference, then node."""
    keys = tuple(sorted((_key(u, over, ages) for u in units), reverse=True))
    return (sum(len(u) for u in units), len(units), keys, node)


def _units(
    state: ClusterState, groups: Mapping[str, str], releasing: frozenset[str]
) -> dict[str, _Unit]:
    """Each grouped bound pod -> its group's bound members (not already leaving), in a
    fixed order (node, uid)."""
    by_group: dict[str, list[BoundPod]] = {}
    for uid, name in groups.items():
        pod = state.pods.get(uid)
        if pod is not None and uid not in releasing:
            by_group.setdefault(name, []).append(pod)
    out: dict[str, _Unit] = {}
    for members in by_group.values():
        unit = tuple(sorted(members, key=lambda p: (p.node, p.uid)))
        for p in unit:
            out[p.uid] = unit
    return out


def _take(
    led: _Ledger, units: Sequence[_Unit], req: PodRequest, *, toward: str,
    evictions: list[Eviction],
) -> None:  # fmt: skip
    """Evict ``units`` for ``req``: each member frees its own node's room in the round."""
    assert req.tenant is not None
    for unit in units:
        for victim in unit:
            assert victim.tenant is not None
            _release(led.sim(victim.node), victim)
            led.add(led.removed, victim.tenant, victim.row)
            led.released.add(victim.uid)
            group = led.group_of.get(victim.uid, "")
            ev = Eviction(
                victim.uid, victim.name, victim.tenant, victim.node, req.uid, req.name,
                req.namespace, req.tenant, toward=toward, group=group,
                group_size=len(unit) if group else 1,
            )  # fmt: skip
            evictions.append(ev)


def _victims_on(
    led: _Ledger,
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
) -> tuple[list[_Unit] | None, bool]:
    """A minimal set of victim units with a member on ``node`` (None if none frees a
    place there); and whether the cool-down ruled out a victim that would otherwise have
    been considered. Victims are outside the subtree of ``level`` (the level under its
    guarantee: the beneficiary's tenant or an ancestor), so a guarantee shared by
    siblings never moves pods among them. A unit is a lone pod or a whole group: its
    members on ``node`` free room here, and all of them count against their tenant's
    guarantee (and fair share)."""
    inside = led.members_of(level)
    pool: list[_Unit] = []
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
    pool.sort(key=lambda u: _key(u, over, ages))
    base = led.sim(node)
    trial = _clone(base)
    chosen: list[_Unit] = []
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
                    _release(trial, m)
            if _fits(trial, req):
                break
    else:
        return None, cooled
    # Prune: put back (latest first) every unit the place does not need.
    for unit in list(reversed(chosen)):
        rest = [u for u in chosen if u is not unit]
        sim = _clone(base)
        for u in rest:
            for m in u:
                if m.node == node:
                    _release(sim, m)
        if _fits(sim, req):
            chosen = rest
    return chosen, cooled


# -- the hold on the room made ----------------------------------------------------------

ANN_HELD_NODE: Final = "fairshare.io/reclaim-node"
"""Annotation on a beneficiary: the node reclaim freed room on for it."""
ANN_HELD_UNTIL: Final = "fairshare.io/reclaim-until"
"""Annotation on a beneficiary: when its hold lapses (Unix seconds, wall clock)."""
ANN_RECLAIMED_FROM: Final = "fairshare.io/reclaimed-from"
"""Annotation on a beneficiary: the tenants whose pods reclaim evicted for it (sorted,
comma-separated); it stays on the pod for its life (no take-back, ``given_in_force``)."""
ANN_RECLAIMED_AT: Final = "fairshare.io/reclaimed-at"
"""Annotation on a beneficiary: when reclaim last evicted pods for it (Unix seconds, wall
clock); the record counts for ``reclaimTakeBackAfter`` from then."""
HOLD_TIMEOUT: Final = 120.0
"""Seconds a hold lasts when its beneficiary neither binds nor goes: long enough for the
victims' termination (30 s by default) and kube-scheduler's retry of the beneficiary
(a victim's deletion requeues it; its backoff is at most 10 s by default), short enough
that room is not kept for a pod that cannot use it."""


@dataclass(frozen=True)
class RoomHold:
    """Room reclaim made on ``node`` for the pending pod ``req``, until ``until``."""

    req: PodRequest
    node: str
    until: float


def hold_annotations(node: str, until: float) -> dict[str, str]:
    """The annotations that carry a hold on ``node`` until ``until`` to the extender."""
    return {ANN_HELD_NODE: node, ANN_HELD_UNTIL: f"{until:.3f}"}


def _unix_seconds(annotations: Mapping[str, object] | None, key: str) -> float | None:
    """An annotation holding Unix seconds (``hold_annotations``, ``given_annotation``),
    or None: missing, not a number, or not finite."""
    value = (annotations or {}).get(key)
    if not isinstance(value, str):
        return None
    try:
        at = float(value)
    except ValueError:
        return None
    return at if math.isfinite(at) else None


def hold_of(req: PodRequest, annotations: Mapping[str, object] | None) -> RoomHold | None:
    """The hold a pending pod's annotations carry (None: none, or unreadable)."""
    node = (annotations or {}).get(ANN_HELD_NODE)
    at = hold_until(annotations)
    if not isinstance(node, str) or not node or at is None:
        return None
    return RoomHold(req, node, at)


def given_of(annotations: Mapping[str, object] | None) -> frozenset[str]:
    """The tenants a pod's ``ANN_RECLAIMED_FROM`` names (empty: none, or unreadable)."""
    value = (annotations or {}).get(ANN_RECLAIMED_FROM)
    if not isinstance(value, str):
        return frozenset()
    return frozenset(t for t in (part.strip() for part in value.split(",")) if t)


def given_in_force(
    annotations: Mapping[str, object] | None, *, now: float, keep: float
) -> frozenset[str]:
    """The tenants a pod's record names while it counts: ``keep`` seconds
    (``reclaimTakeBackAfter``) from its ``ANN_RECLAIMED_AT``, wall clock ``now``. A
    record without a readable time counts for nothing, as does any with ``keep`` 0."""
    givers = given_of(annotations)
    if not givers or keep <= 0:
        return frozenset()
    since = _unix_seconds(annotations, ANN_RECLAIMED_AT)
    return givers if since is not None and now - since < keep else frozenset()


@dataclass(frozen=True)
class GivenRoom:
    """A pod that holds room reclaim gave it: no take-back for ``givers`` until ``until``."""

    pod: str
    """NAMESPACE/NAME."""
    tenant: str
    givers: frozenset[str]
    until: float


def given_rooms(
    pods: Iterable[tuple[str, str | None, Mapping[str, object] | None]], *, now: float, keep: float
) -> list[GivenRoom]:
    """The records in force among ``pods`` (NAMESPACE/NAME, tenant, annotations), for
    ``fairshare explain``: which tenant's pods reclaim takes nothing from, for whom, until
    when (``given_in_force``)."""
    out: list[GivenRoom] = []
    for name, tenant, ann in pods:
        givers = given_in_force(ann, now=now, keep=keep)
        at = _unix_seconds(ann, ANN_RECLAIMED_AT)
        if givers and tenant is not None and at is not None:
            out.append(GivenRoom(name, tenant, givers, at + keep))
    return sorted(out, key=lambda g: (g.tenant, g.pod))


def given_annotation(already: frozenset[str], now: frozenset[str], *, at: float) -> dict[str, str]:
    """The record for a pod that had ``already`` and now also gets room from ``now``, at
    wall time ``at`` (empty when nothing is new: the record and its time stay)."""
    if now <= already:
        return {}
    return {ANN_RECLAIMED_FROM: ",".join(sorted(already | now)), ANN_RECLAIMED_AT: f"{at:.3f}"}


def _bound_on(state: ClusterState, hold: RoomHold) -> bool:
    """Has the hold's pod bound on the node it holds room on (its hold is over)?"""
    bound = state.pods.get(hold.req.uid)
    return bound is not None and bound.node == hold.node


def hold_until(annotations: Mapping[str, object] | None) -> float | None:
    """When a pod's hold lapses (``ANN_HELD_UNTIL``), or None: no hold, or unreadable."""
    return _unix_seconds(annotations, ANN_HELD_UNTIL)


def gate_held(holds: Sequence[RoomHold]) -> HeldOff | None:
    """The holds in force as the gate takes them (``gate.HeldOff``; None: no hold)."""
    if not holds:
        return None
    return lambda state, req, rows: held_off(state, holds, req, rows)


def utc(at: float) -> str:
    """``at`` (Unix seconds) as an RFC 3339 UTC time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def holds_in_force(
    uids: Iterable[str],
    pending: Mapping[str, PodRequest],
    annotations: Callable[[str], Mapping[str, object] | None],
    *,
    now: float,
) -> list[RoomHold]:
    """The holds of the pods ``uids`` that are in force at ``now``: each still pending
    (in ``pending``), its annotations (``annotations(uid)``) carrying a hold that has not
    lapsed. A pod deleted, or bound on its hold's node, is no longer pending, so its hold
    is over; the extender adds the holds of pods bound on another node
    (``ExtenderTracker.room_holds``: ``held_off`` keeps that room for their tenant)."""
    out: list[RoomHold] = []
    for uid in uids:
        req = pending.get(uid)
        hold = hold_of(req, annotations(uid)) if req is not None else None
        if hold is not None and now < hold.until:
            out.append(hold)
    return out


def holds_made(
    plan: ReclaimPlan, pending: Sequence[PodRequest], *, until: float
) -> tuple[RoomHold, ...]:
    """A hold for every pod the plan made room for (``plan.room``), lasting ``until``."""
    rooms = plan.room or {}
    return tuple(RoomHold(p, rooms[p.uid], until) for p in pending if p.uid in rooms)


def held_off(
    state: ClusterState,
    holds: Sequence[RoomHold],
    req: PodRequest,
    rows: Sequence[int],
    *,
    now: float | None = None,
) -> dict[int, str]:
    """Rows of ``rows`` (nodes ``req`` fits now) that holds keep ``req`` off, with the
    reason.

    A hold counts while it has not lapsed (``now < until``; ``now`` None: the caller
    passes only holds in force) and its pod has not bound on its node: a pod that bound
    elsewhere (in room made for another pod of its tenant, say) leaves its room held for
    its tenant until the hold lapses, else other tenants' pods would take the room the
    swap left (seen on the local control plane: two 4-GPU pods of one tenant swapped
    nodes, and the second found its room taken). It binds only pods of other tenants (a
    tenant's own pods sharing the room reclaimed for it is its own business; binding
    them too made a tenant's beneficiaries wait for each other on the local control
    plane while victims were still leaving, until the holds lapsed). As kube-scheduler
    does for a pod nominated on a node, its pod is counted as running there (its devices
    too when it fits; else, its victims still leaving, its request is taken from the free
    vector down to zero at most), and ``req`` must still fit beside it.
    """
    by_node: dict[str, list[RoomHold]] = {}
    for h in holds:
        if (
            (now is None or now < h.until)
            and h.req.uid != req.uid
            and h.req.tenant != req.tenant
            and not _bound_on(state, h)
        ):
            by_node.setdefault(h.node, []).append(h)
    out: dict[int, str] = {}
    if not by_node:
        return out
    for i in rows:
        mine = by_node.get(state.nodes[i].name)
        if not mine:
            continue
        sim = _node_copy(state, i)
        for h in mine:
            if _fits(sim, h.req):
                _reserve(sim, h.req)
            else:
                for k, v in enumerate(h.req.row):
                    sim.free[k] = max(sim.free[k] - v, 0.0)
        if not _fits(sim, req):
            h = mine[0]
            out[i] = (
                f"room on {h.node} is held by reclaim for pod {h.req.namespace}/"
                f"{h.req.name} (tenant {h.req.tenant}) until it binds, is deleted or "
                f"the hold lapses at {utc(h.until)}"
            )
    return out
