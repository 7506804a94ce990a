"""A config swap that changes ``resources`` (the arrays' columns) is applied live.

It used to be hot-swapped into the config while the arrays kept the old columns, and
every filter call failed with a 500 (``zip() argument 3 is shorter ...``).
"""

from __future__ import annotations

import asyncio
from fractions import Fraction
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender import app as ext_app
from extender import serve as ext_serve
from fairshare.config import loading
from fairshare.config.reloading import ConfigHolder
from fairshare.config.schema import FairShareConfig
from fairshare.resources import GPU
from fairshare.simulator.engine import Simulation
from tests.extender_side import Side
from tests.unit.test_extender_app import half_pod, node
from webhook.policies import config_guard


def config(resources: list[str] | None = None) -> FairShareConfig:
    doc: dict[str, Any] = {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
    if resources is not None:
        doc["resources"] = {name: {} for name in resources}
    return loading.config_from_mapping(doc)


FULL = config()
SLIM = config([GPU, "cpu", "memory"])
WIDER = config([GPU, "cpu", "memory", "example.com/fpga"])


def bound_pod(i: int, node_name: str, devices: str | None = None) -> dict[str, Any]:
    pod = half_pod(i)
    pod["spec"]["nodeName"] = node_name
    pod["status"] = {"phase": "Running"}
    if devices:
        pod["metadata"]["annotations"]["fairshare.io/gpu-devices"] = devices
    return pod


def fpga_node(name: str) -> dict[str, Any]:
    obj = node(name, 2)
    obj["status"]["allocatable"]["example.com/fpga"] = "4"
    return obj


def test_tracker_follows_a_config_with_other_columns() -> None:
    holder = ConfigHolder(FULL)
    tr = Side(holder.get)
    tr.on_resync("Node", [fpga_node("n1")])
    tr.on_resync("Pod", [bound_pod(0, "n1", "0:500"), half_pod(1)])
    assert tr.state.index.names == FULL.resource_names()
    before = tr.state.usage_of("a")

    holder.swap(SLIM)
    state = tr.state
    assert state.index.names == (GPU, "cpu", "memory")
    assert len(state.capacity) == 3 and len(tr.pending["u1"].row) == 3
    # What the bound pod holds is the same in the columns that stayed.
    assert state.usage_of("a") == before[:3]
    assert state.node_devices(0)[:2] == [500.0, 1000.0]  # its device share came back too

    holder.swap(WIDER)
    assert tr.state.index.names[-1] == "example.com/fpga"
    assert tr.state.total_capacity()[-1] == 4  # read again from the Node object


def test_assumed_binds_survive_the_rebuild() -> None:
    holder = ConfigHolder(FULL)
    tr = Side(holder.get)
    tr.on_resync("Node", [node("n1", 1)])
    tr.on_resync("Pod", [half_pod(0)])
    row = tr.cache.pending["u0"].row
    tr.cache.assume(
        lambda state: state.bind(uid="u0", node="n1", row=row, devices=[(0, 500.0)]), "u0"
    )
    holder.swap(SLIM)
    assert "u0" in tr.state.pods and "u0" not in tr.pending  # not released by the rebuild
    assert tr.state.node_devices(0)[0] == 500.0


@pytest.fixture
async def swapped_client():
    holder = ConfigHolder(FULL)
    bound: list[Any] = []

    async def binder(plan: Any) -> None:
        await asyncio.sleep(0)
        bound.append(plan)

    deps = ext_app.build_deps(config=holder.get, ready=lambda: True, binder=binder)
    deps.sink.on_resync("Namespace", [{"metadata": {"name": "a"}}])
    deps.sink.on_resync("Node", [node("n1", 2)])
    deps.sink.on_resync("Pod", [half_pod(i) for i in range(3)])
    holder.swap(SLIM)
    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        c.deps = deps  # type: ignore[attr-defined]
        c.bound = bound  # type: ignore[attr-defined]
        yield c


async def test_verbs_answer_after_a_swap_with_fewer_columns(swapped_client: Any) -> None:
    c = swapped_client
    args = {"Pod": half_pod(0), "Nodes": None, "NodeNames": ["n1"]}
    r = await c.post("/filter", json=args)
    assert r.status == 200 and (await r.json())["NodeNames"] == ["n1"]
    r = await c.post("/prioritize", json=args)
    assert r.status == 200 and [p["Host"] for p in await r.json()] == ["n1"]
    r = await c.post(
        "/bind", json={"PodName": "p0", "PodNamespace": "a", "PodUID": "u0", "Node": "n1"}
    )
    assert r.status == 200 and (await r.json())["Error"] == ""
    assert [p.uid for p in c.bound] == ["u0"] and len(c.bound[0].row) == 3
    r = await c.post("/preempt", json={"Pod": half_pod(1), "NodeNameToMetaVictims": {}})
    assert r.status == 200
    ext_serve.publish_metrics(c.deps, seconds=1)  # the periodic figures read the arrays too


def test_the_webhooks_guard_accepts_a_change_of_columns() -> None:
    ref = config_guard.ConfigMapRef("fairshare-system", "fairshare-config")
    text = "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\nresources:\n"
    text += "  nvidia.com/gpu: {}\n  cpu: {}\n  memory: {}\n"
    assert config_guard.check_config_map({"data": {"config.yaml": text}}, ref=ref) is None


def test_the_simulator_runs_with_fewer_columns() -> None:
    sim = Simulation(SLIM)
    sim.add_node("n1", {GPU: Fraction(2), "cpu": Fraction(64), "memory": Fraction(2**38)}, {})
    sim.submit(sim.request_for(half_pod(0), uid="u0"))
    sim.run_until_stable()
    assert sim.outcomes["u0"].status == "running" and sim.index.width == 3


def test_cutting_columns_gives_the_state_a_fresh_sync_would() -> None:
    """The fast path (rows cut to the remaining columns) agrees with reading every object
    again under the new config."""
    mem = half_pod(7)
    mem["metadata"]["annotations"] = {"fairshare.io/gpu-memory": "20Gi"}
    objs = [
        bound_pod(0, "n1", "0:500"),
        bound_pod(1, "n1"),
        bound_pod(2, "n2"),
        {**mem, "spec": {**mem["spec"], "nodeName": "n2"}, "status": {"phase": "Running"}},
        half_pod(3),
        half_pod(4),
    ]
    holder = ConfigHolder(FULL)
    cut = Side(holder.get)
    cut.on_resync("Node", [node("n1", 2), node("n2", 4)])
    cut.on_resync("Pod", objs)
    holder.swap(SLIM)
    fresh = Side(lambda: SLIM)
    fresh.on_resync("Node", [node("n1", 2), node("n2", 4)])
    fresh.on_resync("Pod", objs)
    a, b = cut.state, fresh.state
    assert (list(a.free), list(a.dev_free), a.tenant_usage) == (
        list(b.free),
        list(b.dev_free),
        b.tenant_usage,
    )
    assert {u: (p.node, p.row, p.devices) for u, p in a.pods.items()} == {
        u: (p.node, p.row, p.devices) for u, p in b.pods.items()
    }
    assert {u: r.row for u, r in cut.pending.items()} == {
        u: r.row for u, r in fresh.pending.items()
    }
    assert cut.class_keys == fresh.class_keys
