# cython: language_level=3
"""Node-scoring kernels, compiled twin of ``scoring_py.py``.

Per-node scores for one pod over N nodes × R resources, written into ``out``; masked
nodes (``mask[i] == 0``) get ``-1.0``. ``bestfit_scores`` (BestFit of Weng et al., ATC'23),
``drfh_scores`` (best-fit DRFH, Wang, Liang and Li, IEEE TPDS 2015) and
``stranding_scores`` are in [0, 1]; ``fgd_scores`` / ``fgd_node_frag`` are FGD's
fragmentation gradient and measure (Weng et al.), in milli-GPU. Zero capacity, norm and
weight never divide; each function's docstring gives the value used. Same loop order and
float operations in both twins, so results are bit-equal; KERNELS.md is the contract.

FGD computes each node's per-class state once (O(classes × devices)) and updates it per
candidate placement in O(classes); a fractional pod tries each distinct free value once.
"""

from libc.math cimport INFINITY, exp, fabs, round as c_round
from libc.stdlib cimport malloc, free as c_free

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

# Milli-GPU in one whole device: a pod asking for less than this on one device is
# fractional (FGD tries every device for it), otherwise it takes whole devices.
cdef double _MILLI_PER_GPU = 1000.0
MILLI_PER_GPU = _MILLI_PER_GPU


def bestfit_scores(
    const double[::1] free,
    const double[::1] demand,
    const double[::1] norm,
    const double[::1] weights,
    const signed char[::1] mask,
    Py_ssize_t n_nodes,
    Py_ssize_t n_res,
    double[::1] out,
):
    """BestFit (Weng et al. ATC'23): the least leftover after placement scores highest.

    ``out[i] = 1 - (Σ_r w_r · (free[i,r] - demand[r]) / norm[r]) / Σ_r w_r`` over the r
    with ``norm[r] > 0`` and ``w_r > 0``, clamped to [0, 1]. ``Σ w == 0`` scores 0.
    ``free`` is N×R, ``demand``, ``norm`` and ``weights`` are R.
    """
    cdef Py_ssize_t i, r, base
    cdef double wsum = 0.0, acc, s, nr, w
    with nogil:
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
    const double[::1] free,
    const double[::1] capacity,
    const double[::1] demand,
    const signed char[::1] mask,
    Py_ssize_t n_nodes,
    Py_ssize_t n_res,
    double[::1] out,
):
    """Best-fit DRFH (Wang et al.): how well the pod's shape matches the node's free shape.

    Over the r with ``capacity[i,r] > 0`` (n of them): ``a_r = demand[r]/capacity[i,r]``,
    ``b_r = free[i,r]/capacity[i,r]``, each divided by its own largest component;
    ``out[i] = 1 - Σ_r |a_r - b_r| / n``, clamped to [0, 1]. A vector whose largest
    component is ≤ 0 (no demand, nothing free, or no capacity at all) scores 0.5.
    ``free`` and ``capacity`` are N×R, ``demand`` is R.
    """
    cdef Py_ssize_t i, r, base, n
    cdef double amax, bmax, a, b, c, dist, s
    with nogil:
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
                    dist += fabs(demand[r] / c / amax - free[base + r] / c / bmax)
            s = 1.0 - dist / <double>n
            if s < 0.0:
                s = 0.0
            elif s > 1.0:
                s = 1.0
            out[i] = s


def stranding_scores(
    const double[::1] free,
    const double[::1] capacity,
    const double[::1] demand,
    Py_ssize_t gpu_col,
    const signed char[::1] mask,
    Py_ssize_t n_nodes,
    Py_ssize_t n_res,
    double[::1] out,
):
    """Penalise a GPU-less pod that leaves a node's free GPUs without CPU/memory.

    ``out[i] = 1`` when ``demand[gpu_col] > 0`` or the node has no free GPU
    (``free[i,gpu] <= 0`` or ``capacity[i,gpu] <= 0``). Else with
    ``g = free[i,gpu]/capacity[i,gpu]`` and ``m = min_r (free[i,r]-demand[r])/capacity[i,r]``
    over the other r with capacity > 0 (``+inf`` when there is none),
    ``out[i] = 1 - max(0, g - m)``, clamped to [0, 1].
    """
    cdef Py_ssize_t i, r, base
    cdef bint gpu_demand
    cdef double gf, gc, g, m, c, v, gap, s
    with nogil:
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
            m = INFINITY
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

