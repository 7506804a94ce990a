"""Weighted dominant-resource fairness (Ghodsi et al., NSDI'11): dominant shares and the
fair allocation. Deterministic: tenants are always visited in name order.

* A tenant's **dominant share** is ``max_r(rw_r * used_r / capacity_r) / w_t`` (``rw_r``
  the config's resource weight, ``w_t`` the tenant's weight). A resource the cluster has
  none of is ignored, used or not, so no tenant's share becomes infinite.
* The **fair allocation** is progressive filling: from its ``guaranteed`` level, each
  tenant's allocation grows along its demand (running + pending), weighted dominant
  shares rising at the same pace, until it meets its demand or its ``limit`` or a
  resource it needs runs out. Nothing a tenant could still use is left unassigned.

Modules: ``shares`` (dominant shares, the allocation's types), ``allocation`` (flat
DRF), ``hierarchy`` (H-DRF) with ``tree`` and ``filling``; every name other modules use
is re-exported here. The gate that holds a tenant at its fair share is ``fairshare.gate``.
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
