"""Weighted dominant-resource fairness: dominant shares and the fair allocation.

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

Modules: ``shares`` (dominant shares, the allocation's types, effective weights, Jain's
index), ``allocation`` (``fair_allocation``, flat DRF), ``hierarchy`` (H-DRF), ``tree``
(the tenant tree H-DRF works on) and ``filling`` (the tree's filling, event by event);
every name other modules use is re-exported here. The gate that holds a tenant at its
fair share is ``fairshare.gate``.
"""

from __future__ import annotations

from fairshare.fairness.allocation import fair_allocation
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
    "CurrentShare",
    "FairShare",
    "ShareAfter",
    "TenantDemand",
    "dominant_shares",
    "effective_weights",
    "fair_allocation",
    "hierarchical_allocation",
    "jain_index",
]
