"""The extender's fair-share gate gives the simulator's DRF outcome on the same state.

The extender loop below is what kube-scheduler does with our verbs: pending pods in
creation order, filter, prioritize (skipped with one node left), bind with the best
score (ties to the smaller name), until a pass places nothing.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare import cluster_shares, pipeline, quantities
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest
from fairshare.simulator.engine import Simulation
from fairshare.state import objects
from tests.unit.test_state_objects import node, pod, state_with


def _config(tenants: list[dict[str, Any]]) -> FairShareConfig:
    return config_from_mapping(
        {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig", "tenants": tenants}
    )


DRF_PAPER = (
    # Ghodsi et al. NSDI'11 §4: <1 CPU, 4 GB> vs <3 CPU, 1 GB> on <9 CPU, 18 GB>: A 3, B 2.
    _config([{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}]),
    [{"name": "n", "cpu": "9", "memory": "18Gi", "gpus": 0}],
    [("a", 10, {"cpu": "1", "memory": "4Gi"}), ("b", 10, {"cpu": "3", "memory": "1Gi"})],
)
WEIGHTED_GPU = (
    # prod has weight 2; research arrives first with more pods than the cluster holds.
    _config(
        [
            {"name": "prod", "namespaces": ["prod"], "weight": 2},
            {"name": "research", "namespaces": ["research"]},
        ]
    ),
    [{"name": f"g{k}", "cpu": "64", "memory": "512Gi", "gpus": 4} for k in range(2)],
    [
        ("research", 8, {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}),
        ("prod", 6, {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}),
    ],
)
THREE_TENANTS_FRACTIONAL = (
    _config(
        [
            {"name": "a", "namespaces": ["a"]},
            {"name": "b", "namespaces": ["b"]},
            {"name": "c", "namespaces": ["c"], "guaranteed": {"nvidia.com/gpu": "1"}},
        ]
    ),
    [{"name": "g", "cpu": "32", "memory": "256Gi", "gpus": 2}],
    [
        ("a", 6, {"cpu": "1", "memory": "8Gi", "fraction": "0.5"}),
        ("b", 4, {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}),
        ("c", 3, {"cpu": "1", "memory": "8Gi", "fraction": "0.25"}),
    ],
)


def _pods(workload) -> list[dict[str, Any]]:
    out = []
    for ns, count, base in workload:
        for k in range(count):
            reqs = {r: q for r, q in base.items() if r != "fraction"}
            ann = {"fairshare.io/gpu-fraction": base["fraction"]} if "fraction" in base else {}
            p = {
                "metadata": {"name": f"{ns}-{k}", "namespace": ns, "uid": f"{ns}-{k}"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": reqs}}]},
                "status": {"phase": "Pending"},
            }
            if ann:
                p["metadata"]["annotations"] = ann
            out.append(p)
    return out


def _node(spec) -> dict[str, Any]:
    n = node(spec["name"], gpus=spec["gpus"], cpu=spec["cpu"])
    n["status"]["allocatable"]["memory"] = spec["memory"]
    return n


def simulate(config, nodes, workload) -> Simulation:
    sim = Simulation(config)
    for spec in nodes:
        n = _node(spec)
        alloc = {k: quantities.parse_quantity(v) for k, v in n["status"]["allocatable"].items()}
        sim.add_node(spec["name"], alloc, n["metadata"]["labels"])
    for p in _pods(workload):
        sim.submit(sim.request_for(p, uid=p["metadata"]["uid"]))
    sim.run_until_stable()
    return sim


def extend(config, nodes, workload):
    st = state_with(*[_node(s) for s in nodes], config=config)
    names = [s["name"] for s in nodes]
    queue: list[tuple[dict[str, Any], PodRequest]] = [
        (p, verbs.request_for(p, state=st, config=config, namespace_labels={}))
        for p in _pods(workload)
    ]
    while True:
        placed = False
        for p, req in list(queue):
            pending = [r for _, r in queue]
            args = wire.decode_extender_args({"Pod": p, "Nodes": None, "NodeNames": names})
            passing = verbs.filter_result(args, Snapshot.of(st, pending=pending), config).encode()[
                "NodeNames"
            ]
            if not passing:
                continue
            best = passing[0]
            if len(passing) > 1:
                args = wire.decode_extender_args({"Pod": p, "NodeNames": passing})
                scores = wire.encode_scores(*verbs.prioritize_scores(args, Snapshot.of(st), config))
                best = min(scores, key=lambda h: (-h["Score"], h["Host"]))["Host"]
            bind = wire.ExtenderBindingArgs(req.name, req.namespace, req.uid, best)
            plan = verbs.bind_plan(bind, Snapshot.of(st, pending=pending))
            assert plan.error == ""
            verbs.commit_bind(st, plan)
            queue.remove((p, req))
            placed = True
        if not placed:
            return st, [r for _, r in queue]


def _running(pods) -> dict[str, int]:
    counts: dict[str, int] = {}
    for bp in pods:
        counts[bp.tenant] = counts.get(bp.tenant, 0) + 1
    return counts


CASES = [DRF_PAPER, WEIGHTED_GPU, THREE_TENANTS_FRACTIONAL]
IDS = ["drf-paper", "weighted-gpu", "three-tenants-fractional"]


@pytest.mark.parametrize(("config", "nodes", "workload"), CASES, ids=IDS)
def test_extender_reaches_the_simulator_s_drf_outcome(config, nodes, workload):
    sim = simulate(config, nodes, workload)
    st, left = extend(config, nodes, workload)
    assert _running(st.pods.values()) == _running(sim.state.pods.values())
    assert sorted(r.uid for r in left) == sorted(sim.pending)
    if len(nodes) == 1:
        assert {u: p.node for u, p in st.pods.items()} == {
            u: p.node for u, p in sim.state.pods.items()
        }


def test_drf_paper_counts():
    st, _ = extend(*DRF_PAPER)
    assert _running(st.pods.values()) == {"a": 3, "b": 2}


@pytest.mark.parametrize(("config", "nodes", "workload"), CASES, ids=IDS)
def test_gate_decisions_match_the_simulator_s(config, nodes, workload):
    sim = simulate(config, nodes, workload)
    pending = [sim.pods[u] for u in sim.pending]
    for req in pending:
        mine = pipeline.gate(sim.state, config=config, req=req, pending=pending)
        theirs = sim._gate(req)
        if theirs is None:
            assert mine is None
            continue
        assert mine is not None
        assert (mine.allowed, mine.waiting_for) == (theirs.allowed, theirs.waiting_for)
        assert mine.share_after == pytest.approx(theirs.share_after, rel=1e-12)
        assert mine.fair_share == pytest.approx(theirs.fair_share, rel=1e-12)


def test_guarantees_enter_the_fair_allocation():
    # c guarantees 1 GPU: its fair allocation starts there (kernel units: 1000 milli-GPU).
    config, _, _ = THREE_TENANTS_FRACTIONAL
    st = state_with(node("g", gpus=2), config=config)
    assert cluster_shares.kernel_amounts(st, {"nvidia.com/gpu": Fraction(1)}) == {
        st.gpu_col: 1000.0
    }
    objects.apply_pod(st, pod("x", ns="a", gpu=1, node_name="g"), config, "a")
    req = verbs.request_for(
        pod("c0", ns="c", gpu=1, phase="Pending"), state=st, config=config, namespace_labels={}
    )
    fair = cluster_shares.fair_shares_for(st, config, cluster_shares.demand_rows(st, [req]))
    assert fair["c"].allocation[st.gpu_col] == pytest.approx(1000.0)
