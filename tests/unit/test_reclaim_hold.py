"""The hold on room reclaim made: made from a plan, carried by annotations, honoured for
other tenants' pods, and over once its pod binds or goes or the hold lapses."""

from __future__ import annotations

from typing import Any

from extender import verbs, wire
from fairshare.preemption import holds, reclaim
from tests.builders import make_pod
from tests.extender_side import Side
from tests.unit.test_reclaim import World, config, full_world, gpus
from tests.unit.test_state_objects import node


def _made() -> tuple[World, holds.RoomHold]:
    # A holds all 4 GPUs; B (guaranteed 2) wants one: a3 on n2 is evicted for b0.
    w = full_world()
    w.want("b", "b0")
    plan = w.plan()
    (hold,) = holds.holds_made(plan, w.pending, until=100.0 + holds.HOLD_TIMEOUT)
    assert (hold.req.uid, hold.node, hold.until) == ("uid-b0", "n2", 220.0)
    w.state.unbind("uid-a3")  # the victim is gone: one GPU free on n2
    return w, hold


def _row(w: World, name: str) -> int:
    return w.state.node_index[name]


def test_a_hold_is_made_for_each_pod_the_plan_made_room_for():
    w, hold = _made()
    assert hold.req.tenant == "b"
    assert holds.holds_made(reclaim.ReclaimPlan(), w.pending, until=1.0) == ()


def test_annotations_carry_the_hold_to_the_extender():
    _w, hold = _made()
    ann = holds.hold_annotations(hold.node, hold.until)
    assert ann == {holds.ANN_HELD_NODE: "n2", holds.ANN_HELD_UNTIL: "220.000"}
    assert holds.hold_of(hold.req, ann) == hold
    assert holds.hold_of(hold.req, None) is None
    assert holds.hold_of(hold.req, {holds.ANN_HELD_NODE: "n2"}) is None
    bad = {holds.ANN_HELD_NODE: "n2", holds.ANN_HELD_UNTIL: "soon"}
    assert holds.hold_of(hold.req, bad) is None
    inf = {holds.ANN_HELD_NODE: "n2", holds.ANN_HELD_UNTIL: "inf"}
    assert holds.hold_of(hold.req, inf) is None


def test_another_tenants_pod_is_kept_off_the_held_room():
    w, hold = _made()
    w.want("a", "a9")  # a's pod (the victim, recreated) would take b0's place
    other = w.pending[-1]
    n2 = _row(w, "n2")
    off = holds.held_off(w.state, [hold], other, [n2], now=150.0)
    assert list(off) == [n2]
    assert "held by reclaim for pod b/b0 (tenant b)" in off[n2]
    assert "1970-01-01T00:03:40Z" in off[n2]  # when it lapses (220 s)


def test_the_beneficiary_and_its_own_tenant_are_not_kept_off():
    w, hold = _made()
    n2 = _row(w, "n2")
    assert holds.held_off(w.state, [hold], hold.req, [n2], now=150.0) == {}
    w.want("b", "b1")
    assert holds.held_off(w.state, [hold], w.pending[-1], [n2], now=150.0) == {}


def test_room_beyond_the_hold_stays_open():
    # Two GPUs free on n2, the held pod needs one: another tenant's one-GPU pod fits beside.
    cfg = config({"name": "a"}, {"name": "b", "guaranteed": gpus(2)}, {"name": "c"})
    w = World(cfg, ("n2", 2))
    w.want("b", "b0")
    w.want("c", "c0")
    hold = holds.RoomHold(w.pending[0], "n2", 220.0)
    assert holds.held_off(w.state, [hold], w.pending[1], [0], now=150.0) == {}
    w.want("c", "c1", gpu=2)  # two GPUs would leave b0 none
    assert list(holds.held_off(w.state, [hold], w.pending[2], [0], now=150.0)) == [0]


def test_the_hold_is_kept_while_the_victims_are_still_leaving():
    # The victim is still bound: the held pod's request is counted anyway, so another
    # tenant's pod cannot take the GPU as soon as it is freed.
    w = full_world()
    w.want("b", "b0")
    plan = w.plan()
    (hold,) = holds.holds_made(plan, w.pending, until=220.0)
    n2 = _row(w, "n2")  # a3 still bound there (terminating)
    w.want("a", "a9", gpu=0)  # a CPU-only pod still fits beside it
    assert holds.held_off(w.state, [hold], w.pending[-1], [n2], now=150.0) == {}
    w.state.unbind("uid-a3")  # gone: its GPU is b0's, not a one-GPU pod of a's
    w.want("a", "a10")
    assert list(holds.held_off(w.state, [hold], w.pending[-1], [n2], now=150.0)) == [n2]


