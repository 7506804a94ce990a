"""The gate's rule on shares alone: whether a pod of a tenant may be placed now
(``check_gate``), given the tenants competing with it.

``Contender`` is another tenant competing now, ``GateDecision`` the verdict and its
reason; ``goes_first`` is the gate's order of tenants and ``gate_floor`` the share up to
which a pod always passes. See ``fairshare.gate`` for the rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fairshare.fairness.shares import EPS, CurrentShare, ShareAfter


@dataclass(frozen=True)
class Contender:
    """Another tenant competing for capacity right now."""

    tenant: str
    current_share: CurrentShare
    has_fitting_pending: bool
    blocked: str = ""
    """With ``holdForBlockedTenants``: the tenant has no pod that fits now but a waiting
    pod that would fit a drained node; this names it and its shape (else "")."""


@dataclass(frozen=True)
class GateDecision:
    """Whether a pod may be placed now; if not, who it waits for and why."""

    allowed: bool
    tenant: str
    share_after: ShareAfter
    fair_share: float
    waiting_for: str | None = None
    blocked: str = ""
    """When ``waiting_for`` has no pod that fits now: its blocked pod and shape
    (``holdForBlockedTenants``)."""
    yield_band: float = 0.0
    """The ``yieldBand`` the decision was taken with."""

    @property
    def reason(self) -> str:
        """The text kube-scheduler shows in the pod's FailedScheduling event."""
        if self.allowed:
            return ""
        if self.share_after <= self.fair_share * (1 + EPS) + EPS:
            return (
                f"tenant {self.tenant} near its fair share ({self.share_after:.2f} of "
                f"{self.fair_share:.2f}, yieldBand {self.yield_band:g}) while "
                f"{self.waiting_for} waits"
            )
        head = (
            f"tenant {self.tenant} above its fair share "
            f"({self.share_after:.2f} > {self.fair_share:.2f}) while {self.waiting_for} waits"
        )
        if not self.blocked:
            return head
        return (
            f"{head} (holdForBlockedTenants: its pod {self.blocked} fits no node now "
            "but would fit a drained one)"
        )


def check_gate(
    *,
    tenant: str,
    current_share: CurrentShare,
    share_after: ShareAfter,
    fair_share: float,
    contenders: Sequence[Contender],
    yield_band: float = 0.0,
) -> GateDecision:
    """Decide whether a pod of ``tenant`` may be placed now (the rule: ``fairshare.gate``).

    The tenant waits only for a contender that has a pending pod fitting now (or, with
    ``holdForBlockedTenants``, a blocked one: ``Contender.blocked``) and a lower current
    share, or an equal share and a smaller name. Up to ``(1 - yield_band)`` × its fair
    share it never waits; from there to the fair share only for a fitting pod.
    """
    if share_after <= gate_floor(fair_share, yield_band):
        return GateDecision(True, tenant, share_after, fair_share, yield_band=yield_band)
    above = share_after > fair_share * (1 + EPS) + EPS
    ahead = [
        c
        for c in contenders
        if c.tenant != tenant
        and (c.has_fitting_pending or (above and c.blocked))
        and goes_first(c.tenant, c.current_share, tenant, current_share)
    ]
    if not ahead:
        return GateDecision(True, tenant, share_after, fair_share, yield_band=yield_band)
    first = min(ahead, key=lambda c: (c.current_share, c.tenant))
    blocked = "" if first.has_fitting_pending else first.blocked
    return GateDecision(
        False,
        tenant,
        share_after,
        fair_share,
        waiting_for=first.tenant,
        blocked=blocked,
        yield_band=yield_band,
    )


def goes_first(u: str, share_u: float, t: str, share_t: float) -> bool:
    """The gate's order of tenants: ``u`` goes before ``t`` with a lower share, or an
    equal one (within the tolerance) and a smaller name. A strict order: of two tenants
    exactly one goes first, so ties never hold both."""
    if share_u == share_t or (
        math.isfinite(share_t) and abs(share_u - share_t) <= EPS * max(1.0, share_t)
    ):
        return u < t
    return share_u < share_t


def gate_floor(fair_share: float, yield_band: float = 0.0) -> float:
    """The share after a pod up to which the gate lets it through unconditionally:
    the fair share (with the comparison tolerance), or ``(1 - yield_band)`` of it."""
    if yield_band <= 0:
        return fair_share * (1 + EPS) + EPS
    return fair_share * (1 - yield_band) + EPS
