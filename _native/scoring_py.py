"""Node-scoring kernels, pure-Python twin of ``scoring_c.pyx``.

Per-node scores for one pod over N nodes × R resources, written into ``out``; masked
nodes (``mask[i] == 0``) get ``-1.0``. ``bestfit_scores`` (BestFit of Weng et al., ATC'23),
``drfh_scores`` (best-fit DRFH, Wang, Liang and Li, IEEE TPDS 2015) and
``stranding_scores`` are in [0, 1]; ``fgd_scores`` / ``fgd_node_frag`` are FGD's
fragmentation gradient and measure (Weng et al.), in milli-GPU. Zero capacity, norm and
weight never divide; each function's docstring gives the value used. Same loop order and
float operations in both twins, so results are bit-equal; KERNELS.md is the contract.
"""

from __future__ import annotations

import math
from typing import Protocol

__all__ = [
    "bestfit_scores",
    "combine_scores",
    "drfh_scores",
    "fgd_node_frag",
    "fgd_scores",
    "flag_scores",
    "sigmoid_scores",
    "stranding_scores",
]

#: Milli-GPU in one whole device: a pod asking for less than this on one device is
#: fractional (FGD tries every device for it), otherwise it takes whole devices.
MILLI_PER_GPU = 1000.0


class _Floats(Protocol):
    def __getitem__(self, index: int, /) -> float: ...


class _FloatsOut(_Floats, Protocol):
    def __setitem__(self, index: int, value: float, /) -> None: ...


class _Ints(Protocol):
    def __getitem__(self, index: int, /) -> int: ...


class _IntsOut(_Ints, Protocol):
    def __setitem__(self, index: int, value: int, /) -> None: ...


def bestfit_scores(
    free: _Floats,
    demand: _Floats,
    norm: _Floats,
    weights: _Floats,
    mask: _Ints,
    n_nodes: int,
    n_res: int,
    out: _FloatsOut,
) -> None:
    """BestFit (Weng et al. ATC'23): the least leftover after placement scores highest.

    ``out[i] = 1 - (Σ_r w_r · (free[i,r] - demand[r]) / norm[r]) / Σ_r w_r`` over the r
    with ``norm[r] > 0`` and ``w_r > 0``, clamped to [0, 1]. ``Σ w == 0`` scores 0.
    ``free`` is N×R, ``demand``, ``norm`` and ``weights`` are R.
    """
    wsum = 0.0
    for r in range(n_res):
        if norm[r] > 0.0 and weights[r] > 0.0:
            wsum += weights[r]
    for i in range(n_nodes):
        if mask[i] == 0:
            out[i] = -1.0
            continue
        if wsum == 0.0:
            out[i] = 0.0
            continue
        base = i * n_res
        acc = 0.0
        for r in range(n_res):
            nr = norm[r]
            w = weights[r]
            if nr > 0.0 and w > 0.0:
                acc += w * (free[base + r] - demand[r]) / nr
        s = 1.0 - acc / wsum
        if s < 0.0:
            s = 0.0
        elif s > 1.0:
            s = 1.0
        out[i] = s


def drfh_scores(
    free: _Floats,
    capacity: _Floats,
    demand: _Floats,
    mask: _Ints,
    n_nodes: int,
    n_res: int,
    out: _FloatsOut,
) -> None:
    """Best-fit DRFH (Wang et al.): how well the pod's shape matches the node's free shape.

    Over the r with ``capacity[i,r] > 0`` (n of them): ``a_r = demand[r]/capacity[i,r]``,
    ``b_r = free[i,r]/capacity[i,r]``, each divided by its own largest component;
    ``out[i] = 1 - Σ_r |a_r - b_r| / n``, clamped to [0, 1]. A vector whose largest
    component is ≤ 0 (no demand, nothing free, or no capacity at all) scores 0.5.
    ``free`` and ``capacity`` are N×R, ``demand`` is R.
    """
    for i in range(n_nodes):
        if mask[i] == 0:
            out[i] = -1.0
            continue
        base = i * n_res
        amax = 0.0
        bmax = 0.0
        n = 0
        for r in range(n_res):
            c = capacity[base + r]
            if c > 0.0:
                n += 1
                a = demand[r] / c
                b = free[base + r] / c
                if a > amax:
                    amax = a
                if b > bmax:
                    bmax = b
        if amax <= 0.0 or bmax <= 0.0:
            out[i] = 0.5
            continue
        dist = 0.0
        for r in range(n_res):
            c = capacity[base + r]
            if c > 0.0:
                dist += abs(demand[r] / c / amax - free[base + r] / c / bmax)
        s = 1.0 - dist / n
        if s < 0.0:
            s = 0.0
        elif s > 1.0:
            s = 1.0
        out[i] = s


