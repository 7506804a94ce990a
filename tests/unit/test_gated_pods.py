"""``fairshare_tenant_gated_pods`` counts the pods the fair-share gate held back at their
last filter, not every pending pod (pods that fit nowhere, or were never filtered, are
not gated)."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from extender import app as ext_app
from extender import serve as ext_serve
from tests.extender_side import Side
from tests.unit.test_extender_filter import CONFIG
from tests.unit.test_state_objects import node, pod


def gauge(deps: Any, tenant: str) -> float | None:
    return deps.registry.get_sample_value("fairshare_tenant_gated_pods", {"tenant": tenant})


async def test_gauge_counts_only_pods_the_gate_refused() -> None:
    deps = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True)
    tr = Side.of(deps)
    tr.on_resync("Node", [node("a", gpus=4)])
    held = [pod(f"r{k}", ns="research", gpu=1, node_name="a") for k in range(3)]
    waiting = [
        pod("new", ns="research", gpu=1, phase="Pending"),
        pod("huge", ns="research", gpu=8, phase="Pending"),  # fits nowhere: not gated
        pod("p0", ns="prod", gpu=1, phase="Pending"),
    ]
    tr.on_resync("Pod", held + waiting)
    ext_serve.publish_metrics(deps, seconds=1)
    assert gauge(deps, "research") == 0 and gauge(deps, "prod") == 0  # none filtered yet

    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        for p in waiting:
            r = await c.post("/filter", json={"Pod": p, "NodeNames": ["a"]})
            assert r.status == 200
    ext_serve.publish_metrics(deps, seconds=1)
    # research/new would take research above its fair share while prod waits: gated.
    assert gauge(deps, "research") == 1 and gauge(deps, "prod") == 0

    tr.on_event("Pod", "DELETED", waiting[2])  # prod stops waiting ...
    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        body = await (await c.post("/filter", json={"Pod": waiting[0], "NodeNames": ["a"]})).json()
    assert body["NodeNames"] == ["a"]  # ... so the next filter lets research/new through
    ext_serve.publish_metrics(deps, seconds=1)
    assert gauge(deps, "research") == 0


def test_a_bound_or_deleted_pod_leaves_the_count() -> None:
    deps = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True)
    tr = Side.of(deps)
    tr.on_resync("Node", [node("a", gpus=4)])
    tr.on_resync("Pod", [pod("x", ns="research", gpu=1, phase="Pending")])
    tr.gated.add("uid-x")
    assert tr.gated_by_tenant() == {"research": 1}
    tr.on_event("Pod", "MODIFIED", pod("x", ns="research", gpu=1, node_name="a"))
    assert tr.gated_by_tenant() == {} and "uid-x" not in tr.gated
