"""What ``fairshare status`` / ``explain`` and the extender's ``/status`` page show: plain
JSON-ready dicts (rendered by ``fairshare.report_render``, re-exported here), every
figure from the code the servers run, on the same state. A pod is *held by the gate* when
it fits some node now and ``check_fair_gate`` refuses it; one that fits no node waits for
room.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from fairshare import cluster_shares, fairness, quantities, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.fleet import fleet_health
from fairshare.gate import GateDecision, GroupFits, check_fair_gate, pod_fits_drained, shape_key
from fairshare.history import TenantHistory
from fairshare.placement import PodRequest, WorkloadMix, cluster_fragmentation, filter_nodes
from fairshare.preemption.holds import GivenRoom, RoomHold, gate_held, held_off, utc
from fairshare.report_render import (
    render_explain_text,
    render_status_html,
    render_status_text,
    to_json,
)
from fairshare.resources import GPU, MILLI_GPU, from_kernel_units
from fairshare.state.cluster import ClusterState
from fairshare.usageview import TenantUsageView

__all__ = [
    "AdmissionVerdict",
    "build_status",
    "explain_pod",
    "render_explain_text",
    "render_status_html",
    "render_status_text",
    "to_json",
]


@dataclass(frozen=True)
class AdmissionVerdict:
    """What the webhook's ``review.judge`` answered (computed by the caller, which may
    import the webhook; the core may not)."""

    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()


def _show(resource: str, amount: Fraction | None) -> str | None:
    if amount is None:
        return None
    return quantities.format_quantity(amount, quantities.quantity_kind(resource))


def _kernel(resource: str, value: float) -> Fraction:
    return from_kernel_units(resource, value)


def _round(x: float) -> float:
    return round(float(x), 4)


def _pod_name(req: PodRequest) -> str:
    return f"{req.namespace}/{req.name}"


def _gpu(milli: float) -> float:
    return round(milli / MILLI_GPU, 3)


def _fit_reason(state: ClusterState, req: PodRequest) -> tuple[int, str]:
    """How many nodes fit ``req`` now, and one reason when none does."""
    allowed = state.eligible_rows(req.constraints)
    if allowed is not None and not allowed and state.n_nodes:
        # kube-scheduler's own filters stop it before any resource is looked at.
        return 0, "no node passes its node selector, required node affinity and tolerations"
    fr = filter_nodes(state, req, rows=allowed, explain=True)
    if fr.fits:
        return len(fr.fits), ""
    if not fr.failed:
        return 0, "no nodes"
    first = fr.failed[0]
    return 0, f"{first.node}: {first.reason}" + (
        f" (and {len(fr.failed) - 1} more node(s))" if len(fr.failed) > 1 else ""
    )


def build_status(
    *,
    config: FairShareConfig,
    state: ClusterState,
    pending: Sequence[PodRequest],
    mix: WorkloadMix | None,
    quota: TenantUsageView | None = None,
    unreadable: Mapping[str, str] | None = None,
    scheduling_gated: Collection[str] = (),
    gangs: Sequence[Mapping[str, Any]] = (),
    group_fits: GroupFits | None = None,
) -> dict[str, Any]:
    """The status report: tenants, cluster GPU figures, nodes' devices, held pods, and
    the pod groups (``gangs``: ``gangs.status.GroupStatus.as_dict`` rows; the key is left
    out when there are none).

    ``pending`` is the extender's pending queue, ``mix`` its workload mix; ``quota`` the
    webhook's usage (the ``quotaUsed`` column; None where no such view is kept, e.g. the
    extender's own page). ``scheduling_gated``: uids of pending pods that still have
    ``spec.schedulingGates`` (kube-scheduler does not try them yet; they still count as
    demand and as contenders, as the extender counts them). ``group_fits``: how waiting
    pod groups count at the gate (``fairshare.gangs.waiting``), as the extender's filter
    counts them.
    """
    queue = list(pending)
    shares = cluster_shares.current_shares(state, config)
    fair = cluster_shares.fair_shares_for(state, config, cluster_shares.demand_rows(state, queue))
    weights = tenancy.tenant_weights(config)
    groups = {str(g["group"]): g for g in gangs}
    names = sorted(set(weights) | set(shares) | set(fair))
    running: dict[str, int] = {}
    for bp in state.pods.values():
        if bp.tenant is not None:
            running[bp.tenant] = running.get(bp.tenant, 0) + 1
    waiting: dict[str, int] = {}
    held: list[dict[str, Any]] = []
    unplaced: list[dict[str, Any]] = []
    # Pods of one tenant with one shape and one set of node constraints get one answer
    # (fit and gate read only those and the queue): judged once per shape, so a queue of
    # thousands of replicas costs a handful of gate checks.
    judged: dict[tuple[Any, ...], tuple[int, str, GateDecision | None]] = {}
    for req in queue:
        if req.uid in state.pods:
            continue
        tenant = req.tenant or ""
        waiting[tenant] = waiting.get(tenant, 0) + 1
        shape = (req.tenant, shape_key(req))
        if shape not in judged:
            fits, why = _fit_reason(state, req)
            decision = None
            if fits:
                decision = check_fair_gate(
                    state, config=config, req=req, pending=queue, fair=fair, groups=group_fits
                )
            judged[shape] = (fits, why, decision)
        fits, why, gate = judged[shape]
        entry: dict[str, Any] = {"pod": _pod_name(req), "tenant": req.tenant, "fitsNodes": fits}
        group = _own_gang_verdict(req.unschedulable, groups)
        if group is not None:
            # kube-scheduler's verdict is the extender's refusal of the pod's group
            entry["reason"] = f"waits with its group: {group['reason'] or group['state']}"
            entry["waiting"] = False
            unplaced.append(entry)
        elif req.unschedulable:
            # kube-scheduler's own plugins refused every node: its verdict, not fairshare's
            # fit or gate, says why the pod waits (and it holds no other tenant back).
            entry["reason"] = f"{UNSCHEDULABLE_BY_KUBE_SCHEDULER}: {req.unschedulable}"
            entry["waiting"] = False
            unplaced.append(entry)
        elif gate is not None and not gate.allowed:
            entry.update(
                reason=gate.reason,
                shareAfter=_round(gate.share_after),
                fairShare=_round(gate.fair_share),
                waitingFor=gate.waiting_for,
            )
            if gate.blocked:
                entry["blockedPod"] = gate.blocked
            held.append(entry)
        else:
            entry["reason"] = why or "fits; waiting for the scheduler"
            if req.uid in scheduling_gated:
                entry["reason"] = f"has spec.schedulingGates (not scheduled yet); {entry['reason']}"
            unplaced.append(entry)
    held_by: dict[str, int] = {}
    for entry in held:
        held_by[entry["tenant"]] = held_by.get(entry["tenant"], 0) + 1
    tenants = []
    for name in _tree_order(config, names):
        members = config.subtree(name)
        tenants.append(
            _tenant_row(
                name,
                config=config,
                state=state,
                quota=quota,
                share=shares.get(name, 0.0),
                fair=fair[name].share if name in fair else 0.0,
                weight=weights.get(name, 1.0),
                pods={
                    "running": sum(running.get(m, 0) for m in members),
                    "pending": sum(waiting.get(m, 0) for m in members),
                    "held": sum(held_by.get(m, 0) for m in members),
                },
            )
        )
    return {
        "kind": "FairshareStatus",
        "tenants": tenants,
        "cluster": _cluster(state, mix),
        "health": _health(state, config),
        "nodes": _nodes(state),
        "heldPods": held,
        "pendingPods": unplaced,
        "unreadable": dict(sorted((unreadable or {}).items())),
        **({"gangs": [dict(g) for g in gangs]} if gangs else {}),
    }


_GANG_VERDICT = re.compile(r"gang (\S+?/\S+?)[ :]")


def _own_gang_verdict(
    message: str | None, groups: Mapping[str, Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The group (a ``gangs`` row) whose refusal by the extender kube-scheduler's
    verdict ``message`` repeats, if any."""
    if not message or not groups:
        return None
    for found in _GANG_VERDICT.finditer(message):
        row = groups.get(found.group(1))
        if row is not None:
            return row
    return None


