"""The extender's filter decision: the fit from the core, then the gate and reclaim holds.

The fit is ``fairshare.pipeline.fit`` over the candidate rows, or one kernel pass
(``placement.fit_rows``) when that decides every candidate; ``NodeFailure.unresolvable``
splits ``FailedNodes`` (preemption may help) from ``FailedAndUnresolvableNodes``. The gate
(``pipeline.gate``) runs only when some node fits; when it holds the pod back, every
fitting node fails in ``FailedNodes`` with the gate's reason, which kube-scheduler shows
in the pod's FailedScheduling event. A candidate the state does not know yet fails in
``FailedNodes`` too: a retry can succeed.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress

from fairshare import cluster_shares, fairness, pipeline
from fairshare.config.schema import FairShareConfig
from fairshare.gate import GateDecision, GroupFits, HeldOff
from fairshare.placement import PodRequest, fit_rows, row_failure
from fairshare.preemption.holds import RoomHold, gate_held, held_off
from fairshare.state.cluster import ClusterState

UNKNOWN_NODE = "node not known to fairshare yet (its informer has not caught up)"


@dataclass(frozen=True)
class FilterOutcome:
    """The filter verdict for one pod over the candidate names (in input order)."""

    passing: tuple[str, ...]
    failed: Mapping[str, str] = field(default_factory=dict)
    unresolvable: Mapping[str, str] = field(default_factory=dict)
    gate: GateDecision | None = None
    gpu_milli: Mapping[str, float] = field(default_factory=dict)


# The gate lives in the core so the simulator and the extender share one implementation.
current_shares = cluster_shares.current_shares
kernel_amounts = cluster_shares.kernel_amounts


def fair_shares(
    state: ClusterState, config: FairShareConfig, queue: Sequence[PodRequest]
) -> dict[str, fairness.FairShare]:
    """Fair allocation over running + pending demand (as the simulator computes it)."""
    return cluster_shares.fair_shares_for(state, config, cluster_shares.demand_rows(state, queue))


def filter_pod(
    state: ClusterState,
    *,
    config: FairShareConfig,
    req: PodRequest,
    names: Sequence[str],
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None = None,
    groups: GroupFits | None = None,
    holds: Sequence[RoomHold] = (),
) -> FilterOutcome:
    """Fit ``req`` against the candidate ``names``, then apply the fair-share gate
    (``groups``: how waiting pod groups count there, ``fairshare.gangs.waiting``) and the
    reclaim ``holds`` in force (``held_off``: room reclaim made for another
    tenant's pod fails in ``FailedNodes`` with the hold as reason)."""
    held = gate_held(holds)
    out = _filter_rows(
        state, config=config, req=req, names=names, pending=pending, fair=fair, groups=groups,
        held=held,
    )  # fmt: skip
    if out is None:
        out = _filter_names(
            state, config=config, req=req, names=names, pending=pending, fair=fair,
            groups=groups, held=held,
        )  # fmt: skip
    if holds and out.passing:
        return _keep_off_held_room(state, req, out, holds)
    return out


def _keep_off_held_room(
    state: ClusterState, req: PodRequest, out: FilterOutcome, holds: Sequence[RoomHold]
) -> FilterOutcome:
    """``out`` less the passing nodes the holds keep ``req`` off (failed with the reason)."""
    rows = [state.node_index[n] for n in dict.fromkeys(out.passing) if n in state.node_index]
    off = held_off(state, holds, req, rows)
    if not off:
        return out
    held = {state.nodes[i].name: reason for i, reason in off.items()}
    passing = tuple(n for n in out.passing if n not in held)
    milli = {n: out.gpu_milli[n] for n in passing}
    return FilterOutcome(passing, {**out.failed, **held}, out.unresolvable, out.gate, milli)


def _filter_names(
    state: ClusterState,
    *,
    config: FairShareConfig,
    req: PodRequest,
    names: Sequence[str],
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None,
    groups: GroupFits | None = None,
    held: HeldOff | None = None,
) -> FilterOutcome:
    """``filter_pod`` by the pipeline's ``fit`` over the known rows (every kind of pod)."""
    found = list(map(state.node_index.get, names))
    rows = [i for i in found if i is not None]
    fr = pipeline.fit(state, req, rows, explain=True)
    nodes, milli = state.nodes, fr.gpu_milli
    fits = {nodes[i].name: milli.get(i, 0.0) for i in fr.fits}
    failed: dict[str, str] = {}
    if len(rows) < len(found):
        failed = {n: UNKNOWN_NODE for n, i in zip(names, found, strict=True) if i is None}
    unresolvable: dict[str, str] = {}
    for f in fr.failed:
        (unresolvable if f.unresolvable else failed)[f.node] = f.reason
    gate = None
    if fits:
        gate = pipeline.gate(
            state, config=config, req=req, pending=pending, fair=fair, groups=groups, held=held
        )
        if gate is not None and not gate.allowed:
            failed.update(dict.fromkeys(fits, gate.reason))
            fits = {}
    passing = tuple(filter(fits.__contains__, names))
    return FilterOutcome(passing, failed, unresolvable, gate, fits)


def _filter_rows(
    state: ClusterState,
    *,
    config: FairShareConfig,
    req: PodRequest,
    names: Sequence[str],
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None,
    groups: GroupFits | None = None,
    held: HeldOff | None = None,
) -> FilterOutcome | None:
    """``filter_pod`` in one kernel pass over the candidates (``placement.fit_rows``);
    None when that cannot decide (MIG, GPU-memory or GPU-model requests)."""
    fitted = fit_rows(state, req, candidate_rows(state, names))
    if fitted is None:
        return None
    passing = tuple(compress(names, fitted.ok))
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if fitted.n_fit < len(names):
        ok = fitted.ok.tobytes()
        k = ok.find(0)
        while k >= 0:
            if fitted.codes[k] == NOT_A_NODE:
                failed[names[k]] = UNKNOWN_NODE
            else:
                f = row_failure(state, req, fitted, k)
                (unresolvable if f.unresolvable else failed)[f.node] = f.reason
            k = ok.find(0, k + 1)
    gate = None
    if passing:
        gate = pipeline.gate(
            state, config=config, req=req, pending=pending, fair=fair, groups=groups, held=held
        )
        if gate is not None and not gate.allowed:
            failed.update(dict.fromkeys(passing, gate.reason))
            return FilterOutcome((), failed, unresolvable, gate, {})
    return FilterOutcome(passing, failed, unresolvable, gate, _Uniform(passing, fitted.gpu_milli))


def candidate_rows(state: ClusterState, names: Sequence[str]) -> array[int]:
    """The state's row of each name (int32), ``-1`` for a node it does not know."""
    return state.rows_of(names)


NOT_A_NODE = -2
"""``fit_rows``' code of a candidate the state does not know."""


class _Uniform(Mapping[str, float]):
    """``FilterOutcome.gpu_milli`` when every passing node takes the same per-device
    share: the mapping without building it per node."""

    def __init__(self, names: Sequence[str], milli: float) -> None:
        self._names, self._milli = names, milli

    @cached_property
    def _keys(self) -> frozenset[str]:
        return frozenset(self._names)

    def __getitem__(self, name: str) -> float:
        if name not in self._keys:
            raise KeyError(name)
        return self._milli

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(self._names))

    def __len__(self) -> int:
        return len(self._keys)
