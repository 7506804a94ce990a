"""The extender's view (``verbs.ExtenderView``): one per version of what the tracker
holds, and the verbs as functions of ``(args, view, config)``; the bind's whole decision
(``verbs.bind_decision``)."""

from __future__ import annotations

from typing import Any

from extender import verbs, wire
from extender.tracking import ExtenderTracker
from fairshare.config.loading import config_from_mapping
from tests.unit.test_extender_bind_costs import CONFIG
from tests.unit.test_extender_bind_costs import pending as bind_costs_pending
from tests.unit.test_state_objects import node


def pending(ns: str, i: int, gpus: int = 1) -> dict[str, Any]:
    """``test_extender_bind_costs``' pending pod, with a resourceVersion (the view is
    made per tracker version, and the request cache per pod version)."""
    obj = bind_costs_pending(ns, i, gpus)
    obj["metadata"]["resourceVersion"] = "1"
    return obj


def tracker() -> ExtenderTracker:
    t = ExtenderTracker(lambda: CONFIG)
    t.on_resync("Node", [node("n1"), node("n2")])
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    t.on_resync("Pod", [pending("a", i) for i in range(3)] + [pending("b", 0, gpus=2)])
    return t


def test_one_view_per_version_of_the_tracker() -> None:
    t = tracker()
    first = t.view(CONFIG)
    assert t.view(CONFIG) is first  # nothing changed
    # Its parts are computed once and kept, and are the tracker's own figures.
    assert first.fair() is first.fair() and first.fair() == t.fair_shares(CONFIG)
    assert first.mix() is t.mix() and first.context() is t.context()
    assert [p.uid for p in first.queue()] == ["a0", "a1", "a2", "b0"]
    t.on_event("Pod", "ADDED", pending("b", 1))  # the queue changed: a new view
    second = t.view(CONFIG)
    assert second is not first and "b1" in second.pending
    other = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
        }
    )
    assert t.view(other) is not second  # another config in force: another view
    # The adapter's own queue changes (a bind assumed, a failed Binding) make new views.
    third = t.view(CONFIG)
    req = t.pending["a0"]
    t.take_pending("a0")
    assert t.view(CONFIG) is not third and "a0" not in t.view(CONFIG).pending
    fourth = t.view(CONFIG)
    t.requeue("a0", req)
    assert t.view(CONFIG) is not fourth and t.view(CONFIG).pending["a0"] is req


def test_the_view_reads_the_pod_as_the_tracker_does() -> None:
    t = tracker()
    p = pending("a", 0)
    assert t.view(CONFIG).request(p, CONFIG) is t.request(p, CONFIG)
    # A plain view (a state file, a test) reads it afresh.
    plain = verbs.ExtenderView.of(t.state)
    assert plain.request(p, CONFIG).row == t.request(p, CONFIG).row


def test_the_verbs_answer_alike_through_the_trackers_view_and_a_plain_one() -> None:
    t = tracker()
    view = t.view(CONFIG)
    plain = verbs.ExtenderView.of(
        t.state, pending=t.pending_queue(), namespace_labels=t.namespace_labels, mix=t.mix()
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
    decision = verbs.bind_decision(args, t.view(CONFIG), CONFIG)
    assert decision.error == "" and decision.plan is not None
    assert decision.req is t.pending["a0"] and decision.gate is None
    assert decision.plan.binding["target"]["name"] == "n1"
    verbs.commit_bind(t.state, decision.plan)
    t.take_pending("a0")
    # kube-scheduler retries a bind that went through: answered as bound, nothing to do.
    again = verbs.bind_decision(args, t.view(CONFIG), CONFIG)
    assert (again.error, again.plan, again.result()) == ("", None, {"Error": ""})
    # The same pod to another node: refused by the plan (it is no longer pending).
    elsewhere = verbs.bind_decision(
        wire.ExtenderBindingArgs("a0", "a", "a0", "n2"), t.view(CONFIG), CONFIG
    )
    assert "is not pending here" in elsewhere.error and elsewhere.plan is not None
    # An unknown node.
    nowhere = verbs.bind_decision(
        wire.ExtenderBindingArgs("a1", "a", "a1", "n9"), t.view(CONFIG), CONFIG
    )
    assert "is not known to fairshare" in nowhere.error


def test_the_bind_decision_judges_the_gate_again_unless_told_not_to() -> None:
    t = ExtenderTracker(lambda: CONFIG)
    t.on_resync("Node", [node("n1", gpus=8)])
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    asks = [pending("a", i, gpus=2) for i in range(4)] + [pending("b", i, gpus=2) for i in range(3)]
    t.on_resync("Pod", asks)
    for i in range(2):  # a takes 4 of the node's GPUs (8): its fair share is 4
        d = verbs.bind_decision(
            wire.ExtenderBindingArgs(f"a{i}", "a", f"a{i}", "n1"), t.view(CONFIG), CONFIG
        )
        assert d.plan is not None and not d.error, d.error
        verbs.commit_bind(t.state, d.plan)
        t.take_pending(f"a{i}")
    args = wire.ExtenderBindingArgs("a2", "a", "a2", "n1")
    held = verbs.bind_decision(args, t.view(CONFIG), CONFIG)
    assert held.plan is None and held.gate is not None and not held.gate.allowed
    assert held.error == held.gate.reason and "while b waits" in held.error
    assert held.req is t.pending["a2"]
    # A pod group's member: the gate was judged for the whole group.
    member = verbs.bind_decision(args, t.view(CONFIG), CONFIG, judge_gate=False)
    assert member.plan is not None and not member.error
