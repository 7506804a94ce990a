"""A tenant's limits: what it, with everything below it in the tenant tree, may hold,
checked for a pod or claim about to be counted. The webhook refuses what would go past a
limit and warns near one; the simulator rejects such pods at admission. The decision is
data (``Insufficient`` and ``NearLimit`` items), amounts are exact ``Fraction`` values (a
tenant can use its limit exactly), and only the resources the demand asks for are
checked, as ResourceQuota does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from fairshare.config.schema import FairShareConfig
from fairshare.resources import PodDemand

__all__ = [
    "WARN_RATIO",
    "Insufficient",
    "NearLimit",
    "QuotaDecision",
    "check_limits",
    "check_quota",
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


def _no_namespaces(members: Sequence[str]) -> Iterable[str]:
    return ()


def check_limits(
    config: FairShareConfig,
    tenant: str,
    demand: PodDemand,
    usage: Callable[[Sequence[str]], Mapping[str, Fraction]],
    *,
    namespaces: Callable[[Sequence[str]], Iterable[str]] = _no_namespaces,
    limits: Callable[[str], Mapping[str, Fraction] | None] | None = None,
    warn_ratio: Fraction = WARN_RATIO,
) -> QuotaDecision:
    """``check_quota`` at every level of the tree that has a limit: ``tenant``'s own, then
    each ancestor's upwards, whose limit caps its whole subtree.

    ``usage(members)``: what those tenants (a level and every tenant below it) hold
    together; ``namespaces(members)``: the namespaces counted for them, named in the
    items. ``limits(name)``: a level's limits (default: the config's; None or empty:
    unlimited). The items come level by level, resources sorted within each.
    """
    short: list[Insufficient] = []
    near: list[NearLimit] = []
    for level in (tenant, *(a.name for a in config.ancestors(tenant))):
        if limits is not None:
            limit = limits(level)
        else:
            spec = config.tenant(level)
            limit = None if spec is None else spec.limit_amounts()
        if not limit:
            continue
        members = config.subtree(level)
        got = check_quota(
            tenant=level,
            demand=demand,
            usage=usage(members),
            limits=limit,
            namespaces=tuple(namespaces(members)),
            warn_ratio=warn_ratio,
            level=config.level_name(level),
        )
        short.extend(got.insufficient)
        near.extend(got.near_limit)
    return QuotaDecision(tuple(short), tuple(near))
