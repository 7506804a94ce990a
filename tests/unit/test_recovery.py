"""Runs lost to hardware faults: the pure rules (``fairshare.recovery``), the history's
forgiveness (``History.forgive``), and the extender's tracker and controller over a fake
API (``extender.recovery``)."""

from __future__ import annotations

import asyncio
import copy
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from extender import recovery as ext
from extender.cache import Cache
from extender.usagehistory import UsageHistoryFeed
from fairshare import history, recovery
from fairshare import metrics as metrics_mod
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.hardware import NodeHealth
from fairshare.recovery import LostPod, LostRun, Member
from tests.unit.test_state_objects import node, pod

FATAL = {"key": "nvidia.com/gpu-error", "value": "fatal", "effect": "NoExecute"}


def config(**health: Any) -> FairShareConfig:
    return config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
            "usageHistory": {"halfLife": "1h"},
            "health": health,
        }
    )


# -- the pure rules ------------------------------------------------------------------------


def test_loss_reason_names_the_signal() -> None:
    fatal = NodeHealth(fatal=("taint nvidia.com/gpu-error=fatal:NoExecute",), no_execute=True)
    assert recovery.loss_reason("n1", fatal, node_gone=False, failed=False) == (
        "node n1: taint nvidia.com/gpu-error=fatal:NoExecute"
    )
    assert recovery.loss_reason("n1", None, node_gone=True, failed=False) == "node n1 was deleted"
    sick = NodeHealth(unhealthy_devices=2)
    assert "2 of its GPUs were unhealthy" in str(
        recovery.loss_reason("n1", sick, node_gone=False, failed=True)
    )
    # Ended on a healthy node, or succeeded beside unhealthy GPUs: not a hardware loss.
    assert recovery.loss_reason("n1", NodeHealth(), node_gone=False, failed=True) is None
    assert recovery.loss_reason("n1", sick, node_gone=False, failed=False) is None
    assert recovery.loss_reason("n1", None, node_gone=False, failed=True) is None


def test_gang_rest_takes_the_members_of_the_lost_run_only() -> None:
    members = [
        Member("lost", 10.0, leaving=False),
        Member("peer", 11.0, leaving=False),
        Member("going", 11.0, leaving=True),
        Member("new", 200.0, leaving=False),  # created after the loss: the replacement
        Member("unknown", None, leaving=False),
    ]
    assert recovery.gang_rest(members, ["lost"], lost_at=100.0) == ["peer", "unknown"]


def test_forgiven_is_the_history_integral() -> None:
    # One unit held from 0 to 3600 with a half-life of 3600, seen at 3600:
    # T/ln2 * (1 - 1/2).
    got = recovery.forgiven([1.0, 2.0], 0.0, 3600.0, 3600.0, 3600.0)
    want = 3600.0 / math.log(2.0) * 0.5
    assert got == pytest.approx([want, 2 * want])
    assert recovery.forgiven([1.0], 5.0, 5.0, 10.0, 60.0) == [0.0]
    assert recovery.forgiven([1.0], 8.0, 50.0, 10.0, 60.0) == pytest.approx(
        recovery.forgiven([1.0], 8.0, 10.0, 10.0, 60.0)
    )
    with pytest.raises(ValueError, match="half_life"):
        recovery.forgiven([1.0], 0.0, 1.0, 1.0, 0.0)


@given(
    usage=st.floats(0.0, 100.0),
    start=st.floats(0.0, 1000.0),
    length=st.floats(0.0, 1000.0),
    after=st.floats(0.0, 1000.0),
    half=st.floats(60.0, 10_000.0),
)
def test_forgiving_a_run_undoes_charging_it(
    usage: float, start: float, length: float, after: float, half: float
) -> None:
    """A history that held a run, and was then told it was lost, holds what a history
    that never saw it holds (to rounding)."""
    end = start + length
    now = end + after
    with_run = history.History(half, ("gpu",))
    without = history.History(half, ("gpu",))
    for h in (with_run, without):
        h.advance(0.0, {}, [8.0])
        h.advance(start, {"a": [1.0]}, [8.0])
    with_run.advance(end, {"a": [1.0 + usage]}, [8.0])
    without.advance(end, {"a": [1.0]}, [8.0])
    for h in (with_run, without):
        h.advance(now, {"a": [1.0]}, [8.0])
    with_run.forgive("uid", "a", [usage], start, end)
    held = with_run.usage.get("a", [0.0])[0]
    assert held == pytest.approx(without.usage.get("a", [0.0])[0], rel=1e-9, abs=1e-6)
    # Once per pod: a second call takes nothing more.
    assert with_run.forgive("uid", "a", [usage], start, end) == [0.0]