def stranding_scores(
    free: _Floats,
    capacity: _Floats,
    demand: _Floats,
    gpu_col: int,
    mask: _Ints,
    n_nodes: int,
    n_res: int,
    out: _FloatsOut,
) -> None:
    """Penalise a GPU-less pod that leaves a node's free GPUs without CPU/memory.

    ``out[i] = 1`` when ``demand[gpu_col] > 0`` or the node has no free GPU
    (``free[i,gpu] <= 0`` or ``capacity[i,gpu] <= 0``). Else with
    ``g = free[i,gpu]/capacity[i,gpu]`` and ``m = min_r (free[i,r]-demand[r])/capacity[i,r]``
    over the other r with capacity > 0 (``+inf`` when there is none),
    ``out[i] = 1 - max(0, g - m)``, clamped to [0, 1].
    """
    gpu_demand = demand[gpu_col] > 0.0
    for i in range(n_nodes):
        if mask[i] == 0:
            out[i] = -1.0
            continue
        base = i * n_res
        gf = free[base + gpu_col]
        gc = capacity[base + gpu_col]
        if gpu_demand or gf <= 0.0 or gc <= 0.0:
            out[i] = 1.0
            continue
        g = gf / gc
        m = math.inf
        for r in range(n_res):
            if r == gpu_col:
                continue
            c = capacity[base + r]
            if c > 0.0:
                v = (free[base + r] - demand[r]) / c
                if v < m:
                    m = v
        gap = g - m
        s = 1.0 if gap <= 0.0 else 1.0 - gap
        if s < 0.0:
            s = 0.0
        out[i] = s


# --- FGD -----------------------------------------------------------------------------


def _model_ok(allowed: int, model: int) -> bool:
    """``model`` is in the bitmask ``allowed`` (0 = any model; ids outside 0..62 never)."""
    if allowed == 0:
        return True
    if model < 0 or model > 62:
        return False
    return (allowed >> model) & 1 == 1


class _Classes:
    """The target workload M as lists, plus per-class scratch for the node at hand."""

    __slots__ = ("cnt", "count", "cpu", "excl", "fb", "milli", "models", "pop", "slt")

    def __init__(
        self,
        cls_cpu: _Floats,
        cls_gpu_milli: _Floats,
        cls_gpu_count: _Ints,
        cls_models: _Ints,
        cls_pop: _Floats,
        n_classes: int,
    ) -> None:
        self.cpu = [cls_cpu[m] for m in range(n_classes)]
        self.milli = [cls_gpu_milli[m] for m in range(n_classes)]
        self.count = [cls_gpu_count[m] for m in range(n_classes)]
        self.models = [cls_models[m] for m in range(n_classes)]
        self.pop = [cls_pop[m] for m in range(n_classes)]
        self.fb = [0.0] * n_classes  # F_n(m) before the placement
        self.cnt = [0] * n_classes  # #{g : R_g >= d_m}
        self.slt = [0.0] * n_classes  # Σ_g R_g · 1[R_g < d_m]
        self.excl = [False] * n_classes  # CPU-only class or model not allowed


def _class_state(devs: list[float], cpu: float, model: int, k: _Classes) -> float:
    """Fill ``F_n(m)`` per class into ``k.fb`` (and the parts the deltas need); return Rtot.

    ``devs`` holds the node's present devices (free milli ≥ 0) in index order.
    """
    c_cpu, c_milli, c_count, c_models = k.cpu, k.milli, k.count, k.models
    fb, cnt, slt, excl = k.fb, k.cnt, k.slt, k.excl
    rtot = 0.0
    for r in devs:
        rtot += r
    for m in range(len(c_milli)):
        d = c_milli[m]
        if d <= 0.0 or not _model_ok(c_models[m], model):
            # CPU-only class, or the node's GPU model is not allowed: all idle GPU is
            # fragment for it.
            excl[m] = True
            fb[m] = rtot
            continue
        c = 0
        s = 0.0
        for r in devs:
            if r >= d:
                c += 1
            else:
                s += r
        excl[m] = False
        cnt[m] = c
        slt[m] = s
        fb[m] = s if (c >= c_count[m] and cpu >= c_cpu[m]) else rtot
    return rtot