def _tree_order(config: FairShareConfig, names: Sequence[str]) -> list[str]:
    """``names`` sorted, each tenant with children followed by its subtree (depth first)."""
    if not config.is_hierarchical():
        return list(names)
    known = set(names)
    out: list[str] = []

    def visit(name: str) -> None:
        if name in out:
            return
        out.append(name)
        for child in sorted(t.name for t in config.children(name)):
            if child in known:
                visit(child)

    for name in names:
        spec = config.tenant(name)
        if spec is None or spec.parent is None or spec.parent not in known:
            visit(name)
    out += [n for n in names if n not in out]  # a cycle (not in a validated config)
    return out


def _tenant_row(
    name: str,
    *,
    config: FairShareConfig,
    state: ClusterState,
    quota: TenantUsageView | None,
    share: float,
    fair: float,
    weight: float,
    pods: dict[str, int],
) -> dict[str, Any]:
    spec = config.tenant(name)
    guaranteed = spec.guaranteed_amounts() if spec else {}
    limits = (spec.limit_amounts() if spec else None) or {}
    members = config.subtree(name)
    bound = state.index.amounts(cluster_shares.subtree_usage(state, config, name))
    used_quota: dict[str, Fraction] = {}
    if quota is not None:
        # A tenant with children: what its whole subtree uses.
        for member in members:
            for res, amount in quota.tenant_usage(member).items():
                used_quota[res] = used_quota.get(res, Fraction(0)) + amount
    resources = []
    for res in sorted(
        set(state.index.names) | set(guaranteed) | set(limits) | set(used_quota),
        key=lambda r: (r != GPU, r),
    ):
        row: dict[str, Any] = {
            "resource": res,
            "used": _show(res, bound.get(res, Fraction(0))),
            "guaranteed": _show(res, guaranteed.get(res)),
            "limit": _show(res, limits.get(res)),
        }
        if quota is not None:
            row["quotaUsed"] = _show(res, used_quota.get(res, Fraction(0)))
        resources.append(row)
    out: dict[str, Any] = {
        "name": name,
        "weight": weight,
        # As configured: among its siblings (``weight`` is its weight in the whole tree).
        "configuredWeight": float(spec.weight) if spec else 1.0,
        "dominantShare": _round(share),
        "fairShare": _round(fair),
        "pods": pods,
        "resources": resources,
    }
    if config.is_hierarchical():
        out["parent"] = spec.parent if spec else None
        out["level"] = config.level_name(name)
    if quota is not None:
        out["namespaces"] = [ns for m in members for ns in quota.tenant_namespaces(m)]
    return out


