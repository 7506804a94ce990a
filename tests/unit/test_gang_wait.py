"""Pod groups as waiting work at the fair-share gate (``fairshare.gangs.waiting``): the rule,
the gate weighing a group's whole demand, and the extender and the simulator agreeing.

The cluster of every test: two nodes of 4 GPUs; tenants a and b of weight 1.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import pytest

from extender import ganging
from fairshare import gangs, gate
from fairshare.simulator.gangsim import GangSimulation
from tests.extender_side import Side
from tests.unit.test_gangs import CONFIG, member, node, tracker

NODES = [node("n1", 4), node("n2", 4)]


def plain(ns: str, name: str, gpus: int, on: str | None = None) -> dict[str, Any]:
    res = {"cpu": "1", "nvidia.com/gpu": str(gpus)}
    pod: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"{ns}-{name}"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": res, "limits": res}}]},
        "status": {"phase": "Pending"},
    }
    if on is not None:
        pod["spec"]["nodeName"] = on
        pod["status"]["phase"] = "Running"
    return pod


def a_holds_six() -> list[dict[str, Any]]:
    """Tenant a runs 6 of the 8 GPUs (4 on n1, 2 on n2): above its fair share."""
    return [plain("a", "big", 4, "n1"), plain("a", "mid", 2, "n2")]


def judge(t: Side, pod: dict[str, Any], rule: gangs.waiting.Rule = gangs.waiting.RULE):
    """The gate for a's pending ``pod`` as the extender's filter judges it."""
    groups = gangs.waiting.group_fits(
        CONFIG,
        gangs.waiting.lookup_over(
            t.group_members(),
            t.pending,
            t.state.pods,
            lambda key, uid: gangs.annotated_min_count(t.pods[uid]),
        ),
        fair=t.fair_shares(CONFIG),
        rule=rule,
    )
    if rule == gangs.waiting.RULE:  # the extender's own wiring: the snapshot's rule
        t.gangs = ganging.GangCoordinator(t.cache)
        groups = t.snapshot(CONFIG).groups
    req = t.pending[pod["metadata"]["uid"]]
    return gate.check_fair_gate(
        t.state,
        config=CONFIG,
        req=req,
        pending=t.pending_queue(),
        fair=t.fair_shares(CONFIG),
        groups=groups,
    )


def _with_coordinator(t: Side) -> Side:
    t.gangs = ganging.GangCoordinator(t.cache)
    return t


# -- the rule --------------------------------------------------------------------------


def test_a_member_of_a_group_that_does_not_fit_whole_and_is_not_owed_holds_nobody():
    """b's group (3 × 2 GPUs) cannot start in the 2 free GPUs, and started whole it would
    take b past its fair share (6 > 4): a's 1-GPU pod runs. Judged pod by pod (the old
    rule), one 2-GPU member "fits now" and a is held while 2 GPUs sit idle."""
    pods = [*a_holds_six(), plain("a", "next", 1)]
    pods += [member("b", "jb", i, min_members=3) for i in range(3)]
    t = tracker(NODES, pods)
    decision = judge(t, pods[2])
    assert decision is not None and decision.allowed, decision
    old = judge(t, pods[2], rule="pod")
    assert old is not None and not old.allowed and old.waiting_for == "b"


def test_a_group_its_tenant_is_owed_holds_the_tenants_above_it_back():
    """b's group of 2 × 2 GPUs does not fit the 2 free GPUs now, but it keeps b within its
    fair share (4 of 8): a's next pod waits, so the room a gives back goes to b's group."""
    pods = [*a_holds_six(), plain("a", "next", 1)]
    pods += [member("b", "jb", i, min_members=2) for i in range(2)]
    t = tracker(NODES, pods)
    decision = judge(t, pods[2])
    assert decision is not None and not decision.allowed
    assert decision.waiting_for == "b"
    assert not judge(t, pods[2], rule="owed").allowed  # type: ignore[union-attr]
    assert judge(t, pods[2], rule="whole").allowed  # type: ignore[union-attr]


@pytest.mark.parametrize("rule", ["whole", "kept", "owed"])
def test_a_group_that_can_never_run_whole_or_misses_members_holds_nobody(rule):
    """Five 2-GPU members never fit two 4-GPU nodes; a group with 2 of its 3 members
    is refused until the third exists: under every group rule a's pod runs (pod by pod,
    one member fits the 2 free GPUs and a is held)."""
    base = [*a_holds_six(), plain("a", "next", 1)]
    never = [member("b", "huge", i, min_members=5) for i in range(5)]
    short = [member("b", "short", i, gpus=1, min_members=3) for i in range(2)]
    for extra in (never, short):
        t = tracker(NODES, base + extra)
        decision = judge(t, base[2], rule)
        assert decision is not None and decision.allowed, (rule, decision)
        assert not judge(t, base[2], "pod").allowed  # type: ignore[union-attr]


def test_kept_counts_the_room_of_the_tenants_above():
    """b's 3 × 2-GPU group fits whole once a's pods are gone (the room the gate keeps
    for b): under ``kept`` it holds a back, under ``whole`` it does not."""
    pods = [*a_holds_six(), plain("a", "next", 1)]
    pods += [member("b", "jb", i, min_members=3) for i in range(3)]
    t = tracker(NODES, pods)
    assert not judge(t, pods[2], rule="kept").allowed  # type: ignore[union-attr]
    assert judge(t, pods[2], rule="whole").allowed  # type: ignore[union-attr]


def test_the_probe_leaves_the_state_and_its_versions_alone():
    pods = [*a_holds_six(), *(member("b", "jb", i, min_members=2) for i in range(2))]
    t = tracker(NODES, pods)
    state = t.state
    before = (state.version, state.room_version, list(state.free), dict(state.pods))
    gang = gangs.gang_of(
        gangs.GroupKey("b", "jb"), 2, pods=t.pods, pending=t.pending, bound=state.pods
    )
    for rule in gangs.waiting.RULES:
        gangs.waiting.counts(state, CONFIG, gang, fair=t.fair_shares(CONFIG), rule=rule)
    assert (state.version, state.room_version, list(state.free), dict(state.pods)) == before


def test_a_planned_group_counts_as_fitting_and_is_not_planned_again():
    """A group whose plan holds its room in the state (the extender reserved it) fits:
    planning it again on a probe would try to hold its members' room twice."""
    pods = [member("b", "jb", i, min_members=2) for i in range(2)]
    t = tracker(NODES, pods)
    gang = gangs.gang_of(
        gangs.GroupKey("b", "jb"), 2, pods=t.pods, pending=t.pending, bound=t.state.pods
    )
    plan = gangs.plan_gang(t.state, gang)
    assert isinstance(plan, gangs.GangPlan)
    t.cache.reserve(plan)
    for rule in ("whole", gangs.waiting.RULE):
        assert gangs.waiting.counts(t.state, CONFIG, gang, fair=t.fair_shares(CONFIG), rule=rule)


