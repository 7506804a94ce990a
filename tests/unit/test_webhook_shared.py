"""Reservations shared by several webhook replicas through compare-and-swap."""

from __future__ import annotations

import asyncio
from fractions import Fraction
from typing import Any

from fairshare.config import loading
from tests.unit.test_webhook_app import review_body
from webhook import app as webhook_app
from webhook import coordination
from webhook.reservations import ReservationLedger, ledger_from_data, ledger_to_data

CONFIG = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "nlp", "namespaces": ["nlp"], "limit": {"nvidia.com/gpu": "10"}}],
    }
)


class MemoryStore:
    """An in-memory object store with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[dict[str, Any], int]] = {}
        self.conflicts = 0
        self.reads = 0
        self.writes = 0

    async def read(self, tenant: str) -> tuple[dict[str, Any], str | None]:
        await asyncio.sleep(0)  # a network round trip: other requests run meanwhile
        self.reads += 1
        data, version = self.objects.get(tenant, ({}, 0))
        return dict(data), (str(version) if tenant in self.objects else None)

    async def write(self, tenant: str, data: dict[str, Any], version: str | None) -> str:
        await asyncio.sleep(0)
        current = self.objects.get(tenant)
        if (current is None) != (version is None) or (
            current is not None and str(current[1]) != version
        ):
            self.conflicts += 1
            raise coordination.Conflict("resourceVersion changed")
        self.objects[tenant] = (dict(data), (current[1] if current else 0) + 1)
        self.writes += 1
        return str(self.objects[tenant][1])


def replica(store: MemoryStore) -> webhook_app.WebhookDeps:
    deps = webhook_app.build_deps(config=lambda: CONFIG, ready=lambda: True)
    deps.tracker.on_resync("Namespace", [{"metadata": {"name": "nlp"}}])
    deps.shared = coordination.SharedReservations(store, ttl=30.0, attempts=500)
    return deps


async def _validate(deps: webhook_app.WebhookDeps, body: dict[str, Any]) -> bool:
    from webhook import wire

    req = wire.decode_review(__import__("json").dumps(body).encode())
    assert deps.shared is not None
    resp = await deps.shared.admit(req, view=deps.tracker, config=CONFIG)
    return resp.allowed


async def test_two_replicas_never_admit_past_the_limit():
    # 200 creates of 1 GPU spread over two replicas against a 10-GPU limit: each
    # replica alone sees no usage in its watch; only the shared object stops them.
    store = MemoryStore()
    a, b = replica(store), replica(store)
    bodies = [review_body(f"u{i}", f"p{i}", 1) for i in range(200)]
    results = await asyncio.gather(
        *(_validate(a if i % 2 else b, body) for i, body in enumerate(bodies))
    )
    assert sum(results) == 10
    assert store.conflicts > 0  # they really raced
    data, _ = store.objects["nlp"]
    assert len(data) == 10


async def test_watched_pods_release_their_reservation():
    store = MemoryStore()
    a = replica(store)
    assert await _validate(a, review_body("u1", "p1", 4))
    # the pod shows up in the watch: its reservation must not count twice
    pod = review_body("u1", "p1", 4)["request"]["object"]
    pod["metadata"]["uid"] = "pod-uid-1"
    a.tracker.on_event("Pod", "ADDED", pod)
    assert await _validate(a, review_body("u2", "p2", 6))  # 4 watched + 6 = 10
    assert not await _validate(a, review_body("u3", "p3", 1))
    data, _ = store.objects["nlp"]
    assert "nlp/p1" not in data


def test_ledger_round_trip_is_exact():
    ledger = ReservationLedger(ttl=30)
    ledger.reserve(key="ns/a", tenant="t", amounts={"nvidia.com/gpu": Fraction(1, 7)}, now=100)
    data = ledger_to_data(ledger)
    again = ledger_from_data(data, ttl=30)
    assert again.reserved("t") == {"nvidia.com/gpu": Fraction(1, 7)}
    assert ledger_to_data(again) == data
    # malformed entries are dropped, never fatal
    assert len(ledger_from_data({"x": {"tenant": "t"}, "y": 3}, ttl=30)) == 0


async def test_one_replica_needs_one_api_call_per_admission():
    # Unlimited tenants never touch the store; a limited one costs one write per
    # admission once the replica has the object cached (no read before each write).
    store = MemoryStore()
    a = replica(store)
    for i in range(5):
        assert await _validate(a, review_body(f"u{i}", f"p{i}", 1))
    assert store.writes == 5
    assert store.reads == 1
    open_body = review_body("o1", "o1", 1, namespace="open")
    assert await _validate(a, open_body)  # namespace in no tenant with a limit
    assert store.writes == 5