cdef struct _Classes:
    # the target workload M (borrowed from the caller's buffers)
    Py_ssize_t n
    const double* cpu
    const double* milli
    const long long* count
    const long long* models
    const double* pop
    # per-class scratch for the node at hand
    double* fb         # F_n(m) before the placement
    long long* cnt     # #{g : R_g >= d_m}
    double* slt        # Σ_g R_g · 1[R_g < d_m]
    char* excl         # CPU-only class or model not allowed


cdef inline bint _model_ok(long long allowed, long long model) noexcept nogil:
    """``model`` is in the bitmask ``allowed`` (0 = any model; ids outside 0..62 never)."""
    if allowed == 0:
        return True
    if model < 0 or model > 62:
        return False
    return ((<unsigned long long>allowed) >> model) & 1


cdef double _class_state(
    const double* R, Py_ssize_t max_dev, double cpu, long long model, _Classes* k
) noexcept nogil:
    """Fill ``F_n(m)`` per class into ``k.fb`` (and the parts the deltas need); return Rtot.

    ``R`` is the node's row of ``dev_free``; slots with ``R_g < 0`` are absent.
    """
    cdef Py_ssize_t g, m
    cdef double rtot = 0.0, d, s, r
    cdef long long c
    for g in range(max_dev):
        r = R[g]
        if r >= 0.0:
            rtot += r
    for m in range(k.n):
        d = k.milli[m]
        if d <= 0.0 or not _model_ok(k.models[m], model):
            # CPU-only class, or the node's GPU model is not allowed: all idle GPU is
            # fragment for it.
            k.excl[m] = 1
            k.fb[m] = rtot
            continue
        c = 0
        s = 0.0
        for g in range(max_dev):
            r = R[g]
            if r < 0.0:
                continue
            if r >= d:
                c += 1
            else:
                s += r
        k.excl[m] = 0
        k.cnt[m] = c
        k.slt[m] = s
        k.fb[m] = s if (c >= k.count[m] and cpu >= k.cpu[m]) else rtot
    return rtot


cdef double _delta(
    const double* R,
    const Py_ssize_t* taken,
    Py_ssize_t n_taken,
    double milli,
    double cpu_after,
    double rtot_after,
    _Classes* k,
) noexcept nogil:
    """``Σ_m p_m (F_n(m) - F_n'(m))`` after taking ``milli`` from each device in ``taken``.

    Each class's count and small-device sum are updated, not recomputed.
    """
    cdef Py_ssize_t m, j
    cdef double delta = 0.0, fa, d, s, r, r2
    cdef long long c
    for m in range(k.n):
        if k.excl[m]:
            fa = rtot_after
        else:
            d = k.milli[m]
            c = k.cnt[m]
            s = k.slt[m]
            for j in range(n_taken):
                r = R[taken[j]]
                r2 = r - milli
                if r >= d:
                    c -= 1
                else:
                    s -= r
                if r2 >= d:
                    c += 1
                else:
                    s += r2
            fa = s if (c >= k.count[m] and cpu_after >= k.cpu[m]) else rtot_after
        delta += k.pop[m] * (k.fb[m] - fa)
    return delta


cdef int _alloc(_Classes* k, Py_ssize_t n_classes) noexcept:
    k.n = n_classes
    k.fb = <double*>malloc((n_classes + 1) * sizeof(double))
    k.cnt = <long long*>malloc((n_classes + 1) * sizeof(long long))
    k.slt = <double*>malloc((n_classes + 1) * sizeof(double))
    k.excl = <char*>malloc((n_classes + 1) * sizeof(char))
    return k.fb != NULL and k.cnt != NULL and k.slt != NULL and k.excl != NULL


