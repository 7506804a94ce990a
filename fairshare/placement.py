"""Where a pod may go and how good each node is: the filter and scoring pipeline.

Pure: no network, no clock. Must not import aiohttp, kubernetes_asyncio or
prometheus_client. Both the scheduler extender and the simulator call these
functions on a ``ClusterState``, so a simulated policy is the deployed policy.
(STYLE.md puts filtering and scoring under ``scheduler_plugin/``; they live in the
core because the simulator, which may not import the extender, must run the same code.)

Pipeline for one pod: ``filter_nodes`` (resource fit, GPU-device fit, GPU health,
GPU model) → the fairness gate (``fairness.check_gate``, applied by the caller, which
knows the pending pods) → ``Scorer`` (a weighted sum of per-node terms in [0, 1]) →
``choose_devices`` on the winning node.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property, lru_cache
from itertools import compress
from operator import itemgetter
from typing import TypeAlias, TypeVar

from _native import fit, scoring
from fairshare import eligibility, mig
from fairshare.resources import CPU, GPU, MILLI_GPU, PodDemand, to_kernel_units
from fairshare.state.cluster import BoundPod, ClusterState

_T = TypeVar("_T")

MAX_SCORE = 10
"""Extender score range is 0..MAX_SCORE (kube-scheduler MaxExtenderPriority)."""

CHOICE_LEVELS = 30
"""The node fairshare itself chooses (the simulator's ``ours``, the extender's
``--pick-in-filter``): scores rounded to this many levels, ties to the first node of one
fixed random node order (``node_rank``). Near-equal nodes then fill in one order, which
packs; measured on openb against float scores with name-order ties in the README.
Pods of whole GPUs on a workload without model-restricted classes are the exception
(``choice_levels``)."""


@lru_cache(maxsize=1 << 16)
def node_rank(name: str) -> int:
    """A node's place in the fixed random order that breaks ties between equal levels
    (a hash of its name: the same in every process and after restarts)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def choice_levels(req: PodRequest, mix: WorkloadMix | None) -> int | None:
    """The levels ``choose_level`` rounds ``req``'s node scores to: ``CHOICE_LEVELS``,
    or None (the exact scores) for a pod of whole GPUs when no class of the workload
    mix is restricted to some GPU models.

    Measured on openb (README, seeds 42-51): the coarse levels with one fixed tie order
    pack fractional and CPU-only pods, and on fleets where some classes need certain
    models they keep whole-GPU pods off those nodes (gpuspec33 +5 points over the exact
    scores); without such classes, whole-GPU pods placed by the exact fragmentation
    gradient leave more whole GPUs usable (+0.04 to +0.57 points on 10 of the other 13
    lists, -0.10 and -0.05 on multigpu20 and multigpu30).
    """
    g = req.demand.gpu
    whole = g.count > 0 and g.source != "mig" and g.per_device == 1
    if whole and not (mix is not None and mix.restricted_models):
        return None
    return CHOICE_LEVELS


def choose_level(
    scores: Mapping[int, float],
    order: Iterable[int],
    rank: Callable[[int], int],
    levels: int | None = CHOICE_LEVELS,
) -> int | None:
    """The row of ``order`` (rows present in ``scores``) with the highest score rounded
    to ``levels`` levels (None: the exact score); ties to the lowest ``rank``. None when
    none is scored. ``rank`` is asked only about the rows on the top level."""
    top: float | None = None
    tied: list[int] = []
    for i in order:
        s = scores.get(i)
        if s is None:
            continue
        level = s if levels is None else round(s * levels)
        if top is None or level > top:
            top, tied = level, [i]
        elif level == top:
            tied.append(i)
    if not tied:
        return None
    return tied[0] if len(tied) == 1 else min(tied, key=rank)


class RequestShape:
    """What decides whether a pending pod fits now: kernel row, GPU demand (count, share
    or memory), allowed GPU models and node constraints. Two pods with one shape fit
    alike. Hashable, with the hash computed once (a GPU demand hashes Fractions)."""

    __slots__ = ("__weakref__", "_hash", "key")

    def __init__(self, key: tuple[object, ...]) -> None:
        self.key = key
        self._hash = hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, RequestShape) and self._hash == other._hash and self.key == other.key
        )

    def __repr__(self) -> str:
        return f"RequestShape{self.key!r}"