def test_group_row_is_min_count_times_the_member():
    members = [member("b", "jb", i, min_members=2) for i in range(3)]
    t = tracker(NODES, members)
    gang = gangs.gang_of(
        gangs.GroupKey("b", "jb"), 2, pods=t.pods, pending=t.pending, bound=t.state.pods
    )
    g = t.state.gpu_col
    assert gangs.waiting.group_row(gang)[g] == 2 * 2000  # two of the three 2-GPU members


# -- the gate weighs the group's whole demand ------------------------------------------


def test_the_gate_judges_a_group_on_its_whole_demand():
    """a holds 4 GPUs, its fair share of 8 (b runs 2 and waits with two 1-GPU pods that
    fit): one 1-GPU member alone would take a to 5/8, the group of 2 × 1 GPU to 6/8, and
    the gate judges that share."""
    pods = [plain("a", "big", 4, "n1"), plain("b", "run", 2, "n2")]
    pods += [plain("b", "s0", 1), plain("b", "s1", 1)]
    pods += [member("a", "ja", i, gpus=1, min_members=2) for i in range(2)]
    t = tracker(NODES, pods)
    gang = gangs.gang_of(
        gangs.GroupKey("a", "ja"), 2, pods=t.pods, pending=t.pending, bound=t.state.pods
    )
    decision = gangs.gang_gate(
        t.state,
        CONFIG,
        gang,
        pending=t.pending_queue(),
        fair=t.fair_shares(CONFIG),
        groups=_with_coordinator(t).snapshot(CONFIG).groups,
    )
    assert decision is not None and not decision.allowed
    assert decision.share_after == pytest.approx(0.75)
    alone = gate.check_fair_gate(
        t.state, config=CONFIG, req=gang.waiting[0], pending=t.pending_queue()
    )
    assert alone is not None and alone.share_after == pytest.approx(0.625)
    assert decision.waiting_for == "b"


