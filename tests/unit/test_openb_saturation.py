"""The openb saturation fairness protocol on small synthetic traces written per test."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from fairshare.simulator import openb
from fairshare.simulator.engine import Simulation

NODE_HEADER = ["sn", "cpu_milli", "memory_mib", "gpu", "model"]
POD_HEADER = [
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
]


def _write(path: Path, header: list[str], rows: list[list[object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def _pod(name: str, cpu: int, mem: int, gpus: int, milli: int, spec: str = "") -> list[object]:
    return [name, cpu, mem, gpus, milli, spec, "LS", "Running", 0, 1, 0]


@pytest.fixture
def uniform(tmp_path: Path) -> Path:
    """4 nodes × 8 GPUs; 40 one-GPU pods with small CPU and memory (GPU dominates)."""
    _write(
        tmp_path / openb.NODE_FILE,
        NODE_HEADER,
        [[f"node-{i}", 96_000, 393_216, 8, "V100M32"] for i in range(4)],
    )
    pods = [_pod(f"pod-{i:03d}", 4000, 8192, 1, 1000) for i in range(40)]
    _write(tmp_path / "openb_pod_list_uniform.csv", POD_HEADER, pods)
    return tmp_path


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """Two GPU models and pods of many shapes: shared, whole, multi-GPU, typed, CPU-only."""
    nodes = [[f"node-a{i}", 64_000, 262_144, 4, "T4"] for i in range(3)]
    nodes += [[f"node-b{i}", 96_000, 393_216, 8, "V100M32"] for i in range(3)]
    _write(tmp_path / openb.NODE_FILE, NODE_HEADER, nodes)
    shapes = [
        (4000, 8192, 1, 250, ""),
        (8000, 16384, 1, 500, ""),
        (12000, 24576, 1, 1000, ""),
        (16000, 32768, 2, 1000, ""),
        (32000, 65536, 4, 1000, "V100M32"),
        (24000, 49152, 8, 1000, ""),
        (6000, 12288, 1, 460, "T4"),
        (8000, 16384, 0, 0, ""),
    ]
    pods = [_pod(f"pod-{i:03d}", *shapes[i % len(shapes)]) for i in range(64)]
    _write(tmp_path / "openb_pod_list_mixed.csv", POD_HEADER, pods)
    return tmp_path


def _placements(sim: Simulation) -> dict[str, str | None]:
    return {uid: out.node for uid, out in sim.outcomes.items() if out.status == "running"}


def test_trace_config_takes_weights() -> None:
    config = openb.trace_config(3, [1, 2, 0.5])
    assert [(t.name, t.weight) for t in config.tenants] == [
        ("tenant-0", 1.0),
        ("tenant-1", 2.0),
        ("tenant-2", 0.5),
    ]
    assert [t.weight for t in openb.trace_config(2).tenants] == [1.0, 1.0]
    with pytest.raises(ValueError, match="2 given for 3 tenants"):
        openb.trace_config(3, [1, 2])


def test_saturation_order_stops_at_the_load(uniform: Path) -> None:
    originals = openb.load_pods(uniform, "uniform")
    order = openb.saturation_order(originals, seed=7, gpus=32, load=2.0)
    assert sum(p.gpu_total_milli for p in order) == 64_000
    half = openb.saturation_order(originals, seed=7, gpus=32, load=0.5)
    assert sum(p.gpu_total_milli for p in half) == 16_000
    assert [p.name for p in half] == [p.name for p in order[: len(half)]]


def test_ours_honours_the_weights(uniform: Path) -> None:
    # Demand 4 × capacity: each tenant asks for about a whole cluster, far above its share.
    sim, res = openb.run_saturation(uniform, pods="uniform", seed=3, policy="ours", load=4.0)
    by = {t.tenant: t for t in res.tenants}
    assert sorted(by) == ["tenant-0", "tenant-1", "tenant-2", "tenant-3"]
    assert all(t.demand > t.fair for t in res.tenants)
    assert [by[f"tenant-{i}"].fair for i in range(4)] == pytest.approx([1 / 8, 1 / 8, 2 / 8, 4 / 8])
    assert by["tenant-3"].share == pytest.approx(4 * by["tenant-0"].share, rel=0.15)
    assert by["tenant-2"].share == pytest.approx(2 * by["tenant-1"].share, rel=0.15)
    assert res.max_abs_deviation <= 100 / 32 + 1e-9  # within one pod (1 GPU of 32)
    assert res.jain > 0.98
    assert res.allocation == pytest.approx(100.0)
    assert res.pending == res.pods - res.placed
    # The gate held pods back: the placed set is not simply the first 32 to arrive.
    order = openb.saturation_order(openb.load_pods(uniform, "uniform"), seed=3, gpus=32, load=4.0)
    assert set(_placements(sim)) != {p.name for p in order[:32]}


@pytest.mark.parametrize("policy", ["bestfit", "fgd"])
def test_controls_do_not_gate(uniform: Path, policy: str) -> None:
    sim, res = openb.run_saturation(uniform, pods="uniform", seed=3, policy=policy, load=4.0)  # type: ignore[arg-type]
    # Without the gate every pod fits until the cluster is full: the first 32 arrive, win.
    order = openb.saturation_order(openb.load_pods(uniform, "uniform"), seed=3, gpus=32, load=4.0)
    assert set(_placements(sim)) == {p.name for p in order[:32]}
    assert not any("fair share" in r for r in sim.last_reason.values())
    assert res.max_abs_deviation > 100 / 32  # arrival order, not weights, decides


@pytest.mark.parametrize("policy", ["ours", "bestfit", "fgd"])
def test_shape_skip_gives_the_same_result(mixed: Path, policy: str) -> None:
    kw = {"pods": "mixed", "seed": 11, "policy": policy, "load": 3.0}
    fast, rf = openb.run_saturation(mixed, skip_shapes=True, **kw)  # type: ignore[arg-type]
    slow, rs = openb.run_saturation(mixed, skip_shapes=False, **kw)  # type: ignore[arg-type]
    assert _placements(fast) == _placements(slow)
    assert list(fast.pending) == list(slow.pending)
    assert {u: fast.last_reason.get(u) for u in fast.pending} == {
        u: slow.last_reason.get(u) for u in slow.pending
    }
    assert rf.tenants == rs.tenants
    assert (rf.placed, rf.passes, rf.allocation) == (rs.placed, rs.passes, rs.allocation)
    assert rf.skipped > 0  # the skip was exercised
    assert rf.attempts + rf.skipped == rs.attempts


def test_the_existing_replay_is_unchanged_by_weights(uniform: Path) -> None:
    _, a = openb.run_trace(uniform, pods="uniform", seed=5, policy="fgd")
    _, b = openb.run_trace(uniform, pods="uniform", seed=5, policy="fgd", tenants=4)
    assert a.curve == b.curve


def test_unknown_pod_list(uniform: Path) -> None:
    with pytest.raises(openb.TraceError, match=r"no pod list 'nope'.*found: uniform"):
        openb.run_saturation(uniform, pods="nope")
    with pytest.raises(ValueError, match="letters, digits"):
        openb.run_saturation(uniform, pods="../uniform")


@pytest.mark.parametrize("load", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_load(uniform: Path, load: float) -> None:
    with pytest.raises(ValueError, match="load must be"):
        openb.run_saturation(uniform, pods="uniform", load=load)


@pytest.mark.parametrize(
    ("weights", "match"),
    [((), "at least one"), ((1.0, -2.0), "> 0, got -2.0"), ((1.0, 0.0), "> 0, got 0.0")],
)
def test_bad_weights(uniform: Path, weights: tuple[float, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        openb.run_saturation(uniform, pods="uniform", weights=weights)


def test_weighted_demand_splits_pods_in_proportion_to_the_weights() -> None:
    names = [f"openb-pod-{i:05d}" for i in range(8000)]
    ws = (1.0, 1.0, 2.0, 4.0)
    counts = {f"tenant-{i}": 0 for i in range(4)}
    for n in names:
        counts[openb.tenant_by_weight(n, ws)] += 1
    for i, w in enumerate(ws):
        assert counts[f"tenant-{i}"] / len(names) == pytest.approx(w / 8, abs=0.015)
    # The name decides, copies follow their original, and the equal split differs.
    assert openb.tenant_by_weight("openb-pod-00007-tuned-3", ws) == openb.tenant_by_weight(
        "openb-pod-00007", ws
    )
    assert any(openb.tenant_by_weight(n, ws) != openb.tenant_of(n, 4) for n in names[:50])
    assert {openb.tenant_by_weight(n, (1.0,)) for n in names[:50]} == {"tenant-0"}


def test_weighted_demand_at_saturation(uniform: Path) -> None:
    _, eq = openb.run_saturation(uniform, pods="uniform", seed=3, load=4.0)
    _, wd = openb.run_saturation(uniform, pods="uniform", seed=3, load=4.0, demand="weighted")
    demand = {t.tenant: t.demand for t in wd.tenants}
    # Weighted: the weight-4 tenant asks for much more than a weight-1 one.
    assert demand["tenant-3"] > 2 * demand["tenant-0"]
    assert {t.tenant: t.demand for t in eq.tenants} != demand
    assert wd.max_abs_deviation <= 100 / 32 + 1e-9
    with pytest.raises(ValueError, match="demand must be one of equal, weighted, got 'even'"):
        openb.run_saturation(uniform, pods="uniform", demand="even")


def test_largest_queue_puts_each_tenants_larger_pods_in_its_own_places(mixed: Path) -> None:
    """``queue="largest"``: the places in creation order stay with their tenants; within
    a tenant, the larger GPU demand goes first, equal demands by age."""
    config = openb.trace_config(2)
    sim, originals = openb._cluster(mixed, "mixed", config, policy="ours", seed=5)
    for p in originals[:24]:
        sim.submit(openb._request(sim, p, openb.tenant_of(p.name, 2)))
    fifo = openb.queue_order(sim, "fifo")
    largest = openb.queue_order(sim, "largest")
    assert fifo == list(sim.pending)
    assert sorted(largest) == sorted(fifo)
    tenant = [sim.pods[u].tenant for u in fifo]
    assert [sim.pods[u].tenant for u in largest] == tenant
    assert largest != fifo  # the mixed list has several sizes per tenant
    for t in set(tenant):
        mine = [u for u in largest if sim.pods[u].tenant == t]
        sizes = [openb._gpu_demand(sim.pods[u]) for u in mine]
        assert sizes == sorted(sizes, reverse=True)
        by_age = [u for u in fifo if sim.pods[u].tenant == t]
        for size in set(sizes):  # equal sizes keep their creation order
            same = [u for u in mine if openb._gpu_demand(sim.pods[u]) == size]
            assert same == [u for u in by_age if u in same]


def test_largest_queue_runs_the_protocol_and_bad_queues_are_refused(mixed: Path) -> None:
    kw = {"pods": "mixed", "seed": 3, "policy": "ours", "load": 2.0}
    _, fifo = openb.run_saturation(mixed, **kw)  # type: ignore[arg-type]
    _, big = openb.run_saturation(mixed, queue="largest", **kw)  # type: ignore[arg-type]
    assert big.pods == fifo.pods and big.placed + big.pending == big.pods
    assert big.placed > 0
    with pytest.raises(ValueError, match="queue must be one of fifo, largest, got 'lifo'"):
        openb.run_saturation(mixed, queue="lifo", **kw)  # type: ignore[arg-type]
