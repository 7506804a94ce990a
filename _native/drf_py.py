"""Dominant-resource-fairness kernel, pure-Python twin of ``drf_c.pyx``.

Computes each tenant's weighted dominant share (DRF: Ghodsi et al., "Dominant
Resource Fairness: Fair Allocation of Multiple Resource Types", NSDI'11)::

    share[t] = max_r  res_weights[r] * used[t, r] / capacity[r]
    out[t]   = share[t] / tenant_weights[t]

Range: ``[0, +inf]``; a share of 1 means the tenant holds the whole cluster of its
dominant resource. Edge cases (the compiled twin is built with ``cdivision``, so
neither twin may divide by zero):

* ``capacity[r] == 0``: ignored while ``used[t, r] == 0``, else the share is ``+inf``
  (usage of a resource the cluster does not have).
* ``res_weights[r] == 0``: the resource does not count at all, even at zero capacity.
* a tenant with no usage has share 0.
* ``tenant_weights[t] == 0``: ``+inf`` when the share is > 0, else 0.

Must not import anything from the project: it takes buffers and numbers. The loop
order and the float operations are those of ``drf_c.pyx``, so results are bit-equal.
"""

from __future__ import annotations

import math
from typing import Protocol

__all__ = ["dominant_shares"]


class _Floats(Protocol):
    def __getitem__(self, index: int, /) -> float: ...


class _FloatsOut(_Floats, Protocol):
    def __setitem__(self, index: int, value: float, /) -> None: ...


def dominant_shares(
    used: _Floats,
    capacity: _Floats,
    res_weights: _Floats,
    tenant_weights: _Floats,
    n_tenants: int,
    n_res: int,
    out: _FloatsOut,
) -> None:
    """Write each tenant's weighted dominant share into ``out`` (length ``n_tenants``).

    ``used`` is T×R (row-major), ``capacity`` and ``res_weights`` are R,
    ``tenant_weights`` is T. ``out[t] = max_r(w_r · used[t,r] / cap_r) / tenant_weights[t]``
    with the zero-capacity and zero-weight rules of the module docstring.
    """
    inf = math.inf
    for t in range(n_tenants):
        base = t * n_res
        share = 0.0
        for r in range(n_res):
            w = res_weights[r]
            if w == 0.0:
                continue
            u = used[base + r]
            c = capacity[r]
            if c > 0.0:
                v = w * u / c
                if v > share:
                    share = v
            elif u != 0.0:
                share = inf
        tw = tenant_weights[t]
        if tw == 0.0:
            out[t] = inf if share > 0.0 else 0.0
        else:
            out[t] = share / tw
