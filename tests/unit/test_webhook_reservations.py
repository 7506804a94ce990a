"""The reservation ledger and ``review.admit``: concurrent creates cannot over-admit."""

from __future__ import annotations

import asyncio
import json
from fractions import Fraction as F
from typing import Any

import pytest

from fairshare.config.loading import config_from_mapping
from fairshare.resources import CPU, GPU
from tests.builders import make_pod
from webhook import review, wire
from webhook.reservations import PodKey, ReservationLedger, ReservingView, pod_key
from webhook.view import StaticView

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "nlp", "namespaces": ["nlp"], "limit": {GPU: "10"}}],
    }
)
EMPTY = StaticView()


def create(name: str, *, gpu: int = 1, dry_run: bool = False) -> wire.AdmissionRequest:
    pod = make_pod(name).ns("nlp").req(gpu=gpu).obj()
    body: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"uid-{name}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": "nlp",
            "operation": "CREATE",
            "object": pod,
            "oldObject": None,
            "dryRun": dry_run,
        },
    }
    return wire.decode_review(json.dumps(body).encode())


def admit(
    ledger: ReservationLedger, request: wire.AdmissionRequest, *, now: float = 0.0, view=EMPTY
) -> bool:
    response = review.admit(request, view=view, config=CONFIG, ledger=ledger, now=now)
    return response.allowed


K = PodKey


# --- the ledger ----------------------------------------------------------------------------


def test_reserve_and_release_keep_per_tenant_totals() -> None:
    ledger = ReservationLedger(ttl=30)
    ledger.reserve(key=K("a/1"), tenant="t", amounts={GPU: F(1), CPU: F(2)}, now=0)
    ledger.reserve(key=K("a/2"), tenant="t", amounts={GPU: F(1, 2)}, now=0)
    ledger.reserve(key=K("b/1"), tenant="u", amounts={GPU: F(3)}, now=0)
    assert ledger.reserved("t") == {GPU: F(3, 2), CPU: F(2)}
    assert ledger.tenants() == ("t", "u")
    released = ledger.release(K("a/1"))
    assert released is not None and released.tenant == "t"
    assert ledger.reserved("t") == {GPU: F(1, 2)}
    assert ledger.release(K("a/1")) is None
    ledger.release(K("a/2"))
    assert ledger.reserved("t") == {}
    assert ledger.tenants() == ("u",)
    assert len(ledger) == 1 and K("b/1") in ledger


def test_reserving_the_same_key_replaces_it() -> None:
    ledger = ReservationLedger(ttl=30)
    ledger.reserve(key=K("a/1"), tenant="t", amounts={GPU: F(4)}, now=0)
    ledger.reserve(key=K("a/1"), tenant="t", amounts={GPU: F(1)}, now=10)
    assert ledger.reserved("t") == {GPU: F(1)}
    # The first deadline (30) is stale: the reservation now lives until 40.
    assert ledger.expire(35) == ()
    assert ledger.reserved("t") == {GPU: F(1)}
    (gone,) = ledger.expire(40)
    assert gone.key == "a/1" and ledger.reserved("t") == {}


@pytest.mark.parametrize(
    ("now", "left"),
    [(29.999, 2), (30, 1), (45, 0)],
    ids=["before-deadline", "at-deadline", "after-both"],
)
def test_expire(now: float, left: int) -> None:
    ledger = ReservationLedger(ttl=30)
    ledger.reserve(key=K("a/1"), tenant="t", amounts={GPU: F(1)}, now=0)
    ledger.reserve(key=K("a/2"), tenant="t", amounts={GPU: F(1)}, now=10)
    ledger.expire(now)
    assert len(ledger) == left
    assert ledger.reserved("t") == ({GPU: F(left)} if left else {})


def test_released_then_expired_is_not_dropped_twice() -> None:
    ledger = ReservationLedger(ttl=30)
    ledger.reserve(key=K("a/1"), tenant="t", amounts={GPU: F(1)}, now=0)
    ledger.release(K("a/1"))
    assert ledger.expire(100) == ()


