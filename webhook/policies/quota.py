"""The text of the tenant quota check (``fairshare.limits``): the deny message for the
limits a pod would go past and the warning for a pod admitted close to one. The decision
stays data (``Insufficient`` and ``NearLimit`` items, which tests assert on); the text is
made here only, amounts shown as Kubernetes quantities.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from fairshare import quantities
from fairshare.limits import Insufficient, NearLimit

__all__ = [
    "render_denial",
    "render_warning",
]


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
