"""The extender's aiohttp app over HTTP (in-process server): the adapter layer."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender import app as ext_app
from extender import serve as ext_serve
from fairshare.config import loading

CONFIG = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}],
    }
)


def node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": "81559"}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus)}},
    }


def half_pod(i: int) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"p{i}",
            "namespace": "a",
            "uid": f"u{i}",
            "annotations": {"fairshare.io/gpu-fraction": "0.5"},
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Pending"},
    }


@pytest.fixture
async def client():
    bound: list[Any] = []

    async def binder(plan):
        await asyncio.sleep(0.001)  # let other binds interleave
        bound.append(plan)

    deps = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True, binder=binder)
    deps.sink.on_resync("Namespace", [{"metadata": {"name": "a"}}])
    deps.sink.on_resync("Node", [node("n1", 2), node("n2", 0)])
    deps.sink.on_resync("Pod", [half_pod(i) for i in range(10)])
    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        c.deps = deps  # type: ignore[attr-defined]
        c.bound = bound  # type: ignore[attr-defined]
        yield c


async def test_filter_prioritize_in_scheduler_json(client):
    args = {"Pod": half_pod(0), "Nodes": None, "NodeNames": ["n1", "n2"]}
    body = await (await client.post("/filter", json=args)).json()
    assert body["NodeNames"] == ["n1"]
    assert "n2" in body["FailedAndUnresolvableNodes"]  # no GPU devices at all
    prio = await (await client.post("/scheduler/prioritize", json=args)).json()
    assert [p["Host"] for p in prio] == ["n1", "n2"]
    assert all(isinstance(p["Score"], int) and 0 <= p["Score"] <= 10 for p in prio)


async def test_concurrent_binds_never_oversubscribe_a_device(client):
    # ten 0.5-GPU pods race for one node with 2 GPUs: exactly 4 fit, 2 per device
    results = await asyncio.gather(
        *(
            client.post(
                "/bind",
                json={"PodName": f"p{i}", "PodNamespace": "a", "PodUID": f"u{i}", "Node": "n1"},
            )
            for i in range(10)
        )
    )
    errors = [(await r.json())["Error"] for r in results]
    assert sum(1 for e in errors if e == "") == 4
    assert all("cannot take" in e or "no " in e for e in errors if e)
    devices = client.deps.cache.state.node_devices(0)[:2]
    assert devices == [0.0, 0.0]
    per_device: dict[int, float] = {}
    for plan in client.bound:
        for dev, milli in plan.devices:
            per_device[dev] = per_device.get(dev, 0.0) + milli
        assert plan.annotations["fairshare.io/gpu-devices"]
    assert per_device == {0: 1000.0, 1: 1000.0}


async def test_bind_finds_the_pod_by_name_when_its_uid_is_not_known(client):
    r = await client.post(
        "/bind", json={"PodName": "p2", "PodNamespace": "a", "PodUID": "", "Node": "n1"}
    )
    assert (await r.json())["Error"] == ""
    assert client.deps.cache.state.pods["u2"].node == "n1"
    assert "u2" not in client.deps.snapshot().pending


async def test_failed_binding_is_reported_and_nothing_is_held(client):
    async def refuse(plan):
        raise RuntimeError("apiserver said no")

    client.deps.binder = refuse
    r = await client.post(
        "/bind", json={"PodName": "p0", "PodNamespace": "a", "PodUID": "u0", "Node": "n1"}
    )
    assert "apiserver said no" in (await r.json())["Error"]
    assert client.deps.cache.state.node_devices(0)[:2] == [1000.0, 1000.0]


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/preempt", "/bind"])
async def test_malformed_bodies_get_400(client, path):
    r = await client.post(path, data=b"{not json")
    assert r.status == 400


async def test_health_and_metrics(client):
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    await client.post("/filter", json={"Pod": half_pod(1), "NodeNames": ["n1"]})
    ext_serve.publish_metrics(client.deps, seconds=60)
    text = await (await client.get("/metrics")).text()
    assert 'fairshare_extender_requests_total{outcome="ok",verb="filter"}' in text
    assert "fairshare_tenant_dominant_share" in text
    assert "fairshare_cluster_gpu_allocation_ratio" in text


async def test_verb_answers_keep_the_connection_open(client):
    # kube-scheduler's extender client reuses its (at most two) idle connections: an
    # answer that closed its connection would cost every call a new one (and a TLS
    # handshake in a deployment).
    opened = 0

    async def count(session: Any, ctx: Any, params: Any) -> None:
        nonlocal opened
        opened += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(count)
    args = {"Pod": half_pod(0), "NodeNames": ["n1", "n2"]}
    bind = {"PodName": "p0", "PodNamespace": "a", "PodUID": "u0", "Node": "n1"}
    calls = [("/filter", args), ("/prioritize", args), ("/bind", bind), ("/filter", args)]
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1), trace_configs=[trace]
    ) as session:
        for path, body in calls:
            async with session.post(client.make_url(path), json=body) as r:
                assert r.status == 200
                assert "close" not in r.headers.get("Connection", "").lower()
                await r.read()
    assert opened == 1


async def test_late_filter_does_not_revive_a_deleted_pod(client):
    pod = half_pod(3)
    client.deps.sink.on_event("Pod", "DELETED", pod)
    await client.post("/filter", json={"Pod": pod, "NodeNames": ["n1"]})
    assert "u3" not in client.deps.snapshot().pending


async def test_bind_rechecks_the_gate_with_binds_in_flight():
    # DRF paper cluster: 9 CPU, 18Gi; a's pods <1, 4Gi>, b's <3, 1Gi>. a already holds
    # 3 pods (share 12/18 = 2/3, its fair share with b's 3 pending pods in the demand);
    # a 4th a-pod would take a to 16/18 while b (share 0) has a pod that fits: the bind
    # is refused by the gate even though the filter let it through earlier.
    config = loading.config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "resources": {
                "cpu": {"weight": 1},
                "memory": {"weight": 1},
                "nvidia.com/gpu": {"weight": 1},
            },
            "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
        }
    )

    def pod(ns: str, i: int, cpu: str, mem: str, node: str | None = None) -> dict[str, Any]:
        p = {
            "kind": "Pod",
            "metadata": {"name": f"{ns}{i}", "namespace": ns, "uid": f"{ns}{i}"},
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}
                ]
            },
            "status": {"phase": "Running" if node else "Pending"},
        }
        if node:
            p["spec"]["nodeName"] = node
        return p

    deps = ext_app.build_deps(config=lambda: config, ready=lambda: True)
    deps.sink.on_resync("Namespace", [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}])
    deps.sink.on_resync(
        "Node",
        [
            {
                "kind": "Node",
                "metadata": {"name": "n"},
                "status": {"allocatable": {"cpu": "9", "memory": "18Gi"}},
            }
        ],
    )
    deps.sink.on_resync(
        "Pod",
        [pod("a", i, "1", "4Gi", node="n") for i in range(3)]
        + [pod("a", 3, "1", "4Gi")]
        + [pod("b", i, "3", "1Gi") for i in range(3)],
    )
    async with TestClient(TestServer(ext_app.make_app(deps))) as c:
        r = await c.post(
            "/bind", json={"PodName": "a3", "PodNamespace": "a", "PodUID": "a3", "Node": "n"}
        )
        assert "above its fair share" in (await r.json())["Error"]
        assert deps.feedback.gated_by_tenant(deps.snapshot().pending) == {
            "a": 1
        }  # held back at bind: gated
        r = await c.post(
            "/bind", json={"PodName": "b0", "PodNamespace": "b", "PodUID": "b0", "Node": "n"}
        )
        assert (await r.json())["Error"] == ""
        assert "b0" in deps.cache.state.pods  # assumed before its Binding returned


@pytest.mark.parametrize(
    "body",
    [
        # found by the fuzzer: a lone surrogate in a resource name made the 400 text
        # itself fail to encode (aiohttp then answered a bare 500)
        b'{"Pod": {"metadata": {"name": "p", "namespace": "a", "uid": "x"}, "spec": '
        b'{"containers": [{"name": "c", "resources": {"limits": {"\\ud800gpu": null}}}]}}, '
        b'"NodeNames": ["n1"]}',
        # found by the fuzzer: a phase that is an object crashed the pending queue
        b'{"Pod": {"metadata": {"name": "p", "namespace": "a", "uid": "y"}, "spec": '
        b'{"containers": []}, "status": {"phase": {}}}, "NodeNames": ["n1"]}',
    ],
    ids=["lone-surrogate", "phase-object"],
)
async def test_fuzzer_findings_are_not_500s(client, body):
    r = await client.post("/filter", data=body)
    assert r.status in (200, 400)


@pytest.mark.parametrize("pick", [False, True])
async def test_pick_in_filter_answers_prioritize_s_best_node(client, pick):
    client.deps.sink.on_resync("Node", [node("n1", 2), node("n2", 0), node("n3", 4)])
    client.deps.pick_in_filter = pick
    # A CPU-only pod passes all three nodes.
    pod = half_pod(0)
    del pod["metadata"]["annotations"]
    args = {"Pod": pod, "Nodes": None, "NodeNames": ["n1", "n2", "n3"]}
    prio = await (await client.post("/prioritize", json=args)).json()
    top = max(p["Score"] for p in prio)
    best = [p["Host"] for p in prio if p["Score"] == top]
    body = await (await client.post("/filter", json=args)).json()
    if pick:
        assert body["NodeNames"] in ([b] for b in best)
        assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}
    else:
        assert body["NodeNames"] == ["n1", "n2", "n3"]