_SHAPES: weakref.WeakValueDictionary[tuple[object, ...], RequestShape] = (
    weakref.WeakValueDictionary()
)


@dataclass(frozen=True)
class PodRequest:
    """A pod ready to place: identity, tenant, exact demand and kernel row."""

    uid: str
    name: str
    namespace: str
    tenant: str | None
    demand: PodDemand
    row: tuple[float, ...]
    gpu_models: frozenset[str] = frozenset()
    constraints: eligibility.NodeConstraints = eligibility.UNCONSTRAINED
    """Node selector, required node affinity and tolerations (which nodes it may use)."""
    waiting: bool = True
    """In the queue of a scheduler that calls the extender, with no scheduling gate, and
    not found unschedulable by kube-scheduler for a reason fairshare does not check."""
    unschedulable: str = ""
    """kube-scheduler's verdict when it found the pod unschedulable for a reason fairshare
    does not check (``eligibility.rejected_by_kube_scheduler``); ``waiting`` is then False."""

    @cached_property
    def shape(self) -> RequestShape:
        """The request's shape (``RequestShape``), computed once and shared by every
        live request of that shape (so that comparing two is an identity check)."""
        key = (self.row, self.demand.gpu, self.gpu_models, self.constraints)
        got = _SHAPES.get(key)
        if got is None:
            got = _SHAPES[key] = RequestShape(key)
        return got

    @cached_property
    def fixed_gpu_milli(self) -> float | None:
        """Per-device milli-GPU when it does not depend on the node (not a memory request)."""
        g = self.demand.gpu
        return None if g.memory is not None else to_kernel_units(GPU, g.per_device)

    def gpu_milli_for(self, device_memory: int) -> float:
        """Per-device milli-GPU this pod needs on a node with ``device_memory`` bytes."""
        if self.fixed_gpu_milli is not None:
            return self.fixed_gpu_milli
        g = self.demand.gpu
        if g.memory is not None:
            if device_memory <= 0:
                return math.inf
            g = g.with_device_memory(device_memory)
        return to_kernel_units(GPU, g.per_device)

    @property
    def gpu_count(self) -> int:
        return self.demand.gpu.count

    def row_on(self, gpu_col: int, milli: float) -> tuple[float, ...]:
        """The kernel row as bound on a node where each device share is ``milli``.

        Equal to ``row`` except for GPU-memory requests, whose GPU amount is only
        known once the node (and so the device memory) is.
        """
        if self.demand.gpu.memory is None or not math.isfinite(milli):
            return self.row
        row = list(self.row)
        row[gpu_col] = milli * self.gpu_count
        return tuple(row)


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


def mig_use(state: ClusterState, req: PodRequest, i: int) -> tuple[str, int] | None:
    """(profile, slices) the pod takes on node row ``i`` if it runs on MIG slices there.

    A ``nvidia.com/mig-<profile>: n`` request takes n slices of that profile anywhere;
    ``nvidia.com/gpu: n`` takes n slices on a ``single``-strategy node (whose
    ``nvidia.com/gpu`` are slices); any other pod takes none (None).
    """
    g = req.demand.gpu
    if g.source == "mig":
        return (g.mig_profile, g.count)
    if g.source == "device":
        single = state.nodes[i].mig_single
        if single:
            return (single, g.count)
    return None


def mig_row(
    state: ClusterState, req: PodRequest, i: int, use: tuple[str, int]
) -> tuple[float, ...]:
    """The pod's kernel row on node ``i`` when it takes the slices ``use``: its GPU column
    is slices × the node's milli-GPU per slice (what the slices add to the node's GPU
    capacity), so a MIG pod counts as its fraction wherever it runs."""
    per_slice = state.nodes[i].mig.get(use[0], (0, 0.0))[1]
    if per_slice <= 0:
        return req.row
    row = list(req.row)
    row[state.gpu_col] = use[1] * per_slice
    return tuple(row)


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


# -- workload mix (FGD's target workload) ---------------------------------------


@dataclass(frozen=True)
class WorkloadMix:
    """Task classes and their popularity: the workload FGD measures fragmentation for.

    After Weng et al. ATC'23: pods are grouped by (cpu milli, per-device milli-GPU,
    device count, allowed models); the most common classes covering ``coverage`` of
    the pods are kept and their popularities renormalised to sum to 1.
    """

    cpu: array[float]
    gpu_milli: array[float]
    gpu_count: array[int]
    models: array[int]
    popularity: array[float]

    @property
    def size(self) -> int:
        return len(self.popularity)

    @cached_property
    def restricted_models(self) -> int:
        """Bitmask of the GPU model ids that some model-restricted class may use."""
        bits = 0
        for m in self.models:
            bits |= m
        return bits


