"""An in-process ledger of admitted-but-not-yet-watched pods, per tenant. The watch lags
behind admission, so an allowed create reserves its demand here and ``ReservingView``
adds it to the watched usage until the pod is watched (``release``) or its TTL passes.
``review.admit`` checks and reserves with no ``await`` in between, so the ledger takes no
locks; ``now`` is always a parameter.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NewType

from fairshare.resources import add_amounts
from webhook.view import TenantUsageView

__all__ = ["PodKey", "Reservation", "ReservationLedger", "ReservingView", "pod_key"]

PodKey = NewType("PodKey", str)
"""``namespace/name`` of a pod (what the informer knows it by)."""


def pod_key(namespace: str, name: str) -> PodKey:
    """The ledger key of pod ``name`` in ``namespace``."""
    return PodKey(f"{namespace}/{name}")


@dataclass(frozen=True)
class Reservation:
    """Demand held for one admitted pod until it is watched or ``expires`` passes."""

    key: PodKey
    tenant: str
    amounts: Mapping[str, Fraction]
    expires: float
    serial: int


class ReservationLedger:
    """Reservations by pod key, with per-tenant totals."""

    def __init__(self, *, ttl: float) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl}")
        self.ttl = ttl
        self._by_key: dict[PodKey, Reservation] = {}
        self._totals: dict[str, dict[str, Fraction]] = {}
        self._deadlines: deque[tuple[float, PodKey, int]] = deque()
        self._serial = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def reserve(
        self, *, key: PodKey, tenant: str, amounts: Mapping[str, Fraction], now: float
    ) -> Reservation:
        """Hold ``amounts`` for ``tenant`` until ``now + ttl`` (replacing ``key``'s old one)."""
        self.release(key)
        self._serial += 1
        kept = {name: amount for name, amount in amounts.items() if amount}
        held = Reservation(key, tenant, kept, now + self.ttl, self._serial)
        self._by_key[key] = held
        self._deadlines.append((held.expires, key, held.serial))
        self._apply(tenant, held.amounts, +1)
        return held

    def release(self, key: PodKey) -> Reservation | None:
        """Drop ``key``'s reservation (the pod is now in the watched usage); None if absent."""
        held = self._by_key.pop(key, None)
        if held is not None:
            self._apply(held.tenant, held.amounts, -1)
        return held

    def expire(self, now: float) -> tuple[Reservation, ...]:
        """Drop and return every reservation whose deadline is at or before ``now``."""
        dropped: list[Reservation] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, key, serial = self._deadlines.popleft()
            held = self._by_key.get(key)
            if held is not None and held.serial == serial:
                self.release(key)
                dropped.append(held)
        return tuple(dropped)

    def reserved(self, tenant: str, *, exclude: PodKey | None = None) -> Mapping[str, Fraction]:
        """The tenant's reserved amounts by resource, without ``exclude``'s own reservation
        (call ``expire`` first)."""
        totals = dict(self._totals.get(tenant, {}))
        held = self._by_key.get(exclude) if exclude is not None else None
        if held is not None and held.tenant == tenant:
            for name, amount in held.amounts.items():
                totals[name] -= amount
                if not totals[name]:
                    del totals[name]
        return totals

    def tenants(self) -> tuple[str, ...]:
        """Tenants holding reservations, sorted (for metrics)."""
        return tuple(sorted(self._totals))

    def _apply(self, tenant: str, amounts: Mapping[str, Fraction], sign: int) -> None:
        totals = self._totals.setdefault(tenant, {})
        add_amounts(totals, amounts, sign)
        if not totals:
            del self._totals[tenant]


@dataclass(frozen=True)
class ReservingView:
    """A ``TenantUsageView`` whose usage is the watched usage plus the ledger's reservations
    (except ``exclude``'s: the request being judged, when it is a retry)."""

    base: TenantUsageView
    ledger: ReservationLedger
    exclude: PodKey | None = None

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        return self.base.namespace_labels(namespace)

    def tenant_usage(self, tenant: str) -> Mapping[str, Fraction]:
        usage = dict(self.base.tenant_usage(tenant))
        for name, amount in self.ledger.reserved(tenant, exclude=self.exclude).items():
            usage[name] = usage.get(name, Fraction(0)) + amount
        return usage

    def tenant_namespaces(self, tenant: str) -> Sequence[str]:
        return self.base.tenant_namespaces(tenant)

    def max_device_memory(self) -> int | None:
        return self.base.max_device_memory()


def ledger_to_data(ledger: ReservationLedger) -> dict[str, dict[str, object]]:
    """The ledger as JSON-ready data: ``{key: {tenant, amounts, expires}}``.

    Amounts are exact fraction strings (``"1/2"``), so a round trip loses nothing.
    Used to keep one ledger in an API object shared by several webhook replicas.
    """
    return {
        key: {
            "tenant": held.tenant,
            "amounts": {name: str(amount) for name, amount in sorted(held.amounts.items())},
            "expires": held.expires,
        }
        for key, held in sorted(ledger._by_key.items())
    }


def ledger_from_data(data: Mapping[str, object], *, ttl: float) -> ReservationLedger:
    """Rebuild a ledger from :func:`ledger_to_data` output; malformed entries are dropped
    (a reservation is a hint that expires, never worth refusing admissions over)."""
    ledger = ReservationLedger(ttl=ttl)
    entries = []
    for key, raw in data.items():
        if not isinstance(raw, Mapping):
            continue
        try:
            amounts = {str(k): Fraction(str(v)) for k, v in dict(raw["amounts"]).items()}
            entries.append((float(raw["expires"]), PodKey(str(key)), str(raw["tenant"]), amounts))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue
    for expires, key, tenant, amounts in sorted(entries, key=lambda e: (e[0], e[1])):
        ledger.reserve(key=key, tenant=tenant, amounts=amounts, now=expires - ttl)
    return ledger
