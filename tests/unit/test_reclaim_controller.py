"""The reclaim controller over a fake API: leases, evictions, PDB refusals, events, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender import reclaimer as rec
from fairshare import metrics as metrics_mod
from fairshare.config.loading import config_from_mapping
from fairshare.preemption import holds, reclaim
from tests.extender_side import Side
from tests.unit.test_state_objects import node, pod

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "a", "namespaces": ["a"], "guaranteed": {"nvidia.com/gpu": "1"}},
            {"name": "b", "namespaces": ["b"], "guaranteed": {"nvidia.com/gpu": "2"}},
        ],
    }
)


class FakeApi:
    def __init__(self) -> None:
        self.evicted: list[str] = []
        self.events: list[tuple[str, str, str]] = []
        self.refuse: set[str] = set()
        self.lease: dict[str, Any] | None = None
        self.rv = 0
        self.conflict = False
        self.annotated: list[tuple[str, dict[str, str]]] = []
        self.evicted_before_hold: list[int] = []

    async def evict(self, namespace: str, name: str, grace: int | None) -> rec.EvictResult:
        if name in self.refuse:
            return rec.EvictResult("blocked", "Cannot evict pod as it would violate the budget")
        self.evicted.append(f"{namespace}/{name}")
        return rec.EvictResult("evicted")

    async def record_event(
        self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool = False
    ) -> None:
        self.events.append((pod["metadata"]["name"], reason, message))

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.lease

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.annotated.append((f"{namespace}/{name}", dict(annotations)))
        self.evicted_before_hold.append(len(self.evicted))

    async def write_lease(self, namespace: str, body: dict[str, Any], *, create: bool) -> bool:
        if self.conflict or (create and self.lease is not None):
            return False
        if not create and body["metadata"]["resourceVersion"] != str(self.rv):
            return False
        self.rv += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
        return True


def bound(name: str, ns: str, node_name: str, t: int) -> dict[str, Any]:
    obj = pod(name, ns=ns, gpu=1, node_name=node_name)
    obj["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{t:02d}Z"
    return obj


def world(api: FakeApi, **kw: Any) -> tuple[rec.Reclaimer, list[float]]:
    """Node n1 (2 GPUs) and n2 (2 GPUs) full of A's pods a0..a3 (a3 youngest, on n2)."""
    tracker = Side(lambda: CONFIG)
    tracker.on_resync("Node", [node("n1", gpus=2), node("n2", gpus=2)])
    pods = [bound(f"a{k}", "a", n, k) for k, n in enumerate(("n1", "n1", "n2", "n2"))]
    tracker.on_resync("Pod", pods)
    clock = [1000.0]
    r = rec.Reclaimer(
        tracker.cache,
        lambda: CONFIG,
        api,
        metrics_mod.Metrics(CollectorRegistry()),
        clock=lambda: clock[0],
        **kw,
        feedback=tracker.feedback,
    )
    return r, clock


def want(r: rec.Reclaimer, name: str) -> None:
    r.sink.on_event("Pod", "ADDED", pod(name, ns="b", gpu=1))


def sample(r: rec.Reclaimer, name: str, **labels: str) -> float | None:
    return r.metrics.registry.get_sample_value(name, labels)


async def test_evicts_youngest_and_records_events_on_both_pods():
    api = FakeApi()
    r, _ = world(api)
    want(r, "b0")
    plan = await r.tick()
    assert api.evicted == ["a/a3"]
    assert [(n, reason) for n, reason, _ in api.events] == [
        ("a3", reclaim.REASON_RECLAIMED),
        ("b0", reclaim.REASON_MADE_ROOM),
    ]
    assert "a/a3" in api.events[1][2]
    assert plan.decisions == (("a", "b"),)
    labels = {"outcome": "evicted", "tenant": "a", "beneficiary": "b"}
    assert sample(r, "fairshare_reclaim_evictions_total", **labels) == 1
    # Next round: a3 is still terminating; nothing more is evicted for b0.
    await r.tick()
    assert api.evicted == ["a/a3"]


