"""A pod kube-scheduler itself cannot place holds no other tenant back; held pods are
requeued as soon as the gate lifts.

The messages are ``FitError.Error()`` of kube-scheduler v1.36 (pkg/scheduler/framework/
types.go) as it writes them in the ``PodScheduled`` condition: the node reasons as a
histogram sorted as strings, then PostFilter's (preemption's) message.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender import app as ext_app
from extender import requeue
from fairshare import report, verdicts
from fairshare.resources import ANN_REQUEUED
from fairshare.state import objects
from tests.extender_side import Side
from tests.unit.test_extender_filter import CONFIG
from tests.unit.test_state_objects import node, pod

AFFINITY = (
    "0/2 nodes are available: 2 node(s) didn't match pod affinity rules. preemption: "
    "0/2 nodes are available: 2 Preemption is not helpful for scheduling."
)
GATED = (
    "0/2 nodes are available: 2 tenant research above its fair share (0.62 > 0.50) while "
    "prod waits. preemption: 0/2 nodes are available: 2 No preemption victims found for "
    "incoming pod."
)

VERDICTS = [
    # (message, kube-scheduler's plugins refused every node for a reason fairshare does not check)
    (AFFINITY, True),
    (GATED, False),  # fairshare's gate: not a verdict against the pod
    ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", False),  # checked by fairshare
    # As kube-scheduler v1.36 wrote it on the local control plane: DRA's PostFilter
    # message comes before preemption's.
    (
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. no new claims to "
        "deallocate, preemption: 0/1 nodes are available: 1 No preemption victims found "
        "for incoming pod.",
        False,
    ),
    (
        "0/1 nodes are available: 1 node(s) didn't match pod affinity rules. no new claims "
        "to deallocate, preemption: 0/1 nodes are available: 1 Preemption is not helpful "
        "for scheduling.",
        True,
    ),
    (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match "
        "Pod's node affinity/selector. preemption: 0/3 nodes are available: 1 No "
        "preemption victims found for incoming pod, 2 Preemption is not helpful for "
        "scheduling.",
        False,
    ),
    (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match "
        "pod topology spread constraints.",
        True,
    ),
    (
        "0/2 nodes are available: 1 node(s) had taints that the pod didn't tolerate, "
        "1 node(s) didn't have free ports for the requested pod ports.",
        True,
    ),
    # A PreFilter message replaces the histogram.
    ("0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims.", True),
    (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu (free 0, requested 1), "
        "1 node(s) didn't match pod affinity rules.",
        False,  # fairshare's filter answered for one node: its own checks decide
    ),
    (
        "0/1 nodes are available: 1 no 1 GPU device(s) with 0.5 free (free per device: "
        "gpu0=0.25, gpu1=0.25).",
        False,
    ),
    ("something else entirely", False),
    ("", False),
]


@pytest.mark.parametrize(("message", "rejected"), VERDICTS)
def test_kube_scheduler_verdicts_are_told_from_fairshares(message: str, rejected: bool) -> None:
    assert verdicts.rejected_by_kube_scheduler(message) is rejected


def test_the_filters_own_answers_mark_a_verdict_as_fairshares() -> None:
    custom = "0/1 nodes are available: 1 held for reasons of its own."
    assert verdicts.rejected_by_kube_scheduler(custom)
    assert not verdicts.rejected_by_kube_scheduler(custom, {"held for reasons of its own"})


def test_histogram_reasons_keep_commas_inside_a_reason() -> None:
    msg = (
        "0/3 nodes are available: 1 no 2 GPU device(s) with 0.5 free (free per device: "
        "gpu0=0.25, gpu1=0.25), 2 node(s) didn't match pod affinity rules. preemption: x"
    )
    assert verdicts.verdict_reasons(msg) == (
        "no 2 GPU device(s) with 0.5 free (free per device: gpu0=0.25, gpu1=0.25)",
        "node(s) didn't match pod affinity rules",
    )


def unschedulable(obj: dict[str, Any], message: str) -> dict[str, Any]:
    out = dict(obj)
    out["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": "2026-12-06T10:00:00Z",
            },
            {"type": "Ready", "status": "False"},
        ],
    }
    return out


def test_slim_pods_keep_only_the_unschedulable_verdict() -> None:
    p = unschedulable(pod("x", ns="prod", gpu=1, phase="Pending"), AFFINITY)
    slim = objects.slim_pod(p)
    assert objects.unschedulable_message(slim) == AFFINITY
    assert [c["type"] for c in slim["status"]["conditions"]] == ["PodScheduled"]
    assert "conditions" not in objects.slim_pod(pod("y", gpu=1, phase="Pending"))["status"]
    bound = unschedulable(pod("z", gpu=1, node_name="a"), AFFINITY)
    assert "conditions" not in objects.slim_pod(bound)["status"]  # bound: no longer a verdict


def cluster() -> ext_app.ExtenderDeps:
    """Node a (4 GPUs) holds 3 of research's pods; research has one more pending, prod
    one pending that fits (so research is held: it is above its fair share)."""
    deps = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True)
    tr = Side.of(deps)
    tr.on_resync("Node", [node("a", gpus=4)])
    held = [pod(f"r{k}", ns="research", gpu=1, node_name="a") for k in range(3)]
    tr.on_resync("Pod", [*held, pod("new", ns="research", gpu=1, phase="Pending")])
    tr.on_event("Pod", "ADDED", pod("p0", ns="prod", gpu=1, phase="Pending"))
    return deps


async def filter_new(deps: ext_app.ExtenderDeps) -> dict[str, Any]:
    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        body = {"Pod": pod("new", ns="research", gpu=1, phase="Pending"), "NodeNames": ["a"]}
        r = await c.post("/filter", json=body)
        assert r.status == 200
        out: dict[str, Any] = await r.json()
        return out


async def test_a_pod_kube_scheduler_cannot_place_holds_no_one_back() -> None:
    deps = cluster()
    tr = Side.of(deps)
    assert (await filter_new(deps))["NodeNames"] == []  # prod/p0 waits: research held
    tr.on_event(
        "Pod", "MODIFIED", unschedulable(pod("p0", ns="prod", gpu=1, phase="Pending"), AFFINITY)
    )
    assert not tr.pending["uid-p0"].waiting and tr.verdicts["uid-p0"] == AFFINITY
    assert (await filter_new(deps))["NodeNames"] == ["a"]  # nobody waits any more
    rep = report.build_status(config=CONFIG, state=tr.state, pending=tr.pending_queue(), mix=None)
    entry = next(e for e in rep["pendingPods"] if e["pod"] == "prod/p0")
    assert (
        entry["reason"].startswith("unschedulable by kube-scheduler")
        and AFFINITY in entry["reason"]
    )


async def test_the_gates_own_refusal_is_not_a_verdict_against_the_pod() -> None:
    deps = cluster()
    tr = Side.of(deps)
    tr.on_event(
        "Pod", "MODIFIED", unschedulable(pod("p0", ns="prod", gpu=1, phase="Pending"), GATED)
    )
    assert tr.pending["uid-p0"].waiting and "uid-p0" not in tr.verdicts
    assert (await filter_new(deps))["NodeNames"] == []


async def test_a_verdict_is_dropped_once_kube_scheduler_asks_about_the_pod_again() -> None:
    deps = cluster()
    tr = Side.of(deps)
    p0 = pod("p0", ns="prod", gpu=1, phase="Pending")
    tr.on_event("Pod", "MODIFIED", unschedulable(p0, AFFINITY))
    assert not tr.pending["uid-p0"].waiting
    # kube-scheduler's plugins now pass a node (the pod it wanted to be near arrived):
    # it calls the extender's filter for p0.
    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        r = await c.post("/filter", json={"Pod": p0, "NodeNames": ["a"]})
        assert (await r.json())["NodeNames"] == ["a"]
    assert tr.pending["uid-p0"].waiting and "uid-p0" not in tr.verdicts
    # A later event carrying the same (older) verdict does not bring it back ...
    tr.on_event("Pod", "MODIFIED", unschedulable(p0, AFFINITY))
    assert tr.pending["uid-p0"].waiting
    # ... a new one does.
    spread = AFFINITY.replace("pod affinity rules", "pod topology spread constraints")
    tr.on_event("Pod", "MODIFIED", unschedulable(p0, spread))
    assert not tr.pending["uid-p0"].waiting and tr.verdicts["uid-p0"] == spread


async def test_a_gated_pod_of_another_scheduler_stays_not_waiting_when_its_verdict_goes() -> None:
    deps = cluster()
    tr = Side.of(deps)
    other = pod("p0", ns="prod", gpu=1, phase="Pending")
    other["spec"]["schedulerName"] = "someone-else"
    tr.on_event("Pod", "MODIFIED", unschedulable(other, AFFINITY))
    assert not tr.pending["uid-p0"].waiting
    tr.on_event("Pod", "MODIFIED", other)  # the verdict is gone, the scheduler is not ours
    assert not tr.pending["uid-p0"].waiting and not tr.pending["uid-p0"].unschedulable


class Patches:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def __call__(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.calls.append((namespace, name, body))


def requeuer(deps: ext_app.ExtenderDeps, patches: Patches) -> requeue.Requeuer:
    import asyncio

    synced = asyncio.Event()
    synced.set()
    return requeue.Requeuer(
        snapshot=deps.reading, feedback=deps.feedback, config=lambda: CONFIG,
        patch=patches, synced=synced, is_leader=lambda: True,
    )  # fmt: skip


async def test_held_pods_are_requeued_once_when_the_gate_lifts() -> None:
    deps = cluster()
    tr = Side.of(deps)
    patches = Patches()
    rq = requeuer(deps, patches)
    assert (await filter_new(deps))["NodeNames"] == []
    assert tr.gated == {"uid-new"}
    assert await rq.round() == 0 and patches.calls == []  # prod still waits: no nudge
    tr.on_event("Pod", "DELETED", pod("p0", ns="prod", gpu=1, phase="Pending"))
    assert await rq.round() == 1
    ((ns, name, body),) = patches.calls
    assert (ns, name) == ("research", "new")
    stamp = body["metadata"]["annotations"][ANN_REQUEUED]
    assert dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
    # Once per filter: no second nudge until kube-scheduler asked about the pod again.
    tr.on_event("Pod", "ADDED", pod("p1", ns="research", gpu=1, phase="Pending"))
    assert await rq.round() == 0 and len(patches.calls) == 1
    tr.on_event("Pod", "ADDED", pod("p2", ns="prod", gpu=1, phase="Pending"))
    assert (await filter_new(deps))["NodeNames"] == []  # held again (prod waits again)
    tr.on_event("Pod", "DELETED", pod("p2", ns="prod", gpu=1, phase="Pending"))
    assert await rq.round() == 1 and len(patches.calls) == 2


async def test_a_verdict_that_lifts_the_gate_requeues_the_held_pods() -> None:
    deps = cluster()
    tr = Side.of(deps)
    patches = Patches()
    rq = requeuer(deps, patches)
    assert (await filter_new(deps))["NodeNames"] == []
    assert await rq.round() == 0
    tr.on_event(
        "Pod", "MODIFIED", unschedulable(pod("p0", ns="prod", gpu=1, phase="Pending"), AFFINITY)
    )
    assert await rq.round() == 1 and patches.calls[0][1] == "new"


async def test_filter_waits_for_a_preemptors_victims_to_leave_its_view() -> None:
    """kube-scheduler retries a preemptor on its nominated node as soon as its own cache
    dropped the victim; the extender's watch may be a little behind. Filter waits for the
    victims the preempt verb answered there (not longer than ``VICTIM_WAIT``)."""
    import asyncio
    import time

    deps = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True)
    tr = Side.of(deps)
    tr.on_resync("Node", [node("a", gpus=1)])
    victim = pod("v", ns="research", gpu=1, node_name="a")
    tr.on_resync("Pod", [victim])
    hi = pod("hi", ns="prod", gpu=1, phase="Pending")
    tr.note_preempted("uid-hi", {"a": ("uid-v",)})
    body = {"Pod": hi, "NodeNames": ["a"]}

    async def filter_once(pod_obj: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        started = time.monotonic()
        raw = json.dumps({**body, "Pod": pod_obj}).encode()
        answer = await ext_app._filter(deps, raw)
        return time.monotonic() - started, answer.encode()

    # Not nominated yet: judged at once on what the extender sees (the victim holds the GPU).
    took, out = await filter_once(hi)
    assert out["NodeNames"] == [] and took < 0.1
    nominated = {**hi, "status": {"phase": "Pending", "nominatedNodeName": "a"}}

    async def delete_later() -> None:
        await asyncio.sleep(0.3)
        tr.on_event("Pod", "DELETED", victim)

    deleting = asyncio.create_task(delete_later())
    took, out = await filter_once(nominated)
    await deleting
    assert out["NodeNames"] == ["a"] and 0.25 < took < ext_app.VICTIM_WAIT