def test_a_hold_ends_when_its_pod_binds_is_deleted_or_lapses():
    w, hold = _made()
    w.want("a", "a9")
    other, n2 = w.pending[-1], _row(w, "n2")
    # lapsed
    assert holds.held_off(w.state, [hold], other, [n2], now=220.0) == {}
    # deleted: the extender finds no pending pod, so no hold (``hold_of`` is never asked)
    assert holds.held_off(w.state, [], other, [n2], now=150.0) == {}
    # bound in the room made for it: the hold is over
    w.run("b", "b0", "n2")
    assert holds.held_off(w.state, [hold], other, [n2], now=150.0) == {}
    # bound elsewhere: the room stays held for its tenant until the hold lapses
    w.state.unbind("uid-b0")
    w.run("b", "b0", "n1")
    assert list(holds.held_off(w.state, [hold], other, [n2], now=150.0)) == [n2]
    assert holds.held_off(w.state, [hold], other, [n2], now=220.0) == {}


# -- the extender: the hold reaches the filter through the pod's annotations --------------

EXT_CONFIG = config({"name": "a"}, {"name": "b", "guaranteed": gpus(1)})


def _pending(ns: str, i: int, **ann: str) -> dict[str, Any]:
    obj = make_pod(f"{ns}{i}").ns(ns).req(gpu=1, cpu="1").obj()
    obj["metadata"]["uid"] = f"{ns}{i}"
    if ann:
        obj["metadata"]["annotations"] = dict(ann)
    obj["status"] = {"phase": "Pending"}
    return obj


def _tracker(now: float) -> Side:
    t = Side(lambda: EXT_CONFIG)
    t.cache.clock = lambda: now
    t.on_resync("Node", [node("n1", gpus=1), node("n2", gpus=1)])
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    held = _pending("b", 0, **holds.hold_annotations("n1", 200.0))
    t.on_resync("Pod", [held, _pending("a", 0)])
    return t


def _filter(t: Side, uid: str) -> wire.ExtenderFilterResult:
    args = wire.ExtenderArgs(pod=t.pods[uid], nodes=None, node_names=("n1", "n2"))
    return verbs.filter_answer(args, t.snapshot(EXT_CONFIG), EXT_CONFIG).result


def test_the_extender_filter_keeps_another_tenants_pod_off_held_room():
    t = _tracker(now=150.0)
    (hold,) = t.room_holds()
    assert (hold.req.uid, hold.node, hold.until) == ("b0", "n1", 200.0)
    out = _filter(t, "a0")
    assert out.node_names == ("n2",)
    assert out.failed_nodes["n1"].startswith("room on n1 is held by reclaim for pod b/b0")
    assert _filter(t, "b0").node_names == ("n1", "n2")  # its own pod is not kept off


def test_the_extender_hold_ends_when_its_pod_binds():
    t = _tracker(now=150.0)
    bound = _pending("b", 0, **holds.hold_annotations("n1", 200.0))
    bound["spec"]["nodeName"] = "n1"
    bound["status"] = {"phase": "Running"}
    t.on_event("Pod", "MODIFIED", bound)
    assert t.room_holds() == []