def _cluster(state: ClusterState, mix: WorkloadMix | None) -> dict[str, Any]:
    g = state.gpu_col
    cap = state.total_capacity()[g]
    free = state.total_free()[g]
    frag = cluster_fragmentation(state, mix)
    healthy = sum(1 for i in range(state.n_nodes) if state.healthy[i])
    return {
        "nodes": state.n_nodes,
        "gpuHealthyNodes": healthy,
        "gpus": _gpu(cap),
        "gpusAllocated": _gpu(cap - free),
        "gpusFree": _gpu(free),
        "gpuAllocationRatio": _round((cap - free) / cap) if cap > 0 else 0.0,
        "gpuFragmentation": _gpu(frag),
        "gpuFragmentationRatio": _round(frag / cap) if cap > 0 else 0.0,
    }


def _health(state: ClusterState, config: FairShareConfig) -> dict[str, Any]:
    """The healthy fleet (``fairshare.fleet``): GPUs out of service, the nodes and the
    tenants they cost, and whether the guarantees are still covered."""
    fleet = fleet_health(state, config)
    return {
        "gpusInService": fleet.gpus_in_service,
        "gpusFailed": fleet.gpus_failed,
        "unhealthyDevices": fleet.unhealthy_devices,
        "warnedNodes": fleet.warned_nodes,
        "nodes": [
            {
                "name": n.name,
                "failed": n.failed,
                "gpus": n.gpus,
                "reason": n.reason,
                "warning": n.warning,
                "tenants": {t: _gpu(g * 1000) for t, g in n.holders.items()},
            }
            for n in fleet.nodes
        ],
        "tenantsOnFailedHardware": {t: _gpu(g * 1000) for t, g in fleet.tenants_on_failed.items()},
        "guarantees": [
            {
                "resource": c.resource,
                "guaranteed": _round(c.guaranteed),
                "inService": _round(c.in_service),
                "coverage": _round(c.ratio),
                "covered": c.covered,
            }
            for c in fleet.coverage
        ],
    }