# -- kube-scheduler's record of the group's refusal ------------------------------------


def refused(pod: dict[str, Any], text: str) -> dict[str, Any]:
    pod = dict(pod, status={"phase": "Pending"})
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": f"0/2 nodes are available: 2 {text}. preemption: 0/2 nodes are "
            "available: 2 Preemption is not helpful for scheduling.",
        }
    ]
    return pod


def test_a_members_verdict_that_is_its_groups_refusal_keeps_it_waiting():
    """kube-scheduler writes the extender's refusal of the group into the members'
    PodScheduled condition; the members still wait with their group (the group rule
    decides whether they hold anyone back), where they used to drop out as
    'unschedulable by kube-scheduler'. A verdict of kube-scheduler's own still counts."""
    text = "gang b/jb (2 × nvidia.com/gpu 2, cpu 1) does not fit whole: 1 of 2 members placed"
    members = [refused(member("b", "jb", i, min_members=2), text) for i in range(2)]
    other = refused(plain("b", "aff", 1), "node(s) didn't match pod affinity rules")
    pods = [*a_holds_six(), plain("a", "next", 1), *members, other]
    t = tracker(NODES, pods)
    for m in members:
        req = t.pending[m["metadata"]["uid"]]
        assert req.waiting and gangs.waiting.is_group_refusal(req.unschedulable)
    assert not t.pending["b-aff"].waiting
    decision = judge(t, pods[2])
    assert decision is not None and not decision.allowed and decision.waiting_for == "b"


# -- the extender and the simulator agree ----------------------------------------------


def simulated(pods: list[dict[str, Any]], rule: gangs.waiting.Rule) -> GangSimulation:
    """The same cluster in the simulator: bound pods placed on their nodes, groups
    registered as ``gangsim.Replay`` registers its jobs."""
    sim = GangSimulation(CONFIG, policy="ours")
    sim.group_rule = rule
    for n in NODES:
        alloc = {k: Fraction(str(v).removesuffix("Gi")) * (1 << 30 if "Gi" in str(v) else 1)
                 for k, v in n["status"]["allocatable"].items()}  # fmt: skip
        sim.add_node(n["metadata"]["name"], alloc, dict(n["metadata"]["labels"]))
    by_group: dict[gangs.GroupKey, list[str]] = {}
    for p in pods:
        key = gangs.group_of(p)
        if key is not None and p["spec"].get("nodeName") is None:
            by_group.setdefault(key, []).append(p["metadata"]["uid"])
    for key, uids in by_group.items():
        for uid in uids:
            sim.members[uid] = (key, tuple(uids))
        first = next(p for p in pods if p["metadata"]["uid"] == uids[0])
        n = gangs.annotated_min_count(first)
        if n is not None:
            sim.min_counts[key] = n
    for p in pods:
        uid = p["metadata"]["uid"]
        req = sim.request_for(p, uid=uid)
        sim.submit(req)
        on = p["spec"].get("nodeName")
        if on is not None:
            i = sim.state.node_index[on]
            devs = [(d, 1000.0) for d in range(req.gpu_count)]
            taken = sum(1 for bp in sim.state.pods.values() if bp.node == on)
            devs = [(d + 2 * taken, m) for d, m in devs]
            sim.bind_planned(uid, on, req.row_on(sim.state.gpu_col, 1000.0), devs)
            assert sim.state.node_index[on] == i
    return sim


def _decision(d: gate.GateDecision | None) -> tuple[Any, ...] | None:
    if d is None:
        return None
    return (d.allowed, d.waiting_for, round(d.share_after, 9), round(d.fair_share, 9))


