"""The quarantine of failed GPU nodes: the pure decision (``fairshare.quarantine``) and the
leader's controller over a fake API (``extender.quarantine``). No network."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from extender import quarantine as ctl
from extender.cache import Cache
from fairshare import metrics as metrics_mod
from fairshare import quarantine as q
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig, HealthPolicy

T0 = 1_800_000_000.0
XID = {"key": "nvidia.com/gpu-xid-error", "value": "79", "effect": "NoSchedule"}
FALLEN = {"type": "SysLogsGPUFallenOff", "status": "True", "reason": "XID79"}


def policy(**quarantine: Any) -> HealthPolicy:
    return HealthPolicy.model_validate({"quarantine": {"enabled": True, **quarantine}})


def gpu_node(
    name: str,
    *,
    gpus: int = 8,
    taints: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    rv: str = "1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus), "cpu": "64"},
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"},
            "conditions": list(conditions or []),
        },
    }


def ours(name: str, at: float, **kw: Any) -> dict[str, Any]:
    """A node fairshare cordoned at ``at``."""
    return gpu_node(
        name,
        unschedulable=kw.pop("unschedulable", True),
        labels={q.LABEL: q.LABEL_VALUE, **kw.pop("labels", {})},
        annotations={q.ANN_AT: q.format_time(at), q.ANN_REASON: "taint"},
        **kw,
    )


# -- the pure decision ---------------------------------------------------------------------


def test_fatal_node_is_cordoned_with_reason() -> None:
    plan = q.plan_quarantine(
        [gpu_node("a", taints=[XID]), gpu_node("b")], policy(max_fraction=1.0), T0
    )
    assert [n for n, _ in plan.cordon] == ["a"]
    assert "nvidia.com/gpu-xid-error=79:NoSchedule" in plan.cordon[0][1]
    assert not plan.breaker.open and not plan.uncordon


def test_condition_counts_as_fatal() -> None:
    plan = q.plan_quarantine([gpu_node("a", conditions=[FALLEN])], policy(max_fraction=1.0), T0)
    assert [n for n, _ in plan.cordon] == ["a"]


def test_defaults_quarantine_one_node_of_a_small_cluster_and_hold_the_second() -> None:
    # maxFraction 0.1 of 4 GPU nodes rounds down to 0, raised to one node: the first
    # failed node is quarantined, the second is held back by the breaker.
    nodes = [gpu_node("a", taints=[XID])] + [gpu_node(f"h{k}") for k in range(3)]
    plan = q.plan_quarantine(nodes, policy(), T0)
    assert [n for n, _ in plan.cordon] == ["a"] and not plan.breaker.open
    assert plan.breaker.limit == 1
    nodes.append(gpu_node("b", conditions=[FALLEN]))
    plan = q.plan_quarantine(nodes, policy(), T0)
    assert [n for n, _ in plan.cordon] == ["a"] and plan.breaker.held_back == ("b",)
    # maxFraction 0 quarantines nothing.
    plan = q.plan_quarantine(nodes, policy(max_fraction=0.0), T0)
    assert plan.cordon == () and plan.breaker.limit == 0


def test_breaker_holds_the_second_node_within_the_window() -> None:
    nodes = [ours("a", T0 - 60, taints=[XID]), gpu_node("b", conditions=[FALLEN])]
    nodes += [gpu_node(f"h{k}") for k in range(8)]
    plan = q.plan_quarantine(nodes, policy(max_nodes=1, max_fraction=1.0, window="1h"), T0)
    assert plan.cordon == ()
    assert plan.drain == ("a",)
    assert plan.breaker.open and plan.breaker.held_back == ("b",)
    assert plan.breaker.used == ("a",) and plan.breaker.limit == 1


def test_window_slides_past_an_old_quarantine() -> None:
    # Node a was quarantined 2 h ago and is still cordoned; the 1 h window is free again.
    nodes = [ours("a", T0 - 7200, taints=[XID]), gpu_node("b", conditions=[FALLEN])]
    plan = q.plan_quarantine(nodes, policy(max_nodes=1, max_fraction=1.0, window="1h"), T0)
    assert [n for n, _ in plan.cordon] == ["b"] and not plan.breaker.open


def test_uncordoned_node_still_counts_in_the_window() -> None:
    released = gpu_node("a", annotations={q.ANN_AT: q.format_time(T0 - 100)})
    plan = q.plan_quarantine(
        [released, gpu_node("b", taints=[XID])], policy(max_nodes=1, max_fraction=1.0), T0
    )
    assert plan.breaker.held_back == ("b",) and plan.breaker.used == ("a",)


def test_fraction_of_gpu_nodes_is_the_tighter_limit() -> None:
    nodes = [gpu_node(f"n{k}", taints=[XID]) for k in range(3)]
    nodes += [gpu_node(f"h{k}") for k in range(17)]  # 20 GPU nodes, 10 %: 2
    plan = q.plan_quarantine(nodes, policy(max_nodes=5, max_fraction=0.1), T0)
    assert [n for n, _ in plan.cordon] == ["n0", "n1"] and plan.breaker.held_back == ("n2",)


def test_cpu_nodes_are_neither_counted_nor_cordoned() -> None:
    cpu = gpu_node("cpu", gpus=0, taints=[XID])
    plan = q.plan_quarantine([cpu, gpu_node("g")], policy(max_fraction=1.0), T0)
    assert plan.cordon == () and plan.breaker.gpu_nodes == 1


def test_cleared_signal_uncordons_only_our_nodes() -> None:
    nodes = [
        ours("mine", T0 - 10),
        gpu_node("by-hand", unschedulable=True),
        gpu_node("by-hand-failed", unschedulable=True, taints=[XID]),
    ]
    plan = q.plan_quarantine(nodes, policy(), T0)
    assert plan.uncordon == ("mine",)
    assert plan.others == ("by-hand-failed",)
    assert plan.cordon == ()


def test_remediator_nodes_are_left_alone() -> None:
    nvs = {"k8saas.nvidia.com/cordon-by": "NVSentinel"}
    nodes = [
        gpu_node("nvs", unschedulable=True, labels=nvs, conditions=[FALLEN]),
        gpu_node("nvs-up", labels={"dgxc.nvidia.com/nvsentinel-state": "draining"},
                 taints=[XID]),
        ours("ours-then-nvs", T0 - 5, labels={q.LABEL: q.LABEL_VALUE, **nvs}),
    ]  # fmt: skip
    plan = q.plan_quarantine(nodes, policy(max_nodes=10, max_fraction=1.0), T0)
    assert plan.cordon == () and plan.drain == () and plan.uncordon == ()
    # The last one counts as failed: cordoned by a remediator (``read_node_health``).
    assert [n for n, _ in plan.remediated] == ["nvs", "nvs-up", "ours-then-nvs"]


def test_uncordoned_by_hand_is_not_cordoned_again_until_clear() -> None:
    hand = ours("a", T0 - 5, unschedulable=False, taints=[XID])
    plan = q.plan_quarantine([hand], policy(max_fraction=1.0), T0)
    assert plan.released == ("a",) and plan.cordon == ()
    overridden = gpu_node("a", taints=[XID], annotations={q.ANN_OVERRIDDEN: "x"})
    plan = q.plan_quarantine([overridden], policy(max_fraction=1.0), T0)
    assert plan.by_hand == ("a",) and plan.cordon == ()
    clear = gpu_node("a", annotations={q.ANN_OVERRIDDEN: "x"})
    assert q.plan_quarantine([clear], policy(max_fraction=1.0), T0).forget_override == ("a",)


def test_drain_off_holds_the_cordon_only() -> None:
    plan = q.plan_quarantine([ours("a", T0, taints=[XID])], policy(drain=False), T0)
    assert plan.drain == () and plan.held == ("a",)


def test_malformed_nodes_do_not_raise() -> None:
    odd: list[Any] = [
        {},
        {"metadata": None},
        {"metadata": {"name": 5}},
        {"metadata": {"name": "x", "annotations": {q.ANN_AT: "yesterday"}},
         "status": {"capacity": {"nvidia.com/gpu": "lots"}}},
        {"metadata": {"name": "y", "labels": {"nvidia.com/gpu.present": "true"}},
         "spec": {"taints": "no"}, "status": {"conditions": [None, 3]}},
    ]  # fmt: skip
    plan = q.plan_quarantine(odd, policy(), T0)
    assert plan.cordon == () and plan.breaker.gpu_nodes == 1


def test_breaker_limit_arithmetic() -> None:
    assert q.breaker_limit(1, 0.1, 100) == 1
    assert q.breaker_limit(20, 0.1, 100) == 10
    assert q.breaker_limit(5, 0.3, 10) == 3  # not 2 by a rounding error
    assert q.breaker_limit(5, 0.1, 9) == 1  # a small cluster still quarantines one node
    assert q.breaker_limit(5, 0.0, 9) == 0
    assert q.breaker_limit(0, 0.5, 9) == 0
    assert q.breaker_limit(3, 1.0, 0) == 0
    with pytest.raises(ValueError):
        q.breaker_limit(1, 1.5, 10)


def test_time_round_trip_and_bad_text() -> None:
    assert q.parse_time(q.format_time(T0)) == T0
    assert q.parse_time("2026-01-02T03:04:05+00:00") == q.parse_time("2026-01-02T03:04:05Z")
    assert q.parse_time("soon") is None and q.parse_time(None) is None


@given(
    stamps=st.dictionaries(
        st.text("abcdef", min_size=1, max_size=3), st.integers(-10_000, 10_000), max_size=12
    ),
    window=st.integers(0, 5000),
)
def test_window_holds_exactly_the_recent_stamps(stamps: dict[str, int], window: int) -> None:
    now = 0.0
    inside = q.recent({k: float(v) for k, v in stamps.items()}, now, float(window))
    assert list(inside) == sorted(inside)
    for name, at in stamps.items():
        assert (name in inside) == (window > 0 and now - at < window)


@given(
    failed=st.integers(0, 12),
    healthy=st.integers(0, 12),
    held=st.integers(0, 4),
    max_nodes=st.integers(1, 6),
    fraction=st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.5, 1.0]),
)
def test_never_more_than_the_limit_in_the_window(
    failed: int, healthy: int, held: int, max_nodes: int, fraction: float
) -> None:
    nodes = [ours(f"q{k}", T0 - 10 * k, taints=[XID]) for k in range(held)]
    nodes += [gpu_node(f"f{k:02d}", conditions=[FALLEN]) for k in range(failed)]
    nodes += [gpu_node(f"h{k:02d}") for k in range(healthy)]
    plan = q.plan_quarantine(nodes, policy(max_nodes=max_nodes, max_fraction=fraction), T0)
    limit = q.breaker_limit(max_nodes, fraction, len(nodes))
    assert plan.breaker.limit == limit
    assert len(plan.cordon) <= max(0, limit - held)
    assert len(plan.cordon) + len(plan.breaker.held_back) == failed
    assert plan.breaker.open == (failed > max(0, limit - held))
    assert all(n.startswith("f") for n, _ in plan.cordon)
    assert set(plan.drain) == {f"q{k}" for k in range(held)}


# -- the controller over a fake API ----------------------------------------------------------


def config(**quarantine: Any) -> FairShareConfig:
    return config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [],
            "health": {"quarantine": {"enabled": True, "max_fraction": 1.0, **quarantine}},
        }
    )


def pod(name: str, node: str, *, group: str | None = None, daemonset: bool = False) -> Any:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if group:
        meta["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    if daemonset:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "ds", "uid": "d"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {}}]},
        "status": {"phase": "Running"},
    }


class FakeApi:
    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.evicted: list[str] = []
        self.refuse: set[str] = set()
        self.events: list[tuple[str, str]] = []
        self.pods: list[dict[str, Any]] = []

    async def patch_node(self, name: str, body: dict[str, Any]) -> ctl.Outcome:
        self.patches.append((name, body))
        node = self.cache.nodes[name]
        if body["metadata"].get("resourceVersion") != node["metadata"]["resourceVersion"]:
            return ctl.Outcome("conflict", "changed")
        new = _merge(node, body)
        new["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
        return ctl.Outcome("done", node=new)

    async def node_pods(self, name: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"]["nodeName"] == name]

    async def evict(self, namespace: str, name: str) -> ctl.Outcome:
        if name in self.refuse:
            return ctl.Outcome("blocked", "Cannot evict pod as it would violate the budget")
        self.evicted.append(name)
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
        return ctl.Outcome("done")

    async def event(self, body: dict[str, Any]) -> None:
        self.events.append((body["involvedObject"]["name"], body["reason"]))


def _merge(base: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return patch
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(base.get(k), v)
    return out


def controller(cfg: FairShareConfig, *nodes: dict[str, Any], pods: list[Any] = ()) -> Any:
    cache = Cache(lambda: cfg)
    cache.on_resync("Node", list(nodes))
    cache.on_resync("Pod", list(pods))
    api = FakeApi(cache)
    api.pods = list(pods)
    registry = CollectorRegistry()
    metrics = metrics_mod.Metrics(registry)
    c = ctl.Quarantiner(cache, lambda: cfg, api, metrics, wall_clock=lambda: T0)
    return c, api, cache, registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


async def test_cordons_drains_gangs_whole_and_leaves_daemonsets() -> None:
    pods = [
        pod("lone", "a"),
        pod("ds", "a", daemonset=True),
        pod("m0", "a", group="job"),
        pod("m1", "b", group="job"),
        pod("other", "b"),
    ]
    c, api, _, registry = controller(
        config(), gpu_node("a", taints=[XID]), gpu_node("b"), pods=pods
    )
    plan = await c.tick()
    assert plan is not None and [n for n, _ in plan.cordon] == ["a"]
    name, body = api.patches[0]
    assert name == "a" and body["spec"] == {"unschedulable": True}
    assert body["metadata"]["labels"] == {q.LABEL: q.LABEL_VALUE}
    assert body["metadata"]["resourceVersion"] == "1"
    assert sorted(api.evicted) == ["lone", "m0", "m1"]  # the group whole, not the DaemonSet's
    assert ("a", ctl.REASON_QUARANTINED) in api.events
    assert ("m1", ctl.REASON_EVICTED) in api.events
    assert sample(registry, "fairshare_quarantine_evictions_total", outcome="evicted") == 3
    # The cache has not seen the patch yet: the next round must not count or cordon twice.
    await c.tick()
    assert len([p for p in api.patches if p[0] == "a"]) == 1
    assert ("a", ctl.REASON_DRAINED) in api.events


async def test_pdb_refusal_on_the_first_member_keeps_the_group_whole() -> None:
    pods = [pod("m0", "a", group="job"), pod("m1", "b", group="job")]
    c, api, _, registry = controller(config(), gpu_node("a", taints=[XID]), gpu_node("b"),
                                     pods=pods)  # fmt: skip
    api.refuse = {"m0"}
    await c.tick()
    assert api.evicted == []
    assert ("m0", ctl.REASON_BLOCKED) in api.events
    assert sample(registry, "fairshare_quarantine_evictions_total", outcome="blocked") == 1
    # After the back-off it is asked again; refused again, it is not told twice.
    c.clock = lambda: 1e9
    await c.tick()
    assert api.evicted == [] and api.events.count(("m0", ctl.REASON_BLOCKED)) == 1
    assert sample(registry, "fairshare_quarantine_evictions_total", outcome="blocked") == 2
    # Within the back-off it is not asked again; after it, it is (and now allowed).
    api.refuse = set()
    await c.tick()
    assert api.evicted == []
    c.clock = lambda: 1e12
    await c.tick()
    assert sorted(api.evicted) == ["m0", "m1"]


async def test_breaker_opens_exports_and_tells_once() -> None:
    c, api, _, registry = controller(
        config(max_nodes=1), ours("a", T0 - 30, taints=[XID]), gpu_node("b", taints=[XID])
    )
    await c.tick()
    await c.tick()
    assert [p for p in api.patches if p[0] == "b"] == []
    assert sample(registry, "fairshare_quarantine_breaker_open") == 1
    assert sample(registry, "fairshare_quarantine_nodes", state="held_back") == 1
    assert api.events.count(("b", ctl.REASON_BREAKER)) == 1
    status = c.status()
    assert status["state"] == "active" and status["breaker"]["heldBack"] == ["b"]


async def test_uncordon_after_clear_and_conflict_is_retried() -> None:
    c, api, cache, _ = controller(config(), ours("a", T0 - 30), gpu_node("h", unschedulable=True))
    cache.nodes["a"]["metadata"]["resourceVersion"] = "7"
    await c.tick()
    name, body = api.patches[0]
    assert name == "a" and body["spec"] == {"unschedulable": None}
    assert body["metadata"]["labels"] == {q.LABEL: None}
    assert q.ANN_AT not in body["metadata"]["annotations"]  # the window's memory stays
    assert all(p[0] != "h" for p in api.patches)  # cordoned by hand: never touched
    assert ("a", ctl.REASON_LIFTED) in api.events


async def test_standby_and_disabled_do_nothing() -> None:
    c, api, _, registry = controller(config(), gpu_node("a", taints=[XID]))
    c.is_leader = lambda: False
    assert await c.tick() is None and api.patches == []
    assert c.status() == {"state": "standby"}
    off = config_from_mapping({"apiVersion": "fairshare.io/v1alpha1",
                               "kind": "FairShareConfig", "tenants": []})  # fmt: skip
    c.is_leader = lambda: True
    c.config = lambda: off
    assert await c.tick() is None and api.patches == []
    assert c.status() == {"state": "disabled"}
    assert sample(registry, "fairshare_quarantine_breaker_open") == 0


async def test_api_errors_do_not_escape_a_round() -> None:
    c, api, _, registry = controller(config(), gpu_node("a", taints=[XID]))

    async def broken(name: str, body: dict[str, Any]) -> ctl.Outcome:
        raise OSError("connection reset")

    api.patch_node = broken  # type: ignore[method-assign]
    await c.tick()
    assert sample(registry, "fairshare_quarantine_actions_total", action="cordon",
                  outcome="failed") == 1  # fmt: skip


async def test_quarantine_json_route_is_public_and_shows_the_breaker() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    import serving
    from extender import app as ext_app

    async def binder(plan: Any) -> None:
        return None

    cfg = config(max_nodes=1)
    d = ext_app.build_deps(config=lambda: cfg, ready=lambda: True, binder=binder)
    async with TestClient(TestServer(ext_app.make_app(d))) as client:
        assert await (await client.get("/quarantine.json")).json() == {"state": "disabled"}
        c, _, _, _ = controller(cfg, ours("a", T0 - 30, taints=[XID]), gpu_node("b", taints=[XID]))
        d.quarantine = c.status
        await c.tick()
        data = await (await client.get("/quarantine.json")).json()
    assert "/quarantine.json" in serving.PUBLIC_PATHS
    assert data["state"] == "active" and data["draining"] == ["a"]
    assert data["breaker"] == {
        "open": True, "limit": 1, "used": ["a"], "room": 0, "heldBack": ["b"],
        "gpuNodes": 2, "windowSeconds": 3600.0,
    }  # fmt: skip


async def test_uncordoned_by_hand_is_released_not_fought() -> None:
    c, api, _, _ = controller(config(), ours("a", T0 - 30, unschedulable=False, taints=[XID]))
    await c.tick()
    [(name, body)] = api.patches
    assert name == "a" and "spec" not in body  # never cordoned again
    assert body["metadata"]["labels"] == {q.LABEL: None}
    assert q.ANN_OVERRIDDEN in body["metadata"]["annotations"]
    assert ("a", ctl.REASON_OVERRIDDEN) in api.events