def _nodes(state: ClusterState) -> list[dict[str, Any]]:
    holders: dict[tuple[str, int], dict[str, float]] = {}
    for bp in state.pods.values():
        for dev, milli in bp.devices:
            slot = holders.setdefault((bp.node, dev), {})
            who = bp.tenant or "(no tenant)"
            slot[who] = slot.get(who, 0.0) + milli
    out = []
    for i, info in enumerate(state.nodes):
        devices = []
        for d, free in enumerate(state.node_devices(i)):
            if free < 0:
                continue
            held = holders.get((info.name, d), {})
            devices.append(
                {
                    "index": d,
                    "free": _gpu(free),
                    "holders": {t: _gpu(m) for t, m in sorted(held.items())},
                }
            )
        out.append(
            {
                "name": info.name,
                "gpuModel": info.gpu_model,
                "healthy": bool(state.healthy[i]),
                "healthReason": info.health_reason,
                "healthWarning": info.health_warning,
                "unhealthyGpus": info.unhealthy_gpus,
                "devices": devices,
            }
        )
    return sorted(out, key=lambda n: n["name"])


# -- explain -----------------------------------------------------------------------------


def _no_take_back(
    given: Sequence[GivenRoom],
    tenant: str,
    shares: Mapping[str, float],
    fair: Mapping[str, fairness.FairShare],
) -> list[dict[str, Any]]:
    """Per tenant above its fair share that holds room ``tenant`` gave it by reclaim (so
    reclaim toward fair share takes nothing from it for ``tenant``): its pods with such
    a record, and when the last record lapses."""
    out: dict[str, dict[str, Any]] = {}
    for g in given:
        holder = g.tenant
        above = shares.get(holder, 0.0) > (fair[holder].share if holder in fair else 0.0)
        if tenant in g.givers and holder != tenant and above:
            row = out.setdefault(holder, {"tenant": holder, "pods": [], "until": 0.0})
            row["pods"].append(g.pod)
            row["until"] = max(row["until"], g.until)
    return [{**row, "until": utc(row["until"])} for _, row in sorted(out.items())]