async def test_the_pod_room_was_made_for_is_annotated_with_its_hold():
    api = FakeApi()
    r, _ = world(api, wall_clock=lambda: 5000.0)
    want(r, "b0")
    await r.tick()
    until = 5000.0 + holds.HOLD_TIMEOUT
    # Whose pod went for it, and when: no take-back for reclaimTakeBackAfter.
    given = {holds.ANN_RECLAIMED_FROM: "a", holds.ANN_RECLAIMED_AT: "5000.000"}
    assert api.annotated == [("b/b0", {**holds.hold_annotations("n2", until), **given})]
    assert api.evicted == ["a/a3"] and api.evicted_before_hold == [0]  # held, then evicted
    # The watch brings the annotation back: the next round leaves the hold as it is.
    held = pod("b0", ns="b", gpu=1)
    held["metadata"]["annotations"] = {**holds.hold_annotations("n2", until), **given}
    r.sink.on_event("Pod", "MODIFIED", held)
    await r.tick()
    assert len(api.annotated) == 1
    # In the hold's second half, the round writes it again (the room is still kept).
    r.wall_clock = lambda: until - rec.HOLD_RENEW + 1
    await r.tick()
    assert [node for _, ann in api.annotated for node in [ann[holds.ANN_HELD_NODE]]] == [
        "n2",
        "n2",
    ]


async def test_the_record_of_who_gave_room_is_read_back_from_the_pods():
    """b (fair share 2 of 4 GPUs, guarantee 2) runs 3 pods, one of them with room a gave
    it; a (1 pod) wants one more, toward its fair share: nothing is taken from b."""
    cfg = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "reclaimToFairShare": True,
            "yieldBand": 0.0,
            "tenants": [{"name": n, "namespaces": [n]} for n in ("a", "b")],
        }
    )
    record_at = {holds.ANN_RECLAIMED_FROM: "a", holds.ANN_RECLAIMED_AT: "9000.000"}
    for record in ({}, record_at):
        api = FakeApi()
        tracker = Side(lambda: cfg)
        tracker.on_resync("Node", [node("n1", gpus=4)])
        pods = [bound("a0", "a", "n1", 0)] + [bound(f"b{k}", "b", "n1", k + 1) for k in range(3)]
        pods[1]["metadata"]["annotations"] = dict(record)
        tracker.on_resync("Pod", pods)
        tracker.on_event("Pod", "ADDED", pod("a1", ns="a", gpu=1))
        r = rec.Reclaimer(
            tracker.cache,
            lambda: cfg,
            api,
            metrics_mod.Metrics(CollectorRegistry()),
            feedback=tracker.feedback,
        )
        r.wall_clock = lambda: 9000.0 + 3599.0  # within the hour of reclaimTakeBackAfter
        await r.tick()
        assert api.evicted == ([] if record else ["b/b2"])
    # An hour after it was given, the record no longer counts: the room may be taken back.
    r = rec.Reclaimer(
        tracker.cache,
        lambda: cfg,
        FakeApi(),
        metrics_mod.Metrics(CollectorRegistry()),
        feedback=tracker.feedback,
    )
    r.wall_clock = lambda: 9000.0 + 3600.0
    assert [e.victim_name for e in (await r.tick()).evictions] == ["b2"]


async def test_pdb_refusal_picks_another_victim_and_explains():
    api = FakeApi()
    api.refuse = {"a3", "a2"}
    r, _ = world(api)
    want(r, "b0")
    await r.tick()
    assert api.evicted == ["a/a1"]
    blocked = [m for n, reason, m in api.events if reason == rec.REASON_BLOCKED]
    assert len(blocked) == 2 and all("PodDisruptionBudget" in m for m in blocked)
    labels = {"outcome": "blocked", "tenant": "a", "beneficiary": "b"}
    assert sample(r, "fairshare_reclaim_evictions_total", **labels) == 2


async def test_all_victims_protected_means_waiting_with_one_event():
    api = FakeApi()
    api.refuse = {"a0", "a1", "a2", "a3"}
    r, clock = world(api)
    want(r, "b0")
    await r.tick()
    assert api.evicted == []
    waits = [reason for n, reason, _ in api.events if n == "b0" and reason.startswith("Reclaim")]
    assert rec.REASON_BLOCKED in waits and reclaim.WAIT_NO_VICTIMS in waits
    clock[0] += 1
    before = len(api.events)
    await r.tick()
    assert len(api.events) == before  # the wait is explained once, not every round
    clock[0] += rec.PDB_BACKOFF  # protection expires: tried again
    await r.tick()
    assert len(api.events) > before


async def test_rate_limit_per_minute():
    api = FakeApi()
    r, clock = world(api, max_per_minute=1)
    want(r, "b0")
    want(r, "b1")
    plan = await r.tick()
    assert len(api.evicted) == 1
    assert [w.reason for w in plan.waiting] == [reclaim.WAIT_BUDGET]
    clock[0] += 61
    await r.tick()
    assert len(api.evicted) == 2


