"""Where a pod may go and how good each node is: the fit, the scores and the devices.

Pure: no network, no clock. Must not import aiohttp, kubernetes_asyncio or
prometheus_client. Both the scheduler extender and the simulator call these
functions on a ``ClusterState``, so a simulated policy is the deployed policy.
(STYLE.md puts filtering and scoring under ``extender/``; they live in the
core because the simulator, which may not import the extender, must run the same code.)

The pieces of the pipeline for one pod (``fairshare.pipeline`` chains them, with the
fair-share gate between fit and score): ``filter_nodes`` (resource fit, GPU-device fit,
GPU health, GPU model) → ``Scorer`` (a weighted sum of per-node terms in [0, 1]) and the
node choice → ``choose_devices`` on the chosen node.

One module per job, every public name re-exported here:

* ``fairshare.podrequest``: the pod request (``PodRequest``, ``RequestShape``), below
  the state layer, which builds requests from pod objects;
* ``placement.filtering``: which nodes fit, and why the others do not;
* ``placement.workload``: the workload mix (FGD's task classes);
* ``placement.scoring``: the scoring terms, the scorer and the node choice;
* ``fairshare.state.devices``: the devices (and MIG slices) a pod takes on a node, in
  the state layer because the device ledger restores pods by the same rule.
"""

from __future__ import annotations

from fairshare.placement.filtering import (
    FilterResult,
    NodeFailure,
    RowFit,
    filter_nodes,
    fit_rows,
    fits_after_release,
    row_failure,
)
from fairshare.placement.scoring import (
    CHOICE_LEVELS,
    MAX_SCORE,
    SCORERS,
    Candidates,
    Mask,
    ScoreContext,
    Scored,
    Scorer,
    TermFn,
    TermOut,
    build_scorer,
    candidates,
    choice_levels,
    choose_level,
    cluster_fragmentation,
    fgd_device,
    fgd_raw,
    node_rank,
    score_bestfit,
    score_context,
    score_fairness,
    score_fit,
    score_fragmentation,
    score_health,
    score_packing,
    score_spread,
    score_stranding,
)
from fairshare.placement.workload import ClassKey, WorkloadMix, build_workload_mix, class_key
from fairshare.podrequest import PodRequest, RequestShape
from fairshare.state.devices import choose_devices, gpu_fraction_str, mig_row, mig_use

__all__ = [
    "CHOICE_LEVELS",
    "MAX_SCORE",
    "SCORERS",
    "Candidates",
    "ClassKey",
    "FilterResult",
    "Mask",
    "NodeFailure",
    "PodRequest",
    "RequestShape",
    "RowFit",
    "ScoreContext",
    "Scored",
    "Scorer",
    "TermFn",
    "TermOut",
    "WorkloadMix",
    "build_scorer",
    "build_workload_mix",
    "candidates",
    "choice_levels",
    "choose_devices",
    "choose_level",
    "class_key",
    "cluster_fragmentation",
    "fgd_device",
    "fgd_raw",
    "filter_nodes",
    "fit_rows",
    "fits_after_release",
    "gpu_fraction_str",
    "mig_row",
    "mig_use",
    "node_rank",
    "row_failure",
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