def test_forgiveness_floors_at_zero_and_survives_the_record() -> None:
    h = history.History(60.0, ("gpu",))
    h.advance(0.0, {}, [8.0])
    h.advance(10.0, {"a": [1.0]}, [8.0])
    taken = h.forgive("p1", "a", [100.0], 0.0, 10.0)
    assert h.usage["a"] == [0.0] and taken[0] > 0
    back = history.History.from_dict(h.to_dict(), half_life=60.0, resources=("gpu",))
    assert back.forgiven == {"p1": 10.0}
    assert back.forgive("p1", "a", [1.0], 0.0, 10.0) == [0.0]
    h.prune_forgiven(keep=0.0)
    assert h.forgiven == {"p1": 10.0}  # lost at the history's time: kept
    h.advance(20.0, {}, [8.0])
    h.prune_forgiven(keep=5.0)
    assert h.forgiven == {}


def lost_pod(
    uid: str, *, group: str = "a/job", evicted: bool = False, at: float = 100.0
) -> LostPod:
    return LostPod(
        uid=uid, name=uid, namespace="a", tenant="a", node="n1", row=(1.0,),
        bound_at=40.0, lost_at=at, created=30.0, group=group, reason="node n1: taint x",
        evicted=evicted,
    )  # fmt: skip


def test_a_run_and_its_record() -> None:
    run = recovery.run_of("a/job", True, [lost_pod("p0"), lost_pod("p1", evicted=True)])
    assert run.lost == ("p0",) and run.evicted == ("p1",)
    assert run.queued_at == 30.0 and run.lost_at == 100.0 and run.run_seconds == 120.0
    back, problems = recovery.runs_from_dict(recovery.runs_to_dict({run.key: run}))
    assert problems == [] and back == {run.key: run}
    assert "evicted p1 so that the group restarts whole" in recovery.describe(run)
    with pytest.raises(ValueError, match="at least one pod"):
        recovery.run_of("a/job", True, [])


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"runs": {}}, "runs: a list is required"),
        ({"runs": [3]}, "runs[0]: an object is required"),
        ({"runs": [{"key": ""}]}, "key: a non-empty string"),
        ({"runs": [{"key": "k", "reason": "r", "queuedAt": "x", "lostAt": 1}]}, "queuedAt"),
        (
            {"runs": [{"key": "k", "reason": "r", "queuedAt": 1, "lostAt": 1, "lost": [1]}]},
            "lost must be a list of strings",
        ),
        ({"runs": [{"key": "k", "reason": 5, "queuedAt": 1, "lostAt": 1}]}, "reason"),
    ],
)
def test_a_bad_record_is_skipped_with_a_clear_problem(data: dict[str, Any], problem: str) -> None:
    runs, problems = recovery.runs_from_dict(data)
    assert runs == {} and len(problems) == 1 and problem in problems[0]


def test_the_replacing_pods_inherit_the_queue_time() -> None:
    run = LostRun("a/job", True, "a", queued_at=30.0, lost_at=100.0, reason="r")
    runs = {run.key: run}
    assert recovery.inherited_queue_time("a/job", 120.0, runs) is run
    assert recovery.inherited_queue_time("a/job", 90.0, runs) is None  # the lost run's own
    assert recovery.inherited_queue_time("a/other", 120.0, runs) is None
    assert recovery.inherited_queue_time(None, 120.0, runs) is None
    lone = LostRun("a/p", False, "a", queued_at=30.0, lost_at=100.0, reason="r")
    assert recovery.inherited_queue_time("a/p", 120.0, {"a/p": lone}) is None


