"""Where a pod may go and how good each node is: the fit, the scores and the devices.

The extender and the simulator both call these on a ``ClusterState``, so a simulated
policy is the deployed policy (which is why they live in the core). ``filtering`` (which
nodes fit, and why not), ``scoring`` (terms, scorer, node choice) and ``workload`` (the
workload mix), with ``fairshare.podrequest`` and ``fairshare.state.devices``, are
re-exported here; ``fairshare.pipeline`` chains them with the gate.
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