cdef void _release(_Classes* k) noexcept:
    c_free(k.fb)
    c_free(k.cnt)
    c_free(k.slt)
    c_free(k.excl)


def fgd_scores(
    const double[::1] dev_free,
    Py_ssize_t max_dev,
    const double[::1] node_cpu_free,
    const long long[::1] node_model,
    const signed char[::1] mask,
    Py_ssize_t n_nodes,
    double pod_cpu,
    double pod_gpu_milli,
    Py_ssize_t pod_gpu_count,
    const double[::1] cls_cpu,
    const double[::1] cls_gpu_milli,
    const long long[::1] cls_gpu_count,
    const long long[::1] cls_models,
    const double[::1] cls_pop,
    Py_ssize_t n_classes,
    double[::1] out_delta,
    int[::1] out_device,
):
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
    cdef _Classes k
    cdef Py_ssize_t* taken
    cdef Py_ssize_t i, g, h, n_taken, dev
    cdef const double* R
    cdef const double* dev_base = &dev_free[0]
    cdef double rtot, cpu_after, best, delta, r, milli
    cdef bint cpu_only, fractional, dup
    k.cpu = &cls_cpu[0]
    k.milli = &cls_gpu_milli[0]
    k.count = &cls_gpu_count[0]
    k.models = &cls_models[0]
    k.pop = &cls_pop[0]
    taken = <Py_ssize_t*>malloc((max_dev + 1) * sizeof(Py_ssize_t))
    if not _alloc(&k, n_classes) or taken == NULL:
        _release(&k)
        c_free(taken)
        raise MemoryError()
    cpu_only = pod_gpu_count <= 0 or pod_gpu_milli <= 0.0
    fractional = not cpu_only and pod_gpu_count == 1 and pod_gpu_milli < _MILLI_PER_GPU
    milli = 0.0 if cpu_only else pod_gpu_milli
    try:
        with nogil:
            for i in range(n_nodes):
                if mask[i] == 0:
                    out_delta[i] = -INFINITY
                    out_device[i] = -1
                    continue
                R = dev_base + i * max_dev
                rtot = _class_state(R, max_dev, node_cpu_free[i], node_model[i], &k)
                cpu_after = node_cpu_free[i] - pod_cpu
                best = -INFINITY
                dev = -1
                if cpu_only:
                    best = _delta(R, taken, 0, milli, cpu_after, rtot - milli * 0.0, &k)
                elif fractional:
                    for g in range(max_dev):
                        r = R[g]
                        if r < 0.0 or r < milli:
                            continue
                        # the same free value as a lower device gives the same delta,
                        # and the lower index wins ties anyway
                        dup = False
                        for h in range(g):
                            if R[h] == r:
                                dup = True
                                break
                        if dup:
                            continue
                        taken[0] = g
                        delta = _delta(R, taken, 1, milli, cpu_after, rtot - milli * 1.0, &k)
                        if dev < 0 or delta > best:
                            best = delta
                            dev = g
                else:
                    n_taken = 0
                    for g in range(max_dev):
                        if n_taken >= pod_gpu_count:
                            break
                        r = R[g]
                        if r >= 0.0 and r >= milli:
                            taken[n_taken] = g
                            n_taken += 1
                    if n_taken >= pod_gpu_count:
                        best = _delta(
                            R, taken, n_taken, milli, cpu_after,
                            rtot - milli * <double>n_taken, &k,
                        )
                        dev = taken[0]
                out_delta[i] = best
                out_device[i] = <int>dev
    finally:
        _release(&k)
        c_free(taken)