def _delta(
    taken: list[float], milli: float, cpu_after: float, rtot_after: float, k: _Classes
) -> float:
    """``Σ_m p_m (F_n(m) - F_n'(m))`` after taking ``milli`` from each device in ``taken``.

    ``taken`` lists the free milli of the devices the pod takes, before it takes them;
    each class's count and small-device sum are updated, not recomputed.
    """
    c_cpu, c_milli, c_count, c_pop = k.cpu, k.milli, k.count, k.pop
    fb, cnt, slt, excl = k.fb, k.cnt, k.slt, k.excl
    delta = 0.0
    for m in range(len(c_milli)):
        if excl[m]:
            fa = rtot_after
        else:
            d = c_milli[m]
            c = cnt[m]
            s = slt[m]
            for r in taken:
                r2 = r - milli
                if r >= d:
                    c -= 1
                else:
                    s -= r
                if r2 >= d:
                    c += 1
                else:
                    s += r2
            fa = s if (c >= c_count[m] and cpu_after >= c_cpu[m]) else rtot_after
        delta += c_pop[m] * (fb[m] - fa)
    return delta


def fgd_scores(
    dev_free: _Floats,
    max_dev: int,
    node_cpu_free: _Floats,
    node_model: _Ints,
    mask: _Ints,
    n_nodes: int,
    pod_cpu: float,
    pod_gpu_milli: float,
    pod_gpu_count: int,
    cls_cpu: _Floats,
    cls_gpu_milli: _Floats,
    cls_gpu_count: _Ints,
    cls_models: _Ints,
    cls_pop: _Floats,
    n_classes: int,
    out_delta: _FloatsOut,
    out_device: _IntsOut,
) -> None:
    """Fragmentation gradient of FGD (Weng et al. ATC'23) for one pod on every node.

    ``out_delta[i] = F_i(M) - F_i'(M) = Σ_m p_m (F_i(m) - F_i'(m))`` in milli-GPU, where
    ``F_i(m)`` is node i's fragmentation for task class m::

        F_i(m) = Σ_g R_g                  if d_m == 0 or node_model[i] not in S_m (S_m ≠ ∅)
               = Σ_g R_g · 1[R_g < d_m]   if #{g : R_g >= d_m} >= k_m and C_i >= c_m
               = Σ_g R_g                  otherwise

    and ``'`` is the node after the placement (C_i reduced by ``pod_cpu``). Higher is
    better. Placement: a CPU-only pod (count or milli 0) takes no device
    (``out_device = -1``); a fractional pod (count 1, milli < 1000) tries each distinct
    free value among the devices with ``R_g >= milli`` and keeps the best delta (lowest
    device index on ties); any other pod takes the first ``count`` devices with
    ``R_g >= milli`` (for 1000 milli: the fully free ones) and reports the first.
    Masked-out nodes, and nodes without room for the pod's devices, get ``-inf``/``-1``.
    """
    k = _Classes(cls_cpu, cls_gpu_milli, cls_gpu_count, cls_models, cls_pop, n_classes)
    cpu_only = pod_gpu_count <= 0 or pod_gpu_milli <= 0.0
    fractional = not cpu_only and pod_gpu_count == 1 and pod_gpu_milli < MILLI_PER_GPU
    milli = 0.0 if cpu_only else pod_gpu_milli
    for i in range(n_nodes):
        if mask[i] == 0:
            out_delta[i] = -math.inf
            out_device[i] = -1
            continue
        dbase = i * max_dev
        slots = [dev_free[dbase + g] for g in range(max_dev)]
        devs = [r for r in slots if r >= 0.0]
        rtot = _class_state(devs, node_cpu_free[i], node_model[i], k)
        cpu_after = node_cpu_free[i] - pod_cpu
        best = -math.inf
        dev = -1
        if cpu_only:
            best = _delta([], milli, cpu_after, rtot - milli * 0, k)
        elif fractional:
            for g in range(max_dev):
                r = slots[g]
                if r < 0.0 or r < milli or r in slots[:g]:
                    # absent, too small, or the same free value as a lower device: same
                    # delta, and the lower index wins ties anyway
                    continue
                delta = _delta([r], milli, cpu_after, rtot - milli * 1, k)
                if dev < 0 or delta > best:
                    best = delta
                    dev = g
        else:
            picked = [g for g in range(max_dev) if slots[g] >= 0.0 and slots[g] >= milli]
            if len(picked) >= pod_gpu_count:
                picked = picked[:pod_gpu_count]
                taken = [slots[g] for g in picked]
                best = _delta(taken, milli, cpu_after, rtot - milli * len(picked), k)
                dev = picked[0]
        out_delta[i] = best
        out_device[i] = dev


