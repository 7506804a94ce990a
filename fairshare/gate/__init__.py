"""The fair-share gate: whether a pod of a tenant may be placed now.

A pod of tenant t waits when t's share after the pod would exceed its fair share
(``fairshare.fairness``) and another tenant with a lower current share (ties by name) has
a pending pod that fits now, so no capacity idles while a fitting pod waits. Opt-in:
with ``holdForBlockedTenants`` a contender also counts when its pod fits no node now but
would fit a drained one; with ``yieldBand`` b the gate applies from ``(1 - b)`` × t's fair
share for contenders whose pod fits now, tenants below their fair shares going in order
of the fraction of it they hold.

``rule`` decides on shares alone (``check_gate``); ``cluster`` finds the contenders in a
``ClusterState`` (``check_fair_gate``). Their public names are re-exported here.
"""

from __future__ import annotations

from fairshare.gate.cluster import (
    GroupFits,
    HeldOff,
    ShapeKey,
    check_fair_gate,
    describe_request,
    dominates,
    fitting_pending,
    has_fitting_pending,
    pod_fits_drained,
    pod_fits_somewhere,
    shape_key,
)
from fairshare.gate.rule import Contender, GateDecision, check_gate, gate_floor, goes_first

__all__ = [
    "Contender",
    "GateDecision",
    "GroupFits",
    "HeldOff",
    "ShapeKey",
    "check_fair_gate",
    "check_gate",
    "describe_request",
    "dominates",
    "fitting_pending",
    "gate_floor",
    "goes_first",
    "has_fitting_pending",
    "pod_fits_drained",
    "pod_fits_somewhere",
    "shape_key",
]
