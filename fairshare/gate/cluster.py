"""The fair-share gate over a ``ClusterState``, one implementation for extender and
simulator: ``check_fair_gate`` takes the current shares, the fair allocation over bound
plus pending demand and the contenders with a pending pod that fits now (or, with
``holdForBlockedTenants``, would fit a drained node), and applies ``rule.check_gate``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from fairshare import eligibility, fairness, quantities, tenancy
from fairshare.cluster_shares import (
    current_shares,
    demand_rows,
    dominant_share,
    fair_fractions,
    fair_shares_for,
    kernel_amounts,
    usage_after,
)
from fairshare.config.schema import FairShareConfig
from fairshare.gate.rule import Contender, GateDecision, check_gate, gate_floor
from fairshare.placement import PodRequest, RequestShape, filter_nodes
from fairshare.resources import GPU
from fairshare.state.cluster import ClusterState

ShapeKey = RequestShape
"""What decides whether a pending pod fits now: kernel row, GPU demand (count, share or
memory), allowed GPU models and node constraints. Two pods with one key fit alike."""


GroupFits = Callable[[ClusterState, PodRequest], bool | None]
"""For a waiting pod: whether its pod group counts as waiting and fitting now (the rule
of ``fairshare.gangs.waiting``), or None for a pod judged alone (no group, or one that runs)."""


def shape_key(p: PodRequest) -> ShapeKey:
    return p.shape


HeldOff = Callable[[ClusterState, PodRequest, Sequence[int]], Mapping[int, str]]
"""Of the rows given (nodes a pod fits now), those that reclaim's room holds keep the pod
off, with the reason (``holds.held_off`` over the holds in force: ``holds.gate_held``).
A gate given one counts a waiting pod as fitting only where no hold keeps it off, as the
filter does: else a tenant would yield to a pod that the filter then refuses."""


def pod_fits_somewhere(state: ClusterState, p: PodRequest, held: HeldOff | None = None) -> bool:
    """Does some node pass ``p``'s node constraints and fit it now (and, with ``held``,
    is not kept off by a reclaim hold)?"""
    rows = state.eligible_rows(p.constraints)
    if rows is not None and not rows:
        return False
    fits = filter_nodes(state, p, rows=rows, explain=False).fits
    if not fits or held is None:
        return bool(fits)
    return len(held(state, p, fits)) < len(fits)


def dominates(big: PodRequest, small: PodRequest, *, mig: bool = False) -> bool:
    """Would ``small`` fit on every node where ``big`` fits? (Sufficient, not necessary.)

    True when both have the same node constraints, ``big`` asks at least as much of
    every resource, and, if ``small`` wants GPUs, ``big`` wants at least as many devices
    with at least as much of each (fixed shares, not GPU-memory requests) on the same or
    fewer GPU models. The device check of the fit is monotone in both (a device counts
    when its free share is at least the pod's), so a node that takes ``big`` takes
    ``small``. MIG (``mig``: the cluster has MIG nodes) never counts: slices are not
    ordered by size.
    """
    b, s = _Order.of(big), _Order.of(small)
    return b is not None and s is not None and b.dominates(s, mig=mig)


@dataclass(frozen=True)
class _Order:
    """A request as ``dominates`` compares it (fields read once per shape)."""

    constraints: object
    row: tuple[float, ...]
    gpu: bool  # wants GPUs
    plain: bool  # a fixed per-device share, no MIG profile and no memory request
    count: int
    per_device: float
    models: frozenset[str]

    @staticmethod
    def of(p: PodRequest) -> _Order | None:
        g = p.demand.gpu
        plain = g.source != "mig" and g.memory is None
        return _Order(
            p.constraints,
            p.row,
            p.demand.wants_gpu,
            plain,
            g.count,
            float(g.per_device),
            p.gpu_models,
        )

    def dominates(self, small: _Order, *, mig: bool) -> bool:
        if small.gpu:
            if not (self.gpu and self.plain and small.plain) or mig:
                return False
            if self.count < small.count or self.per_device < small.per_device:
                return False
            if small.models and not (self.models and self.models <= small.models):
                return False
        if self.constraints != small.constraints:
            return False
        return all(b >= s for b, s in zip(self.row, small.row, strict=True))


class _Misfits:
    """Shapes known to fit nowhere, kept as their minimal members (a shape dominating
    another adds nothing: whatever dominates it dominates the other)."""

    def __init__(self) -> None:
        self.keys: set[ShapeKey] = set()
        self.minimal: list[_Order] = []
        self.orders: dict[ShapeKey, _Order | None] = {}

    def order(self, p: PodRequest) -> _Order | None:
        got = self.orders.get(p.shape)
        if got is None:
            got = self.orders[p.shape] = _Order.of(p)
        return got

    def covers(self, key: ShapeKey, order: _Order | None, mig: bool) -> bool:
        """Known to fit nowhere: listed, or dominating a listed one."""
        if key in self.keys:
            return True
        if order is not None and any(order.dominates(m, mig=mig) for m in self.minimal):
            self.keys.add(key)
            return True
        return False

    def add(self, key: ShapeKey, order: _Order | None, mig: bool) -> None:
        self.keys.add(key)
        if order is not None:
            self.minimal = [m for m in self.minimal if not m.dominates(order, mig=mig)]
            self.minimal.append(order)


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
    the fit (resources, GPU devices, GPU health and model: ``filter_nodes``).
    """
    return fitting_pending(state, {tenant}, queue, memo=memo)[tenant]


def fitting_pending(
    state: ClusterState,
    tenants: Iterable[str],
    queue: Iterable[PodRequest],
    *,
    memo: dict[ShapeKey, bool] | None = None,
    blocked: dict[str, PodRequest] | None = None,
    groups: GroupFits | None = None,
    admits: Callable[[PodRequest], bool] | None = None,
    held: HeldOff | None = None,
) -> dict[str, bool]:
    """For each of ``tenants``: does it have a pod waiting that could run now?

    With ``admits``, only pods it admits count (the yield band: pods that keep their
    tenant within its fair share).

    One walk over ``queue``, which stops once every tenant has a pod that fits. Each
    distinct shape (``shape_key``) is probed at most once: the answer goes in ``memo``,
    which ``check_fair_gate`` keeps per state version (``ClusterState.memo``), across
    tenants and decisions. A shape that fits nowhere is also remembered across binds
    (they only take room) until a node changes or room is given back
    (``room_version``); so is a shape that ``dominates`` one known to fit nowhere,
    without being probed.

    With ``blocked`` (``holdForBlockedTenants``), the same walk also puts there, for a
    tenant, its first waiting pod met before any that fits now that fits no node now but
    would fit a drained one (``_DrainedFit``).

    With ``groups``, a member of a pod group counts as its group does (``GroupFits``):
    a group is waiting work as a whole, never one member at a time.

    With ``held`` (reclaim holds in force), a pod that fits counts only where no hold
    keeps it off; a hold binds other tenants' pods only, so that answer is kept per
    tenant and shape, for this walk.
    """
    out = dict.fromkeys(tenants, False)
    open_ = set(out)
    if not open_:
        return out
    known = {} if memo is None else memo
    nowhere: dict[str, _Misfits] = state.memo("gate.shape_fits_nowhere", growing_only=True)
    misfits = nowhere.get("misfits") or nowhere.setdefault("misfits", _Misfits())
    mig = bool(state.mig_nodes)
    drained = _DrainedFit.of(state) if blocked is not None else None
    held_memo: dict[tuple[str, ShapeKey], bool] = {}
    pods = state.pods
    for p in queue:
        u = p.tenant
        if u not in open_ or not p.waiting or p.uid in pods:
            continue
        if admits is not None and not admits(p):
            continue
        whole = groups(state, p) if groups is not None else None
        if whole is not None:
            if whole:
                out[u] = True
                open_.discard(u)
                if not open_:
                    break
            continue
        key = p.shape
        fits = known.get(key)
        if fits is None:
            if key in misfits.keys:
                fits = False
            else:
                order = misfits.order(p)
                if misfits.covers(key, order, mig):
                    fits = False
                else:
                    fits = known[key] = pod_fits_somewhere(state, p)
                    if not fits:
                        misfits.add(key, order, mig)
        if fits and held is not None:
            outside = held_memo.get((u, key))
            if outside is None:
                outside = held_memo[(u, key)] = pod_fits_somewhere(state, p, held)
            fits = outside
        if fits:
            out[u] = True
            open_.discard(u)
            if not open_:
                break
        elif blocked is not None and drained is not None and u not in blocked and drained.fits(p):
            blocked[u] = p
    return out


def _within_fair_share(
    state: ClusterState,
    config: FairShareConfig,
    fair: Mapping[str, fairness.FairShare],
    weights: Mapping[str, float],
) -> Callable[[PodRequest], bool]:
    """Does a waiting pod keep its tenant within its fair share (the plain gate never
    holds it)? In the yield band a tenant yields only to such pods. A pod that would lift
    its tenant above its fair share is judged by the plain gate, in the order of current
    shares, and may wait for the very tenant that yields to it: the band orders tenants by
    the fraction of their fair share instead, so counting such pods let two tenants hold
    each other while GPUs stayed idle (seen with ``yieldBand: 0.1`` on the simulator's
    dra-mixed scenario: inference near its share waited for vision, whose next pod,
    above its share, waited for inference)."""

    def admits(p: PodRequest) -> bool:
        u = p.tenant
        mine = fair.get(u) if u is not None else None
        if u is None or mine is None:
            return False
        share = dominant_share(state, config, u, usage_after(state, u, p.row), weights)
        return share <= gate_floor(mine.share)

    return admits


def pod_fits_drained(state: ClusterState, p: PodRequest) -> bool:
    """Would ``p`` fit some node it may use (``eligibility``) if that node's pods were
    gone? The same fit as ``pod_fits_somewhere`` (resources, GPU devices, model, health,
    MIG slices) against ``ClusterState.drained``. False means unrunnable as the nodes are."""
    return pod_fits_somewhere(state.drained(), p)


class _DrainedFit:
    """``pod_fits_drained`` per shape, kept on the drained state: probed once per node
    change, across tenants, decisions and binds. A shape that ``dominates`` one known
    not to fit a drained node does not fit either and is not probed."""

    def __init__(self, state: ClusterState) -> None:
        self.drained = state.drained()
        self.known: dict[ShapeKey, bool] = self.drained.memo("gate.shape_fits_drained")
        held: dict[str, _Misfits] = self.drained.memo("gate.shape_fits_no_drained_node")
        self.misfits = held.get("misfits") or held.setdefault("misfits", _Misfits())
        self.mig = bool(state.mig_nodes)

    @staticmethod
    def of(state: ClusterState) -> _DrainedFit:
        return _DrainedFit(state)

    def fits(self, p: PodRequest) -> bool:
        key = p.shape
        ok = self.known.get(key)
        if ok is None:
            order = self.misfits.order(p)
            if self.misfits.covers(key, order, self.mig):
                return False
            ok = self.known[key] = pod_fits_somewhere(self.drained, p)
            if not ok:
                self.misfits.add(key, order, self.mig)
        return ok


def describe_request(p: PodRequest) -> str:
    """``ns/name (nvidia.com/gpu 8, cpu 32, memory 64Gi)``: the pod and its shape as a
    gate reason names it (requests, GPU first, allowed GPU models, node constraints)."""
    amounts = p.demand.amounts
    parts = [
        f"{name} {quantities.format_quantity(amounts[name], quantities.quantity_kind(name))}"
        for name in sorted(amounts, key=lambda n: (n != GPU, n))
        if amounts[name]
    ]
    if p.gpu_models:
        parts.append("GPU model " + "|".join(sorted(p.gpu_models)))
    if p.constraints != eligibility.UNCONSTRAINED:
        parts.append("node constraints")
    return f"{p.namespace}/{p.name} ({', '.join(parts) or 'no requests'})"


def _within_guarantee(
    state: ClusterState,
    config: FairShareConfig,
    tenant: str,
    row: Sequence[float],
    after: Sequence[float],
) -> bool:
    """The pod (``row``) asks for a guaranteed resource of ``tenant`` and keeps the
    tenant within its guarantee on every guaranteed resource it asks for."""
    spec = config.tenant(tenant)
    if spec is None:
        return False
    g = kernel_amounts(state, spec.guaranteed_amounts())
    asked = [c for c in g if row[c] > 0]
    return bool(asked) and all(after[c] <= g[c] + 1e-6 for c in asked)


def check_fair_gate(
    state: ClusterState,
    *,
    config: FairShareConfig,
    req: PodRequest,
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None = None,
    groups: GroupFits | None = None,
    held: HeldOff | None = None,
) -> GateDecision | None:
    """The gate's decision for ``req``; None when it does not apply.

    ``pending`` is every pod waiting to be placed (``req`` is counted once whether or
    not it is listed). ``fair`` may be passed when the caller caches the allocation.
    ``groups``: how a waiting member of a pod group counts (``fitting_pending``).
    ``held``: the reclaim holds in force (``HeldOff``); a waiting pod that fits only in
    room held for another tenant's pod does not count as fitting now.
    """
    t = req.tenant
    if t is None:
        return None
    weights = tenancy.tenant_weights(config)
    after = usage_after(state, t, req.row)
    share_after = dominant_share(state, config, t, after, weights)
    queue = list(pending)
    if all(p.uid != req.uid for p in queue):
        queue.append(req)
    if fair is None:
        fair = fair_shares_for(state, config, demand_rows(state, queue))
    mine_fair = fair.get(t)
    fair_share = mine_fair.share if mine_fair else 0.0
    band = config.yield_band
    if share_after <= gate_floor(fair_share, band):
        return None
    above = share_after > gate_floor(fair_share)
    if not above and _within_guarantee(state, config, t, req.row, after):
        return None  # what is guaranteed is never held back, in the band either
    # Blocked pods hold others only above the fair share (``check_gate``).
    hold = config.hold_for_blocked_tenants and above
    shares = current_shares(state, config)
    mine = shares.get(t, 0.0)
    if not above:
        # In the yield band tenants are ordered by the fraction of their own fair share
        # they hold: t yields to those further behind theirs (never to one at or above
        # its fair share, e.g. a victim of reclaim whose pods come back).
        shares = fair_fractions(shares, fair)
        mine = shares.get(t, 0.0)
    memo: dict[ShapeKey, bool] = state.memo("gate.shape_fits")  # until the state changes
    lower = [(u, s) for u, s in sorted(shares.items()) if u != t and s < mine + fairness.EPS]
    blocked: dict[str, PodRequest] = {}
    can_run = fitting_pending(
        state,
        [u for u, _ in lower],
        queue,
        memo=memo,
        blocked=blocked if hold else None,
        groups=groups,
        admits=None if above else _within_fair_share(state, config, fair, weights),
        held=held,
    )
    contenders = [
        Contender(u, fairness.CurrentShare(s), can_run[u], "blocked" * (u in blocked))
        for u, s in lower
    ]
    decision = check_gate(
        tenant=t,
        current_share=fairness.CurrentShare(mine),
        share_after=fairness.ShareAfter(share_after),
        fair_share=fair_share,
        contenders=contenders,
        yield_band=band,
    )
    if decision.blocked and decision.waiting_for in blocked:
        # Named only for the tenant waited for (formatting every contender's pod costs).
        text = describe_request(blocked[decision.waiting_for])
        decision = dataclasses.replace(decision, blocked=text)
    return decision