def test_runs_are_pruned_by_age_and_count() -> None:
    runs = {
        f"a/j{i}": LostRun(f"a/j{i}", True, "a", 0.0, float(i), "r")
        for i in range(recovery.MAX_RUNS + 5)
    }
    kept = recovery.prune_runs(runs, now=float(recovery.MAX_RUNS + 4))
    assert len(kept) == recovery.MAX_RUNS and "a/j0" not in kept
    assert recovery.prune_runs(runs, now=1e9) == {}


# -- the extender: tracker and controller -------------------------------------------------


def member(name: str, node_name: str, *, group: str = "job", ns: str = "a") -> dict[str, Any]:
    p = pod(name, ns=ns, gpu="4", node_name=node_name)
    p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    p["metadata"]["annotations"] = {"fairshare.io/gang-min-members": "2"}
    p["metadata"]["creationTimestamp"] = "1970-01-01T00:00:00Z"  # the fake clock's 0
    return p


class FakeApi:
    def __init__(self) -> None:
        self.evicted: list[str] = []
        self.events: list[tuple[str, str, str]] = []
        self.refuse: set[str] = set()
        self.written: list[dict[str, Any]] = []
        self.stored: dict[str, Any] | None = None

    async def evict(self, namespace: str, name: str) -> tuple[str, str]:
        if name in self.refuse:
            return "blocked", "Cannot evict pod as it would violate the budget"
        self.evicted.append(f"{namespace}/{name}")
        return "evicted", ""

    async def record_event(
        self, namespace: str, name: str, uid: str, *, reason: str, message: str
    ) -> None:
        self.events.append((name, reason, message))

    async def read_runs(self) -> dict[str, Any] | None:
        return self.stored

    async def write_runs(self, data: dict[str, Any]) -> None:
        self.written.append(data)
        self.stored = data


