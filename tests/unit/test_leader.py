"""Leader election (extender.leader): the pure term logic, the Lease attempts over a
fake API, and the extender's follower behaviour over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender import app as ext_app
from extender import leader
from extender import serve as ext_serve
from fairshare_cli import main as cli

from .test_extender_app import CONFIG, half_pod, node


class FakeLeases:
    """One Lease with compare-and-swap on ``resourceVersion``."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0
        self.fail = False

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.fail:
            raise OSError("apiserver unreachable")
        return self.lease

    async def write_lease(self, namespace: str, body: dict[str, Any], *, create: bool) -> bool:
        if create and self.lease is not None:
            return False
        if not create and body["metadata"]["resourceVersion"] != str(self.rv):
            return False
        self.rv += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
        return True


# -- Term: the pure state machine ---------------------------------------------------------------


def test_a_term_leads_only_once_caught_up_and_until_the_renew_deadline():
    t = leader.Term(renew_deadline=10)
    assert t.observe(True, 100) == "acquired" and t.number == 1
    assert t.holds(101) and not t.leading(101)  # holds the Lease, not caught up yet
    assert t.mark_caught_up(1) and t.leading(101)
    assert t.observe(True, 105) == "renewed" and t.leading(114.9)
    assert not t.leading(115)  # no successful renewal for the deadline: stops deciding
    # An API error within the deadline keeps the term (the Lease may still be ours).
    assert t.observe(None, 114) == "kept" and t.leading(114.5)
    assert t.observe(None, 116) == "lost" and not t.leading(116)


def test_another_holder_ends_the_term_at_once():
    t = leader.Term(renew_deadline=10)
    t.observe(True, 0)
    t.mark_caught_up(1)
    assert t.observe(False, 1) == "lost" and not t.leading(1)
    assert t.observe(False, 2) == "following"


def test_a_lapsed_term_renewed_late_is_a_new_term_that_must_catch_up_again():
    t = leader.Term(renew_deadline=10)
    t.observe(True, 0)
    t.mark_caught_up(1)
    assert t.observe(True, 12) == "acquired" and t.number == 2  # nobody took it meanwhile
    assert not t.leading(12)
    assert not t.mark_caught_up(1)  # the old term's catch-up does not count
    assert t.mark_caught_up(2) and t.leading(13)


def test_a_catch_up_that_ends_after_the_term_does_not_lead():
    t = leader.Term(renew_deadline=10)
    t.observe(True, 0)
    t.observe(False, 1)
    assert not t.mark_caught_up(1) and not t.leading(1)


@pytest.mark.parametrize(
    ("timings", "problem"),
    [
        ((15, 10, 2), None),
        ((4, 3, 1), None),
        ((10, 10, 2), "lease duration (10 s) must be longer than the renew deadline"),
        ((15, 2, 2), "renew deadline (2 s) must be longer than the retry period"),
        ((15, 10, 0), "retry period must be > 0"),
    ],
)
def test_timing_error(timings: tuple[float, float, float], problem: str | None):
    got = leader.timing_error(*timings)
    assert got == problem if problem is None else problem in (got or "")


# -- LeaseElector and Leadership over a fake API ------------------------------------------------


async def test_release_lets_the_other_replica_take_over_without_waiting_it_out():
    api = FakeLeases()
    wall = [1_800_000_000.0]
    a = leader.LeaseElector(api, "ns", "l", "a", duration=15, wall=lambda: wall[0])
    b = leader.LeaseElector(api, "ns", "l", "b", duration=15, wall=lambda: wall[0])
    assert await a.try_lead()
    assert not await b.try_lead()
    assert not await b.release()  # not b's to release
    assert await a.release()
    assert api.lease is not None and "holderIdentity" not in api.lease["spec"]
    assert await b.try_lead()  # at once, same instant
    assert api.lease["spec"]["holderIdentity"] == "b"
    assert api.lease["spec"]["leaseTransitions"] == 1


async def test_the_old_leader_stops_deciding_before_the_other_may_take_the_lease():
    # Both replicas share one clock (wall = monotonic here); the leader's API calls start
    # failing (a partition): it must stop deciding before the follower can acquire.
    api = FakeLeases()
    now = [1_800_000_000.0]
    caught_up: list[str] = []

    def replica(name: str) -> leader.Leadership:
        async def catch_up() -> None:
            caught_up.append(name)

        el = leader.LeaseElector(api, "ns", "l", name, duration=15, wall=lambda: now[0])
        return leader.Leadership(el, renew_deadline=10, retry_period=2, catch_up=catch_up,
                                 clock=lambda: now[0])  # fmt: skip

    a, b = replica("a"), replica("b")
    assert await a.attempt() == "acquired"
    await asyncio.sleep(0)
    assert caught_up == ["a"] and a.leading()
    assert await b.attempt() == "following" and not b.leading()

    lead_until = follow_from = None
    for _ in range(20):
        now[0] += 1
        api.fail = True
        await a.attempt()
        api.fail = False
        if not a.leading() and lead_until is None:
            lead_until = now[0]
        if await b.attempt() == "acquired":
            follow_from = now[0]
            break
    assert lead_until is not None and follow_from is not None
    assert lead_until < follow_from  # never two deciders at once
    await asyncio.sleep(0)
    assert caught_up == ["a", "b"] and b.leading()
    assert await a.attempt() == "following"


