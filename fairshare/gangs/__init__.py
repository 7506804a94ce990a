"""Pod groups (gangs): pods that are useless until ``min_count`` of them run together.

Modules: ``identity`` (a pod's group), ``plan`` (the group and its all-or-nothing plan),
``waiting`` (groups at the fair-share gate), ``status`` (where each group stands) and
``podgroups`` (the PodGroup objects, read from the API). The names of ``identity`` and
``plan`` are re-exported here.
"""

from __future__ import annotations

from fairshare.gangs import podgroups, status, waiting
from fairshare.gangs.identity import (
    ANN_MIN_MEMBERS,
    ANN_TOPOLOGY_KEY,
    NATIVE_GROUP,
    NATIVE_VERSION,
    POD_GROUP_LABEL,
    PODGROUP_GROUP,
    PODGROUP_PLURAL,
    PODGROUP_VERSION,
    GroupKey,
    annotated_min_count,
    group_of,
)
from fairshare.gangs.plan import (
    DOMAINS_SHOWN,
    RESERVATION_PREFIX,
    Gang,
    GangPlan,
    Pick,
    Placement,
    Refusal,
    annotated_topology_key,
    best_fit,
    domains_of,
    gang_from,
    gang_gate,
    gang_of,
    is_reservation,
    plan_gang,
    podgroup_min_count,
    podgroup_topology_key,
    release,
    reserve,
    topology_key,
)

__all__ = [
    "ANN_MIN_MEMBERS",
    "ANN_TOPOLOGY_KEY",
    "DOMAINS_SHOWN",
    "NATIVE_GROUP",
    "NATIVE_VERSION",
    "PODGROUP_GROUP",
    "PODGROUP_PLURAL",
    "PODGROUP_VERSION",
    "POD_GROUP_LABEL",
    "RESERVATION_PREFIX",
    "Gang",
    "GangPlan",
    "GroupKey",
    "Pick",
    "Placement",
    "Refusal",
    "annotated_min_count",
    "annotated_topology_key",
    "best_fit",
    "domains_of",
    "gang_from",
    "gang_gate",
    "gang_of",
    "group_of",
    "is_reservation",
    "plan_gang",
    "podgroup_min_count",
    "podgroup_topology_key",
    "podgroups",
    "release",
    "reserve",
    "status",
    "topology_key",
    "waiting",
]
