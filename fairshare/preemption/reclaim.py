"""Reclaim: which borrowed pods to evict so that a tenant gets its ``guaranteed`` share back.

Deterministic: ``now`` is a parameter, ties are broken by name. ``plan_reclaim`` walks
the pending queue in order. A waiting pod ``p`` of tenant ``t`` is a **beneficiary** when
``usage_t + p <= guaranteed_t`` on every guaranteed column ``p`` requests (in a tree, for
``t`` or an ancestor, and victims then come from outside that subtree), ``p`` fits no
node now only for capacity, and ``t``'s share after ``p`` stays within its fair share.

**Victims** are bound pods of other tenants, taken only while their tenant (and each
ancestor) stays at or above its own guarantee on every guaranteed column the victim
uses: the most over-share tenant first, then the youngest pod, then uid. On each node
where ``p`` failed for capacity, victims are released in that order on a copy of the
node until ``p`` fits, then pruned; the node needing the fewest wins (a greedy minimal
set, not a global minimum). A pod group is one unit, evicted whole or not at all.

It cannot loop: a beneficiary gains only up to its guarantee, and a victim's tenant never
drops below its own. Toward fair share (opt-in) fair shares move with demand, so a pod
that got room records the tenants whose pods went for it, and reclaim takes nothing from
its tenant for them for ``reclaimTakeBackAfter`` (``holds``); ``cooldown`` blocks
reclaiming from ``t`` for ``u`` soon after a reclaim from ``u`` for ``t``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from fairshare import cluster_shares, fairness, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.gate import check_fair_gate, gate_floor, goes_first
from fairshare.placement import PodRequest, filter_nodes
from fairshare.preemption import nodesim
from fairshare.preemption.ledger import Cost, Ledger, Unit, group_units, node_cost, victims_on
from fairshare.state.cluster import BoundPod, ClusterState

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
        reclaimer records on the pod: ``holds.ANN_RECLAIMED_FROM``)."""
        out: dict[str, set[str]] = {}
        for e in self.evictions:
            out.setdefault(e.beneficiary_uid, set()).add(e.victim_tenant)
        return {uid: frozenset(tenants) for uid, tenants in out.items()}


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
    pods still there, bound or pending, and records still in force
    (``holds.given_in_force``): while such a pod of tenant t holds room from u, reclaim
    toward fair share takes nothing from t for u (no take-back, ``_toward_fair_share``).
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
    led = Ledger(state, guaranteed, {}, {}, set(), {}, by_node)
    if groups:
        led.group_of = groups
        led.units = group_units(state, groups, releasing)
    if config.is_hierarchical():
        names = [t.name for t in config.all_tenants()]
        led.levels = {n: (n, *(a.name for a in config.ancestors(n))) for n in names}
        led.members = {n: config.subtree(n) for n in names}
    for uid in sorted(releasing):
        pod = state.pods.get(uid)
        if pod is not None:
            nodesim.release(led.sim(pod.node), pod)
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
    ``goes_first``) has a pod waiting, fitting now or not. The gate counts only
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
    led: Ledger,
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
        return cluster_shares.dominant_share(state, config, tenant, row, weights)

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
            (n for n in sorted(led.sims) if n in allowed and nodesim.fits(led.sims[n], req)), None
        )
        if freed is not None:
            nodesim.reserve(led.sims[freed], req)
            led.add(led.gained, t, req.row)
            room[req.uid] = freed
            continue
        blocked = _blocked_pairs(t, last_evictions, now=now, cooldown=cooldown)
        if no_take_back:
            given_now = {e.beneficiary_tenant for e in evictions if e.victim_tenant == t}
            blocked = blocked | holders.get(t, set()) | given_now
        failed = filter_nodes(state, req, rows=rows, explain=True).failed
        best: tuple[Cost, list[Unit]] | None = None
        for node in sorted(f.node for f in failed if not f.unresolvable):
            found, _ = victims_on(
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
            cost = node_cost(found, node, over, ages)
            if best is None or cost < best[0]:
                best = (cost, found)
        if best is None or best[0][0] > budget - len(evictions):
            continue
        node, chosen = best[0][-1], best[1]
        _take(led, chosen, req, toward="fair share", evictions=evictions)
        sim = led.sim(node)
        nodesim.reserve(sim, req)
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
    led: Ledger,
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
        if name in allowed and nodesim.fits(led.sims[name], req):
            nodesim.reserve(led.sims[name], req)
            led.add(led.gained, t, req.row)
            room[req.uid] = name
            return (WAIT_EVICTING, f"room on {name} is being freed")
    after = led.usage(t)
    for k, v in enumerate(req.row):
        after[k] += v
    mine = fair[t].share if t in fair else 0.0
    share_after = cluster_shares.dominant_share(state, config, t, after)
    if share_after > mine * (1 + fairness.EPS) + fairness.EPS:
        detail = f"share after {share_after:.3f} would exceed fair share {mine:.3f}"
        return (WAIT_FAIR_SHARE, detail)
    if budget <= 0:
        return (WAIT_BUDGET, "the eviction rate limit is reached for now")
    failed = filter_nodes(state, req, rows=rows, explain=True).failed
    nodes = sorted(f.node for f in failed if not f.unresolvable)
    best: tuple[Cost, list[Unit]] | None = None
    cooled = False
    for node in nodes:
        found, hit_cooldown = victims_on(
            led, req, node, level=level, over=over, ages=ages, blocked=blocked, skip=releasing
        )
        cooled = cooled or hit_cooldown
        if found is None:
            continue
        cost = node_cost(found, node, over, ages)
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
    nodesim.reserve(sim, req)
    led.add(led.gained, t, req.row)
    room[req.uid] = node
    return None


def _take(
    led: Ledger, units: Sequence[Unit], req: PodRequest, *, toward: str,
    evictions: list[Eviction],
) -> None:  # fmt: skip
    """Evict ``units`` for ``req``: each member frees its own node's room in the round."""
    assert req.tenant is not None
    for unit in units:
        for victim in unit:
            assert victim.tenant is not None
            nodesim.release(led.sim(victim.node), victim)
            led.add(led.removed, victim.tenant, victim.row)
            led.released.add(victim.uid)
            group = led.group_of.get(victim.uid, "")
            ev = Eviction(
                victim.uid, victim.name, victim.tenant, victim.node, req.uid, req.name,
                req.namespace, req.tenant, toward=toward, group=group,
                group_size=len(unit) if group else 1,
            )  # fmt: skip
            evictions.append(ev)
