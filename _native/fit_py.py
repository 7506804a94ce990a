"""Node-fit kernel, pure-Python twin of ``fit_c.pyx``.

Which nodes can take a pod, and why not, in one pass: kube-scheduler's
``NodeResourcesFit`` plus the per-device GPU check of FGD's ``Open-Gpu-Share`` filter
(Weng et al., ATC'23)::

    out[i] = -1                    if demand[r] <= free[i, r] for every r
                                   and #{g : dev_free[i, g] >= gpu_milli} >= gpu_count
           = first r (column order) with demand[r] > free[i, r]
           = n_res                 if only the device check fails

Returns the number of fitting nodes. ``gpu_count == 0`` skips the device check; absent
device slots (``dev_free < 0``) never count. Same loop order in both twins.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["fit_nodes", "fit_rows"]


class _Floats(Protocol):
    def __getitem__(self, index: int, /) -> float: ...


class _Ints(Protocol):
    def __getitem__(self, index: int, /) -> int: ...


class _IntsOut(Protocol):
    def __getitem__(self, index: int, /) -> int: ...

    def __setitem__(self, index: int, value: int, /) -> None: ...


def fit_nodes(
    free: _Floats,
    dev_free: _Floats,
    demand: _Floats,
    n_nodes: int,
    n_res: int,
    max_dev: int,
    gpu_milli: float,
    gpu_count: int,
    out: _IntsOut,
) -> int:
    """Write each node's fit verdict into ``out`` (int32) and return how many fit.

    ``free`` is N×R, ``dev_free`` is N×max_dev (``-1`` = no device in that slot),
    ``demand`` is R. ``out[i]`` is ``-1`` (fits), the first short resource column, or
    ``n_res`` when fewer than ``gpu_count`` devices have ``dev_free >= gpu_milli``.
    """
    n_fit = 0
    for i in range(n_nodes):
        base = i * n_res
        verdict = -1
        for r in range(n_res):
            if demand[r] > free[base + r]:
                verdict = r
                break
        if verdict < 0 and gpu_count > 0:
            dbase = i * max_dev
            found = 0
            for g in range(max_dev):
                f = dev_free[dbase + g]
                if f >= 0.0 and f >= gpu_milli:
                    found += 1
                    if found >= gpu_count:
                        break
            if found < gpu_count:
                verdict = n_res
        out[i] = verdict
        if verdict < 0:
            n_fit += 1
    return n_fit


def fit_rows(
    free: _Floats,
    dev_free: _Floats,
    demand: _Floats,
    healthy: _Ints,
    rows: _Ints,
    n_rows: int,
    n_res: int,
    max_dev: int,
    gpu_milli: float,
    gpu_count: int,
    check_health: int,
    out: _IntsOut,
    ok: _IntsOut,
    mask: _IntsOut,
) -> tuple[int, int]:
    """``fit_nodes`` over the candidate node rows ``rows`` only (one pass, in order).

    ``out[k]`` (int32) is node ``rows[k]``'s verdict as ``fit_nodes`` writes it, or
    ``-2`` when ``rows[k] < 0`` (not a node), or ``n_res + 1`` when ``check_health``
    and ``healthy[rows[k]] == 0`` (checked first). ``ok[k]`` is 1 when it fits, else 0;
    ``mask[rows[k]]`` is set to 1 for every fitting row (``mask`` starts zeroed, N long).
    Returns ``(fitting candidates, fitting candidates whose row was already marked)``.
    """
    n_fit = 0
    n_dup = 0
    for k in range(n_rows):
        i = rows[k]
        if i < 0:
            out[k] = -2
            ok[k] = 0
            continue
        verdict = -1
        if check_health != 0 and healthy[i] == 0:
            verdict = n_res + 1
        else:
            base = i * n_res
            for r in range(n_res):
                if demand[r] > free[base + r]:
                    verdict = r
                    break
            if verdict < 0 and gpu_count > 0:
                dbase = i * max_dev
                found = 0
                for g in range(max_dev):
                    f = dev_free[dbase + g]
                    if f >= 0.0 and f >= gpu_milli:
                        found += 1
                        if found >= gpu_count:
                            break
                if found < gpu_count:
                    verdict = n_res
        out[k] = verdict
        if verdict < 0:
            ok[k] = 1
            n_fit += 1
            if mask[i] != 0:
                n_dup += 1
            mask[i] = 1
        else:
            ok[k] = 0
    return n_fit, n_dup
