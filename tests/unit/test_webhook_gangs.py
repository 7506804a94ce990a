"""Quota for pod groups at admission: a gang is admitted whole or refused whole.

Requests are AdmissionReviews as kube-apiserver sends them (``admission.k8s.io/v1``),
decoded by the webhook's own decoder; the usage is the webhook's ``UsageTracker`` fed like
the watch feeds it, so the holds, reservations and watched members meet as in the server.
"""

from __future__ import annotations

import json
from fractions import Fraction as F
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fairshare.config.loading import config_from_mapping
from fairshare.gangs import ANN_MIN_MEMBERS, POD_GROUP_LABEL, GroupKey
from fairshare.resources import GPU
from fairshare.state.usage import UsageTracker
from webhook import app as webhook_app
from webhook import review, wire
from webhook.gangquota import GangBook
from webhook.reservations import ReservationLedger

HEAD = {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig"}


def config(limit: int = 8) -> Any:
    return config_from_mapping(
        {
            **HEAD,
            "tenants": [
                {"name": "ml", "namespaces": ["ml"], "limit": {GPU: str(limit)}},
                {"name": "other", "namespaces": ["other"], "limit": {GPU: "4"}},
            ],
        }
    )


def pod(
    name: str,
    gpus: int = 2,
    *,
    group: str | None = "job",
    min_members: int | None = None,
    namespace: str = "ml",
    phase: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if group is not None:
        meta["labels"] = {POD_GROUP_LABEL: group}
    if min_members is not None:
        meta["annotations"] = {ANN_MIN_MEMBERS: str(min_members)}
    limits = {"cpu": "100m", "memory": "128Mi", GPU: str(gpus)}
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
    }
    if phase is not None:
        out["status"] = {"phase": phase}
    return out


def admission_review(
    obj: dict[str, Any], uid: str = "", *, dry_run: bool = False
) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or f"req-{meta['name']}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": meta["name"],
            "namespace": meta["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def request(obj: dict[str, Any], **kw: Any) -> wire.AdmissionRequest:
    return wire.decode_review(json.dumps(admission_review(obj, **kw)).encode())


class Cluster:
    """The webhook's state: usage tracker, reservation ledger and gang book, one clock."""

    def __init__(self, limit: int = 8) -> None:
        cfg = config(limit)
        self.config = cfg
        self.tracker = UsageTracker(lambda: cfg)
        self.tracker.on_resync(
            "Namespace", [{"metadata": {"name": "ml"}}, {"metadata": {"name": "other"}}]
        )
        self.ledger = ReservationLedger(ttl=30)
        self.book = GangBook(lambda: cfg)
        self.now = 100.0

    def admit(
        self, obj: dict[str, Any], *, podgroup_min: int | None = None, dry_run: bool = False
    ) -> wire.AdmissionResponse:
        return review.admit(
            request(obj, dry_run=dry_run),
            view=self.tracker,
            config=self.config,
            ledger=self.ledger,
            now=self.now,
            gang=review.GangContext(self.book, podgroup_min=podgroup_min),
        )

    def watch(self, obj: dict[str, Any], event: str = "ADDED") -> None:
        """The watch delivers ``obj`` to both sinks (the tracker releases the reservation)."""
        self.tracker.on_event("Pod", event, obj)
        self.book.on_event("Pod", event, obj)
        if event != "DELETED":
            self.ledger.release(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")  # type: ignore[arg-type]

    def usage(self, tenant: str = "ml") -> F:
        view = review.gangquota.GangHoldView(self.tracker, self.book)
        return F(view.tenant_usage(tenant).get(GPU, 0)) + F(
            self.ledger.reserved(tenant).get(GPU, 0)
        )


def test_a_gang_over_its_tenants_limit_is_refused_as_a_group_and_holds_nothing():
    c = Cluster(limit=8)
    resp = c.admit(pod("job-0", min_members=5))
    assert not resp.allowed
    assert resp.status is not None and resp.status.code == 403
    assert resp.status.message == (
        "gang ml/job (5 members × nvidia.com/gpu 2) would take tenant ml over its "
        "nvidia.com/gpu limit: 0 used + 10 for the group > 8 (namespaces: ml); no member "
        "of the group is admitted until all 5 fit"
    )
    assert len(c.ledger) == 0 and not c.book.groups
    # every member is refused alike: none is ever admitted
    for i in range(1, 5):
        assert not c.admit(pod(f"job-{i}", min_members=5)).allowed
    assert c.usage() == 0
    # the same 2-GPU pod without the group would have passed the per-pod check
    assert c.admit(pod("alone", group=None)).allowed


def test_an_admitted_gang_holds_its_room_and_each_next_member_is_judged_once():
    c = Cluster(limit=10)
    assert c.admit(pod("job-0", min_members=5)).allowed
    # the whole group's 10 GPUs count now: 2 reserved for job-0, 8 held for the rest
    assert c.usage() == 10
    other = c.admit(pod("stray", 1, group=None))
    assert not other.allowed
    assert other.status is not None and other.status.message.startswith(
        "tenant ml would exceed its nvidia.com/gpu limit: 10 used + 1 requested > 10"
    )
    # the next members are admitted: the group's demand counts once, not per member again
    for i in range(1, 5):
        resp = c.admit(pod(f"job-{i}", min_members=5))
        assert resp.allowed, resp.status
        assert c.usage() == 10
    # watched, reservations released: the group counts as its five pods, nothing more
    for i in range(5):
        c.watch(pod(f"job-{i}", min_members=5))
    assert len(c.ledger) == 0
    assert c.usage() == 10
    assert c.book.incomplete() == ()
    # a member beyond minCount counts alone
    extra = c.admit(pod("job-5", min_members=5))
    assert not extra.allowed
    assert "tenant ml would exceed its nvidia.com/gpu limit: 10 used + 2 requested > 10" in (
        extra.status.message if extra.status else ""
    )


def test_members_watched_before_admission_judge_consistently():
    """After a restart the book learns the group from the watch: two members of four exist,
    so two more are held, and the third member is admitted without counting twice."""
    c = Cluster(limit=8)
    for i in range(2):
        c.watch(pod(f"job-{i}", min_members=4))
    assert c.book.incomplete() == ((GroupKey("ml", "job"), 2, 4),)
    assert c.usage() == 8
    assert not c.admit(pod("stray", 1, group=None)).allowed
    assert c.admit(pod("job-2", min_members=4)).allowed
    assert c.admit(pod("job-3", min_members=4)).allowed
    assert c.usage() == 8


def test_the_podgroup_min_member_wins_over_the_annotation():
    c = Cluster(limit=8)
    refused = c.admit(pod("job-0", min_members=2), podgroup_min=5)
    assert not refused.allowed
    assert "5 members × nvidia.com/gpu 2" in (refused.status.message if refused.status else "")
    c2 = Cluster(limit=8)
    assert c2.admit(pod("job-0", min_members=9), podgroup_min=4).allowed
    assert c2.usage() == 8


def test_without_podgroup_or_annotation_members_are_checked_pod_by_pod():
    c = Cluster(limit=8)
    resp = c.admit(pod("job-0"))
    assert resp.allowed
    assert any("checked pod by pod" in w for w in resp.warnings), resp.warnings
    assert c.usage() == 2


def test_a_dry_run_holds_nothing():
    c = Cluster(limit=10)
    assert c.admit(pod("job-0", min_members=5), dry_run=True).allowed
    assert c.usage() == 0 and not c.book.groups


def test_a_member_whose_create_never_landed_stops_holding_after_the_ttl():
    c = Cluster(limit=10)
    assert c.admit(pod("job-0", min_members=5)).allowed
    c.now += 31  # the create failed later (another webhook): nothing was watched
    assert c.admit(pod("stray", 4, group=None)).allowed


def test_finished_members_still_count_as_members_and_deleted_groups_are_forgotten():
    c = Cluster(limit=8)
    c.watch(pod("job-0", min_members=3, phase="Succeeded"))
    c.watch(pod("job-1", min_members=3))
    assert c.book.incomplete() == ((GroupKey("ml", "job"), 2, 3),)
    assert c.usage() == 4  # job-1's 2, and 2 held for the third member
    for name in ("job-0", "job-1"):
        c.watch(pod(name, min_members=3), "DELETED")
    assert not c.book.groups and c.usage() == 0


def test_an_ancestors_limit_refuses_the_group_naming_the_level():
    cfg = config_from_mapping(
        {
            **HEAD,
            "tenants": [
                {"name": "org", "limit": {GPU: "6"}},
                {"name": "team", "parent": "org", "namespaces": ["ml"]},
            ],
        }
    )
    tracker = UsageTracker(lambda: cfg)
    tracker.on_resync("Namespace", [{"metadata": {"name": "ml"}}])
    resp = review.admit(
        request(pod("job-0", min_members=4)),
        view=tracker,
        config=cfg,
        ledger=ReservationLedger(ttl=30),
        now=0,
        gang=review.GangContext(GangBook(lambda: cfg)),
    )
    assert not resp.allowed
    message = resp.status.message if resp.status else ""
    assert "gang ml/job (4 members × nvidia.com/gpu 2) would take" in message
    assert "over its nvidia.com/gpu limit: 0 used + 8 for the group > 6" in message


# --- through the HTTP app, with the PodGroup read from the API ------------------------


@pytest.fixture
async def client():
    deps = webhook_app.build_deps(config=lambda: config(8), ready=lambda: True)
    deps.tracker.on_resync("Namespace", [{"metadata": {"name": "ml"}}])
    podgroups: dict[GroupKey, Any] = {}
    calls: list[GroupKey] = []

    async def fetch(key: GroupKey) -> Any:
        calls.append(key)
        got = podgroups.get(key)
        if isinstance(got, Exception):
            raise got
        return got

    deps.podgroups = fetch
    async with TestClient(TestServer(webhook_app.make_app(deps))) as c:
        c.podgroups = podgroups  # type: ignore[attr-defined]
        c.calls = calls  # type: ignore[attr-defined]
        yield c


async def post(client: Any, obj: dict[str, Any]) -> dict[str, Any]:
    r = await client.post("/validate", json=admission_review(obj))
    assert r.status == 200
    return dict((await r.json())["response"])


async def test_validate_reads_the_podgroup_and_refuses_the_whole_group(client):
    client.podgroups[GroupKey("ml", "job")] = {"spec": {"minMember": 5}}
    answer = await post(client, pod("job-0"))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    assert answer["status"]["message"].startswith("gang ml/job (5 members × nvidia.com/gpu 2)")
    # read once, then reused
    await post(client, pod("job-1"))
    assert client.calls == [GroupKey("ml", "job")]


async def test_a_podgroup_that_cannot_be_read_falls_back_with_a_warning(client):
    client.podgroups[GroupKey("ml", "job")] = RuntimeError("403 Forbidden")
    answer = await post(client, pod("job-0", min_members=3))
    assert answer["allowed"] is True
    warnings = answer.get("warnings") or []
    assert any("its PodGroup could not be read (403 Forbidden)" in w for w in warnings), warnings
    # sized by the annotation: 3 × 2 = 6 of 8 committed, a 4-GPU pod no longer fits
    refused = await post(client, pod("big", 4, group=None))
    assert refused["allowed"] is False


def test_the_min_members_annotation_is_accepted_and_checked():
    """The extender's fallback annotation passes the unknown-annotation check (it was
    refused as unknown before), and a value that is not a positive integer is refused."""
    c = Cluster(limit=100)
    assert c.admit(pod("job-0", min_members=4)).allowed
    bad = pod("job-x")
    bad["metadata"]["annotations"] = {ANN_MIN_MEMBERS: "0"}
    resp = c.admit(bad)
    assert not resp.allowed and resp.status is not None and resp.status.code == 400
    assert f'annotation {ANN_MIN_MEMBERS}="0": not a positive integer' in resp.status.message


async def test_with_shared_reservations_a_replica_judges_and_holds_the_group():
    """``--shared-reservations``: the gang's account lives in the replica's book; its
    first member's admission holds the room for the rest there too."""
    from tests.unit.test_webhook_shared import MemoryStore
    from webhook import coordination

    c = Cluster(limit=10)
    shared = coordination.SharedReservations(MemoryStore(), ttl=30.0)

    async def admit(obj: dict[str, Any]) -> wire.AdmissionResponse:
        return await shared.admit(
            request(obj), view=c.tracker, config=c.config, gang=review.GangContext(c.book)
        )

    refused = await admit(pod("big-0", 3, group="big", min_members=4))
    assert not refused.allowed and "gang ml/big (4 members" in (
        refused.status.message if refused.status else ""
    )
    assert (await admit(pod("job-0", min_members=5))).allowed
    assert not (await admit(pod("stray", 1, group=None))).allowed
    for i in range(1, 5):
        assert (await admit(pod(f"job-{i}", min_members=5))).allowed