ClassKey = tuple[float, float, int, frozenset[str]]


def class_key(req: PodRequest, *, cpu_col: int) -> ClassKey:
    g = req.demand.gpu
    if g.source == "mig":  # slices are no share of a device: a GPU-less task class
        return (req.row[cpu_col], 0.0, 0, req.gpu_models)
    milli = to_kernel_units(GPU, g.per_device) if g.count else 0.0
    return (req.row[cpu_col], milli, g.count, req.gpu_models)


def build_workload_mix(
    keys: Iterable[ClassKey], *, model_ids: Mapping[str, int], coverage: float = 0.95
) -> WorkloadMix:
    """Most popular classes covering ``coverage`` of the pods.

    Classes are taken by count, most first; among equal counts the larger key first
    (CPU, then GPU milli per device, device count, models), the order of the FGD
    reference simulator (its class list sorted in reverse). The order only decides which
    of the equally rare classes at the coverage cut are kept; on the openb gpuspec lists
    it moves the FGD control by up to 0.23 points.
    """
    counts = Counter(keys)
    total = sum(counts.values())
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], _sortable(kv[0])), reverse=True)
    kept: list[tuple[ClassKey, int]] = []
    covered = 0
    for key, c in ordered:
        if total and covered / total >= coverage:
            break
        kept.append((key, c))
        covered += c
    mass = sum(c for _, c in kept) or 1
    mask = array("q")
    for (_cpu, _milli, _count, models), _c in kept:
        bits = 0
        for m in models:
            if m in model_ids:
                bits |= 1 << model_ids[m]
        mask.append(bits)
    return WorkloadMix(
        cpu=array("d", [k[0] for k, _ in kept]),
        gpu_milli=array("d", [k[1] for k, _ in kept]),
        gpu_count=array("q", [k[2] for k, _ in kept]),
        models=mask,
        popularity=array("d", [c / mass for _, c in kept]),
    )


def _sortable(key: ClassKey) -> tuple[float, float, int, tuple[str, ...]]:
    return (key[0], key[1], key[2], tuple(sorted(key[3])))


# -- scoring ----------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreContext:
    """What a scoring term may read besides the pod and the state."""

    mix: WorkloadMix | None
    norm: tuple[float, ...]  # per-resource normaliser (max node capacity)


class Candidates:
    """The rows to score: as a kernel mask (``int8``, 1 = score) and as a list.

    Python-level terms loop over ``rows`` only, so scoring 500 candidates in a
    10,000-node cluster costs 500 iterations, not 10,000. ``rows`` may be given as
    ``(row array, selector)``: the selected rows, in order, listed only if a term asks.
    """

    __slots__ = ("_pick", "_rows", "mask")

    def __init__(
        self,
        mask: array[int],
        rows: Sequence[int] | None = None,
        *,
        pick: tuple[Sequence[int], Sequence[int]] | None = None,
    ) -> None:
        self.mask = mask
        self._rows = tuple(rows) if rows is not None else None
        self._pick = pick

    @property
    def rows(self) -> tuple[int, ...]:
        if self._rows is None:
            data, selectors = self._pick or ((), ())
            self._rows = tuple(compress(data, selectors))
        return self._rows


Mask: TypeAlias = Candidates
TermOut: TypeAlias = "tuple[array[float], array[int] | None]"
TermFn: TypeAlias = "Callable[[ClusterState, PodRequest, Candidates, ScoreContext], TermOut]"


def _at(values: Sequence[_T], rows: Sequence[int]) -> list[_T]:
    """``[values[i] for i in rows]`` at C speed."""
    if len(rows) > 1:
        return list(itemgetter(*rows)(values))
    return [values[i] for i in rows]


def candidates(state: ClusterState, fits: Sequence[int]) -> Candidates:
    """The ``Candidates`` for rows ``fits``."""
    return Candidates(_mask(state, fits), tuple(fits))


def _mask(state: ClusterState, fits: Sequence[int]) -> array[int]:
    m = array("b", bytes(state.n_nodes))
    for i in fits:
        m[i] = 1
    return m