def fgd_node_frag(
    dev_free: _Floats,
    max_dev: int,
    node_cpu_free: _Floats,
    node_model: _Ints,
    n_nodes: int,
    cls_cpu: _Floats,
    cls_gpu_milli: _Floats,
    cls_gpu_count: _Ints,
    cls_models: _Ints,
    cls_pop: _Floats,
    n_classes: int,
    out: _FloatsOut,
) -> float:
    """FGD's fragmentation amount per node (Weng et al. ATC'23).

    ``out[i] = F_i(M) = Σ_m p_m · F_i(m)`` with ``F_i(m)`` as in ``fgd_scores``, in
    milli-GPU; returns ``F(M) = Σ_i F_i(M)`` (summed in node order). A node without
    devices has 0. Divide by ``Σ_i Σ_g R_g`` for the fragmentation ratio.
    """
    k = _Classes(cls_cpu, cls_gpu_milli, cls_gpu_count, cls_models, cls_pop, n_classes)
    total = 0.0
    for i in range(n_nodes):
        dbase = i * max_dev
        devs = [r for r in (dev_free[dbase + g] for g in range(max_dev)) if r >= 0.0]
        _class_state(devs, node_cpu_free[i], node_model[i], k)
        f = 0.0
        for m in range(n_classes):
            f += k.pop[m] * k.fb[m]
        out[i] = f
        total += f
    return total


def flag_scores(flags: _Ints, mask: _Ints, n_nodes: int, out: _FloatsOut) -> None:
    """``out[i] = 1.0`` if ``flags[i] != 0`` else ``0.0`` (a per-node yes/no as a score)."""
    for i in range(n_nodes):
        if mask[i] == 0:
            out[i] = -1.0
        elif flags[i] != 0:
            out[i] = 1.0
        else:
            out[i] = 0.0


def sigmoid_scores(
    delta: _Floats, mask: _Ints, n_nodes: int, scale: float, out: _FloatsOut
) -> None:
    """``out[i] = 1 / (1 + exp(-delta[i] / scale))`` where ``delta[i] > -inf``; a masked
    node, or one whose delta is ``-inf`` (or NaN), gets ``-1.0``."""
    for i in range(n_nodes):
        d = delta[i]
        if mask[i] == 0 or not (d > -math.inf):
            out[i] = -1.0
        else:
            out[i] = 1.0 / (1.0 + math.exp(-d / scale))


def combine_scores(
    terms: _Floats,
    weights: _Floats,
    n_terms: int,
    n_nodes: int,
    rows: _Ints,
    ok: _Ints,
    n_rows: int,
    total: float,
    max_score: float,
    lo: int,
    hi: int,
    out_raw: _FloatsOut,
    out_int: _IntsOut,
) -> None:
    """The weighted score of each candidate ``k`` (node ``rows[k]``), where ``ok[k]``.

    ``terms`` is T×N (term t's score of node i at ``t * N + i``). With
    ``acc = Σ_t weights[t] · max(0, terms[t, i])`` summed in term order from 0.0,
    ``out_raw[k] = acc / total`` (0.0 when ``total <= 0``) and ``out_int[k]`` is
    ``out_raw[k] · max_score`` rounded half to even, clamped to [lo, hi]. Candidates
    with ``ok[k] == 0`` get 0.0 and 0.
    """
    for k in range(n_rows):
        if ok[k] == 0:
            out_raw[k] = 0.0
            out_int[k] = 0
            continue
        i = rows[k]
        acc = 0.0
        for t in range(n_terms):
            v = terms[t * n_nodes + i]
            if not (v > 0.0):
                v = 0.0
            acc = acc + weights[t] * v
        s = acc / total if total > 0.0 else 0.0
        out_raw[k] = s
        rounded = round(s * max_score)
        out_int[k] = min(hi, max(lo, rounded))
