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


def _cpu_body(uid: str, name: str, namespace: str) -> dict[str, Any]:
    body = review_body(uid, name, 0, namespace=namespace)
    body["request"]["object"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    return body


async def test_a_claim_no_limit_caps_is_not_written():
    # A CPU-only pod of a tenant that limits only GPUs: its reservation could not change
    # any verdict, so it costs no API call; a GPU pod still writes.
    store = MemoryStore()
    a = replica(store)
    for i in range(3):
        assert await _validate(a, _cpu_body(f"c{i}", f"c{i}", "nlp"))
    assert (store.reads, store.writes) == (0, 0)
    assert await _validate(a, review_body("g1", "g1", 1))
    assert store.writes == 1


async def test_an_ancestor_s_limit_on_the_claimed_resource_is_written():
    # The tenant limits GPUs only, its parent limits CPU: a CPU-only pod's reservation
    # counts against the parent's limit, so it is written as before.
    config = loading.config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [
                {"name": "org", "limit": {"cpu": "2"}},
                {
                    "name": "team",
                    "parent": "org",
                    "namespaces": ["team"],
                    "limit": {"nvidia.com/gpu": "4"},
                },
            ],
        }
    )
    store = MemoryStore()
    deps = webhook_app.build_deps(config=lambda: config, ready=lambda: True)
    deps.tracker.on_resync("Namespace", [{"metadata": {"name": "team"}}])
    shared = coordination.SharedReservations(store, ttl=30.0)
    from webhook import wire

    async def validate(body: dict[str, Any]) -> bool:
        req = wire.decode_review(__import__("json").dumps(body).encode())
        return (await shared.admit(req, view=deps.tracker, config=config)).allowed

    assert await validate(_cpu_body("c1", "c1", "team"))
    assert await validate(_cpu_body("c2", "c2", "team"))
    assert store.writes == 2
    assert not await validate(_cpu_body("c3", "c3", "team"))  # 2 reserved + 1 > 2


def test_claims_limited_reads_the_tenant_and_its_ancestors():
    from webhook.review import Claim

    config = loading.config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [
                {"name": "org", "limit": {"memory": "1Ti"}},
                {
                    "name": "team",
                    "parent": "org",
                    "namespaces": ["t"],
                    "limit": {"nvidia.com/gpu": "4"},
                },
            ],
        }
    )
    one = Fraction(1)
    assert coordination.claims_limited(config, Claim("t/p", "team", {"nvidia.com/gpu": one}))
    assert coordination.claims_limited(config, Claim("t/p", "team", {"memory": one}))
    assert not coordination.claims_limited(config, Claim("t/p", "team", {"cpu": one}))
    assert not coordination.claims_limited(
        config, Claim("t/p", "team", {"nvidia.com/gpu": Fraction(0), "cpu": one})
    )