def _out(state: ClusterState) -> array[float]:
    return array("d", [-1.0]) * state.n_nodes


def score_fit(state: ClusterState, req: PodRequest, mask: Mask, ctx: ScoreContext) -> TermOut:
    """DRFH best fit: demand shape vs the node's free shape, in [0, 1]."""
    out = _out(state)
    scoring.drfh_scores(
        state.free, state.capacity, array("d", req.row), mask.mask, state.n_nodes, state.n_res, out
    )
    return out, None


def score_bestfit(state: ClusterState, req: PodRequest, mask: Mask, ctx: ScoreContext) -> TermOut:
    """Weng et al.'s BestFit control: least weighted leftover of CPU and GPU."""
    out = _out(state)
    weights = array("d", [0.0] * state.n_res)
    weights[state.gpu_col] = 0.5
    weights[state.index.column(CPU)] = 0.5
    scoring.bestfit_scores(
        state.free,
        array("d", req.row),
        array("d", ctx.norm),
        weights,
        mask.mask,
        state.n_nodes,
        state.n_res,
        out,
    )
    return out, None


def score_packing(state: ClusterState, req: PodRequest, mask: Mask, ctx: ScoreContext) -> TermOut:
    """Best fit (``score_bestfit``), but 0 on nodes of a GPU model that some
    model-restricted class of the workload mix may use.

    Best fit pulls pods towards the nodes with the least left over, which on a mixed
    fleet are the small nodes (2-GPU T4s in openb), whatever their model. The
    fragmentation term already pushes unconstrained pods off the models restricted
    classes need (their idle GPUs elsewhere are fragment for those classes); packing
    breaks ties only where it cannot undo that push. Without restricted classes this is
    ``score_bestfit`` exactly.
    """
    out, _ = score_bestfit(state, req, mask, ctx)
    reserved = ctx.mix.restricted_models if ctx.mix is not None else 0
    if reserved:
        models = state.node_model
        for i in mask.rows:
            m = models[i]
            if 0 <= m <= 62 and (reserved >> m) & 1:
                out[i] = 0.0
    return out, None


def fgd_raw(state: ClusterState, req: PodRequest, mask: Mask, ctx: ScoreContext) -> TermOut:
    """FGD fragmentation delta per node in milli-GPU, and the device it would use."""
    mix = ctx.mix
    n = state.n_nodes
    delta, device = _out(state), array("i", bytes(4 * n))
    if mix is None or mix.size == 0:
        delta = array("d", [-math.inf]) * n
        device = array("i", [-1]) * n
        for i in mask.rows:
            delta[i] = 0.0
        return delta, device
    r = state.n_res
    cpu_col = state.index.column(CPU)
    cpu_free = array("d", state.free[cpu_col::r])
    g = req.demand.gpu
    count = 0 if g.source == "mig" else g.count  # MIG slices take no device share
    milli = to_kernel_units(GPU, g.per_device) if count else 0.0
    scoring.fgd_scores(
        state.dev_free, state.max_dev, cpu_free, state.node_model, mask.mask, n,
        req.row[cpu_col], milli, count,
        mix.cpu, mix.gpu_milli, mix.gpu_count, mix.models, mix.popularity, mix.size,
        delta, device,
    )  # fmt: skip
    return delta, device


def score_fragmentation(
    state: ClusterState, req: PodRequest, mask: Mask, ctx: ScoreContext
) -> TermOut:
    """FGD term: ``sigmoid(Δ / 1000)`` with Δ the fragmentation decrease in milli-GPU."""
    delta, device = fgd_raw(state, req, mask, ctx)
    out = _out(state)
    scoring.sigmoid_scores(delta, mask.mask, state.n_nodes, float(MILLI_GPU), out)
    return out, device


def score_stranding(state: ClusterState, req: PodRequest, mask: Mask, ctx: ScoreContext) -> TermOut:
    """Keep CPU-only pods off the CPU and memory that free GPUs need."""
    out = _out(state)
    scoring.stranding_scores(
        state.free, state.capacity, array("d", req.row), state.gpu_col, mask.mask,
        state.n_nodes, state.n_res, out,
    )  # fmt: skip
    return out, None


