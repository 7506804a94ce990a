"""Dominant-resource-fairness kernel, pure-Python twin of ``drf_c.pyx``.

Each tenant's weighted dominant share (Ghodsi et al., "Dominant Resource Fairness",
NSDI'11), in ``[0, +inf]``::

    share[t] = max_r  res_weights[r] * used[t, r] / capacity[r]
    out[t]   = share[t] / tenant_weights[t]

No zero division (the compiled twin is built with ``cdivision``): ``capacity[r] == 0`` is
ignored while ``used[t, r] == 0``, else the share is ``+inf``; ``res_weights[r] == 0``
never counts; no usage gives 0; ``tenant_weights[t] == 0`` gives ``+inf`` when the share
is > 0, else 0. Same loop order and float operations in both twins (built with
``-ffp-contract=off``), so results are bit-equal.
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
