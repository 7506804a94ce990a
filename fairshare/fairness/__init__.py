"""Weighted dominant-resource fairness: shares, the fair allocation, and the gate.

Pure and deterministic: no network, no clock, no globals; tenants are always
visited in name order. Must not import aiohttp, kubernetes_asyncio or
prometheus_client. The per-tenant share kernel is in ``_native.drf``.

Definitions (Ghodsi et al., "Dominant Resource Fairness", NSDI'11, with weights):

* A tenant's **dominant share** is ``max_r(rw_r * used_r / capacity_r) / w_t`` where
  ``rw_r`` is the resource weight from the config and ``w_t`` the tenant's weight.
  A resource of zero capacity is ignored, used or not: the cluster's arrays hold none
  of it (GPUs offered only through DRA, ``storage`` with no capacity declared), so no
  share of it can be measured, and one tenant's use of it must not make its share
  infinite (which would freeze every fair allocation it takes part in).
* The **fair allocation** is computed by progressive filling: every tenant's
  allocation grows along the direction of its demand (running + pending), with
  weighted dominant shares rising at the same pace, starting from its
  ``guaranteed`` level. A tenant stops growing when it reaches its demand, its
  ``limit``, or when a resource it needs is exhausted. The result is Pareto-efficient
  for divisible demand, so it is work-conserving: nothing a tenant could still use is
  left unassigned.
* The **gate**: a pod of tenant t waits when t's share *after* the pod would exceed
  t's fair share **and** another tenant u with a lower current share (ties broken by
  tenant name) has a pending pod that fits now. The lowest-share tenant with a fitting
  pod is never held back, so no capacity is idle while a pod that fits waits.
* With ``holdForBlockedTenants`` (opt-in) u also counts when its waiting pod fits no
  node now but would fit a node drained of its pods (*blocked*, not unrunnable): t then
  waits even though capacity may stay idle, so that room freed later goes to u. A pod
  that fits no node even drained never holds anyone.
* With ``yieldBand`` b > 0 (opt-in) the gate applies from ``(1 - b)`` × t's fair share
  instead of from the fair share, for contenders with a pod that fits now (blocked
  pods hold only above the fair share). Below the fair share the order is by the
  fraction of its own fair share each tenant holds (``gating.check_fair_gate`` passes
  those fractions as the current shares): tenants near their fair shares go in turn,
  so what fragmentation leaves idle at the end is spread over them. Still
  work-conserving.

Modules: ``shares`` (dominant shares, the allocation's types, effective weights, Jain's
index), ``allocation`` (``fair_allocation``, flat DRF), ``hierarchy`` (H-DRF), ``tree``
(the tenant tree H-DRF works on), ``filling`` (the tree's filling, event by event) and
``gate`` (the gate); every name other modules use is re-exported here.
"""

from __future__ import annotations

from fairshare.fairness.allocation import fair_allocation
from fairshare.fairness.gate import (
    Contender,
    GateDecision,
    check_gate,
    gate_floor,
    goes_first,
)
from fairshare.fairness.hierarchy import hierarchical_allocation
from fairshare.fairness.shares import (
    EPS,
    MIN_LEVEL,
    CurrentShare,
    FairShare,
    ShareAfter,
    TenantDemand,
    dominant_shares,
    effective_weights,
    jain_index,
)

# Two private helpers the property tests check the allocation against.
from fairshare.fairness.shares import _dom as _dom
from fairshare.fairness.shares import _level as _level

__all__ = [
    "EPS",
    "MIN_LEVEL",
    "Contender",
    "CurrentShare",
    "FairShare",
    "GateDecision",
    "ShareAfter",
    "TenantDemand",
    "check_gate",
    "dominant_shares",
    "effective_weights",
    "fair_allocation",
    "gate_floor",
    "goes_first",
    "hierarchical_allocation",
    "jain_index",
]