def score_spread(state: ClusterState, req: PodRequest, mask: Mask, ctx: ScoreContext) -> TermOut:
    """Least allocated GPU: free GPU share of the node (1 = idle); 1 for GPU-less nodes."""
    out = _out(state)
    r, g = state.n_res, state.gpu_col
    for i in mask.rows:
        cap = state.capacity[i * r + g]
        out[i] = state.free[i * r + g] / cap if cap > 0 else 1.0
    return out, None


def score_health(state: ClusterState, req: PodRequest, mask: Mask, ctx: ScoreContext) -> TermOut:
    """Prefer GPU-healthy nodes even for CPU-only pods (1 healthy, 0 not)."""
    out = _out(state)
    scoring.flag_scores(state.healthy, mask.mask, state.n_nodes, out)
    return out, None


def score_fairness(state: ClusterState, req: PodRequest, mask: Mask, ctx: ScoreContext) -> TermOut:
    """Tenant spread: ``1 - (GPU the pod's tenant holds on the node / node GPUs)``.

    Spreading a tenant's GPU pods limits how many of its pods one node's failure, drain
    or reclaim touches. 1 for pods without a tenant and for GPU-less nodes.
    """
    out = _out(state)
    r, g = state.n_res, state.gpu_col
    for i in mask.rows:
        cap = state.capacity[i * r + g]
        held = state.node_tenant_gpu.get(state.nodes[i].name, {}).get(req.tenant or "", 0.0)
        out[i] = 1.0 - held / cap if cap > 0 and req.tenant is not None else 1.0
    return out, None


SCORERS: dict[str, TermFn] = {
    "fairness": score_fairness,
    "fit": score_fit,
    "packing": score_packing,
    "fragmentation": score_fragmentation,
    "stranding": score_stranding,
    "spread": score_spread,
    "health": score_health,
}


@dataclass(frozen=True)
class Scored:
    """Scores in [0, 1] per candidate row, and the device each term proposed."""

    scores: Mapping[int, float]
    devices: Mapping[int, int]

    def best(self, names: Sequence[str]) -> int | None:
        """Highest score; ties go to the smaller node name (deterministic)."""
        if not self.scores:
            return None
        return min(self.scores, key=lambda i: (-self.scores[i], names[i]))

    def extender_scores(self) -> dict[int, int]:
        """Scores mapped to the extender's integer range 0..MAX_SCORE."""
        return {i: round(s * MAX_SCORE) for i, s in self.scores.items()}


@dataclass(frozen=True)
class Scorer:
    """A weighted sum of terms, built by :func:`build_scorer`."""

    weights: tuple[tuple[str, float], ...]

    def __call__(
        self, state: ClusterState, req: PodRequest, fits: Sequence[int], ctx: ScoreContext
    ) -> Scored:
        """``Σ w_k s_k / Σ w_k`` per node; all-zero weights give every node 0."""
        mask = candidates(state, fits)
        total = sum(w for _, w in self.weights)
        rows = mask.rows
        if len(set(rows)) != len(rows):
            return self._summed_per_row(state, req, mask, ctx, total)
        # One list per term, aligned with ``rows``, summed in the same order as the
        # per-row loop (bit-identical floats), without a dict update per node and term.
        acc = [0.0] * len(rows)
        devices: dict[int, int] = {}
        for name, w in self.weights:
            if w <= 0:
                continue
            out, dev = SCORERS[name](state, req, mask, ctx)
            vals = _at(out, rows)
            acc = [a + w * (v if v > 0.0 else 0.0) for a, v in zip(acc, vals, strict=True)]
            if dev is not None and name == "fragmentation":
                devices.update(zip(rows, _at(dev, rows), strict=True))
        if total <= 0:
            return Scored(dict.fromkeys(fits, 0.0), devices)
        return Scored(dict(zip(rows, [v / total for v in acc], strict=True)), devices)

    def extender(
        self,
        state: ClusterState,
        req: PodRequest,
        fitted: RowFit,
        ctx: ScoreContext,
        *,
        lo: int = 0,
        hi: int = MAX_SCORE,
    ) -> tuple[array[int], array[float]] | None:
        """Per candidate of ``fitted`` (``fit_rows``), in one kernel pass: the [0, 1] score
        ``__call__`` gives a fitting row and the extender's int made of it (rounded score
        × MAX_SCORE, as ``Scored.extender_scores``, clamped to ``lo..hi``); 0 and 0.0 for
        the others. None when a fitting row is listed twice (``__call__`` counts it
        twice; use it)."""
        if fitted.duplicates:
            return None
        n, k = state.n_nodes, len(fitted.rows)
        cand = Candidates(fitted.mask, pick=(fitted.rows, fitted.ok))
        stacked, weights = array("d"), array("d")
        for name, w in self.weights:
            if w > 0 and fitted.n_fit:
                stacked += SCORERS[name](state, req, cand, ctx)[0]
                weights.append(w)
        total = sum(w for _, w in self.weights)
        raw, ints = array("d", bytes(8 * k)), array("q", bytes(8 * k))
        scoring.combine_scores(
            stacked, weights, len(weights), n, fitted.rows, fitted.ok, k, total,
            float(MAX_SCORE), lo, hi, raw, ints,
        )  # fmt: skip
        return ints, raw

    def _summed_per_row(
        self,
        state: ClusterState,
        req: PodRequest,
        mask: Candidates,
        ctx: ScoreContext,
        total: float,
    ) -> Scored:
        """The sum row by row: a row listed twice is counted twice, as it always was."""
        fits = mask.rows
        acc = dict.fromkeys(fits, 0.0)
        devices: dict[int, int] = {}
        for name, w in self.weights:
            if w <= 0:
                continue
            out, dev = SCORERS[name](state, req, mask, ctx)
            for i in fits:
                acc[i] += w * max(0.0, out[i])
                if dev is not None and name == "fragmentation":
                    devices[i] = dev[i]
        if total <= 0:
            return Scored(dict.fromkeys(fits, 0.0), devices)
        return Scored({i: v / total for i, v in acc.items()}, devices)


