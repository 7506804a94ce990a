"""The extender's filter decision: resource/device/health fit from the core, plus the gate.

Pure: no network, no clock, no globals; it reads a ``ClusterState`` and never changes it.
Must not import aiohttp, kubernetes_asyncio or prometheus_client.

Design choices:

* The fit itself is ``fairshare.placement.filter_nodes`` (the simulator's code), run over
  the candidate rows only; its ``NodeFailure.unresolvable`` decides between
  ``FailedNodes`` (preemption may help) and ``FailedAndUnresolvableNodes`` (GPU health,
  GPU model, a demand above the node's capacity).
* The fair-share gate is ``fairshare.gating.check_fair_gate``, the code the simulator
  runs: current weighted dominant shares from the bound pods, the fair allocation by
  progressive filling over running + pending demand (the pod itself included), and
  ``fairness.check_gate`` against tenants with a lower share and a pending pod that fits
  now. The gate runs only when some node fits (a pod that fits nowhere waits anyway);
  when it holds the pod back every fitting node fails with the gate's reason, in
  ``FailedNodes``, which kube-scheduler shows in the pod's FailedScheduling event.
* A candidate the state does not know (informer lag) fails in ``FailedNodes`` with a
  reason saying so: retrying later can succeed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fairshare import fairness, gating
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest, filter_nodes
from fairshare.state.cluster import ClusterState

UNKNOWN_NODE = "node not known to fairshare yet (its informer has not caught up)"


@dataclass(frozen=True)
class FilterOutcome:
    """The filter verdict for one pod over the candidate names (in input order)."""

    passing: tuple[str, ...]
    failed: Mapping[str, str] = field(default_factory=dict)
    unresolvable: Mapping[str, str] = field(default_factory=dict)
    gate: fairness.GateDecision | None = None
    gpu_milli: Mapping[str, float] = field(default_factory=dict)


# The gate lives in the core so the simulator and the extender share one implementation.
current_shares = gating.current_shares
kernel_amounts = gating.kernel_amounts
check_fair_gate = gating.check_fair_gate


def fair_shares(
    state: ClusterState, config: FairShareConfig, queue: Sequence[PodRequest]
) -> dict[str, fairness.FairShare]:
    """Fair allocation over running + pending demand (as the simulator computes it)."""
    return gating.fair_shares_for(state, config, gating.demand_rows(state, queue))


def filter_pod(
    state: ClusterState,
    *,
    config: FairShareConfig,
    req: PodRequest,
    names: Sequence[str],
    pending: Sequence[PodRequest],
    fair: Mapping[str, fairness.FairShare] | None = None,
) -> FilterOutcome:
    """Fit ``req`` against the candidate ``names``, then apply the fair-share gate."""
    found = list(map(state.node_index.get, names))
    rows = [i for i in found if i is not None]
    fr = filter_nodes(state, req, rows=rows, explain=True)
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
        gate = check_fair_gate(state, config=config, req=req, pending=pending, fair=fair)
        if gate is not None and not gate.allowed:
            failed.update(dict.fromkeys(fits, gate.reason))
            fits = {}
    passing = tuple(filter(fits.__contains__, names))
    return FilterOutcome(passing, failed, unresolvable, gate, fits)
