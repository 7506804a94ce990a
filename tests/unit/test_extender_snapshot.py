"""The cache's snapshot (``extender.snapshot``): one value per version of the cache, never
changed by a later write; the verbs as functions of ``(args, snapshot, config)``; the
bind's whole decision (``verbs.bind_decision``)."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare.config.loading import config_from_mapping
from tests.extender_side import Side
from tests.unit.test_extender_bind_costs import CONFIG
from tests.unit.test_extender_bind_costs import pending as bind_costs_pending
from tests.unit.test_state_objects import node


def pending(ns: str, i: int, gpus: int = 1) -> dict[str, Any]:
    """``test_extender_bind_costs``' pending pod, with a resourceVersion (the cache reads
    each pod version once)."""
    obj = bind_costs_pending(ns, i, gpus)
    obj["metadata"]["resourceVersion"] = "1"
    return obj


def tracker() -> Side:
    t = Side(lambda: CONFIG)
    t.on_resync("Node", [node("n1"), node("n2")])
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    t.on_resync("Pod", [pending("a", i) for i in range(3)] + [pending("b", 0, gpus=2)])
    return t


def test_one_snapshot_per_version_of_the_cache() -> None:
    t = tracker()
    first = t.snapshot(CONFIG)
    assert t.snapshot(CONFIG) is first  # nothing changed
    # Its parts are computed once, when it is taken, and are the cache's own figures.
    assert first.fair == t.cache.fair_shares(CONFIG)
    assert first.mix is t.cache.mix() and first.context is t.cache.context()
    assert [p.uid for p in first.queue] == ["a0", "a1", "a2", "b0"]
    assert list(first.pending) == ["a0", "a1", "a2", "b0"]
    t.on_event("Pod", "ADDED", pending("b", 1))  # the queue changed: a new snapshot
    second = t.snapshot(CONFIG)
    assert second is not first and "b1" in second.pending
    other = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
        }
    )
    assert t.snapshot(other) is not second  # another config in force: another snapshot
    # The app's own queue changes (a bind assumed, a failed Binding) make new snapshots.
    third = t.snapshot(CONFIG)
    req = t.cache.pending["a0"]
    t.cache.take_pending("a0")
    assert t.snapshot(CONFIG) is not third and "a0" not in t.snapshot(CONFIG).pending
    fourth = t.snapshot(CONFIG)
    t.cache.requeue("a0", req)
    assert t.snapshot(CONFIG) is not fourth and t.snapshot(CONFIG).pending["a0"] is req


def _figures(snap: Snapshot) -> tuple[object, ...]:
    """Everything a verb reads of a snapshot, as plain values."""
    state = snap.state
    return (
        [p.uid for p in snap.queue],
        dict(snap.pending),
        {k: dict(v) for k, v in snap.namespace_labels.items()},
        dict(snap.fair or {}),
        snap.holds,
        state.version,
        list(state.free),
        list(state.dev_free),
        list(state.capacity),
        sorted(state.pods),
        {t: list(row) for t, row in state.tenant_usage.items()},
        [n.name for n in state.nodes],
    )


def test_a_snapshot_is_a_value_the_cache_never_changes() -> None:
    """Every kind of write the cache takes after a snapshot leaves the snapshot as it was:
    a bind assumed and forgotten, a pod added and deleted, a node added and removed, a
    namespace relabelled, a pod group's room reserved."""
    t = tracker()
    snap = t.snapshot(CONFIG)
    before = _figures(snap)
    state = snap.state
    req = t.cache.pending["a0"]
    plan = verbs.bind_plan(wire.ExtenderBindingArgs("a0", "a", "a0", "n1"), snap)
    t.cache.assume(lambda s: verbs.commit_bind(s, plan), "a0")
    assert "a0" in t.cache.state.pods and "a0" not in t.cache.pending
    t.on_event("Pod", "ADDED", pending("b", 7))
    t.on_event("Pod", "DELETED", pending("a", 2))
    t.on_event("Node", "ADDED", node("n3"))
    t.on_event("Node", "DELETED", node("n2"))
    t.on_event("Namespace", "MODIFIED", {"metadata": {"name": "a", "labels": {"x": "y"}}})
    t.cache.forget("a0", req)
    assert t.cache.state is not state  # the cache wrote to a copy
    assert snap.state is state and _figures(snap) == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.queue = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        snap.pending["zz"] = req  # type: ignore[index]
    # And the next snapshot sees the writes.
    now = t.snapshot(CONFIG)
    assert "b7" in now.pending and "a2" not in now.pending
    assert [n.name for n in now.state.nodes] == ["n1", "n3"]


def test_verbs_read_the_apps_reading_of_the_pod() -> None:
    t = tracker()
    p = pending("a", 0)
    req = t.cache.request(p, CONFIG)
    assert req is t.cache.request(p, CONFIG)  # read once per pod version
    assert req is t.cache.pending["a0"]  # the watch's reading serves the call
    # A plain snapshot (a state file, a test) reads it afresh.
    plain = Snapshot.of(t.state)
    assert plain.request(p, CONFIG).row == req.row