def build_scorer(weights: Mapping[str, float]) -> Scorer:
    """A scorer from term weights; unknown term names fail fast."""
    unknown = sorted(set(weights) - set(SCORERS))
    if unknown:
        raise ValueError(f"unknown scoring terms: {', '.join(unknown)}; known: {sorted(SCORERS)}")
    return Scorer(tuple(sorted((k, float(v)) for k, v in weights.items())))


def score_context(state: ClusterState, mix: WorkloadMix | None) -> ScoreContext:
    """Normalisers = the largest node capacity per resource (BestFit's max_r)."""
    r = state.n_res
    norm = [0.0] * r
    for i in range(state.n_nodes):
        for k in range(r):
            norm[k] = max(norm[k], state.capacity[i * r + k])
    return ScoreContext(mix, tuple(norm))


def cluster_fragmentation(state: ClusterState, mix: WorkloadMix | None) -> float:
    """FGD fragmentation amount of the whole cluster in milli-GPU (0 without a mix).

    ``Σ_n F_n(M)`` (Weng et al., ATC'23): the free GPU the workload mix ``M`` cannot use.
    """
    if mix is None or mix.size == 0 or state.n_nodes == 0:
        return 0.0
    r = state.n_res
    cpu_free = array("d", state.free[state.index.column(CPU) :: r])
    out = array("d", bytes(8 * state.n_nodes))
    total = scoring.fgd_node_frag(
        state.dev_free, state.max_dev, cpu_free, state.node_model, state.n_nodes,
        mix.cpu, mix.gpu_milli, mix.gpu_count, mix.models, mix.popularity, mix.size, out,
    )  # fmt: skip
    return float(total)


# -- devices ----------------------------------------------------------------------


def choose_devices(
    state: ClusterState, req: PodRequest, node: int, *, milli: float, hint: int = -1
) -> tuple[tuple[int, float], ...]:
    """Devices for the pod on ``node``: (device index, milli-GPU) pairs.

    Whole devices: the first fully free ones in index order. A share of one device:
    ``hint`` when it holds the share (the fragmentation term's choice), else the
    device with the least free that still holds it (best fit, lowest index on ties).
    """
    count = req.gpu_count
    if not req.demand.wants_gpu or count == 0:
        return ()
    devs = state.node_devices(node)
    if milli >= MILLI_GPU:
        whole = [k for k, v in enumerate(devs) if v >= MILLI_GPU][:count]
        return tuple((k, float(MILLI_GPU)) for k in whole)
    if count == 1 and 0 <= hint < len(devs) and devs[hint] >= milli:
        return ((hint, milli),)
    fitting = sorted((v, k) for k, v in enumerate(devs) if v >= milli)
    return tuple((k, milli) for _, k in fitting[:count])


def gpu_fraction_str(milli: float) -> str:
    return str(Fraction(int(milli), MILLI_GPU))
