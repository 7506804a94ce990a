# cython: language_level=3
"""Dominant-resource-fairness kernel, compiled twin of ``drf_py.py``.

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

from libc.math cimport INFINITY

__all__ = ["dominant_shares"]


def dominant_shares(
    const double[::1] used,
    const double[::1] capacity,
    const double[::1] res_weights,
    const double[::1] tenant_weights,
    Py_ssize_t n_tenants,
    Py_ssize_t n_res,
    double[::1] out,
):
    """Write each tenant's weighted dominant share into ``out`` (length ``n_tenants``).

    ``used`` is T×R (row-major), ``capacity`` and ``res_weights`` are R,
    ``tenant_weights`` is T. ``out[t] = max_r(w_r · used[t,r] / cap_r) / tenant_weights[t]``
    with the zero-capacity and zero-weight rules of the module docstring.
    """
    cdef Py_ssize_t t, r, base
    cdef double share, w, u, c, v, tw
    with nogil:
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
                    share = INFINITY
            tw = tenant_weights[t]
            if tw == 0.0:
                out[t] = INFINITY if share > 0.0 else 0.0
            else:
                out[t] = share / tw
    return None