class World:
    """A cache fed through the tracker as the extender's watch feeds them."""

    def __init__(self, cfg: FairShareConfig, clock: list[float]) -> None:
        self.cfg = cfg
        self.cache = Cache(lambda: self.cfg)
        self.tracker = ext.LossTracker(self.cache, lambda: self.cfg, clock=lambda: clock[0])
        self.api = FakeApi()
        self.registry = CollectorRegistry()
        self.metrics = metrics_mod.Metrics(self.registry)
        self.leading = True
        self.ctl = ext.Recovery(
            tracker=self.tracker, config=lambda: self.cfg, api=self.api,
            metrics=self.metrics, is_leader=lambda: self.leading, clock=lambda: clock[0],
        )  # fmt: skip

    def feed(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        for sink in (self.tracker, self.cache):
            sink.on_event(kind, event, copy.deepcopy(obj))

    def resync(self, kind: str, objs: list[dict[str, Any]]) -> None:
        for sink in (self.tracker, self.cache):
            sink.on_resync(kind, copy.deepcopy(objs))

    def recovered(self) -> float:
        v = self.registry.get_sample_value("fairshare_gangs_recovered_total", {"tenant": "a"})
        return v or 0.0


def two_member_world(**health: Any) -> tuple[World, list[float]]:
    clock = [1000.0]
    w = World(config(**health), clock)
    w.resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    w.resync("Node", [node("n1"), node("n2"), node("n3")])
    w.resync(
        "Pod",
        [member("m0", "n1"), member("m1", "n2"), pod("solo", ns="a", gpu="4", node_name="n3")],
    )
    return w, clock


def test_a_member_lost_to_a_no_execute_taint_evicts_the_rest_of_its_group() -> None:
    w, clock = two_member_world()
    clock[0] = 1100.0
    w.feed("Node", "MODIFIED", node("n1", taints=[FATAL]))
    assert set(w.tracker.lost) == {"uid-m0"}  # a member: lost as its node turned fatal
    asyncio.run(w.ctl.once())
    # m0 still runs on the broken node (nothing evicted it yet): it goes too.
    assert sorted(w.api.evicted) == ["a/m0", "a/m1"]
    reasons = {(n, r) for n, r, _ in w.api.events}
    assert ("m1", ext.REASON_RECOVERY) in reasons and ("m0", ext.REASON_LOST) in reasons
    assert w.recovered() == 1.0
    run = w.ctl.runs["a/job"]
    assert run.gang and run.lost == ("m0",) and run.evicted == ("m1",)
    assert "nvidia.com/gpu-error=fatal:NoExecute" in run.reason
    assert w.api.written and w.api.written[-1]["runs"][0]["key"] == "a/job"
    # The second look finds nothing more to do; the lone pod was left alone.
    asyncio.run(w.ctl.once())
    assert sorted(w.api.evicted) == ["a/m0", "a/m1"] and w.recovered() == 1.0


def test_recovery_switched_off_leaves_the_group_alone() -> None:
    w, clock = two_member_world(recoverGangs=False)
    w.feed("Node", "MODIFIED", node("n1", taints=[FATAL]))
    assert w.tracker.lost == {}  # still running: not lost while nothing recovers it
    clock[0] = 1100.0
    w.feed("Pod", "DELETED", member("m0", "n1"))
    asyncio.run(w.ctl.once())
    assert set(w.tracker.lost) == {"uid-m0"} and w.api.evicted == []
    assert w.recovered() == 0.0


def test_a_lone_pod_is_lost_only_when_it_ends_and_is_left_to_its_controller() -> None:
    w, clock = two_member_world()
    w.feed("Node", "MODIFIED", node("n3", taints=[FATAL]))
    assert w.tracker.lost == {}
    clock[0] = 1200.0
    w.feed("Pod", "DELETED", pod("solo", ns="a", gpu="4", node_name="n3"))
    asyncio.run(w.ctl.once())
    assert set(w.tracker.lost) == {"uid-solo"} and w.api.evicted == []
    assert not w.ctl.runs["a/solo"].gang


def test_a_deleted_node_loses_its_pods_and_an_ordinary_end_is_no_loss() -> None:
    w, _ = two_member_world()
    w.feed("Pod", "DELETED", pod("solo", ns="a", gpu="4", node_name="n3"))
    assert w.tracker.lost == {}
    w.feed("Node", "DELETED", node("n2"))
    assert set(w.tracker.lost) == {"uid-m1"}
    assert w.tracker.lost["uid-m1"].reason == "node n2 was deleted"


def test_a_budget_refusal_is_asked_again_and_a_follower_acts_on_nothing() -> None:
    w, _ = two_member_world()
    w.leading = False
    w.feed("Node", "MODIFIED", node("n1", taints=[FATAL]))
    asyncio.run(w.ctl.once())
    assert w.api.evicted == [] and w.api.written == []
    w.leading = True
    w.api.refuse = {"m1"}
    asyncio.run(w.ctl.once())  # the loss seen while following is acted on once leading
    assert w.api.evicted == ["a/m0"] and "a/job" in w.ctl.recovering
    w.api.refuse = set()
    asyncio.run(w.ctl.once())
    assert sorted(w.api.evicted) == ["a/m0", "a/m1"] and w.ctl.recovering == {}


def test_a_new_leader_starts_from_the_recorded_runs() -> None:
    w, _ = two_member_world()
    run = LostRun("a/old", True, "a", 1.0, 999.0, "node n9 was deleted", lost=("x",))
    w.api.stored = {"runs": [run.to_dict(), {"key": 5}]}
    asyncio.run(w.ctl.once())
    assert w.ctl.runs["a/old"] == run


def test_explain_tells_a_replacing_member_from_the_lost_run() -> None:
    run = LostRun(
        "a/job", True, "a", 30.0, 1.8e9, "node n1: taint x", lost=("m0",), evicted=("m1",),
        uids=("uid-m0", "uid-m1"),
    )  # fmt: skip
    runs = {run.key: run}
    fresh = member("m2", "")
    fresh["metadata"]["creationTimestamp"] = "2030-01-01T00:00:00Z"
    got = ext.explain_run(fresh, runs)
    assert got is not None and got["role"] == "replaces" and "uids" not in got
    assert ext.explain_run(member("m1", "n2"), runs)["role"] == "evicted"  # type: ignore[index]
    assert ext.explain_run(member("m0", "n1"), runs)["role"] == "lost"  # type: ignore[index]
    stale = member("m9", "")  # created before the loss: not a replacement
    stale["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    assert ext.explain_run(stale, runs) is None
    assert ext.explain_run(pod("other", ns="a"), runs) is None


def test_the_history_forgives_the_lost_run_and_stops_charging_it() -> None:
    w, clock = two_member_world()
    feed = UsageHistoryFeed(lambda: w.cfg)
    feed.lost = w.tracker.forgivable
    told: list[tuple[str, float]] = []
    feed.on_forgiven = lambda t, s: told.append((t, s))
    cache = w.cache
    feed.step(0.0, cache.state, ())  # the history runs since the pods were bound
    feed.step(1100.0, cache.state, ())
    assert feed.history is not None
    charged = list(feed.history.usage["a"])
    clock[0] = 1100.0
    w.feed("Node", "MODIFIED", node("n1", taints=[FATAL]))
    asyncio.run(w.ctl.once())  # m0 lost, m1 evicted: both still bound in the cache
    feed.step(1100.0, cache.state, ())
    after = feed.history.usage["a"]
    gpu = cache.state.index.names.index("nvidia.com/gpu")
    # The solo pod's run stays charged; the group's two members' are taken back.
    assert after[gpu] == pytest.approx(charged[gpu] / 3, rel=1e-6)
    assert sorted(told) == [("a", 1100.0), ("a", 1100.0)]
    feed.step(1200.0, cache.state, ())  # still bound, lost: not charged any more
    solo_only = feed.history.usage["a"][gpu]
    w.cfg = config(forgiveFaults=False)
    feed2 = UsageHistoryFeed(lambda: w.cfg)
    feed2.lost = w.tracker.forgivable
    assert w.tracker.forgivable() == {}
    assert solo_only < charged[gpu]


def test_a_tenants_newer_pods_wait_behind_its_restarting_group() -> None:
    run = LostRun("a/job", True, "a", 30.0, 100.0, "r", uids=("u0", "u1"))
    runs = {run.key: run}

    def behind(**kw: Any) -> LostRun | None:
        args: dict[str, Any] = {
            "tenant": "a", "group": None, "created": 50.0, "now": 110.0, "replaced": {},
        } | kw  # fmt: skip
        return recovery.waits_behind(
            args["tenant"], args["group"], args["created"], runs, args["now"],
            replaced=args["replaced"],
        )  # fmt: skip

    assert behind() is run  # newer than the run: waits
    assert behind(created=20.0) is None  # older: keeps its own place
    assert behind(created=30.0) is run  # the run's own second: taken as newer
    assert behind(tenant="b") is None  # another tenant: the gate's business
    assert behind(group="a/job") is None  # the replacement itself
    assert behind(replaced={"a/job": 2}) is None  # bound whole again
    assert behind(replaced={"a/job": 1}) is run
    assert behind(now=100.0 + recovery.QUEUE_HOLD + 1) is None  # the hold is bounded
    assert behind(tenant=None) is None


def test_the_filter_holds_a_newer_pod_while_the_group_restarts() -> None:
    w, clock = two_member_world()
    clock[0] = 1100.0
    w.feed("Node", "MODIFIED", node("n1", taints=[FATAL]))
    early = pod("early", ns="a", gpu="4")
    early["metadata"]["creationTimestamp"] = "1970-01-01T00:10:00Z"
    w.feed("Pod", "ADDED", early)
    # Held from the loss on, before the controller's next look noted the run.
    assert w.ctl.runs == {} and w.ctl.queue_hold("uid-early") is not None
    asyncio.run(w.ctl.once())
    for uid in ("uid-m0", "uid-m1"):
        w.feed("Pod", "DELETED", member(uid[4:], "n1" if uid == "uid-m0" else "n2"))
    newer = pod("newer", ns="a", gpu="4")
    newer["metadata"]["creationTimestamp"] = "1970-01-01T00:10:00Z"
    w.feed("Pod", "ADDED", newer)
    why = w.ctl.queue_hold("uid-newer")
    assert why is not None and "pod group a/job of tenant a restarts" in why
    # The replacement members: pending, they are not held; once bound whole, nobody is.
    fresh = [member(f"r{i}", "") for i in range(2)]
    for p in fresh:
        p["spec"].pop("nodeName", None)
        p["metadata"]["creationTimestamp"] = "1970-01-01T00:30:00Z"
        w.feed("Pod", "ADDED", p)
    assert w.ctl.queue_hold("uid-r0") is None
    for p, n in zip(fresh, ("n2", "n3"), strict=True):
        p["spec"]["nodeName"] = n
        w.feed("Pod", "MODIFIED", p)
    assert w.ctl.queue_hold("uid-newer") is None
    w.cfg = config(forgiveFaults=False)
    assert w.ctl.queue_hold("uid-newer") is None


NO_EXEC = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}


@pytest.mark.parametrize(
    ("toleration", "ok"),
    [
        ({"key": "gpu.nvidia.com/xid", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),
        ({"key": "gpu.nvidia.com/xid", "value": "79"}, True),
        ({"key": "gpu.nvidia.com/xid", "value": "48"}, False),
        ({"key": "gpu.nvidia.com/xid", "operator": "Exists", "effect": "NoSchedule"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_a_device_toleration_matches_as_kubernetes_matches(
    toleration: dict[str, str], ok: bool
) -> None:
    assert recovery.tolerates(toleration, NO_EXEC) is ok


def dra_slice(name: str, taints: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com", "pool": {"name": "n3"},
            "devices": [{"name": "gpu-0", "taints": taints}, {"name": "gpu-1"}],
        },
    }  # fmt: skip


def dra_claim(tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"driver": "gpu.nvidia.com", "pool": "n3", "device": "gpu-0"}
    if tolerations:
        result["tolerations"] = tolerations
    return {
        "metadata": {"name": "c1", "namespace": "a"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def dra_pod() -> dict[str, Any]:
    p = pod("draw", ns="a", node_name="n3")
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c1"}]
    return p


@pytest.mark.parametrize("source", ["slice", "rule"])
def test_a_pod_whose_dra_device_gets_a_no_execute_taint_is_lost(source: str) -> None:
    w, _ = two_member_world()
    w.feed("ResourceClaim", "ADDED", dra_claim())
    w.feed("Pod", "ADDED", dra_pod())
    if source == "slice":
        w.resync("ResourceSlice", [dra_slice("s1", [NO_EXEC])])
    else:
        rule = {
            "metadata": {"name": "r1"},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "device": "gpu-0"},
                     "taint": NO_EXEC},
        }  # fmt: skip
        w.feed("DeviceTaintRule", "ADDED", rule)
    w.feed("Pod", "DELETED", dra_pod())
    lost = w.tracker.lost["uid-draw"]
    assert (
        lost.reason == "DRA device gpu.nvidia.com/n3/gpu-0: taint gpu.nvidia.com/xid=79:NoExecute"
    )


def test_a_tolerated_or_informational_device_taint_is_no_loss() -> None:
    w, _ = two_member_world()
    w.feed(
        "ResourceClaim", "ADDED", dra_claim([{"key": "gpu.nvidia.com/xid", "operator": "Exists"}])
    )
    w.feed("Pod", "ADDED", dra_pod())
    w.feed("ResourceSlice", "ADDED", dra_slice("s1", [NO_EXEC]))
    w.feed("ResourceSlice", "ADDED", dra_slice("s2", [NO_EXEC | {"effect": "None"}]))
    w.feed("Pod", "DELETED", dra_pod())
    assert w.tracker.lost == {}
    assert set(w.tracker.slice_taints) == {"s1"}
    w.feed("ResourceSlice", "DELETED", dra_slice("s1", [NO_EXEC]))
    assert w.tracker.slice_taints == {}


@pytest.mark.parametrize(
    ("role", "text"),
    [
        ("lost", "lost to a hardware fault at 2025-12-07T23:29:19Z: node n1: taint x"),
        ("evicted", "evicted at 2025-12-07T23:29:19Z so that pod group a/job restarts whole"),
        ("replaces", "replaces the run of pod group a/job lost at 2025-12-07T23:29:19Z"),
    ],
)
def test_explain_renders_the_hardware_line(role: str, text: str) -> None:
    from fairshare import report_render

    run = LostRun("a/job", True, "a", 1765150154.0, 1765150159.0, "node n1: taint x")
    hw = run.to_dict() | {"role": role}
    report = {
        "pod": "a/p", "tenant": "a", "tenantSource": "label", "hardware": hw,
        "webhook": {"allowed": True, "message": "", "warnings": []},
        "extender": {"boundTo": "n2"},
    }  # fmt: skip
    out = report_render.render_explain_text(report)
    assert "HARDWARE: " + text in out


def test_a_node_failed_before_its_pods_were_listed_loses_its_members_at_the_first_look() -> None:
    clock = [1000.0]
    w = World(config(), clock)
    w.resync("Namespace", [{"metadata": {"name": "a"}}])
    w.resync("Node", [node("n1", taints=[FATAL]), node("n2")])
    w.resync("Pod", [member("m0", "n1"), member("m1", "n2")])
    assert w.tracker.lost == {}  # the cache knew no pod when the node was read
    asyncio.run(w.ctl.once())
    assert set(w.tracker.lost) >= {"uid-m0"} and sorted(w.api.evicted) == ["a/m0", "a/m1"]


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": "x"},
        {"metadata": {"name": "n1"}, "spec": {"taints": "nope"}, "status": []},
        {"metadata": {"name": "s"}, "spec": {"devices": [{"taints": [{"effect": "NoExecute"}]}]}},
    ],
)
def test_malformed_objects_are_read_without_raising(obj: dict[str, Any]) -> None:
    w, _ = two_member_world()
    for kind in ("Node", "Pod", "ResourceSlice", "ResourceClaim", "DeviceTaintRule"):
        w.tracker.on_event(kind, "MODIFIED", copy.deepcopy(obj))
        w.tracker.on_event(kind, "DELETED", copy.deepcopy(obj))
        w.tracker.on_resync(kind, [copy.deepcopy(obj)])


def test_a_new_leader_reading_the_history_back_does_not_forgive_twice() -> None:
    w, clock = two_member_world()
    old = UsageHistoryFeed(lambda: w.cfg)
    old.lost = w.tracker.forgivable
    old.step(0.0, w.cache.state, ())
    old.step(1100.0, w.cache.state, ())
    clock[0] = 1100.0
    w.feed("Node", "MODIFIED", node("n1", taints=[FATAL]))
    asyncio.run(w.ctl.once())
    old.step(1100.0, w.cache.state, ())
    assert old.history is not None
    record = old.history.to_dict()
    assert set(record["forgiven"]) == {"uid-m0", "uid-m1"}
    # The next leader saw the same losses (its own tracker) and reads the record back.
    new = UsageHistoryFeed(lambda: w.cfg)
    new.lost = w.tracker.forgivable
    told: list[tuple[str, float]] = []
    new.on_forgiven = lambda t, s: told.append((t, s))
    new.load(record, 1100.0)
    new.step(1100.0, w.cache.state, ())
    assert told == []
    assert new.history is not None
    assert new.history.usage["a"] == pytest.approx(old.history.usage["a"])


def test_a_record_that_cannot_be_read_does_not_stop_the_recovery() -> None:
    w, _ = two_member_world()

    async def broken() -> dict[str, Any] | None:
        raise RuntimeError("HTTP 403")

    w.api.read_runs = broken  # type: ignore[method-assign]
    w.feed("Node", "MODIFIED", node("n1", taints=[FATAL]))
    asyncio.run(w.ctl.once())
    assert sorted(w.api.evicted) == ["a/m0", "a/m1"]