async def test_step_down_waits_for_the_binds_in_flight_then_releases():
    api = FakeLeases()
    order: list[str] = []
    el = leader.LeaseElector(api, "ns", "l", "a")
    lead = leader.Leadership(el, on_change=lambda on: order.append(f"leading={on}"))
    await lead.attempt()
    await asyncio.sleep(0)
    assert lead.leading()

    async def drained() -> None:
        assert not lead.leading()
        order.append("drained")

    await lead.step_down(drained)
    assert order == ["leading=True", "leading=False", "drained"]
    assert api.lease is not None and "holderIdentity" not in api.lease["spec"]


async def test_the_leader_label_follows_leadership_and_is_retried_until_it_lands():
    api = FakeLeases()
    labels: list[bool] = []
    failing = [True]

    async def advertise(on: bool) -> None:
        if failing[0]:
            raise OSError("apiserver unreachable")
        labels.append(on)

    other = leader.LeaseElector(api, "ns", "l", "other")
    assert await other.try_lead()
    lead = leader.Leadership(leader.LeaseElector(api, "ns", "l", "me"), advertise=advertise)
    await lead.attempt()
    await lead.reconcile_advert()  # fails: retried next round
    failing[0] = False
    await lead.reconcile_advert()
    assert labels == [False]  # a restarted follower clears a stale label of its pod
    await lead.reconcile_advert()
    assert labels == [False]  # nothing changed: no call
    await other.release()
    assert await lead.attempt() == "acquired"
    await asyncio.sleep(0)  # the catch-up, then the label
    assert labels == [False, True]
    await lead.step_down()
    assert labels == [False, True, False]
    assert api.lease is not None and "holderIdentity" not in api.lease["spec"]


# -- the extender: followers refuse the deciding verbs ------------------------------------------


@pytest.fixture
async def follower():
    deps = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True)
    deps.sink.on_resync("Namespace", [{"metadata": {"name": "a"}}])
    deps.sink.on_resync("Node", [node("n1", 2)])
    deps.sink.on_resync("Pod", [half_pod(0)])
    is_leader = [False]
    deps.leading = lambda: is_leader[0]
    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        c.is_leader = is_leader  # type: ignore[attr-defined]
        c.deps = deps  # type: ignore[attr-defined]
        yield c


async def test_a_follower_refuses_filter_preempt_and_bind(follower):
    # Still ready (synced): rollouts and the PodDisruptionBudget count it; the Service
    # routes by the leader label instead.
    assert (await follower.get("/readyz")).status == 200
    args = {"Pod": half_pod(0), "Nodes": None, "NodeNames": ["n1"]}
    resp = await follower.post("/filter", json=args)
    assert resp.status == 503 and "not the leader" in await resp.text()
    assert resp.headers.get("Connection", "").lower() == "close"  # re-dial: maybe the leader
    preempt = {"Pod": half_pod(0), "NodeNameToVictims": None, "NodeNameToMetaVictims": {}}
    assert (await follower.post("/preempt", json=preempt)).status == 503
    bind = {"PodName": "p0", "PodNamespace": "a", "PodUID": "u0", "Node": "n1"}
    resp = await follower.post("/bind", json=bind)
    assert resp.status == 200
    assert "not the leader" in (await resp.json())["Error"]
    assert "u0" in follower.deps.snapshot().pending  # nothing was assumed
    # Scores only order nodes: a follower still answers prioritize.
    assert (await follower.post("/prioritize", json=args)).status == 200

    follower.is_leader[0] = True
    assert (await follower.post("/filter", json=args)).status == 200
    resp = await follower.post("/bind", json=bind)
    assert (await resp.json())["Error"] == ""


# -- the CLI ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lease", "nons"], "--lease wants NAMESPACE/NAME"),
        (["--lease", "ns/l", "--renew-deadline", "20"], "must be longer than the renew"),
        (["--lease", "ns/l", "--state", "x.json"], "--lease needs the API"),
        (["--leader-label-pod", "ns/p"], "--leader-label-pod needs --lease"),
        (["--lease", "ns/l", "--leader-label-pod", "p"], "--leader-label-pod wants NAMESPACE/"),
    ],
)
def test_cli_extender_lease_flags_are_checked(argv, message, capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n")
    assert cli.main(["extender", "--config", str(config), *argv]) == 1
    assert message in capsys.readouterr().err


def test_cli_extender_passes_the_election(monkeypatch, tmp_path):
    seen: dict[str, Any] = {}

    async def fake_serve(**kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(ext_serve, "serve", fake_serve)
    argv = ["extender", "--config", "c.yaml", "--lease", "fs/ext", "--lease-duration", "4",
            "--renew-deadline", "3", "--retry-period", "0.5", "--identity", "me",
            "--leader-label-pod", "fs/pod-1"]  # fmt: skip
    assert cli.main(argv) == 0
    assert seen["election"] == ext_serve.Election("fs", "ext", "me", 4, 3.0, 0.5, "fs/pod-1")
    seen.clear()
    assert cli.main(["extender", "--config", "c.yaml"]) == 0
    assert "election" not in seen  # no --lease: one replica, no election


async def test_a_failed_catch_up_is_retried_until_the_term_leads():
    api = FakeLeases()
    calls: list[int] = []

    async def catch_up() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("list failed")

    el = leader.LeaseElector(api, "ns", "l", "me")
    lead = leader.Leadership(el, retry_period=0.01, renew_deadline=10, catch_up=catch_up)
    assert await lead.attempt() == "acquired"
    for _ in range(100):
        if lead.leading():
            break
        await asyncio.sleep(0.01)
    assert lead.leading() and len(calls) == 2