@pytest.mark.parametrize("rule", gangs.waiting.RULES)
@pytest.mark.parametrize(
    "case",
    ["not-owed", "owed", "short", "never", "running"],
)
def test_extender_and_simulator_give_the_same_gate_answer(rule, case):
    base = [*a_holds_six(), plain("a", "next", 1)]
    extra = {
        "not-owed": [member("b", "jb", i, min_members=3) for i in range(3)],
        "owed": [member("b", "jb", i, min_members=2) for i in range(2)],
        "short": [member("b", "jb", i, gpus=1, min_members=3) for i in range(2)],
        "never": [member("b", "jb", i, min_members=5) for i in range(5)],
        "running": [member("b", "jb", i, gpus=1, min_members=1) for i in range(2)],
    }[case]
    pods = base + extra
    t = tracker(NODES, pods)
    ext = judge(t, base[2], rule)
    sim = simulated(pods, rule)
    if case == "running":
        # one member bound: the group runs, its next member counts alone in both
        uid = extra[0]["metadata"]["uid"]
        t.on_event("Pod", "MODIFIED", dict(extra[0], spec={**extra[0]["spec"], "nodeName": "n2"}))
        req = sim.pods[uid]
        sim.bind_planned(uid, "n2", req.row_on(sim.state.gpu_col, 1000.0), [(2, 1000.0)])
        ext = judge(t, base[2], rule)
    mine = sim._gate(sim.pods["a-next"])
    assert _decision(ext) == _decision(mine), (rule, case)
    if rule == gangs.waiting.RULE:
        expect = {"not-owed": True, "owed": False, "short": True, "never": True}
        if case in expect:
            assert ext is not None and ext.allowed is expect[case]


def test_requests_pod_helper_shapes_match():
    """The simulated requests equal the extender's (so the differential test compares
    like with like)."""
    pods = [plain("a", "next", 1), member("b", "jb", 0, min_members=2)]
    t = tracker(NODES, pods)
    sim = simulated(pods, "owed")
    for p in pods:
        uid = p["metadata"]["uid"]
        a, b = t.pending[uid], sim.pods[uid]
        assert dataclasses.replace(a, unschedulable="").row == b.row


def test_the_requeuer_counts_groups_as_the_filter_does():
    """A pod the gate held while b's never-whole group waited is lifted (nudged) under
    the group rule; without it the requeuer would still see one member fitting."""
    from extender import requeue

    pods = [*a_holds_six(), plain("a", "next", 1)]
    pods += [member("b", "huge", i, min_members=5) for i in range(5)]
    t = tracker(NODES, pods)
    t.gated.add("a-next")
    alone = requeue.lifted(t.snapshot(CONFIG), t.feedback, CONFIG)
    t.gangs = ganging.GangCoordinator(t.cache)
    assert [p.uid for p in requeue.lifted(t.snapshot(CONFIG), t.feedback, CONFIG)] == ["a-next"]
    assert alone == []


def test_status_and_explain_count_groups_as_the_filter_does():
    """fairshare status and explain judge a's next pod beside b's never-whole group as
    the extender's filter does: not held (judged pod by pod, it was listed as held)."""
    from fairshare import report
    from fairshare_cli import live
    from tests.unit.test_gang_status import snap

    pods = [*a_holds_six(), plain("a", "next", 1)]
    pods += [member("b", "huge", i, min_members=5) for i in range(5)]
    s = snap(pods)
    t, usage = live.feed_trackers(s)
    fits = live.group_fits(s, t, s.config)
    seen = t.snapshot(s.config)
    data = report.build_status(
        config=s.config, state=seen.state, pending=list(seen.queue), mix=seen.mix, group_fits=fits
    )
    assert "a/next" not in [p["pod"] for p in data["heldPods"]]
    before = report.build_status(
        config=s.config, state=seen.state, pending=list(seen.queue), mix=seen.mix
    )
    assert "a/next" in [p["pod"] for p in before["heldPods"]]
    out = live.explain_report(s, t, usage, pods[2])
    assert not out["extender"]["verdict"].startswith("held"), out["extender"]


def test_the_trackers_group_index_follows_pods_coming_and_going():
    pods = [member("b", "jb", i, min_members=2) for i in range(2)] + [plain("a", "x", 1)]
    t = tracker(NODES, pods)
    key = gangs.GroupKey("b", "jb")
    assert t.group_members() == {
        "b-jb-0": (key, ("b-jb-0", "b-jb-1")),
        "b-jb-1": (key, ("b-jb-0", "b-jb-1")),
    }
    t.on_event("Pod", "DELETED", pods[0])
    assert t.group_members() == {"b-jb-1": (key, ("b-jb-1",))}
    t.on_event("Pod", "ADDED", member("b", "jb", 2, min_members=2))
    assert set(t.group_members()) == {"b-jb-1", "b-jb-2"}
