"""Pod groups in view: where each gang stands and why it waits (``fairshare.gangs.status``),
in ``fairshare status``/``explain`` (table and JSON), on the extender's status page, in
its metrics, and as Events on a group's pods when its owner can act."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender import app as ext_app
from extender import ganging
from extender import serve as ext_serve
from fairshare import gangs, report
from fairshare.gangs.podgroups import KIND as PODGROUP
from fairshare.state.snapshot import Snapshot
from fairshare_cli import live
from tests.extender_side import Side
from tests.unit.test_gangs import CONFIG, member, node

KEY_A = gangs.GroupKey("a", "ja")


def ns(name: str) -> dict[str, Any]:
    return {"kind": "Namespace", "metadata": {"name": name}}


def bound(pod: dict[str, Any], node_name: str) -> dict[str, Any]:
    out = json.loads(json.dumps(pod))
    out["spec"]["nodeName"] = node_name
    out["status"] = {"phase": "Running"}
    return out


def podgroup(namespace: str, name: str, min_member: int | None) -> dict[str, Any]:
    spec = {} if min_member is None else {"minMember": min_member}
    return {"kind": PODGROUP, "metadata": {"namespace": namespace, "name": name}, "spec": spec}


def snap(pods: list[dict[str, Any]], podgroups: Sequence[dict[str, Any]] = ()) -> Snapshot:
    return Snapshot(
        CONFIG,
        {
            "Namespace": [ns("a"), ns("b")],
            "Node": [node("n1", 4), node("n2", 4)],
            "Pod": pods,
            PODGROUP: list(podgroups),
        },
    )


def statuses(s: Snapshot) -> dict[str, gangs.status.GroupStatus]:
    tracker, _usage = live.feed_trackers(s)
    return {str(g.key): g for g in live.gang_statuses(s, tracker, s.config)}


def test_each_reason_a_group_waits_for():
    pods = [
        *(member("a", "ja", i, min_members=3) for i in range(3)),  # fits whole
        *(member("a", "short", i, min_members=3) for i in range(2)),  # 2 of 3
        member("b", "nosize", 0),  # no PodGroup, no annotation
        *(member("b", "huge", i, gpus=8, min_members=2) for i in range(2)),  # never fits
        *(member("b", "pg", i, 1, min_members=2) for i in range(2)),  # PodGroup says 4
        *(member("b", "empty", i, 1) for i in range(2)),  # PodGroup without minMember
    ]
    got = statuses(snap(pods, [podgroup("b", "pg", 4), podgroup("b", "empty", None)]))
    assert got["a/ja"].state == "waiting" and got["a/ja"].reason == gangs.status.FITS_NOW
    assert not got["a/ja"].actionable
    assert got["a/short"].reason == (
        "gang a/short has 2 of its 3 members; it holds nothing until all exist"
    )
    assert got["a/short"].actionable
    assert got["b/nosize"].reason.startswith("gang b/nosize: no PodGroup")
    assert got["b/nosize"].min_count is None and got["b/nosize"].actionable
    huge = got["b/huge"]
    assert "does not fit whole: 0 of 2 members placed" in huge.reason
    assert "b/huge-0 fits no node even empty: it can never run" in huge.reason
    assert huge.actionable
    assert (got["b/pg"].min_count, got["b/pg"].min_source) == (4, "PodGroup")
    assert got["b/pg"].reason == (
        "gang b/pg has 2 of its 4 members; it holds nothing until all exist"
    )
    assert got["b/empty"].reason == "gang b/empty: its PodGroup has no positive spec.minMember"


def test_a_group_too_big_for_all_nodes_together_can_never_run():
    pods = [member("a", "big", i, gpus=4, min_members=3) for i in range(3)]
    g = statuses(snap(pods))["a/big"]
    assert "the group asks more nvidia.com/gpu than the nodes its members may use have in all" in (
        g.reason
    )
    assert g.actionable


def test_a_group_that_yields_at_the_gate_names_the_tenant():
    # b holds half the GPUs; a (share 0) has pods that fit: b's gang waits for a.
    pods = [
        bound(member("b", "x", 0, gpus=4), "n1"),
        *(member("b", "jb", i, gpus=1, min_members=2) for i in range(2)),
        *(member("a", "p", i, gpus=1) | {"metadata": {"name": f"p-{i}", "namespace": "a",
                                                        "uid": f"a-p-{i}"}}
          for i in range(4)),
    ]  # fmt: skip
    g = statuses(snap(pods))["b/jb"]
    assert g.state == "waiting" and g.waiting_for == "a"
    assert g.reason.startswith("gang b/jb (2 × nvidia.com/gpu 1")
    assert "tenant b above its fair share" in g.reason and g.reason.endswith("while a waits")
    assert not g.actionable


def test_running_groups_and_gpus_held_by_a_partly_bound_group():
    pods = [
        *(bound(member("a", "ja", i, min_members=2), "n1") for i in range(2)),
        bound(member("b", "jb", 0, min_members=3), "n2"),  # bound alone, before a plan
        *(member("b", "jb", i, min_members=3) for i in (1, 2)),
    ]
    got = statuses(snap(pods))
    assert got["a/ja"].state == "running" and got["a/ja"].held_gpus == 0
    assert got["b/jb"].state == "waiting" and got["b/jb"].held_gpus == 2
    assert (got["b/jb"].members, got["b/jb"].bound) == (3, 1)


def status_args() -> argparse.Namespace:
    return argparse.Namespace(output="json")


def test_status_shows_a_gangs_table_and_json(monkeypatch):
    s = snap([*(member("a", "short", i, min_members=3) for i in range(2))])
    tracker, usage = live.feed_trackers(s)
    monkeypatch.setattr(live, "_live_state", lambda args: (s, tracker, usage))
    data = live._status_once(status_args())
    assert data["gangs"] == [
        {
            "group": "a/short",
            "tenant": "a",
            "minCount": 3,
            "minCountFrom": "annotation",
            "members": 2,
            "bound": 0,
            "state": "waiting",
            "reason": "gang a/short has 2 of its 3 members; it holds nothing until all exist",
            "heldGpus": 0.0,
            "actionable": True,
        }
    ]
    text = report.render_status_text(data)
    assert "\nGANGS\n" in text
    header = next(line for line in text.splitlines() if line.startswith("GROUP"))
    assert header.split() == ["GROUP", "TENANT", "MEMBERS", "BOUND", "STATE", "HELD-GPU",
                              "WHY", "IT", "WAITS"]  # fmt: skip
    assert any(line.startswith("a/short  a       2/3      0      waiting") for line in
               text.splitlines()), text  # fmt: skip
    assert "<table id=gangs>" in report.render_status_html(data)
    # no group: no key, no table
    plain = snap([member("a", "x", 0) | {"metadata": {"name": "x", "namespace": "a", "uid": "x"}}])
    tracker, usage = live.feed_trackers(plain)
    monkeypatch.setattr(live, "_live_state", lambda args: (plain, tracker, usage))
    assert "gangs" not in live._status_once(status_args())


def test_explain_of_a_member_says_why_its_group_waits():
    pods = [
        bound(member("b", "x", 0, gpus=4), "n1"),
        *(member("b", "jb", i, gpus=1, min_members=2) for i in range(2)),
        *(member("a", "p", i, gpus=1) | {"metadata": {"name": f"p-{i}", "namespace": "a",
                                                        "uid": f"a-p-{i}"}}
          for i in range(4)),
    ]  # fmt: skip
    s = snap(pods)
    tracker, usage = live.feed_trackers(s)
    out = live.explain_report(s, tracker, usage, pods[1])
    ext = out["extender"]
    assert ext["verdict"].startswith("waits with its group: gang b/jb (2 × nvidia.com/gpu 1")
    assert ext["gang"]["waitingFor"] == "a"
    text = report.render_explain_text(out)
    assert "  gang: b/jb, 2 of 2 members, 0 bound, waiting, yields to a" in text
    # a member whose group lacks members: which, and how many
    s2 = snap([member("a", "short", i, min_members=3) for i in range(2)])
    tracker, usage = live.feed_trackers(s2)
    out = live.explain_report(s2, tracker, usage, member("a", "short", 0, min_members=3))
    assert out["extender"]["verdict"] == (
        "waits with its group: gang a/short has 2 of its 3 members; it holds nothing until "
        "all exist"
    )


# --- the extender: status page, metrics, Events ---------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def client(monkeypatch):
    monkeypatch.setattr(ganging, "BIND_WAIT", 0.3)
    deps = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True)
    clock = Clock()
    assert deps.gangs is not None
    deps.gangs.clock = clock
    told: list[tuple[gangs.GroupKey, list[tuple[str, str, str]], str]] = []
    deps.gangs.on_wait = lambda key, members, text: told.append((key, list(members), text))
    t = Side.of(deps)
    t.on_resync("Namespace", [ns("a"), ns("b")])
    t.on_resync("Node", [node("n1", 4), node("n2", 4)])
    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        c.deps, c.clock, c.told = deps, clock, told  # type: ignore[attr-defined]
        yield c


async def filter_(client, pod: dict[str, Any]) -> dict[str, Any]:
    r = await client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": ["n1", "n2"]})
    assert r.status == 200
    return dict(await r.json())


async def test_status_json_shows_a_live_plan(client):
    pods = [member("a", "ja", i, min_members=3) for i in range(3)]
    for p in pods:
        client.deps.sink.on_event("Pod", "ADDED", p)
    await filter_(client, pods[0])
    data = await (await client.get("/status.json")).json()
    (g,) = data["gangs"]
    assert g["group"] == "a/ja" and g["state"] == "planned"
    assert g["reason"].startswith("planned; 0 of 3 members reached bind")
    assert set(g["planned"]) == {"ja-0", "ja-1", "ja-2"}
    assert g["heldGpus"] == 6  # the plan's reservations
    # the same figures in the metrics
    ext_serve.publish_gang_metrics(client.deps, CONFIG, client.deps.snapshot(), ["a", "b"])
    body = (await (await client.get("/metrics")).read()).decode()
    assert 'fairshare_tenant_gangs_waiting{tenant="a"} 1.0' in body
    assert 'fairshare_tenant_gang_held_gpus{tenant="a"} 6.0' in body
    assert 'fairshare_tenant_gangs_waiting{tenant="b"} 0.0' in body


async def test_an_event_on_the_members_when_the_owner_can_act_once_per_reason(client):
    pods = [member("a", "short", i, min_members=3) for i in range(2)]
    for p in pods:
        client.deps.sink.on_event("Pod", "ADDED", p)
    await filter_(client, pods[0])
    await filter_(client, pods[1])
    assert len(client.told) == 1
    key, members, text = client.told[0]
    assert key == gangs.GroupKey("a", "short")
    assert members == [("a", "short-0", "a-short-0"), ("a", "short-1", "a-short-1")]
    assert text == (
        "gang a/short has 2 of its 3 members; it holds nothing until all exist. Create the "
        "missing members, or lower the group's minimum (PodGroup spec.minMember or "
        "fairshare.io/gang-min-members)"
    )
    client.clock.now += ganging.TELL_EVERY + 1
    await filter_(client, pods[0])
    assert len(client.told) == 2


async def test_no_event_while_a_group_only_waits_for_room(client):
    # 6 GPUs of 8 taken: a 2 × 2-GPU group waits for room, which is nobody's mistake
    for i, n in enumerate(("n1", "n2", "n1")):
        client.deps.sink.on_event("Pod", "ADDED", bound(member("b", "x", i, gpus=2), n))
    pods = [member("a", "ja", i, min_members=2) for i in range(2)]
    for p in pods:
        client.deps.sink.on_event("Pod", "ADDED", p)
    out = await filter_(client, pods[0])
    assert "does not fit whole" in next(iter(out["FailedNodes"].values()))
    assert client.told == []
    # a group no node could ever hold is told
    huge = [member("a", "huge", i, gpus=8, min_members=2) for i in range(2)]
    for p in huge:
        client.deps.sink.on_event("Pod", "ADDED", p)
    await filter_(client, huge[0])
    assert [k for k, _, _ in client.told] == [gangs.GroupKey("a", "huge")]
    assert "it can never run" in client.told[0][2]


async def test_the_event_writer_posts_a_warning_per_member(monkeypatch):
    from extender import events

    posted: list[tuple[str, dict[str, Any]]] = []

    class Core:
        def __init__(self, _api: Any) -> None:
            pass

        async def create_namespaced_event(self, namespace, body, _preload_content):
            posted.append((namespace, body))
            return None

    async def call_raw(coro):
        await coro
        return 201, b""

    import kubernetes_asyncio.client as k8s

    monkeypatch.setattr(k8s, "CoreV1Api", Core)
    monkeypatch.setattr(events, "call_raw", call_raw)
    record = events.gang_recorder(object())
    record(KEY_A, [("a", "ja-0", "u0"), ("a", "ja-1", "u1")], "why")
    for _ in range(5):
        await asyncio.sleep(0)
    assert [(n, b["involvedObject"]["name"], b["reason"], b["type"]) for n, b in posted] == [
        ("a", "ja-0", "FairShareGang", "Warning"),
        ("a", "ja-1", "FairShareGang", "Warning"),
    ]
    assert posted[0][1]["message"] == "why"


def test_status_quota_and_explain_count_the_room_a_gang_holds():
    """Quota as the webhook sees it: two members of a 5 × 2-GPU group exist, so 6 GPUs
    are held for the other three (QUOTA-USED 10 of 10): another pod of the tenant is
    refused, the group's next member is not."""
    from fairshare.config.loading import config_from_mapping

    limited = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"name": "a", "namespaces": ["a"], "limit": {"nvidia.com/gpu": "10"}}],
        }
    )
    pods = [member("a", "job", i, min_members=5) for i in range(2)]
    s = Snapshot(limited, {"Namespace": [ns("a")], "Node": [node("n1", 8)], "Pod": pods})
    tracker, usage = live.feed_trackers(s)
    seen = tracker.snapshot(limited)
    data = report.build_status(
        config=limited,
        state=seen.state,
        pending=list(seen.queue),
        mix=seen.mix,
        quota=live.quota_view(s, usage),
    )
    gpu = next(r for r in data["tenants"][0]["resources"] if r["resource"] == "nvidia.com/gpu")
    assert (gpu["used"], gpu["quotaUsed"], gpu["limit"]) == ("0", "10", "10")
    stray = member("a", "x", 0, gpus=1) | {"metadata": {"name": "x", "namespace": "a"}}
    out = live.explain_report(s, tracker, usage, stray)
    assert not out["webhook"]["allowed"]
    assert out["webhook"]["message"].startswith(
        "tenant a would exceed its nvidia.com/gpu limit: 10 used + 1 requested > 10"
    )
    nxt = member("a", "job", 2, min_members=5)
    assert live.explain_report(s, tracker, usage, nxt)["webhook"]["allowed"]


