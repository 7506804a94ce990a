"""How good each fitting node is for a pod, and which one fairshare itself picks:
``Scorer`` sums the config's weighted per-node terms in [0, 1] (``SCORERS``), mostly from
the ``_native.scoring`` kernels; ``choose_level`` / ``choice_levels`` are the node choice
of the simulator and of ``--pick-in-filter``; ``cluster_fragmentation`` is FGD's measure.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress
from operator import itemgetter
from typing import TypeAlias, TypeVar

from _native import scoring
from fairshare.placement.filtering import RowFit
from fairshare.placement.workload import WorkloadMix
from fairshare.podrequest import PodRequest
from fairshare.resources import CPU, GPU, MILLI_GPU, to_kernel_units
from fairshare.state.cluster import ClusterState

__all__ = [
    "CHOICE_LEVELS",
    "MAX_SCORE",
    "SCORERS",
    "Candidates",
    "Mask",
    "ScoreContext",
    "Scored",
    "Scorer",
    "TermFn",
    "TermOut",
    "build_scorer",
    "candidates",
    "choice_levels",
    "choose_level",
    "cluster_fragmentation",
    "fgd_device",
    "fgd_raw",
    "node_rank",
    "score_bestfit",
    "score_context",
    "score_fairness",
    "score_fit",
    "score_fragmentation",
    "score_health",
    "score_packing",
    "score_spread",
    "score_stranding",
]

_T = TypeVar("_T")

MAX_SCORE = 10
"""Extender score range is 0..MAX_SCORE (kube-scheduler MaxExtenderPriority)."""

CHOICE_LEVELS = 30
"""The node fairshare itself chooses (the simulator's ``ours``, the extender's
``--pick-in-filter``): scores rounded to this many levels, ties to the first node of one
fixed random node order (``node_rank``). Near-equal nodes then fill in one order, which
packs; measured on openb against float scores with name-order ties
(docs/simulator/openb.md, "How ours chooses a node"). Pods of whole GPUs on a workload
without model-restricted classes are the exception (``choice_levels``)."""


@lru_cache(maxsize=1 << 16)
def node_rank(name: str) -> int:
    """A node's place in the fixed random order that breaks ties between equal levels
    (a hash of its name: the same in every process and after restarts)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def choice_levels(req: PodRequest, mix: WorkloadMix | None) -> int | None:
    """The levels ``choose_level`` rounds ``req``'s node scores to: ``CHOICE_LEVELS``,
    or None (the exact scores) for a pod of whole GPUs when no class of the workload
    mix is restricted to some GPU models.

    Measured on openb (docs/simulator/openb.md, seeds 42-51): the coarse levels with one
    fixed tie order pack fractional and CPU-only pods, and on fleets where some classes need certain
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
    count, milli = _fgd_devices(req)
    scoring.fgd_scores(
        state.dev_free, state.max_dev, cpu_free, state.node_model, mask.mask, n,
        req.row[cpu_col], milli, count,
        mix.cpu, mix.gpu_milli, mix.gpu_count, mix.models, mix.popularity, mix.size,
        delta, device,
    )  # fmt: skip
    return delta, device


def _fgd_devices(req: PodRequest) -> tuple[int, float]:
    """The devices FGD places ``req`` on: how many, and the milli-GPU of each."""
    g = req.demand.gpu
    count = 0 if g.source == "mig" else g.count  # MIG slices take no device share
    return count, to_kernel_units(GPU, g.per_device) if count else 0.0


def fgd_device(state: ClusterState, req: PodRequest, i: int, mix: WorkloadMix | None) -> int:
    """The device ``fgd_raw`` proposes for ``req`` on row ``i`` (-1: none), computed on
    that row alone (the gradient of a node reads that node and the mix only)."""
    if mix is None or mix.size == 0:
        return -1
    d, r = state.max_dev, state.n_res
    cpu_col = state.index.column(CPU)
    count, milli = _fgd_devices(req)
    delta, device = array("d", [0.0]), array("i", [-1])
    scoring.fgd_scores(
        state.dev_free[i * d : (i + 1) * d], d, array("d", [state.free[i * r + cpu_col]]),
        state.node_model[i : i + 1], array("b", [1]), 1,
        req.row[cpu_col], milli, count,
        mix.cpu, mix.gpu_milli, mix.gpu_count, mix.models, mix.popularity, mix.size,
        delta, device,
    )  # fmt: skip
    return device[0]


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
    """Prefer nodes without GPU faults or warnings, also for CPU-only pods (1 clean, 0 not)."""
    out = _out(state)
    scoring.flag_scores(state.clean_flags(), mask.mask, state.n_nodes, out)
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