async def test_restore_time_is_observed_when_the_deficit_clears():
    api = FakeApi()
    r, clock = world(api)
    want(r, "b0")
    await r.tick()
    # The victim goes, b0 is bound where it was: B is at 1 of its 2, with nothing pending.
    r.sink.on_event("Pod", "DELETED", bound("a3", "a", "n2", 3))
    r.sink.on_event("Pod", "MODIFIED", bound("b0", "b", "n2", 9))
    clock[0] += 12.5
    await r.tick()
    assert list(r.restored) == [("b", 12.5)]
    assert sample(r, "fairshare_reclaim_guarantee_restore_seconds_sum", tenant="b") == 12.5


@pytest.mark.parametrize(
    ("spec", "decision"),
    [
        ({}, "acquire"),
        ({"holderIdentity": "me", "renewTime": "2026-01-01T00:00:00.000000Z"}, "renew"),
        (
            {
                "holderIdentity": "other",
                "renewTime": "2026-01-01T00:00:00.000000Z",
                "leaseDurationSeconds": 15,
            },
            "wait",
        ),
        (
            {
                "holderIdentity": "other",
                "renewTime": "2025-12-31T23:59:40.000000Z",
                "leaseDurationSeconds": 15,
            },
            "acquire",
        ),
        ({"holderIdentity": "other", "leaseDurationSeconds": 15}, "acquire"),
    ],
    ids=["empty", "ours", "held", "expired", "never-renewed"],
)
def test_lease_decision(spec, decision):
    now = rec._parse_time("2026-01-01T00:00:05Z")
    assert now is not None
    assert rec.lease_decision(spec, identity="me", now=now) == decision


async def test_lease_elector_single_holder_and_takeover():
    api = FakeApi()
    wall = [1_800_000_000.0]
    me = rec.LeaseElector(api, "ns", "l", "me", duration=10, wall=lambda: wall[0])
    other = rec.LeaseElector(api, "ns", "l", "other", duration=10, wall=lambda: wall[0])
    assert await me.try_lead()
    assert not await other.try_lead()
    wall[0] += 5
    assert await me.try_lead()  # renew
    assert api.lease is not None and api.lease["spec"]["leaseTransitions"] == 0
    wall[0] += 11  # me stopped renewing: expired
    assert await other.try_lead()
    assert api.lease["spec"]["holderIdentity"] == "other"
    assert api.lease["spec"]["leaseTransitions"] == 1
    assert not await me.try_lead()
    api.conflict = True
    assert not await other.try_lead()  # lost the compare-and-swap


async def test_run_loop_only_the_leader_evicts():
    api = FakeApi()
    api.lease = {
        "metadata": {"resourceVersion": "0"},
        "spec": {
            "holderIdentity": "other",
            "renewTime": "2999-01-01T00:00:00.000000Z",
            "leaseDurationSeconds": 15,
        },
    }
    r, _ = world(api)
    want(r, "b0")
    elector = rec.LeaseElector(api, "ns", "l", "me")
    stop = asyncio.Event()
    task = asyncio.create_task(
        rec.run_loop(r, elector, interval=0.01, ready=lambda: True, stop=stop)
    )
    await asyncio.sleep(0.05)
    assert api.evicted == []
    assert sample(r, "fairshare_reclaim_leader") == 0
    api.lease = None  # the other replica is gone and its lease deleted
    await asyncio.sleep(0.05)
    stop.set()
    await task
    assert api.evicted == ["a/a3"]
    assert sample(r, "fairshare_reclaim_leader") == 1


def test_plan_summary():
    plan = reclaim.ReclaimPlan(deficits=("b",))
    assert rec.plan_summary(plan) == {"evictions": [], "waiting": [], "deficits": ["b"]}


def test_cli_reclaimer_arguments():
    from fairshare_cli import main as cli
    from fairshare_cli import servers

    args = cli.build_parser().parse_args(
        [
            "reclaimer",
            "--configmap",
            "fairshare-system/fairshare-config",
            "--kubeconfig",
            "kc",
            "--interval",
            "2",
            "--cooldown",
            "30",
            "--max-evictions-per-minute",
            "20",
        ]
    )
    assert args.func is servers.cmd_reclaimer
    assert (args.interval, args.cooldown, args.max_evictions_per_minute) == (2.0, 30.0, 20)
    assert args.lease == "fairshare-system/fairshare-reclaimer"
    assert args.grace_period is None and args.port == 8889


def test_cli_reclaimer_needs_a_config_source(capsys):
    from fairshare_cli import main as cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["reclaimer", "--kubeconfig", "kc"])
    assert "--config" in capsys.readouterr().err
