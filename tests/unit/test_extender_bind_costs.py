"""What a bind costs the extender beyond deciding it: the fair allocation the gate
re-check reads is the tracker's, reused while every tenant's demand (bound + pending)
is what it was, and always equal to computing it afresh."""

from __future__ import annotations

from typing import Any

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare import cluster_shares
from fairshare.config.loading import config_from_mapping
from tests.builders import make_pod
from tests.extender_side import Side
from tests.unit.test_state_objects import node

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
)


def pending(ns: str, i: int, gpus: int = 1) -> dict[str, Any]:
    obj = make_pod(f"{ns}{i}").ns(ns).req(gpu=gpus, cpu="1").obj()
    obj["metadata"]["uid"] = f"{ns}{i}"
    obj["status"] = {"phase": "Pending"}
    return obj


def fresh(t: Side) -> dict[str, Any]:
    rows = cluster_shares.demand_rows(t.state, t.pending.values())
    return cluster_shares.fair_shares_for(t.state, CONFIG, rows)


def bind(t: Side, uid: str, node_name: str) -> None:
    """What the bind verb does under its lock: plan, account, leave the queue."""
    req = t.pending[uid]
    args = wire.ExtenderBindingArgs(req.name, req.namespace, uid, node_name)
    plan = verbs.bind_plan(args, Snapshot.of(t.state, pending=[req]))
    assert not plan.error
    t.cache.assume(lambda state: verbs.commit_bind(state, plan), uid)


def test_a_bind_reuses_the_fair_allocation_and_a_new_demand_recomputes_it() -> None:
    t = Side(lambda: CONFIG)
    t.on_resync("Node", [node("n1"), node("n2")])
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    t.on_resync("Pod", [pending("a", i) for i in range(6)] + [pending("b", 0, gpus=2)])
    first = t.fair_shares(CONFIG)
    assert first == fresh(t)
    bind(t, "a0", "n1")  # a's request moves from pending to bound: demand unchanged
    assert t.fair_shares(CONFIG) is first
    assert first == fresh(t)
    t.on_event("Pod", "ADDED", pending("b", 1, gpus=4))  # b asks for more
    again = t.fair_shares(CONFIG)
    assert again is not first and again != first
    assert again == fresh(t)
    t.on_event("Pod", "DELETED", pending("a", 5))
    assert t.fair_shares(CONFIG) == fresh(t)


def test_a_node_heartbeat_keeps_every_cached_figure() -> None:
    # kubelet (or kwok) rewrites a Node's status now and then with nothing the extender
    # reads changed: the state's version, hence the score context, the fair allocation
    # and the gate's memos cached on it, must stay. A real change still counts.
    t = Side(lambda: CONFIG)
    t.on_resync("Node", [node("n1"), node("n2")])
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}])
    t.on_resync("Pod", [pending("a", 0)])
    bind(t, "a0", "n1")
    version, ctx, free = t.state.version, t.context(), list(t.state.free)
    beat = node("n1")
    beat["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-12-03T10:00:00Z"}
    ]
    t.on_event("Node", "MODIFIED", beat)
    assert t.state.version == version
    assert t.context() is ctx
    assert list(t.state.free) == free and t.state.pods["a0"].node == "n1"
    t.on_event("Node", "MODIFIED", node("n1", cpu="16"))
    assert t.state.version != version
    assert t.context() is not ctx
