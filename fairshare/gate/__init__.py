"""The fair-share gate: whether a pod of a tenant may be placed now.

* A pod of tenant t waits when t's share *after* the pod would exceed t's fair share
  (``fairshare.fairness``) **and** another tenant u with a lower current share (ties
  broken by tenant name) has a pending pod that fits now. The lowest-share tenant with
  a fitting pod is never held back, so no capacity is idle while a pod that fits waits.
* With ``holdForBlockedTenants`` (opt-in) u also counts when its waiting pod fits no
  node now but would fit a node drained of its pods (*blocked*, not unrunnable): t then
  waits even though capacity may stay idle, so that room freed later goes to u. A pod
  that fits no node even drained never holds anyone.
* With ``yieldBand`` b > 0 (opt-in) the gate applies from ``(1 - b)`` × t's fair share
  instead of from the fair share, for contenders with a pod that fits now (blocked
  pods hold only above the fair share). Below the fair share the order is by the
  fraction of its own fair share each tenant holds (``check_fair_gate`` passes those
  fractions as the current shares): tenants near their fair shares go in turn, so what
  fragmentation leaves idle at the end is spread over them. Still work-conserving.

Modules: ``rule`` (the decision on shares alone: ``check_gate``, ``GateDecision``) and
``cluster`` (the gate over a ``ClusterState``: ``check_fair_gate``, which finds the
contenders, and which waiting pods fit now). Their public names are re-exported here.
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
