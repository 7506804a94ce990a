"""Gangs through the extender's HTTP app: all or nothing at filter and at bind.

kube-scheduler is played as it behaves without the alpha gang gates: one pod at a time
through filter, binds running concurrently with the next pods' filters.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender import app as ext_app
from extender import ganging
from fairshare import gangs
from tests.extender_side import Side
from tests.unit.test_gangs import CONFIG, member, node

NODES = ["n1", "n2"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def client(monkeypatch):
    monkeypatch.setattr(ganging, "BIND_WAIT", 0.3)
    bound: list[str] = []

    async def binder(plan):
        await asyncio.sleep(0.001)
        bound.append(plan.name)

    deps = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True, binder=binder)
    clock = Clock()
    assert deps.gangs is not None
    deps.gangs.clock = clock
    t = Side.of(deps)
    t.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    t.on_resync("Node", [node("n1", 4), node("n2", 4)])
    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        c.deps, c.bound, c.clock = deps, bound, clock  # type: ignore[attr-defined]
        yield c


async def add(client, pods: list[dict[str, Any]]) -> None:
    for p in pods:
        client.deps.sink.on_event("Pod", "ADDED", p)


async def filter_(client, pod: dict[str, Any]) -> dict[str, Any]:
    args = {"Pod": pod, "Nodes": None, "NodeNames": NODES}
    r = await client.post("/filter", json=args)
    assert r.status == 200
    return await r.json()


async def bind(client, pod: dict[str, Any], node_name: str) -> str:
    meta = pod["metadata"]
    body = {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node_name,
    }
    r = await client.post("/bind", json=body)
    return str((await r.json())["Error"])


def free_gpus(client) -> float:
    state = client.deps.cache.state
    return state.total_free()[state.gpu_col] / 1000


async def schedule_interleaved(client, pods: list[dict[str, Any]]) -> dict[str, str]:
    """Filter each pod in turn (first passing node), its bind started at once and run
    concurrently with the next filters; the bind errors by pod name ("" bound)."""
    binds: dict[str, asyncio.Task[str]] = {}
    errors: dict[str, str] = {}
    for p in pods:
        out = await filter_(client, p)
        names = out.get("NodeNames") or []
        if names:
            binds[p["metadata"]["name"]] = asyncio.create_task(bind(client, p, names[0]))
        else:
            fails = {
                **(out.get("FailedNodes") or {}),
                **(out.get("FailedAndUnresolvableNodes") or {}),
            }
            errors[p["metadata"]["name"]] = "filter: " + next(iter(fails.values()))
        await asyncio.sleep(0)
    for name, task in binds.items():
        errors[name] = await task
    return errors


def two_gangs() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    a = [member("a", "ja", i, min_members=3) for i in range(3)]
    b = [member("b", "jb", i, min_members=3) for i in range(3)]
    return a, b


async def test_two_gangs_on_eight_gpus_one_runs_whole_the_other_holds_nothing(client):
    a, b = two_gangs()
    await add(client, a + b)
    interleaved = [p for pair in zip(a, b, strict=True) for p in pair]
    errors = await schedule_interleaved(client, interleaved)
    assert [errors[p["metadata"]["name"]] for p in a] == ["", "", ""]
    for p in b:
        err = errors[p["metadata"]["name"]]
        assert err.startswith("filter: gang b/jb (3 × nvidia.com/gpu 2"), err
        assert "does not fit whole: 1 of 3 members placed" in err
    assert sorted(client.bound) == ["ja-0", "ja-1", "ja-2"]
    assert free_gpus(client) == 2  # b holds nothing
    # the first job is deleted: the second is placed whole
    for p in a:
        client.deps.sink.on_event("Pod", "DELETED", p)
    errors = await schedule_interleaved(client, b)
    assert [errors[p["metadata"]["name"]] for p in b] == ["", "", ""]
    assert free_gpus(client) == 2


async def test_other_members_are_answered_their_planned_node_only(client):
    a, _ = two_gangs()
    await add(client, a)
    first = await filter_(client, a[0])
    assert len(first["NodeNames"]) == 1
    live = client.deps.gangs.plans[gangs.GroupKey("a", "ja")]
    for p in a:
        out = await filter_(client, p)
        planned = live.plan.node_of(p["metadata"]["uid"])
        assert out["NodeNames"] == [planned]
        assert all(f"gang a/ja placed this member on {planned}" == v
                   for v in out["FailedNodes"].values())  # fmt: skip
    assert free_gpus(client) == 2  # reserved before any bind


async def test_a_gang_with_fewer_than_min_count_members_holds_nothing(client):
    pods = [member("a", "ja", i, min_members=3) for i in range(2)]
    await add(client, pods)
    for p in pods:
        out = await filter_(client, p)
        assert out["NodeNames"] == []
        assert set(out["FailedAndUnresolvableNodes"].values()) == {
            "gang a/ja has 2 of its 3 members; it holds nothing until all exist"
        }
    assert free_gpus(client) == 8
    assert client.deps.gangs.plans == {}


async def test_a_member_without_min_count_is_refused_with_the_reason(client):
    pod = member("a", "ja", 0)
    await add(client, [pod])
    out = await filter_(client, pod)
    (reason,) = set(out["FailedAndUnresolvableNodes"].values())
    assert "no PodGroup scheduling.x-k8s.io/v1alpha1 a/ja" in reason


async def test_binds_are_held_until_the_whole_group_reached_bind(client):
    a, _ = two_gangs()
    await add(client, a)
    nodes = [(await filter_(client, p))["NodeNames"][0] for p in a]
    first = asyncio.create_task(bind(client, a[0], nodes[0]))
    await asyncio.sleep(0.05)
    assert not first.done() and client.bound == []  # held
    rest = [asyncio.create_task(bind(client, p, n)) for p, n in zip(a[1:], nodes[1:], strict=True)]
    assert await first == "" and [await r for r in rest] == ["", ""]
    assert sorted(client.bound) == ["ja-0", "ja-1", "ja-2"]
    assert free_gpus(client) == 2


async def test_a_held_bind_times_out_and_the_member_is_bound_when_the_group_completes(client):
    a, _ = two_gangs()
    await add(client, a)
    nodes = [(await filter_(client, p))["NodeNames"][0] for p in a]
    err = await bind(client, a[0], nodes[0])
    assert err == (
        "gang a/ja: 1 of 3 members have reached bind; held 0.3s, "
        "the group binds whole once all have"
    )
    assert client.bound == [] and free_gpus(client) == 2  # nothing bound, room kept
    both = await asyncio.gather(
        *(bind(client, p, n) for p, n in zip(a[1:], nodes[1:], strict=True))
    )
    assert both == ["", ""]
    await asyncio.sleep(0.05)  # the first member's Binding, POSTed by the completing call
    assert sorted(client.bound) == ["ja-0", "ja-1", "ja-2"]
    assert {client.deps.cache.state.pods[p["metadata"]["uid"]].node for p in a} <= set(NODES)
    # kube-scheduler's own retry of the first member finds it bound
    assert await bind(client, a[0], nodes[0]) == ""


async def test_an_unused_plan_expires_and_frees_its_room(client):
    a, b = two_gangs()
    await add(client, a + b)
    await filter_(client, a[0])
    assert free_gpus(client) == 2
    client.clock.now += ganging.PLAN_IDLE + 1
    out = await filter_(client, b[0])  # the expired plan of a is dropped first
    assert out["NodeNames"], out
    assert gangs.GroupKey("a", "ja") not in client.deps.gangs.plans
    assert free_gpus(client) == 2  # now b's


async def test_an_expired_plan_frees_its_room_for_a_pod_without_a_group(client):
    a, _ = two_gangs()
    plain = member("b", "x", 0, gpus=4)
    del plain["metadata"]["labels"]
    await add(client, [*a, plain])
    await filter_(client, a[0])  # a/ja reserves 6 of 8 GPUs: no node has 4 free
    assert (await filter_(client, plain))["NodeNames"] == []
    client.clock.now += ganging.PLAN_IDLE + 1
    assert (await filter_(client, plain))["NodeNames"] == NODES
    assert client.deps.gangs.plans == {}


async def test_deleting_a_member_drops_the_plan(client):
    a, _ = two_gangs()
    await add(client, a)
    await filter_(client, a[0])
    client.deps.sink.on_event("Pod", "DELETED", a[2])
    client.deps.gangs.expire(client.deps.snapshot())
    assert client.deps.gangs.plans == {}
    assert free_gpus(client) == 8


async def test_pods_without_a_group_are_untouched(client):
    pod = member("a", "x", 0)
    del pod["metadata"]["labels"]
    await add(client, [pod])
    out = await filter_(client, pod)
    assert out["NodeNames"] == NODES
    assert await bind(client, pod, "n1") == ""
    assert client.deps.gangs.plans == {}
