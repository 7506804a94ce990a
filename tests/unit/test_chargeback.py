"""Chargeback arithmetic (fairshare.chargeback): shares per GPU from the ledger, the idle
rule, prices (which wins), integration over a period and its reconciliation, token
counters; the ``pricing`` config (the flat map of earlier versions still valid); the
command's input errors."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairshare import chargeback as cb
from fairshare.config.loading import config_from_mapping, parse_config
from fairshare.state import objects
from fairshare_cli.main import main
from tests.unit.test_state_objects import CONFIG, node, pod, state_with

META = cb.PodMeta("prod", "main")


def _mig_node(name: str, slices: int) -> dict[str, Any]:
    n = node(name, gpus=0)
    alloc = n["status"]["allocatable"]
    del alloc["nvidia.com/gpu"]
    alloc["nvidia.com/mig-1g.10gb"] = str(slices)
    return n


def _mig_pod(name: str, slices: int, node_name: str) -> dict[str, Any]:
    p = pod(name, node_name=node_name)
    res = {"nvidia.com/mig-1g.10gb": str(slices)}
    p["spec"]["containers"][0]["resources"] = {"limits": res, "requests": res}
    return p


def _ledger() -> Any:
    st_ = state_with(node("a", gpus=2))
    objects.apply_node(st_, _mig_node("m", 7), CONFIG)
    ann = "fairshare.io/gpu-devices"
    frac = "fairshare.io/gpu-fraction"
    objects.apply_pod(
        st_, pod("whole", gpu=1, node_name="a", annotations={ann: "0:1000"}), CONFIG, "prod"
    )
    objects.apply_pod(
        st_, pod("half", node_name="a", annotations={frac: "0.5", ann: "1:500"}), CONFIG, "prod"
    )
    objects.apply_pod(
        st_,
        pod("quarter", ns="lab", node_name="a", annotations={frac: "0.25", ann: "1:250"}),
        CONFIG,
        "research",
    )
    objects.apply_pod(st_, _mig_pod("mig", 2, "m"), CONFIG, "prod")
    return st_


def test_allocations_read_whole_gpus_fractions_and_mig_slices_from_the_ledger() -> None:
    holdings, slots = cb.allocations(_ledger(), lambda uid: META, CONFIG.mig_fractions())
    shares = {h.pod: (h.node, h.device, h.share) for h in holdings}
    assert shares == {
        "whole": ("a", "0", 1.0),
        "half": ("a", "1", 0.5),
        "quarter": ("a", "1", 0.25),
        "mig": ("m", "mig", pytest.approx(2 / 7)),
    }
    caps = {(s.node, s.device): s.capacity for s in slots}
    assert caps == {("a", "0"): 1.0, ("a", "1"): 1.0, ("m", "mig"): pytest.approx(1.0)}
    assert {h.gpu_model for h in holdings} == {"A100"}
    # A pod the cache no longer has is skipped, not billed to nobody.
    assert cb.allocations(_ledger(), lambda uid: None)[0] == []


def test_the_idle_remainder_of_a_shared_gpu_goes_to_its_holders_pro_rata() -> None:
    holdings, slots = cb.allocations(_ledger(), lambda uid: META, CONFIG.mig_fractions())
    idle, cluster_idle = cb.split_idle(holdings, slots)
    by_pod = {h.pod: i for h, i in zip(holdings, idle, strict=True)}
    # GPU a/1: 0.75 held, 0.25 idle split 2:1 between the half and the quarter.
    assert by_pod["half"] == pytest.approx(0.25 * 2 / 3)
    assert by_pod["quarter"] == pytest.approx(0.25 / 3)
    assert by_pod["whole"] == 0.0
    assert by_pod["mig"] == pytest.approx(5 / 7)
    assert cluster_idle == {}
    # With the half gone nobody holds part of GPU 0... and GPU 0 unheld is cluster idle.
    rest = [h for h in holdings if h.pod != "whole"]
    assert cb.split_idle(rest, slots)[1] == {("a", "0"): 1.0}


shares = st.lists(st.integers(min_value=1, max_value=1000), min_size=0, max_size=5)


@settings(deadline=None)
@given(st.lists(shares, min_size=1, max_size=4))
def test_held_attributed_idle_and_cluster_idle_add_up_to_each_gpu(gpus: list[list[int]]) -> None:
    holdings, slots = [], []
    for d, milli in enumerate(gpus):
        total = sum(milli)
        scale = 1000 / total if total > 1000 else 1.0  # a GPU is never held beyond 1
        slots.append(cb.GpuSlot("n", str(d), "T4", 1.0))
        for k, m in enumerate(milli):
            holdings.append(
                cb.Holding("ns", f"p{d}-{k}", "c", "n", str(d), "t", "T4", m * scale / 1000)
            )
    idle, cluster_idle = cb.split_idle(holdings, slots)
    for s in slots:
        mine = [(h, i) for h, i in zip(holdings, idle, strict=True) if h.device == s.device]
        total = math.fsum(h.share + i for h, i in mine) + cluster_idle.get(("n", s.device), 0.0)
        assert total == pytest.approx(1.0)
        assert math.fsum(h.share for h, _ in mine) <= 1.0 + 1e-12
        assert all(i >= 0 for _, i in mine)


def _series(labels: dict[str, str], values: list[float], t0: float = 0.0, step: float = 1.0):
    return (labels, [(t0 + k * step, v) for k, v in enumerate(values) if not math.isnan(v)])


def _hold(pod_: str, tenant: str, node_: str, device: str, model: str) -> dict[str, str]:
    return {
        "namespace": tenant + "-ns",
        "pod": pod_,
        "container": "main",
        "node": node_,
        "device": device,
        "tenant": tenant,
        "gpu_model": model,
    }


NAN = float("nan")


def test_report_integrates_lifetimes_times_shares_times_prices() -> None:
    step = 10.0
    # n1 (H100, config 4/h) GPU 0: a 0.5 for 6 samples, b 0.25 for 3 samples; n2 (T4,
    # 1/h) GPU 0: b whole for 10 samples, GPU 1 nobody.
    inputs = cb.Inputs(
        holdings=[
            _series(_hold("a1", "a", "n1", "0", "H100"), [0.5] * 6 + [NAN] * 4, step=step),
            _series(
                _hold("b1", "b", "n1", "0", "H100"), [NAN] * 3 + [0.25] * 3 + [NAN] * 4, step=step
            ),
            _series(_hold("b2", "b", "n2", "0", "T4"), [1.0] * 10, step=step),
        ],
        capacity=[
            _series({"node": "n1", "device": "0", "gpu_model": "H100"}, [1.0] * 10, step=step),
            _series({"node": "n2", "device": "0", "gpu_model": "T4"}, [1.0] * 10, step=step),
            _series({"node": "n2", "device": "1", "gpu_model": "T4"}, [1.0] * 10, step=step),
        ],
        gpu_prices=[
            _series({"node": "n1"}, [4.0] * 10, step=step),
            _series({"node": "n2"}, [1.0] * 10, step=step),
        ],
    )
    r = cb.build_report(inputs, 0.0, 100.0, step)
    h = step / 3600
    lines = {(m.tenant, m.gpu_model): m for m in r.by_model}
    assert lines[("a", "H100")].gpu_hours == pytest.approx(0.5 * 6 * h)
    assert lines[("a", "H100")].cost == pytest.approx(0.5 * 6 * h * 4)
    assert lines[("b", "H100")].gpu_hours == pytest.approx(0.25 * 3 * h)
    assert lines[("b", "T4")].cost == pytest.approx(10 * h * 1)
    # Idle of n1/0: 0.5 for 3 samples to a alone, then 0.25 split 2:1 for 3 samples, then
    # cluster idle (nobody holds it) for 4 samples; n2/1 is cluster idle throughout.
    assert lines[("a", "H100")].idle_gpu_hours == pytest.approx((0.5 * 3 + 0.25 * 2 / 3 * 3) * h)
    assert lines[("b", "H100")].idle_gpu_hours == pytest.approx(0.25 / 3 * 3 * h)
    assert r.cluster_idle_gpu_hours == pytest.approx((4 + 10) * h)
    assert r.cluster_gpu_hours == pytest.approx(30 * h)
    assert r.billed_gpu_cost == pytest.approx(r.cluster_gpu_cost)
    assert r.max_gpu_load == pytest.approx(1.0)


def test_opencost_price_wins_where_it_runs() -> None:
    inputs = cb.Inputs(
        holdings=[_series(_hold("a1", "a", "n1", "0", "H100"), [1.0] * 4)],
        capacity=[_series({"node": "n1", "device": "0", "gpu_model": "H100"}, [1.0] * 4)],
        gpu_prices=[_series({"node": "n1"}, [4.0] * 4)],
        opencost_prices=[_series({"node": "n1"}, [NAN, NAN, 9.0, 9.0])],
    )
    r = cb.build_report(inputs, 0.0, 4.0, 1.0)
    assert r.tenants[0].gpu_cost == pytest.approx((4 + 4 + 9 + 9) / 3600)
    assert r.opencost_priced_gpu_hours == pytest.approx(2 / 3600)


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 3),
            st.integers(1, 1000),
            st.integers(0, 19),
            st.integers(1, 20),
        ),
        max_size=12,
    ),
    st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=4, max_size=4),
)
def test_tenants_plus_cluster_idle_reconcile_to_the_cluster_cost(
    pods: list[tuple[str, int, int, int, int]], prices: list[float]
) -> None:
    """Whatever the pods, per sample no GPU above 1: allocated + attributed idle + cluster
    idle = capacity x time x price, and GPU-hours = sum of share x time."""
    n = 20
    load = [[0.0] * n for _ in range(4)]
    holdings = []
    expect: dict[str, float] = {}
    for k, (tenant, gpu, milli, start, length) in enumerate(pods):
        values = []
        for t in range(n):
            share = milli / 1000
            if start <= t < start + length and load[gpu][t] + share <= 1.0:
                load[gpu][t] += share
                values.append(share)
                expect[tenant] = expect.get(tenant, 0.0) + share / 3600
            else:
                values.append(NAN)
        holdings.append(_series(_hold(f"p{k}", tenant, f"n{gpu}", "0", "T4"), values))
    inputs = cb.Inputs(
        holdings=holdings,
        capacity=[
            _series({"node": f"n{g}", "device": "0", "gpu_model": "T4"}, [1.0] * n)
            for g in range(4)
        ],
        gpu_prices=[_series({"node": f"n{g}"}, [prices[g]] * n) for g in range(4)],
    )
    r = cb.build_report(inputs, 0.0, float(n), 1.0)
    assert r.cluster_gpu_hours == pytest.approx(4 * n / 3600)
    assert r.billed_gpu_cost == pytest.approx(r.cluster_gpu_cost, abs=1e-9)
    assert r.max_gpu_load <= 1.0 + 1e-9
    got = {t.tenant: t.gpu_hours for t in r.tenants}
    assert got == pytest.approx(expect)


def test_tokens_are_counter_increases_and_cost_per_million_follows() -> None:
    assert cb.counter_increase([(0, 5.0), (1, 8.0), (2, 2.0), (3, 4.0)]) == 3 + 2 + 2
    inputs = cb.Inputs(
        holdings=[_series(_hold("srv", "a", "n1", "0", "H100"), [1.0] * 10)],
        capacity=[_series({"node": "n1", "device": "0", "gpu_model": "H100"}, [1.0] * 10)],
        gpu_prices=[_series({"node": "n1"}, [3.6] * 10)],
        tokens=[
            _series(
                {"namespace": "a-ns", "pod": "srv", "model_name": "llama"},
                [float(100 * k) for k in range(10)],
            ),
            _series(
                {"namespace": "a-ns", "pod": "srv", "model_name": "llama"},
                [float(400 * k) for k in range(10)],
            ),
        ],
    )
    r = cb.build_report(inputs, 0.0, 10.0, 1.0)
    (dep,) = r.deployments
    assert dep.tokens == 9 * 100 + 9 * 400
    assert dep.cost == pytest.approx(10 * 3.6 / 3600)
    assert dep.cost_per_million_tokens == pytest.approx(0.01 / 4500 * 1e6)
    assert r.tenants[0].tokens == 4500


def test_pricing_the_flat_map_of_earlier_versions_is_the_resources_table() -> None:
    old = parse_config(
        "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n"
        "pricing: {nvidia.com/gpu: 2.5, cpu: 0.03}\n"
    )
    assert old.pricing is not None
    assert old.pricing.resources == {"nvidia.com/gpu": 2.5, "cpu": 0.03}
    new = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "pricing": {
                "resources": {"nvidia.com/gpu": 2.5, "cpu": 0.03},
                "gpuModels": {"Tesla-T4": 0.35, "NVIDIA-H100-80GB-HBM3": 4},
                "nodes": {"special": {"gpu": 9, "resources": {"cpu": 0.1}}},
            },
        }
    )
    p = new.pricing
    assert p is not None
    assert p.gpu_hourly("special", "Tesla-T4") == 9  # the node's own price first
    assert p.gpu_hourly("n", "Tesla-T4") == 0.35  # then the GPU model's
    assert p.gpu_hourly("n", "A10") == 2.5  # then nvidia.com/gpu
    assert p.resource_hourly("special", "cpu") == 0.1
    assert p.resource_hourly("n", "cpu") == 0.03
    # A dump reads back the same config.
    assert config_from_mapping(new.model_dump(by_alias=True)) == new


def test_export_rows_prices_every_node_and_labels_every_share() -> None:
    config = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"name": "prod", "namespaces": ["prod"]}],
            "pricing": {"resources": {"cpu": 0.05}, "gpuModels": {"A100": 3}},
        }
    )
    rows = cb.export_rows(_ledger(), lambda uid: META, config.pricing, CONFIG.mig_fractions())
    assert (("a", "A100"), 3.0) in rows["fairshare_node_gpu_hourly_price"]
    assert (("m", "cpu"), 0.05) in rows["fairshare_node_resource_hourly_price"]
    alloc = {v[1]: s for v, s in rows["fairshare_pod_gpu_allocation"]}
    assert alloc["half"] == 0.5 and alloc["whole"] == 1.0
    cpu = {v[1]: s for v, s in rows["fairshare_pod_resource_allocation"] if v[4] == "cpu"}
    assert cpu["whole"] == 1.0  # cores, not the ledger's millicores


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "yesterday", "--to", "2026-01-02"], "--from: 'yesterday' is not a time"),
        (["--from", "2026-01-02", "--to", "2026-01-01"], "empty range"),
        (["--from", "2026-01-01", "--to", "2026-01-02", "--step", "0"], "--step must be > 0"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_1(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["chargeback", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_step_and_timeout_take_seconds_or_a_duration(capsys: pytest.CaptureFixture[str]) -> None:
    from fairshare_cli.chargeback import _seconds

    assert (_seconds("30"), _seconds("2s"), _seconds("1m30s"), _seconds("0.5")) == (
        30.0,
        2.0,
        90.0,
        0.5,
    )
    with pytest.raises(SystemExit):
        main(["chargeback", "--from", "2026-01-01", "--to", "2026-01-02", "--step", "2x"])
    assert "'2x' is neither seconds nor a duration" in capsys.readouterr().err


def test_runs_lost_to_hardware_are_marked_not_removed() -> None:
    runs = {"runs": [{"key": "a-ns/train", "gang": True, "lost": ["a1"], "evicted": ["a2"]}]}
    lost = cb.lost_pods(runs)
    assert lost == {("a-ns", "a1"), ("a-ns", "a2")}
    inputs = cb.Inputs(
        holdings=[
            _series(_hold("a1", "a", "n1", "0", "H100"), [1.0] * 4),
            _series(_hold("a3", "a", "n1", "1", "H100"), [1.0] * 4),
        ],
        capacity=[
            _series({"node": "n1", "device": d, "gpu_model": "H100"}, [1.0] * 4) for d in "01"
        ],
        gpu_prices=[_series({"node": "n1"}, [3.6] * 4)],
        lost=lost,
    )
    (a,) = cb.build_report(inputs, 0.0, 4.0, 1.0).tenants
    assert a.gpu_hours == pytest.approx(8 / 3600)
    assert a.lost_gpu_hours == pytest.approx(4 / 3600)
    assert a.lost_cost == pytest.approx(4 / 3600 * 3.6)


def test_lost_pods_read_what_the_extenders_recovery_records() -> None:
    from fairshare import recovery

    run = recovery.LostRun(
        key="a-ns/train",
        gang=True,
        tenant="a",
        queued_at=0.0,
        lost_at=10.0,
        reason="node failed",
        lost=("a1",),
        evicted=("a2",),
    )
    data = json.loads(json.dumps(recovery.runs_to_dict({run.key: run})))
    assert cb.lost_pods(data) == {("a-ns", "a1"), ("a-ns", "a2")}