def fgd_node_frag(
    const double[::1] dev_free,
    Py_ssize_t max_dev,
    const double[::1] node_cpu_free,
    const long long[::1] node_model,
    Py_ssize_t n_nodes,
    const double[::1] cls_cpu,
    const double[::1] cls_gpu_milli,
    const long long[::1] cls_gpu_count,
    const long long[::1] cls_models,
    const double[::1] cls_pop,
    Py_ssize_t n_classes,
    double[::1] out,
):
    """FGD's fragmentation amount per node (Weng et al. ATC'23).

    ``out[i] = F_i(M) = Σ_m p_m · F_i(m)`` with ``F_i(m)`` as in ``fgd_scores``, in
    milli-GPU; returns ``F(M) = Σ_i F_i(M)`` (summed in node order). A node without
    devices has 0. Divide by ``Σ_i Σ_g R_g`` for the fragmentation ratio.
    """
    cdef _Classes k
    cdef Py_ssize_t i, m
    cdef const double* dev_base = &dev_free[0]
    cdef double f, total = 0.0
    k.cpu = &cls_cpu[0]
    k.milli = &cls_gpu_milli[0]
    k.count = &cls_gpu_count[0]
    k.models = &cls_models[0]
    k.pop = &cls_pop[0]
    if not _alloc(&k, n_classes):
        _release(&k)
        raise MemoryError()
    try:
        with nogil:
            for i in range(n_nodes):
                _class_state(dev_base + i * max_dev, max_dev, node_cpu_free[i],
                             node_model[i], &k)
                f = 0.0
                for m in range(n_classes):
                    f += k.pop[m] * k.fb[m]
                out[i] = f
                total += f
    finally:
        _release(&k)
    return total


def flag_scores(
    const signed char[::1] flags,
    const signed char[::1] mask,
    Py_ssize_t n_nodes,
    double[::1] out,
):
    """``out[i] = 1.0`` if ``flags[i] != 0`` else ``0.0`` (a per-node yes/no as a score)."""
    cdef Py_ssize_t i
    with nogil:
        for i in range(n_nodes):
            if mask[i] == 0:
                out[i] = -1.0
            elif flags[i] != 0:
                out[i] = 1.0
            else:
                out[i] = 0.0


def sigmoid_scores(
    const double[::1] delta,
    const signed char[::1] mask,
    Py_ssize_t n_nodes,
    double scale,
    double[::1] out,
):
    """``out[i] = 1 / (1 + exp(-delta[i] / scale))`` where ``delta[i] > -inf``; a masked
    node, or one whose delta is ``-inf`` (or NaN), gets ``-1.0``."""
    cdef Py_ssize_t i
    cdef double d
    with nogil:
        for i in range(n_nodes):
            d = delta[i]
            if mask[i] == 0 or not (d > -INFINITY):
                out[i] = -1.0
            else:
                out[i] = 1.0 / (1.0 + exp(-d / scale))


def combine_scores(
    const double[::1] terms,
    const double[::1] weights,
    Py_ssize_t n_terms,
    Py_ssize_t n_nodes,
    const int[::1] rows,
    const signed char[::1] ok,
    Py_ssize_t n_rows,
    double total,
    double max_score,
    long long lo,
    long long hi,
    double[::1] out_raw,
    long long[::1] out_int,
):
    """The weighted score of each candidate ``k`` (node ``rows[k]``), where ``ok[k]``.

    ``terms`` is T×N (term t's score of node i at ``t * N + i``). With
    ``acc = Σ_t weights[t] · max(0, terms[t, i])`` summed in term order from 0.0,
    ``out_raw[k] = acc / total`` (0.0 when ``total <= 0``) and ``out_int[k]`` is
    ``out_raw[k] · max_score`` rounded half to even, clamped to [lo, hi]. Candidates
    with ``ok[k] == 0`` get 0.0 and 0.
    """
    cdef Py_ssize_t k, i, t
    cdef double acc, v, s, x, rounded
    cdef long long q
    with nogil:
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
            x = s * max_score
            rounded = c_round(x)
            if fabs(x - rounded) == 0.5:
                rounded = 2.0 * c_round(x / 2.0)
            if rounded < <double>lo:
                q = lo
            elif rounded > <double>hi:
                q = hi
            else:
                q = <long long>rounded
            out_int[k] = q
