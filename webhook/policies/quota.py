"""The tenant quota check: usage across all the tenant's namespaces + this pod <= limit.

Pure: no network, no clock. Must not import aiohttp, kubernetes_asyncio or
prometheus_client.

Design choices:

* The decision is data (STYLE habit 7): ``Insufficient(tenant, resource, used,
  requested, limit, namespaces)`` items, as k/k's ``InsufficientResource``; tests assert
  on them. The user-facing text is made in ``render_denial`` / ``render_warning`` only.
* Amounts are exact ``Fraction`` values in natural units, compared without rounding:
  ``11 + 1 > 12`` is false, so a tenant can use its limit exactly.
* Only resources the pod requests are checked (as ResourceQuota does): a tenant already
  over its GPU limit after a config change can still start CPU-only pods. A resource
  missing from ``limit`` is unlimited; ``0`` allows none; ``limits=None`` means no limit.
* Resources are visited in sorted order so messages are deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from fairshare import quantities
from fairshare.resources import PodDemand

__all__ = [
    "WARN_RATIO",
    "Insufficient",
    "NearLimit",
    "QuotaDecision",
    "check_quota",
    "render_denial",
    "render_warning",
]

WARN_RATIO: Final = Fraction(9, 10)
"""Admitting a pod that takes its tenant to at least this share of a limit adds a warning."""


@dataclass(frozen=True)
class Insufficient:
    """One resource on which the pod would take its tenant over the limit."""

    tenant: str
    resource: str
    used: Fraction
    requested: Fraction
    limit: Fraction
    namespaces: tuple[str, ...]
    level: str = "tenant"
    """What ``tenant`` is to the pod: its own "tenant", or an ancestor ("team",
    "organisation") whose limit caps the whole subtree."""


@dataclass(frozen=True)
class NearLimit:
    """One resource on which the admitted pod takes its tenant to ``WARN_RATIO`` or more."""

    tenant: str
    resource: str
    after: Fraction
    limit: Fraction
    level: str = "tenant"


@dataclass(frozen=True)
class QuotaDecision:
    """The outcome: denied when any item is insufficient; warnings only matter if allowed."""

    insufficient: tuple[Insufficient, ...] = ()
    near_limit: tuple[NearLimit, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.insufficient


def check_quota(
    *,
    tenant: str,
    demand: PodDemand,
    usage: Mapping[str, Fraction],
    limits: Mapping[str, Fraction] | None,
    namespaces: Sequence[str],
    warn_ratio: Fraction = WARN_RATIO,
    level: str = "tenant",
) -> QuotaDecision:
    """Check ``usage + demand <= limits`` on every limited resource the pod requests.

    ``usage`` already includes reservations; ``namespaces`` are the ones counted (sorted
    into the result). With ``limits`` None the tenant is unlimited. ``level`` names
    what ``tenant`` is to the pod in the messages (an ancestor's limit is checked with
    the usage of its whole subtree).
    """
    if limits is None:
        return QuotaDecision()
    counted = tuple(sorted(set(namespaces)))
    short: list[Insufficient] = []
    near: list[NearLimit] = []
    for resource in sorted(limits):
        requested = demand.get(resource)
        if requested <= 0:
            continue
        limit = limits[resource]
        used = usage.get(resource, Fraction(0))
        after = used + requested
        if after > limit:
            short.append(Insufficient(tenant, resource, used, requested, limit, counted, level))
        elif limit > 0 and after >= warn_ratio * limit:
            near.append(NearLimit(tenant, resource, after, limit, level))
    return QuotaDecision(tuple(short), tuple(near))


def _show(resource: str, amount: Fraction) -> str:
    return quantities.format_quantity(amount, quantities.quantity_kind(resource))


def render_denial(items: Sequence[Insufficient]) -> str:
    """The deny message, one clause per resource, e.g.::

    tenant nlp would exceed its nvidia.com/gpu limit: 11 used + 2 requested > 12
    (namespaces: nlp-serve, nlp-train)

    or, for an ancestor's limit, ``organisation ml would exceed its ...``.
    """
    clauses = []
    for item in items:
        r = item.resource
        counted = ", ".join(item.namespaces) or "none"
        clauses.append(
            f"{item.level} {item.tenant} would exceed its {r} limit: {_show(r, item.used)} used + "
            f"{_show(r, item.requested)} requested > {_show(r, item.limit)} "
            f"(namespaces: {counted})"
        )
    return "; ".join(clauses)


def render_warning(item: NearLimit) -> str:
    """A warning for a pod admitted close to a limit, e.g.
    ``tenant nlp is at 92% of its nvidia.com/gpu limit (11 of 12)``; percent rounded down."""
    percent = int(item.after * 100 / item.limit)
    r = item.resource
    return (
        f"{item.level} {item.tenant} is at {percent}% of its {r} limit "
        f"({_show(r, item.after)} of {_show(r, item.limit)})"
    )