@pytest.mark.parametrize("ttl", [0, -1], ids=["zero", "negative"])
def test_ttl_must_be_positive(ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl must be > 0"):
        ReservationLedger(ttl=ttl)


def test_reserving_view_adds_reservations_to_watched_usage() -> None:
    ledger = ReservationLedger(ttl=30)
    ledger.reserve(key=K("a/1"), tenant="t", amounts={GPU: F(2)}, now=0)
    base = StaticView(
        labels={"a": {"x": "y"}}, usage={"t": {GPU: F(3), CPU: F(1)}}, namespaces={"t": ("a",)}
    )
    view = ReservingView(base, ledger)
    assert view.tenant_usage("t") == {GPU: F(5), CPU: F(1)}
    assert view.tenant_usage("other") == {}
    assert view.namespace_labels("a") == {"x": "y"}
    assert view.tenant_namespaces("t") == ("a",)
    assert view.max_device_memory() is None


def test_pod_key() -> None:
    assert pod_key("nlp", "train-x") == "nlp/train-x"


# --- admit -------------------------------------------------------------------------------


async def test_200_concurrent_creates_against_a_10_gpu_limit_admit_exactly_10() -> None:
    ledger = ReservationLedger(ttl=30)

    async def one(i: int) -> bool:
        await asyncio.sleep(0)  # interleave the 200 handlers as an event loop would
        return admit(ledger, create(f"p{i}"))

    results = await asyncio.gather(*(one(i) for i in range(200)))
    assert sum(results) == 10
    assert ledger.reserved("nlp") == {GPU: F(10)}


def test_dry_run_is_judged_the_same_but_reserves_nothing() -> None:
    ledger = ReservationLedger(ttl=30)
    assert all(admit(ledger, create(f"d{i}", dry_run=True)) for i in range(20))
    assert len(ledger) == 0
    ledger.reserve(key=K("nlp/x"), tenant="nlp", amounts={GPU: F(10)}, now=0)
    assert not admit(ledger, create("d", dry_run=True))


def test_watched_pods_replace_their_reservations() -> None:
    ledger = ReservationLedger(ttl=30)
    for i in range(10):
        assert admit(ledger, create(f"p{i}"))
    # The informer sees the 10 pods: usage 10 from the watch, reservations released.
    for i in range(10):
        ledger.release(pod_key("nlp", f"p{i}"))
    watched = StaticView(usage={"nlp": {GPU: F(10)}}, namespaces={"nlp": ("nlp",)})
    assert not admit(ledger, create("p10"), view=watched)
    assert len(ledger) == 0


def test_expired_reservations_free_the_quota() -> None:
    ledger = ReservationLedger(ttl=30)
    assert admit(ledger, create("big", gpu=10), now=0)
    assert not admit(ledger, create("late"), now=29)
    # "big" never showed up (another webhook denied it): after the TTL its GPUs are free.
    assert admit(ledger, create("later"), now=30)


def test_a_denied_create_reserves_nothing() -> None:
    ledger = ReservationLedger(ttl=30)
    assert not admit(ledger, create("huge", gpu=11))
    assert len(ledger) == 0


def test_reserved_can_leave_out_one_key() -> None:
    ledger = ReservationLedger(ttl=30)
    ledger.reserve(key=K("a/1"), tenant="t", amounts={GPU: F(1), CPU: F(2)}, now=0)
    ledger.reserve(key=K("a/2"), tenant="t", amounts={GPU: F(1)}, now=0)
    assert ledger.reserved("t", exclude=K("a/1")) == {GPU: F(1)}
    assert ledger.reserved("u", exclude=K("a/1")) == {}
    assert ledger.reserved("t", exclude=K("zz")) == {GPU: F(2), CPU: F(2)}


def test_a_retried_create_is_not_counted_twice() -> None:
    ledger = ReservationLedger(ttl=30)
    assert admit(ledger, create("big", gpu=10), now=0)
    # kube-apiserver retries the same create (same name): it still fits, and still
    # holds exactly one reservation.
    assert admit(ledger, create("big", gpu=10), now=1)
    assert ledger.reserved("nlp") == {GPU: F(10)}
    assert not admit(ledger, create("other"), now=2)


@pytest.mark.parametrize(
    ("request_", "key"),
    [
        (create("p1"), "nlp/p1"),
        (create("p1", dry_run=True), "nlp/p1"),
        (create("p1").model_copy(update={"operation": "UPDATE"}), None),
        (create("p1").model_copy(update={"sub_resource": "status"}), None),
        (create("p1").model_copy(update={"object": None}), None),
        (
            create("p1").model_copy(
                update={"kind": wire.GroupVersionKind(version="v1", kind="PersistentVolumeClaim")}
            ),
            "pvc:nlp/p1",
        ),
        (
            create("p1").model_copy(
                update={"kind": wire.GroupVersionKind(version="v1", kind="ConfigMap")}
            ),
            None,
        ),
    ],
    ids=["pod", "dry-run-pod", "update", "subresource", "no-object", "pvc", "configmap"],
)
def test_claim_key(request_: wire.AdmissionRequest, key: str | None) -> None:
    assert review.claim_key(request_) == key