def test_a_pod_bound_elsewhere_leaves_its_room_held_for_its_tenant():
    """b0 (hold on n1) binds on n2: n1 stays held for tenant b until the hold lapses, so
    a's pod is still kept off it (else another tenant takes the room the swap left, seen
    on the local control plane), while b's own pods may use it."""
    t = _tracker(now=150.0)
    t.on_resync("Node", [node("n1", gpus=1), node("n2", gpus=1), node("n3", gpus=1)])
    bound = _pending("b", 0, **holds.hold_annotations("n1", 200.0))
    bound["spec"]["nodeName"] = "n2"
    bound["status"] = {"phase": "Running"}
    t.on_event("Pod", "MODIFIED", bound)
    (hold,) = t.room_holds()
    assert (hold.req.uid, hold.node) == ("b0", "n1")
    args = wire.ExtenderArgs(pod=t.pods["a0"], nodes=None, node_names=("n1", "n3"))
    out = verbs.filter_answer(args, t.snapshot(EXT_CONFIG), EXT_CONFIG).result
    assert out.node_names == ("n3",)
    assert out.failed_nodes["n1"].startswith("room on n1 is held by reclaim for pod b/b0")
    t.on_event("Pod", "ADDED", _pending("b", 1))
    args = wire.ExtenderArgs(pod=t.pods["b1"], nodes=None, node_names=("n1", "n3"))
    assert verbs.filter_answer(args, t.snapshot(EXT_CONFIG), EXT_CONFIG).result.node_names == (
        "n1",
        "n3",
    )
    t.cache.clock = lambda: 200.0  # lapsed
    assert t.room_holds() == []


def test_the_extender_hold_ends_when_its_pod_is_deleted():
    t = _tracker(now=150.0)
    t.on_event("Pod", "DELETED", _pending("b", 0))
    assert t.room_holds() == []
    assert _filter(t, "a0").node_names == ("n1", "n2")


def test_the_extender_hold_ends_when_it_lapses():
    t = _tracker(now=200.0)
    assert t.room_holds() == []
    assert _filter(t, "a0").node_names == ("n1", "n2")


def test_explain_names_the_hold_that_keeps_a_pod_off_a_node():
    """``fairshare explain`` answers as the extender's filter: the held node does not fit
    the other tenant's pod, with the hold's reason, and the verdict says why it waits."""
    from fairshare import report
    from fairshare.usageview import StaticView

    w, hold = _made()
    w.want("a", "a9")
    other = w.pending[-1]
    args: dict[str, Any] = {
        "config": w.cfg,
        "state": w.state,
        "pending": w.pending,
        "req": other,
        "namespace": "a",
        "name": "a9",
        "quota": StaticView(),
        "admission": report.AdmissionVerdict(True),
    }
    free = report.explain_pod(**args)["extender"]
    assert free["fitsNodes"] == 1 and "held by reclaim" not in free["verdict"]
    assert next(n for n in free["nodes"] if n["node"] == "n2")["fits"]
    held = report.explain_pod(**args, holds=[hold])["extender"]
    n2 = next(n for n in held["nodes"] if n["node"] == "n2")
    assert not n2["fits"] and "held by reclaim for pod b/b0 (tenant b)" in n2["reason"]
    assert held["fitsNodes"] == 0
    assert held["verdict"].startswith("pending: the room it fits is held by reclaim")


def test_the_gate_does_not_yield_to_a_pod_the_hold_keeps_off():
    """b's pod b9 has room held on n1 (fair shares have moved since: b9 now takes b above
    its fair share); a, further behind, has a pod a9 that fits only in that room. The
    filter keeps a9 off it, so the gate must not count a9 as able to run: else b9 waits
    for a9 and a9 for b9's hold, and the GPU stays idle until the hold lapses."""
    from fairshare.gate import check_fair_gate

    def world(n1: int) -> tuple[World, Any]:
        w = World(config({"name": "a"}, {"name": "b"}), ("n1", n1), ("n2", 2))
        w.run("a", "a0", "n1")
        w.run("b", "b0", "n2")
        w.run("b", "b1", "n2")
        w.want("b", "b9")
        w.want("a", "a9")
        w.want("a", "a8")
        return w, w.pending[0]

    w, b9 = world(n1=2)
    hold = holds.RoomHold(b9, "n1", until=220.0)

    def gate(**kw: Any) -> Any:
        return check_fair_gate(w.state, config=w.cfg, req=b9, pending=w.pending, **kw)

    plain = gate()
    assert plain is not None and not plain.allowed and plain.waiting_for == "a"
    held = gate(held=holds.gate_held([hold]))
    assert held is not None and held.allowed
    assert holds.gate_held([]) is None
    # With room for a's pod beside the held one, a's pod still counts.
    w, b9 = world(n1=3)
    hold = holds.RoomHold(b9, "n1", until=220.0)
    again = gate(held=holds.gate_held([hold]))
    assert again is not None and not again.allowed and again.waiting_for == "a"