def explain_pod(
    *,
    config: FairShareConfig,
    state: ClusterState,
    pending: Sequence[PodRequest],
    req: PodRequest | None,
    namespace: str,
    name: str,
    quota: TenantUsageView,
    admission: AdmissionVerdict,
    demand_error: str | None = None,
    gang: Mapping[str, Any] | None = None,
    group_fits: GroupFits | None = None,
    holds: Sequence[RoomHold] = (),
    given: Sequence[GivenRoom] = (),
    hardware: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What the webhook and the extender would say about one pod now.

    ``hardware``: the run lost to a hardware fault that the pod belonged to (it was lost
    or evicted so that its group restarts whole) or that it replaces
    (``fairshare.recovery``; shown under ``hardware``).

    ``given``: the no-take-back records in force (``preemption.holds.given_rooms``);
    when the pod's tenant reclaims toward fair share, the tenants that reclaim takes
    nothing from for it (they hold room it gave) are listed under ``noTakeBack``.

    ``holds``: the reclaim holds in force (``preemption.holds.holds_in_force``); a node
    whose room one keeps for another tenant's pod is shown as not fitting, with the
    hold's reason, as the extender's filter answers.

    ``gang``: the pod's group (``gangs.status.GroupStatus.as_dict``) when it is a member of
    one: a member waits with its group, so the verdict says why the group waits.

    ``req`` is the pod as the extender reads it (None when its resources cannot be
    read: ``demand_error``); ``quota`` the webhook's usage without this pod's own share
    (``usageview.ExcludingView``); ``admission`` the webhook's verdict on that view.
    """
    resolution = tenancy.resolve_tenant(namespace, quota.namespace_labels(namespace), config)
    tenant = resolution.tenant
    out: dict[str, Any] = {
        "kind": "FairshareExplain",
        "pod": f"{namespace}/{name}",
        "tenant": tenant,
        "tenantSource": resolution.source,
        "webhook": {
            "allowed": admission.allowed,
            "message": admission.message,
            "warnings": list(admission.warnings),
        },
    }
    if hardware is not None:
        out["hardware"] = dict(hardware)
    if demand_error is not None:
        out["error"] = f"pod resources cannot be read: {demand_error}"
        return out
    assert req is not None
    out["webhook"]["quota"] = _headroom(config, tenant, req, quota) if tenant else []
    bound = state.pods.get(req.uid)
    if bound is not None:
        out["extender"] = {"boundTo": bound.node}
        if gang is not None:
            out["extender"]["gang"] = dict(gang)
        return out
    queue = list(pending)
    # kube-scheduler's node selector, required affinity and taint filters come first:
    # a node they refuse is named with their reason, not judged on resources.
    allowed = state.eligible_rows(req.constraints)
    fr = filter_nodes(state, req, rows=allowed, explain=True)
    off = held_off(state, holds, req, fr.fits) if holds and fr.fits else {}
    nodes: list[dict[str, Any]] = [
        {"node": state.nodes[i].name, "fits": i not in off, "reason": off.get(i, "")}
        for i in fr.fits
    ]
    nodes += [
        {"node": f.node, "fits": False, "reason": f.reason, "unresolvable": f.unresolvable}
        for f in fr.failed
    ]
    if allowed is not None:
        admitted = set(allowed)
        for i, info in enumerate(state.nodes):
            if i not in admitted:
                why = req.constraints.why_not(info.name, info.labels, info.taints)
                nodes.append(
                    {"node": info.name, "fits": False, "reason": why, "unresolvable": True}
                )
    nodes.sort(key=lambda n: n["node"])
    extender: dict[str, Any] = {"nodes": nodes, "fitsNodes": len(fr.fits) - len(off)}
    gate = check_fair_gate(
        state,
        config=config,
        req=req,
        pending=queue,
        groups=group_fits,
        held=gate_held(holds),
    )
    shares = cluster_shares.current_shares(state, config)
    if all(p.uid != req.uid for p in queue):
        queue.append(req)
    fair = cluster_shares.fair_shares_for(state, config, cluster_shares.demand_rows(state, queue))
    if tenant is not None:
        extender["gate"] = {
            "applies": gate is not None,
            "allowed": gate is None or gate.allowed,
            "currentShare": _round(shares.get(tenant, 0.0)),
            "shareAfter": _round(gate.share_after) if gate else None,
            "fairShare": _round(gate.fair_share if gate else fair[tenant].share)
            if (gate or tenant in fair)
            else 0.0,
            "waitingFor": gate.waiting_for if gate else None,
            "reason": gate.reason if gate else "",
        }
        if gate is not None and gate.blocked:
            extender["gate"]["blockedPod"] = gate.blocked
        if given and config.reclaims_to_fair_share(tenant):
            extender["noTakeBack"] = _no_take_back(given, tenant, shares, fair)
    if req.unschedulable:
        verdict = f"{UNSCHEDULABLE_BY_KUBE_SCHEDULER}: {req.unschedulable}"
        extender["kubeScheduler"] = req.unschedulable
    elif not fr.fits:
        verdict = "pending: no node fits now"
        if not pod_fits_drained(state, req):
            verdict = f"pending: can never fit: {_never_fits(state, req)}"
    elif len(off) == len(fr.fits):
        verdict = f"pending: the room it fits is held by reclaim: {next(iter(off.values()))}"
    elif gate is not None and not gate.allowed and gang is None:
        verdict = f"held by the fair-share gate: {gate.reason}"
    else:
        verdict = f"schedulable on {len(fr.fits) - len(off)} node(s)"
    # kube-scheduler's verdict on a member is often the group's own refusal (the
    # extender's "gang ns/name ..." reasons): then the group's standing says more.
    own_verdict = (
        req.unschedulable and gang is not None and f"gang {gang['group']}" in req.unschedulable
    )
    if gang is not None and (not req.unschedulable or own_verdict):
        extender["gang"] = dict(gang)
        if gang["state"] == "waiting":
            verdict = f"waits with its group: {gang['reason']}"
        elif gang["state"] == "planned":
            node = (gang.get("planned") or {}).get(name)
            verdict = f"planned with its group on {node}" if node else gang["reason"]
    extender["verdict"] = verdict
    out["extender"] = extender
    return out


UNSCHEDULABLE_BY_KUBE_SCHEDULER = (
    "unschedulable by kube-scheduler (holds no other tenant back until it asks fairshare"
    " about the pod again)"
)


def _never_fits(state: ClusterState, req: PodRequest) -> str:
    """Why a pod that fits no node even empty never will: the resources it asks more of
    than the largest node has (its allocatable), else the nodes it may use."""
    names, r = state.index.names, state.n_res
    largest = {
        k: max((state.capacity[i * r + k] for i in range(state.n_nodes)), default=0.0)
        for k, x in enumerate(req.row)
        if x > 0
    }
    over = [k for k, most in largest.items() if req.row[k] > most]
    if not over:
        return (
            "no node it may use (node selector, required affinity, taints, GPU models)"
            " would hold it even empty"
        )
    parts = [f"{names[k]} {_show(names[k], _kernel(names[k], largest[k]))}" for k in over]
    return f"asks more than any node has (largest node: {', '.join(parts)})"


def _headroom(
    config: FairShareConfig, tenant: str, req: PodRequest, quota: TenantUsageView
) -> list[dict[str, Any]]:
    """The pod against its tenant's limits and, in a tree, every ancestor's limits (an
    ancestor's usage is its whole subtree's, as admission counts it); in a tree each row
    names its ``tenant`` and ``level``."""
    tree = config.is_hierarchical()
    demand = req.demand.amounts
    rows = []
    for spec_name in (tenant, *(a.name for a in config.ancestors(tenant))):
        spec = config.tenant(spec_name)
        limits = (spec.limit_amounts() if spec else None) or {}
        if spec_name != tenant and not limits:
            continue
        used: dict[str, Fraction] = {}
        for member in config.subtree(spec_name) if spec_name != tenant else (tenant,):
            for res, amount in quota.tenant_usage(member).items():
                used[res] = used.get(res, Fraction(0)) + amount
        shown = set(limits) | set(demand) if spec_name == tenant else set(limits)
        for res in sorted(shown, key=lambda r: (r != GPU, r)):
            u = used.get(res, Fraction(0))
            want = demand.get(res, Fraction(0))
            lim = limits.get(res)
            row: dict[str, Any] = {}
            if tree:
                row["tenant"] = spec_name
                row["level"] = config.level_name(spec_name)
            row.update(
                {
                    "resource": res,
                    "used": _show(res, u),
                    "requested": _show(res, want),
                    "limit": _show(res, lim),
                    "headroom": _show(res, lim - u) if lim is not None else None,
                    "fits": lim is None or u + want <= lim,
                }
            )
            rows.append(row)
    return rows


def history_rows(assessed: Mapping[str, TenantHistory]) -> list[dict[str, Any]]:
    """Per tenant, its decayed usage share U, its weighted share W and the factor on its
    weight (``history.assess``; 1 unless U > W), for the status report."""
    return [
        {
            "tenant": name,
            "usageShare": _round(a.usage_share),
            "weightedShare": _round(a.weighted_share),
            "weightFactor": _round(a.factor),
        }
        for name, a in sorted(assessed.items())
    ]
