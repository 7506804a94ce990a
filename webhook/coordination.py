"""Reservations shared by every webhook replica: compare-and-swap on a per-tenant object.

One process is safe with its in-memory ledger (asyncio makes check-then-reserve atomic);
several replicas are not. So, as ResourceQuota does with its status, admission uses
optimistic concurrency on one ``coordination.k8s.io/v1`` Lease per tenant
(``fairshare-reservations-<tenant>``; a Lease, so the webhook's write permission cannot
touch the config), the reservations held as JSON in an annotation: judge against watched
usage plus the Lease's reservations, write an allowed reservation back with the read
``resourceVersion``, and on 409 read and judge again (bounded attempts). Reservations
carry wall-clock deadlines and are pruned on each write. Tenants without a ``limit``,
pods that claim no limited resource, and dry runs write nothing. ``LeaseStore`` is the
API side, behind a small protocol tests can swap.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fairshare.config.schema import FairShareConfig
from fairshare.state.usage import UsageTracker
from webhook import review, wire
from webhook.policies.config_guard import ConfigMapRef
from webhook.reservations import ledger_from_data, ledger_to_data

log = logging.getLogger("fairshare.webhook.coordination")

ANNOTATION = "fairshare.io/reservations"


class Conflict(Exception):
    """Somebody else wrote the object since we read it."""


class StoreError(Exception):
    """The API refused a read or write for a reason other than a conflict."""


class ReservationStore(Protocol):
    """Read and compare-and-swap one tenant's reservations."""

    async def read(self, tenant: str) -> tuple[dict[str, Any], str | None]:
        """The data and its version (None when the object does not exist yet)."""
        ...

    async def write(self, tenant: str, data: dict[str, Any], version: str | None) -> str | None:
        """Write ``data`` if the object is still at ``version``; raise ``Conflict`` if not.

        Returns the new version (None when the store cannot tell)."""
        ...


def object_name(tenant: str) -> str:
    return f"fairshare-reservations-{tenant}"


class LeaseStore:
    """``ReservationStore`` on Leases through kubernetes_asyncio's ``CoordinationV1Api``."""

    def __init__(self, coordination_v1: Any, namespace: str) -> None:
        self.api = coordination_v1
        self.namespace = namespace

    async def read(self, tenant: str) -> tuple[dict[str, Any], str | None]:
        from kubernetes_asyncio.client.rest import ApiException

        try:
            resp = await self.api.read_namespaced_lease(
                object_name(tenant), self.namespace, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 404:
                return {}, None
            raise
        # With _preload_content=False error statuses may come back unraised.
        if resp.status == 404:
            resp.release()
            return {}, None
        body = await resp.read()
        if resp.status >= 300:
            raise StoreError(f"reading Lease {object_name(tenant)}: HTTP {resp.status}")
        obj = json.loads(body)
        meta = obj.get("metadata") or {}
        try:
            data = json.loads((meta.get("annotations") or {}).get(ANNOTATION) or "{}")
        except json.JSONDecodeError:
            data = {}
        return (data if isinstance(data, dict) else {}), meta.get("resourceVersion")

    async def write(self, tenant: str, data: dict[str, Any], version: str | None) -> str | None:
        from kubernetes_asyncio.client.rest import ApiException

        meta: dict[str, Any] = {
            "name": object_name(tenant),
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/part-of": "fairshare"},
            "annotations": {ANNOTATION: json.dumps(data, sort_keys=True)},
        }
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {},
        }
        try:
            if version is None:
                resp = await self.api.create_namespaced_lease(
                    self.namespace, body, _preload_content=False
                )
            else:
                meta["resourceVersion"] = version
                resp = await self.api.replace_namespaced_lease(
                    object_name(tenant), self.namespace, body, _preload_content=False
                )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(str(exc.reason)) from None
            raise
        status = resp.status
        reply = await resp.read()
        if status == 409:
            raise Conflict("resourceVersion changed")
        if status >= 300:
            raise StoreError(f"writing Lease {object_name(tenant)}: HTTP {status}")
        try:
            new_version = (json.loads(reply).get("metadata") or {}).get("resourceVersion")
        except (ValueError, AttributeError):
            return None
        return str(new_version) if new_version else None


@dataclass
class SharedReservations:
    """Admission with reservations held in a ``ReservationStore`` (see module docstring)."""

    store: ReservationStore
    ttl: float = 30.0
    attempts: int = 10
    clock: Callable[[], float] = time.time
    _cache: dict[str, tuple[dict[str, Any], str | None]] = field(default_factory=dict)

    async def admit(
        self,
        request: wire.AdmissionRequest,
        *,
        view: UsageTracker,
        config: FairShareConfig,
        config_map: ConfigMapRef | None = None,
        gang: review.GangContext | None = None,
    ) -> wire.AdmissionResponse:
        """``review.admit`` against the shared ledger of the pod's tenant."""
        probe = review.judge(
            request, view=view, config=config, phase="validate", config_map=config_map, gang=gang
        )
        claim = probe.claim
        if not probe.response.allowed or claim is None:
            return probe.response
        tenant = config.tenant(claim.tenant)
        if tenant is None or not tenant.limit:
            return probe.response  # nothing to over-admit: no API round trip
        if not claims_limited(config, claim):
            # No limit up the tree caps what this pod claims (a CPU-only pod of a tenant
            # that limits GPUs): no verdict on any replica can depend on its reservation,
            # so it is not written (the Lease write is most of a validate call's time).
            return probe.response
        cached = self._cache.get(claim.tenant)
        for attempt in range(self.attempts):
            # Optimistic: start from the last version this replica saw; read only when
            # there is none or a write lost a race.
            if cached is None or attempt > 0:
                cached = await self.store.read(claim.tenant)
            data, version = cached
            ledger = ledger_from_data(data, ttl=self.ttl)
            for key in [k for k in data if _watched(view, k)]:
                ledger.release(key)  # type: ignore[arg-type]
            resp = review.admit(
                request,
                view=view,
                config=config,
                ledger=ledger,
                now=self.clock(),
                config_map=config_map,
                gang=gang,
            )
            if not resp.allowed or request.dry_run:
                return resp
            after = ledger_to_data(ledger)
            try:
                new_version = await self.store.write(claim.tenant, after, version)
            except Conflict:
                self._cache.pop(claim.tenant, None)
                continue
            # The next admission starts from what we just wrote (one API call, not two);
            # if another replica writes meanwhile, that write conflicts and re-reads.
            if new_version is not None:
                self._cache[claim.tenant] = (after, new_version)
            else:
                self._cache.pop(claim.tenant, None)
            return resp
        log.warning(
            "gave up reserving for tenant %s after %d conflicts", claim.tenant, self.attempts
        )
        return wire.deny(
            429, f"fairshare: quota of tenant {claim.tenant} is busy (concurrent creates); retry"
        )


def claims_limited(config: FairShareConfig, claim: review.Claim) -> bool:
    """Whether ``claim`` holds a positive amount of a resource that the claiming tenant's
    limit or an ancestor's limit caps (only those amounts take part in a quota check)."""
    claimed = {name for name, amount in claim.amounts.items() if amount > 0}
    tenant = config.tenant(claim.tenant)
    chain = () if tenant is None else (tenant, *config.ancestors(claim.tenant))
    return any(claimed & set(t.limit or {}) for t in chain)


def _watched(view: UsageTracker, key: str) -> bool:
    ns, sep, name = key.partition("/")
    return bool(sep) and not key.startswith(("pvc:", "uid:")) and view.has_pod(ns, name)