def test_explain_reads_the_groups_own_refusal_in_kube_schedulers_verdict():
    """kube-scheduler writes the extender's refusal of a member into its PodScheduled
    condition; explain then says why the group waits, not 'unschedulable by
    kube-scheduler'."""
    short = "gang a/short has 2 of its 3 members; it holds nothing until all exist"
    pods = [member("a", "short", i, min_members=3) for i in range(2)]
    for p in pods:
        p["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": f"0/2 nodes are available: 2 {short}. preemption: 0/2 nodes are "
                "available: 2 Preemption is not helpful for scheduling.",
            }
        ]
    s = snap(pods)
    tracker, usage = live.feed_trackers(s)
    out = live.explain_report(s, tracker, usage, pods[0])
    assert out["extender"]["verdict"] == f"waits with its group: {short}"
    # and status lists the members as waiting with their group, not as kube-scheduler's
    seen = tracker.snapshot(s.config)
    data = report.build_status(
        config=s.config,
        state=seen.state,
        pending=list(seen.queue),
        mix=seen.mix,
        gangs=[g.as_dict() for g in live.gang_statuses(s, tracker, s.config)],
    )
    assert [p["reason"] for p in data["pendingPods"]] == [f"waits with its group: {short}"] * 2


def test_which_member_does_not_fit_where():
    """Two 4-GPU nodes with 2 GPUs free each: of a 3 × 2-GPU group two members place, the
    third fits no node beside them; status and explain name it and each node's reason."""
    pods = [
        bound(member("b", "x", 0, gpus=2) | {"metadata": {"name": "x0", "namespace": "b",
                                                            "uid": "b-x0"}}, "n1"),
        bound(member("b", "x", 1, gpus=2) | {"metadata": {"name": "x1", "namespace": "b",
                                                            "uid": "b-x1"}}, "n2"),
        *(member("a", "ja", i, min_members=3) for i in range(3)),
    ]  # fmt: skip
    s = snap(pods)
    g = statuses(s)["a/ja"]
    assert "does not fit whole: 2 of 3 members placed" in g.reason
    full = "Insufficient nvidia.com/gpu (free 0, requested 2)"
    assert g.misfit == ("a/ja-2", {"n1": full, "n2": full})
    assert g.as_dict()["misfit"] == {"member": "a/ja-2", "nodes": {"n1": full, "n2": full}}
    tracker, usage = live.feed_trackers(s)
    before = tracker.cache.state.total_free()
    text = report.render_explain_text(live.explain_report(s, tracker, usage, pods[2]))
    assert "  a/ja-2 fits no node beside the members placed before it:\n" in text
    assert f"    n1: {full}\n    n2: {full}\n" in text
    assert tracker.cache.state.total_free() == before  # the search leaves the state as it was


def test_explain_of_a_bound_pod_judges_it_without_the_annotations_bind_wrote():
    """The admission verdict of ``explain`` is "as if created now": a bound pod carries
    ``fairshare.io/gpu-devices`` (written at bind, refused on a create), which once made
    every bound GPU pod read "WEBHOOK (admission now): denied"."""
    pod = bound(member("b", "x", 0, gpus=2), "n1")
    pod["metadata"].setdefault("annotations", {})["fairshare.io/gpu-devices"] = "0:1000,1:1000"
    s = snap([pod])
    tracker, usage = live.feed_trackers(s)
    out = live.explain_report(s, tracker, usage, pod)
    assert out["webhook"]["allowed"], out["webhook"]
    assert pod["metadata"]["annotations"]["fairshare.io/gpu-devices"] == "0:1000,1:1000"
