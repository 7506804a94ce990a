"""Which nodes can take a pod now, and why each other node cannot. ``filter_nodes`` checks
each resource column, a set of devices for the pod's GPU share, GPU health and model, and
MIG slices; a failing node gets a ``NodeFailure`` with kube-scheduler's text and whether
an eviction could cure it. ``fit_rows`` / ``row_failure`` are the extender's one-pass
version; ``fits_after_release`` tests one node with some pods given back.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from _native import fit
from fairshare import mig
from fairshare.podrequest import PodRequest
from fairshare.resources import CPU, GPU, MILLI_GPU
from fairshare.state.cluster import BoundPod, ClusterState
from fairshare.state.devices import mig_row, mig_use

__all__ = [
    "FilterResult",
    "NodeFailure",
    "RowFit",
    "filter_nodes",
    "fit_rows",
    "fits_after_release",
    "row_failure",
]


@dataclass(frozen=True)
class NodeFailure:
    """Why one node cannot take the pod; ``unresolvable`` if preemption cannot help."""

    node: str
    reason: str
    unresolvable: bool


@dataclass(frozen=True)
class FilterResult:
    """Rows of the nodes that fit, and a structured failure for every other one."""

    fits: tuple[int, ...]
    failed: tuple[NodeFailure, ...]
    gpu_milli: Mapping[int, float] = field(default_factory=dict)


def _fmt(name: str, value: float) -> str:
    if name == GPU:
        return f"{value / MILLI_GPU:g}"
    if name == CPU:
        return f"{value:g}m"
    return f"{value:g}"


def filter_nodes(
    state: ClusterState,
    req: PodRequest,
    *,
    rows: Sequence[int] | None = None,
    explain: bool = True,
) -> FilterResult:
    """Check the pod against ``rows`` (all nodes by default).

    A node fails when a resource is short (``Insufficient <name>``), when no set of
    devices can hold the pod's GPU share, when it is GPU-unhealthy (GPU pods only),
    or when its GPU model is not allowed. Failures that no eviction could cure
    (health, model, demand above the node's capacity) are ``unresolvable``.
    ``explain=False`` skips building failure texts (the simulator's hot path).

    A pod that takes MIG slices on a node (``mig_use``: a ``nvidia.com/mig-<profile>``
    request, or whole GPUs on a ``single``-strategy node) is checked against that
    node's free slices of the profile instead of its devices
    (``Insufficient nvidia.com/mig-<profile> (free 0, requested 1)``).
    """
    src = req.demand.gpu.source
    if src == "mig" or (src == "device" and state.mig_nodes):
        return _filter_with_mig(state, req, rows=rows, explain=explain)
    return _filter_plain(state, req, rows=rows, explain=explain)


def _filter_plain(
    state: ClusterState,
    req: PodRequest,
    *,
    rows: Sequence[int] | None,
    explain: bool,
) -> FilterResult:
    n, r, d = state.n_nodes, state.n_res, state.max_dev
    candidates = list(range(n)) if rows is None else list(rows)
    wants_gpu = req.demand.wants_gpu
    demand = array("d", req.row)
    out = array("i", bytes(4 * n))
    # Nodes that differ in device memory need different per-device milli for a
    # GPU-memory request; group the kernel calls by that value.
    groups: dict[float, list[int]] = {}
    fixed = req.fixed_gpu_milli if wants_gpu else 0.0
    if fixed is not None:
        groups[fixed] = candidates
    else:
        for i in candidates:
            groups.setdefault(req.gpu_milli_for(state.nodes[i].device_memory), []).append(i)
    final = array("i", bytes(4 * n))
    count = req.gpu_count if wants_gpu else 0
    if len(groups) == 1:
        ((milli, _),) = groups.items()
        fit.fit_nodes(state.free, state.dev_free, demand, n, r, d, milli, count, out)
    else:
        for milli, members in sorted(groups.items()):
            gm = milli if math.isfinite(milli) else float(2 * MILLI_GPU)
            fit.fit_nodes(state.free, state.dev_free, demand, n, r, d, gm, count, out)
            for i in members:
                final[i] = out[i]
        out = final
    fits: list[int] = []
    failed: list[NodeFailure] = []
    gpu_milli: dict[int, float] = {}
    gcol = state.gpu_col
    healthy, models = state.healthy, req.gpu_models
    if (
        explain
        and fixed is not None
        and not (wants_gpu and models)
        and (not wants_gpu or all(map(healthy.__getitem__, candidates)))
    ):
        # Hot path (extender filter): one per-device milli for every node and no health
        # or model failure possible, so the kernel's code alone decides each node.
        fits = [i for i in candidates if out[i] < 0]
        if len(fits) < len(candidates):
            bad = [i for i in candidates if out[i] >= 0]
            failed = [_failure(state, req, i, out[i], fixed, gcol) for i in bad]
        return FilterResult(tuple(fits), tuple(failed), dict.fromkeys(fits, fixed))
    if not explain and fixed is not None:
        # Hot path (simulator): no texts, one per-device milli for every node.
        for i in candidates:
            if out[i] >= 0 or (wants_gpu and not healthy[i]):
                continue
            if wants_gpu and models and state.nodes[i].gpu_model not in models:
                continue
            fits.append(i)
        return FilterResult(tuple(fits), (), dict.fromkeys(fits, fixed))
    for i in candidates:
        info = state.nodes[i]
        milli = req.gpu_milli_for(info.device_memory) if wants_gpu else 0.0
        if wants_gpu and not state.healthy[i]:
            if not explain:
                continue
            failed.append(NodeFailure(info.name, f"GPU unhealthy: {info.health_reason}", True))
            continue
        if wants_gpu and req.gpu_models and info.gpu_model not in req.gpu_models:
            if not explain:
                continue
            allowed = ", ".join(sorted(req.gpu_models))
            failed.append(
                NodeFailure(
                    info.name, f"GPU model {info.gpu_model or 'none'} not in {allowed}", True
                )
            )
            continue
        code = out[i]
        if code < 0:
            fits.append(i)
            gpu_milli[i] = milli
            continue
        if explain:
            failed.append(_failure(state, req, i, code, milli, gcol))
    return FilterResult(tuple(fits), tuple(failed), gpu_milli)


@dataclass(frozen=True)
class RowFit:
    """``fit_rows``'s verdict on candidate rows, one kernel pass (see ``fit.fit_rows``).

    ``codes[k]``: -1 fits, -2 not a node, ``n_res + 1`` GPU-unhealthy, else the
    ``fit_nodes`` code. ``ok[k]`` 1 where it fits; ``mask`` marks the fitting rows (N
    long); ``duplicates`` counts fitting candidates whose row was listed before.
    """

    rows: array[int]
    codes: array[int]
    ok: array[int]
    mask: array[int]
    n_fit: int
    duplicates: int
    gpu_milli: float


def fit_rows(state: ClusterState, req: PodRequest, rows: array[int]) -> RowFit | None:
    """``filter_nodes``'s verdict on candidate ``rows`` (``-1`` = not a node) in one pass
    over the candidates only, when one kernel call decides every node: the same per-device
    share everywhere (not a GPU-memory request), no MIG, no GPU-model restriction.
    None otherwise (use ``filter_nodes``)."""
    g = req.demand.gpu
    if g.source == "mig" or (g.source == "device" and state.mig_nodes):
        return None
    wants_gpu = req.demand.wants_gpu
    milli = req.fixed_gpu_milli if wants_gpu else 0.0
    if milli is None or (wants_gpu and req.gpu_models):
        return None
    k = len(rows)
    codes, ok = array("i", bytes(4 * k)), array("b", bytes(k))
    mask = array("b", bytes(state.n_nodes))
    n_fit, dups = fit.fit_rows(
        state.free, state.dev_free, array("d", req.row), state.healthy, rows, k,
        state.n_res, state.max_dev, milli, req.gpu_count if wants_gpu else 0,
        1 if wants_gpu else 0, codes, ok, mask,
    )  # fmt: skip
    return RowFit(rows, codes, ok, mask, n_fit, dups, milli)


def row_failure(state: ClusterState, req: PodRequest, fitted: RowFit, k: int) -> NodeFailure:
    """The ``NodeFailure`` ``filter_nodes`` gives for candidate ``k`` of ``fitted`` (a
    known node that does not fit)."""
    i, code = fitted.rows[k], fitted.codes[k]
    if code == state.n_res + 1:
        info = state.nodes[i]
        return NodeFailure(info.name, f"GPU unhealthy: {info.health_reason}", True)
    return _failure(state, req, i, code, fitted.gpu_milli, state.gpu_col)


def _slices_short(req: PodRequest, profile: str, free: int, count: int) -> str:
    """``Insufficient nvidia.com/mig-1g.10gb (free 0, requested 1)``; on a ``single``
    node ``Insufficient nvidia.com/gpu (MIG 1g.5gb slices: free 0, requested 1)``."""
    if req.demand.gpu.source == "mig":
        return f"Insufficient {mig.resource_name(profile)} (free {free}, requested {count})"
    return f"Insufficient {GPU} (MIG {profile} slices: free {free}, requested {count})"


def _mig_failure(
    state: ClusterState,
    req: PodRequest,
    i: int,
    use: tuple[str, int],
    *,
    free: Sequence[float],
    slices_free: int,
) -> NodeFailure | None:
    """Why the pod cannot take the slices ``use`` on node ``i`` (None if it can), given
    the node's ``free`` row and free slices of the profile."""
    info = state.nodes[i]
    if not state.healthy[i]:
        return NodeFailure(info.name, f"GPU unhealthy: {info.health_reason}", True)
    if req.gpu_models and info.gpu_model not in req.gpu_models:
        allowed = ", ".join(sorted(req.gpu_models))
        return NodeFailure(
            info.name, f"GPU model {info.gpu_model or 'none'} not in {allowed}", True
        )
    if info.mig_unknown:
        why = f"MIG profile {info.mig_unknown} of the node is not in the config's mig table"
        return NodeFailure(info.name, why, True)
    profile, count = use
    if slices_free < count:
        total = info.mig.get(profile, (0, 0.0))[0]
        text = _slices_short(req, profile, max(0, slices_free), count)
        return NodeFailure(info.name, text, total < count)
    row, r = mig_row(state, req, i, use), state.n_res
    for k in range(r):
        if row[k] > free[k]:
            name = state.index.names[k]
            text = (
                f"Insufficient {name} (free {_fmt(name, free[k])}, requested {_fmt(name, row[k])})"
            )
            return NodeFailure(info.name, text, row[k] > state.capacity[i * r + k])
    return None


def _filter_with_mig(
    state: ClusterState,
    req: PodRequest,
    *,
    rows: Sequence[int] | None,
    explain: bool,
) -> FilterResult:
    """``filter_nodes`` for a pod that takes MIG slices on some of the ``rows``: those
    are judged by ``_mig_failure``, the others by the plain filter."""
    candidates = list(range(state.n_nodes)) if rows is None else list(rows)
    uses = {i: u for i in candidates if (u := mig_use(state, req, i)) is not None}
    others = [i for i in candidates if i not in uses]
    base = _filter_plain(state, req, rows=others, explain=explain) if others else None
    fits = list(base.fits) if base else []
    failed = list(base.failed) if base else []
    gpu_milli = dict(base.gpu_milli) if base else {}
    r = state.n_res
    for i, use in uses.items():
        info = state.nodes[i]
        if use[0] not in info.mig and not info.mig_unknown:
            if explain:  # the common case for a MIG pod: a node without the profile
                text = _slices_short(req, use[0], 0, use[1])
                failed.append(NodeFailure(info.name, text, True))
            continue
        free = state.free[i * r : (i + 1) * r]
        why = _mig_failure(state, req, i, use, free=free, slices_free=state.mig_free(i, use[0]))
        if why is None:
            fits.append(i)
            gpu_milli[i] = info.mig[use[0]][1]
        elif explain:
            failed.append(why)
    order = {row: k for k, row in enumerate(candidates)}
    fits.sort(key=order.__getitem__)
    return FilterResult(tuple(fits), tuple(failed), gpu_milli)


def _failure(
    state: ClusterState, req: PodRequest, i: int, code: int, milli: float, gcol: int
) -> NodeFailure:
    info, r = state.nodes[i], state.n_res
    if code < r:
        name = state.index.names[code]
        free = state.free[i * r + code]
        cap = state.capacity[i * r + code]
        want = req.row[code]
        text = f"Insufficient {name} (free {_fmt(name, free)}, requested {_fmt(name, want)})"
        return NodeFailure(info.name, text, want > cap)
    devs = state.node_devices(i)
    present = [v for v in devs if v >= 0]
    if not present:
        if info.mig or info.mig_single:
            return NodeFailure(info.name, "no GPU devices (only MIG slices)", True)
        return NodeFailure(info.name, "no GPU devices", True)
    if not math.isfinite(milli):
        return NodeFailure(info.name, "GPU memory request larger than a device", True)
    free_txt = ", ".join(f"gpu{k}={v / MILLI_GPU:g}" for k, v in enumerate(present))
    text = (
        f"no {req.gpu_count} GPU device(s) with {milli / MILLI_GPU:g} free "
        f"(free per device: {free_txt})"
    )
    return NodeFailure(info.name, text, len(present) < req.gpu_count or milli > MILLI_GPU)


def fits_after_release(
    state: ClusterState, req: PodRequest, i: int, released: Iterable[BoundPod]
) -> bool:
    """Would ``req`` fit on node row ``i`` once the bound pods ``released`` are gone?

    The same test as ``filter_nodes`` (every resource column, then ``count`` devices with
    the per-device share free), run by the same kernel on node ``i``'s free vector and
    device row with what each released pod holds there given back. Released pods bound
    elsewhere are ignored. A GPU-memory request on a node of unknown device memory never
    fits. Used by preemption to check that the victims it keeps still make room.
    """
    r, d = state.n_res, state.max_dev
    free = array("d", state.free[i * r : (i + 1) * r])
    devs = array("d", state.dev_free[i * d : (i + 1) * d])
    name = state.nodes[i].name
    use = mig_use(state, req, i)
    slices = state.mig_free(i, use[0]) if use is not None else 0
    for pod in released:
        if pod.node != name:
            continue
        for k in range(r):
            free[k] += pod.row[k]
        for dev, milli in pod.devices:
            if 0 <= dev < d and devs[dev] >= 0:
                devs[dev] += milli
        if use is not None and pod.mig is not None and pod.mig[0] == use[0]:
            slices += pod.mig[1]
    if use is not None:
        return _mig_failure(state, req, i, use, free=free, slices_free=slices) is None
    wants_gpu = req.demand.wants_gpu
    milli = req.gpu_milli_for(state.nodes[i].device_memory) if wants_gpu else 0.0
    if not math.isfinite(milli):
        return False
    demand = array("d", req.row_on(state.gpu_col, milli) if wants_gpu else req.row)
    out = array("i", [0])
    count = req.gpu_count if wants_gpu else 0
    return bool(fit.fit_nodes(free, devs, demand, 1, r, d, milli, count, out) == 1)
