"""What ``fairshare status`` / ``explain`` and the extender's ``/status`` page show.

Pure: no network, no clock. Must not import aiohttp, kubernetes_asyncio or
prometheus_client. Every number comes from the code the servers run on the same state:
shares from ``gating.current_shares``, fair shares from ``gating.fair_shares_for`` over
``gating.demand_rows``, the gate from ``gating.check_fair_gate``, node fit and per-node
reasons from ``placement.filter_nodes``, fragmentation from
``placement.cluster_fragmentation``, quota usage from the webhook's ``UsageTracker``
(passed in as a ``usageview.TenantUsageView``). Nothing here recomputes them another way.

Design choices:

* A report is a plain JSON-ready ``dict`` (``-o json|yaml`` print it as it is); text and
  HTML are rendered from that dict only (``render_status_text``, ``render_status_html``),
  so the three outputs cannot disagree.
* Amounts are exact natural units as strings (``quantities.format_quantity``: ``"1.5"``
  GPUs, ``"500m"`` CPU, ``"8Gi"``), shares are floats rounded to 4 places.
* *Held by the gate* means what the extender's filter does: a pending pod that fits some
  node now, for which ``check_fair_gate`` refuses. A pending pod that fits no node waits
  for room (``pending``, with the first node's reason), not for the gate. With
  ``holdForBlockedTenants`` a held pod may wait for a tenant whose pod is blocked (fits
  no node now, would fit a drained one): ``blockedPod`` names it and its shape.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from fairshare import fairness, gating, quantities, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.history import TenantHistory
from fairshare.placement import PodRequest, WorkloadMix, cluster_fragmentation, filter_nodes
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
    group_fits: gating.GroupFits | None = None,
) -> dict[str, Any]:
    """The status report: tenants, cluster GPU figures, nodes' devices, held pods, and
    the pod groups (``gangs``: ``gangstatus.GroupStatus.as_dict`` rows; the key is left
    out when there are none).

    ``pending`` is the extender's pending queue, ``mix`` its workload mix; ``quota`` the
    webhook's usage (the ``quotaUsed`` column; None where no such view is kept, e.g. the
    extender's own page). ``scheduling_gated``: uids of pending pods that still have
    ``spec.schedulingGates`` (kube-scheduler does not try them yet; they still count as
    demand and as contenders, as the extender counts them). ``group_fits``: how waiting
    pod groups count at the gate (``fairshare.gangwait``), as the extender's filter counts them.
    """
    queue = list(pending)
    shares = gating.current_shares(state, config)
    fair = gating.fair_shares_for(state, config, gating.demand_rows(state, queue))
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
    judged: dict[tuple[Any, ...], tuple[int, str, fairness.GateDecision | None]] = {}
    for req in queue:
        if req.uid in state.pods:
            continue
        tenant = req.tenant or ""
        waiting[tenant] = waiting.get(tenant, 0) + 1
        shape = (req.tenant, gating.shape_key(req))
        if shape not in judged:
            fits, why = _fit_reason(state, req)
            decision = None
            if fits:
                decision = gating.check_fair_gate(
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
    bound = state.index.amounts(gating.subtree_usage(state, config, name))
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
                "devices": devices,
            }
        )
    return sorted(out, key=lambda n: n["name"])


# -- explain -----------------------------------------------------------------------------


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
    group_fits: gating.GroupFits | None = None,
) -> dict[str, Any]:
    """What the webhook and the extender would say about one pod now.

    ``gang``: the pod's group (``gangstatus.GroupStatus.as_dict``) when it is a member of
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
    nodes: list[dict[str, Any]] = [
        {"node": state.nodes[i].name, "fits": True, "reason": ""} for i in fr.fits
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
    extender: dict[str, Any] = {"nodes": nodes, "fitsNodes": len(fr.fits)}
    gate = gating.check_fair_gate(state, config=config, req=req, pending=queue, groups=group_fits)
    shares = gating.current_shares(state, config)
    if all(p.uid != req.uid for p in queue):
        queue.append(req)
    fair = gating.fair_shares_for(state, config, gating.demand_rows(state, queue))
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
    if req.unschedulable:
        verdict = f"{UNSCHEDULABLE_BY_KUBE_SCHEDULER}: {req.unschedulable}"
        extender["kubeScheduler"] = req.unschedulable
    elif not fr.fits:
        verdict = "pending: no node fits now"
        if not gating.pod_fits_drained(state, req):
            verdict = f"pending: can never fit: {_never_fits(state, req)}"
    elif gate is not None and not gate.allowed and gang is None:
        verdict = f"held by the fair-share gate: {gate.reason}"
    else:
        verdict = f"schedulable on {len(fr.fits)} node(s)"
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


# -- rendering ---------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers).rstrip()]
    lines += [fmt.format(*row).rstrip() for row in rows]
    return lines


def _counts(row: Mapping[str, Any]) -> bool:
    """A resource row with anything to show (the text table leaves out the rest)."""
    zero = (None, "0")
    return any(row.get(k) not in zero for k in ("used", "quotaUsed", "guaranteed", "limit"))


def _cell(value: object) -> str:
    """A table cell: "-" for none; an exact ``p/q`` amount (a GPU total with no finite
    decimal, e.g. MIG sevenths) as a 3-decimal approximation, ``~4.143``, for people
    (``-o json`` keeps the exact form)."""
    if value is None:
        return "-"
    text = str(value)
    num, slash, den = text.partition("/")
    if slash and num.isdigit() and den.isdigit() and int(den):
        return f"~{int(num) / int(den):.3f}"
    return text


def _weight_text(t: Mapping[str, Any]) -> str:
    """``weight 3``; in a tree, where the weight in the whole tree differs from the
    configured one: ``weight 3 (1.5 in the whole tree)``."""
    configured = t.get("configuredWeight", t["weight"])
    if abs(configured - t["weight"]) <= 1e-9 * max(1.0, abs(configured)):
        return f"weight {configured:g}"
    return f"weight {configured:g} ({t['weight']:.4g} in the whole tree)"


def render_status_text(report: Mapping[str, Any]) -> str:
    """The status report as terminal text: one table per tenant, then the cluster."""
    lines: list[str] = [f"WARNING: {w}" for w in report.get("warnings", ())]
    for t in report["tenants"]:
        pods = t["pods"]
        parent = f"  in {t['parent']}" if t.get("parent") else ""
        lines.append(
            f"{t.get('level', 'tenant').upper()} {t['name']}{parent}  {_weight_text(t)}  "
            f"dominant share {t['dominantShare']:.4f}  fair share {t['fairShare']:.4f}  "
            f"pods: {pods['running']} running, {pods['pending']} pending, "
            f"{pods['held']} held by the gate"
        )
        if t.get("namespaces") is not None:
            lines.append(f"  namespaces: {', '.join(t['namespaces']) or '-'}")
        quota = any("quotaUsed" in r for r in t["resources"])
        headers = ["RESOURCE", "USED", *(["QUOTA-USED"] if quota else []), "GUARANTEED", "LIMIT"]
        rows = [
            [
                r["resource"],
                _cell(r["used"]),
                *([_cell(r.get("quotaUsed"))] if quota else []),
                _cell(r["guaranteed"]),
                _cell(r["limit"]),
            ]
            for r in t["resources"]
            if r["resource"] == GPU or _counts(r)
        ]
        lines += ["  " + line for line in _table(headers, rows)]
        lines.append("")
    c = report["cluster"]
    lines.append(
        f"CLUSTER  {c['nodes']} node(s)  GPUs {c['gpusAllocated']:g}/{c['gpus']:g} allocated "
        f"({100 * c['gpuAllocationRatio']:.1f}%)  fragmentation {c['gpuFragmentation']:g} GPU "
        f"({100 * c['gpuFragmentationRatio']:.1f}%)"
    )
    if report["heldPods"]:
        lines.append("")
        lines.append("HELD BY THE GATE")
        lines += [f"  {p['pod']}: {p['reason']}" for p in report["heldPods"]]
    if report["pendingPods"]:
        lines.append("")
        lines.append("PENDING")
        lines += [f"  {p['pod']}: {p['reason']}" for p in report["pendingPods"]]
    if report.get("gangs"):
        lines.append("")
        lines.append("GANGS")
        lines += _table(
            ["GROUP", "TENANT", "MEMBERS", "BOUND", "STATE", "HELD-GPU", "WHY IT WAITS"],
            [_gang_cells(g) for g in report["gangs"]],
        )
    if report.get("usageHistory"):
        lines.append("")
        lines.append("USAGE HISTORY (weights above are lowered by WEIGHT-FACTOR)")
        rows = [
            [h["tenant"], f"{h['usageShare']:.4f}", f"{h['weightedShare']:.4f}",
             f"{h['weightFactor']:.2f}"]
            for h in report["usageHistory"]
        ]  # fmt: skip
        lines += _table(["TENANT", "USAGE-SHARE", "WEIGHTED-SHARE", "WEIGHT-FACTOR"], rows)
    return "\n".join(lines) + "\n"


def _gang_cells(g: Mapping[str, Any]) -> list[str]:
    n = "?" if g["minCount"] is None else str(g["minCount"])
    return [
        g["group"],
        g["tenant"] or "-",
        f"{g['members']}/{n}",
        str(g["bound"]),
        g["state"],
        f"{g['heldGpus']:g}",
        g["reason"] or "-",
    ]


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


def render_explain_text(report: Mapping[str, Any]) -> str:
    """The explain report as terminal text."""
    lines = [f"WARNING: {w}" for w in report.get("warnings", ())]
    lines.append(f"POD {report['pod']}")
    lines.append(f"tenant: {report['tenant'] or '(none)'} (from {report['tenantSource']})")
    wh = report["webhook"]
    lines.append("")
    lines.append("WEBHOOK (admission now): " + ("allowed" if wh["allowed"] else "denied"))
    if wh["message"]:
        lines.append(f"  {wh['message']}")
    lines += [f"  warning: {w}" for w in wh["warnings"]]
    if wh.get("quota"):
        levels = any("level" in q for q in wh["quota"])
        rows = [
            [
                *([f"{q['level']} {q['tenant']}"] if levels else []),
                q["resource"],
                _cell(q["used"]),
                _cell(q["requested"]),
                _cell(q["limit"]),
                _cell(q["headroom"]),
                "yes" if q["fits"] else "NO",
            ]
            for q in wh["quota"]
        ]
        headers = ["RESOURCE", "USED", "REQUESTED", "LIMIT", "HEADROOM", "FITS"]
        if levels:
            headers.insert(0, "LEVEL")
        lines += ["  " + line for line in _table(headers, rows)]
    if "error" in report:
        lines += ["", f"EXTENDER: {report['error']}"]
        return "\n".join(lines) + "\n"
    ext = report["extender"]
    lines.append("")
    if "boundTo" in ext:
        lines.append(f"EXTENDER: already bound to {ext['boundTo']}")
        return "\n".join(lines) + "\n"
    lines.append(f"EXTENDER (scheduling now): {ext['verdict']}")
    g = ext.get("gang")
    if g is not None:
        n = "?" if g["minCount"] is None else g["minCount"]
        lines.append(
            f"  gang: {g['group']}, {g['members']} of {n} members, {g['bound']} bound, "
            f"{g['state']}" + (f", yields to {g['waitingFor']}" if g.get("waitingFor") else "")
        )
        if g.get("misfit"):
            m = g["misfit"]
            lines.append(f"  {m['member']} fits no node beside the members placed before it:")
            lines += [f"    {node}: {why}" for node, why in m["nodes"].items()]
    gate = ext.get("gate")
    if gate is not None:
        after = "-" if gate["shareAfter"] is None else f"{gate['shareAfter']:.4f}"
        lines.append(
            f"  gate: current share {gate['currentShare']:.4f}, after this pod {after}, "
            f"fair share {gate['fairShare']:.4f}"
            + (f", waiting for {gate['waitingFor']}" if gate["waitingFor"] else "")
            + (
                f" (its blocked pod {gate['blockedPod']}: fits no node now, would fit a "
                "drained one; holdForBlockedTenants)"
                if gate.get("blockedPod")
                else ""
            )
        )
    rows = [[n["node"], "fits" if n["fits"] else "no", n["reason"]] for n in ext["nodes"]]
    lines += ["  " + line for line in _table(["NODE", "FIT", "REASON"], rows)]
    return "\n".join(lines) + "\n"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2430;background:#f7f8fa}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
.muted{color:#667}table{border-collapse:collapse;background:#fff;margin:.3em 0 1em}
th,td{border:1px solid #d5d9e0;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.tenant{background:#fff;border:1px solid #d5d9e0;border-radius:6px;padding:.6em 1em;
margin:.6em 0;display:inline-block;vertical-align:top;margin-right:1em}
.bar{display:inline-block;height:.7em;background:#4a7bd0;border-radius:2px}
.fair{display:inline-block;height:.7em;background:#c5d3ea;border-radius:2px}
.dev{display:inline-block;width:7.5em;border:1px solid #b8c0cc;border-radius:4px;
margin:2px;padding:2px 4px;font-size:12px;background:#fff}
.dev.full{background:#fde9d9}.dev.part{background:#fff6d6}.bad{color:#b00020}
.held{color:#8a4b00}
"""


def _e(value: object) -> str:
    return html.escape(_cell(value))


def render_status_html(report: Mapping[str, Any], *, refresh: int = 10) -> str:
    """The status report as one self-contained HTML page (inline CSS, no scripts or
    external assets) that reloads itself every ``refresh`` seconds."""
    c = report["cluster"]
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="refresh" content="{int(refresh)}">',
        "<title>fairshare status</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>fairshare status</h1>",
        f"<p class=muted id=cluster>{c['nodes']} node(s) &middot; GPUs "
        f"<b id=gpus-allocated>{c['gpusAllocated']:g}</b> / <b id=gpus>{c['gpus']:g}</b> "
        f"allocated ({100 * c['gpuAllocationRatio']:.1f}%) &middot; fragmentation "
        f"{c['gpuFragmentation']:g} GPU ({100 * c['gpuFragmentationRatio']:.1f}%) &middot; "
        f"refreshes every {int(refresh)} s</p>",
        "<h2>Tenants</h2>",
    ]
    for t in report["tenants"]:
        pods = t["pods"]
        ds, fs = t["dominantShare"], t["fairShare"]
        level = f"{t['level']}, " if t.get("level") else ""
        parent = f"in {t['parent']}, " if t.get("parent") else ""
        parts.append(f'<div class=tenant id="tenant-{_e(t["name"])}">')
        parts.append(
            f"<b>{_e(t['name'])}</b> <span class=muted>{_e(level)}{_e(parent)}"
            f"{_e(_weight_text(t))}</span><br>"
            f"dominant share <b class=share>{ds:.4f}</b> "
            f'<span class=bar style="width:{min(ds, 1) * 120:.0f}px"></span><br>'
            f"fair share <b class=fair-share>{fs:.4f}</b> "
            f'<span class=fair style="width:{min(fs, 1) * 120:.0f}px"></span><br>'
            f"pods: <b class=running>{pods['running']}</b> running, "
            f"<b class=pending>{pods['pending']}</b> pending, "
            f"<b class=held-count>{pods['held']}</b> held by the gate"
        )
        quota = any("quotaUsed" in r for r in t["resources"])
        head = "".join(
            f"<th>{h}</th>"
            for h in ["resource", "used", *(["quota used"] if quota else []), "guaranteed", "limit"]
        )
        parts.append(f"<table><tr>{head}</tr>")
        for r in t["resources"]:
            if r["resource"] != GPU and not _counts(r):
                continue
            cells = [r["used"], *([r.get("quotaUsed")] if quota else []), r["guaranteed"]]
            cells.append(r["limit"])
            tds = "".join(f"<td class=num>{_e(v)}</td>" for v in cells)
            parts.append(f"<tr><td>{_e(r['resource'])}</td>{tds}</tr>")
        parts.append("</table></div>")
    parts.append("<h2>GPU devices</h2><table id=nodes><tr><th>node</th><th>model</th>")
    parts.append("<th>health</th><th>devices (free GPU; tenants holding shares)</th></tr>")
    for n in report["nodes"]:
        devs = []
        for d in n["devices"]:
            used = 1 - d["free"]
            cls = "full" if d["free"] <= 0 else ("part" if used > 0 else "")
            who = ", ".join(f"{_e(t)} {g:g}" for t, g in d["holders"].items()) or "unused"
            devs.append(
                f'<span class="dev {cls}">gpu{d["index"]}: {d["free"]:g} free<br>{who}</span>'
            )
        health = "ok" if n["healthy"] else f"<span class=bad>{_e(n['healthReason'])}</span>"
        parts.append(
            f"<tr><td>{_e(n['name'])}</td><td>{_e(n['gpuModel'] or '-')}</td>"
            f"<td>{health}</td><td>{''.join(devs) or '-'}</td></tr>"
        )
    parts.append("</table>")
    parts.append("<h2>Pods the gate holds</h2>")
    if report["heldPods"]:
        parts.append("<table id=held><tr><th>pod</th><th>tenant</th><th>reason</th></tr>")
        for p in report["heldPods"]:
            parts.append(
                f"<tr><td>{_e(p['pod'])}</td><td>{_e(p['tenant'])}</td>"
                f"<td class=held>{_e(p['reason'])}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p class=muted id=held>none</p>")
    if report.get("gangs"):
        parts.append("<h2>Pod groups</h2>")
        heads = ["group", "tenant", "members", "bound", "state", "held GPU", "why it waits"]
        parts.append("<table id=gangs><tr>" + "".join(f"<th>{h}</th>" for h in heads) + "</tr>")
        for g in report["gangs"]:
            parts.append("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in _gang_cells(g)) + "</tr>")
        parts.append("</table>")
    if report["pendingPods"]:
        parts.append("<h2>Other pending pods</h2>")
        parts.append("<table id=pending><tr><th>pod</th><th>tenant</th><th>reason</th></tr>")
        for p in report["pendingPods"]:
            parts.append(
                f"<tr><td>{_e(p['pod'])}</td><td>{_e(p['tenant'])}</td>"
                f"<td>{_e(p['reason'])}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "".join(parts)


def to_json(report: Mapping[str, Any]) -> str:
    """The report as indented JSON text."""
    return json.dumps(report, indent=2) + "\n"