def test_the_verbs_answer_alike_through_the_caches_snapshot_and_a_plain_one() -> None:
    t = tracker()
    view = t.snapshot(CONFIG)
    plain = Snapshot.of(
        t.state, pending=t.pending_queue(), namespace_labels=t.cache.namespace_labels, mix=t.mix()
    )
    args = wire.decode_extender_args({"Pod": pending("a", 1), "NodeNames": ["n1", "n2"]})
    assert (
        verbs.filter_result(args, view, CONFIG).encode()
        == verbs.filter_result(args, plain, CONFIG).encode()
    )
    assert verbs.prioritize_scores(args, view, CONFIG) == verbs.prioritize_scores(
        args, plain, CONFIG
    )


def test_the_bind_decision() -> None:
    t = tracker()
    args = wire.ExtenderBindingArgs("a0", "a", "a0", "n1")
    decision = verbs.bind_decision(args, t.snapshot(CONFIG), CONFIG)
    assert decision.error == "" and decision.plan is not None
    assert decision.req is t.pending["a0"] and decision.gate is None
    assert decision.plan.binding["target"]["name"] == "n1"
    plan = decision.plan
    t.cache.assume(lambda s: verbs.commit_bind(s, plan), "a0")
    # kube-scheduler retries a bind that went through: answered as bound, nothing to do.
    again = verbs.bind_decision(args, t.snapshot(CONFIG), CONFIG)
    assert (again.error, again.plan, again.result()) == ("", None, {"Error": ""})
    # The same pod to another node: refused by the plan (it is no longer pending).
    elsewhere = verbs.bind_decision(
        wire.ExtenderBindingArgs("a0", "a", "a0", "n2"), t.snapshot(CONFIG), CONFIG
    )
    assert "is not pending here" in elsewhere.error and elsewhere.plan is not None
    # An unknown node.
    nowhere = verbs.bind_decision(
        wire.ExtenderBindingArgs("a1", "a", "a1", "n9"), t.snapshot(CONFIG), CONFIG
    )
    assert "is not known to fairshare" in nowhere.error


def test_the_bind_decision_judges_the_gate_again_unless_told_not_to() -> None:
    t = Side(lambda: CONFIG)
    t.on_resync("Node", [node("n1", gpus=8)])
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    asks = [pending("a", i, gpus=2) for i in range(4)] + [pending("b", i, gpus=2) for i in range(3)]
    t.on_resync("Pod", asks)
    for i in range(2):  # a takes 4 of the node's GPUs (8): its fair share is 4
        d = verbs.bind_decision(
            wire.ExtenderBindingArgs(f"a{i}", "a", f"a{i}", "n1"), t.snapshot(CONFIG), CONFIG
        )
        assert d.plan is not None and not d.error, d.error
        t.cache.assume(partial(verbs.commit_bind, plan=d.plan), f"a{i}")
    args = wire.ExtenderBindingArgs("a2", "a", "a2", "n1")
    held = verbs.bind_decision(args, t.snapshot(CONFIG), CONFIG)
    assert held.plan is None and held.gate is not None and not held.gate.allowed
    assert held.error == held.gate.reason and "while b waits" in held.error
    assert held.req is t.pending["a2"]
    # A pod group's member: the gate was judged for the whole group.
    member = verbs.bind_decision(args, t.snapshot(CONFIG), CONFIG, judge_gate=False)
    assert member.plan is not None and not member.error


def test_a_snapshot_given_back_costs_no_copy_and_one_kept_costs_one() -> None:
    t = tracker()
    with t.reading(CONFIG) as snap:
        plan = verbs.bind_plan(wire.ExtenderBindingArgs("a0", "a", "a0", "n1"), snap)
    state = snap.state
    t.cache.assume(partial(verbs.commit_bind, plan=plan), "a0")
    assert t.cache.copies == 0 and t.cache.state is state  # written in place
    kept = t.snapshot(CONFIG)  # never given back: the next write copies
    t.on_event("Pod", "DELETED", pending("a", 1))  # the queue only: no copy
    assert t.cache.copies == 0 and "a1" in kept.pending
    t.on_event("Node", "ADDED", node("n3"))
    assert t.cache.copies == 1 and kept.state is not t.cache.state
    assert kept.state.n_nodes == 2 and t.cache.state.n_nodes == 3


async def test_the_apps_binds_write_the_state_in_place() -> None:
    """The bind verb gives its snapshot back before it assumes the bind: a burst of binds
    copies the state at most once (for a snapshot taken before the burst and kept)."""
    from aiohttp.test_utils import TestClient, TestServer

    from extender import app as ext_app

    deps = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True)
    deps.sink.on_resync("Node", [node("n1"), node("n2")])
    deps.sink.on_resync("Namespace", [{"metadata": {"name": "a"}}])
    deps.sink.on_resync("Pod", [pending("a", i) for i in range(6)])
    async with TestClient(TestServer(ext_app.make_app(deps))) as client:
        for i in range(6):
            body = {"PodName": f"a{i}", "PodNamespace": "a", "PodUID": f"a{i}", "Node": "n1"}
            if i >= 4:
                body["Node"] = "n2"
            resp = await client.post("/bind", json=body)
            assert (await resp.json())["Error"] == ""
    assert len(deps.cache.state.pods) == 6 and deps.cache.copies == 0
