"""The simulator end to end on small scenarios (pure, no network)."""

from __future__ import annotations

import json
import textwrap

import pytest

from fairshare.simulator import runner, scenario
from fairshare_cli import main as cli

DRF_PAPER = textwrap.dedent(
    """
    apiVersion: fairshare.io/v1alpha1
    kind: Scenario
    config:
      apiVersion: fairshare.io/v1alpha1
      kind: FairShareConfig
      resources: {cpu: {weight: 1}, memory: {weight: 1}, nvidia.com/gpu: {weight: 1}}
      tenants:
      - {name: a, namespaces: [a], weight: 1}
      - {name: b, namespaces: [b], weight: 1}
    nodes:
    - name: n
      allocatable: {cpu: "9", memory: 18Gi, pods: "110"}
    workload:
    - {namespace: a, count: 10, requests: {cpu: "1", memory: 4Gi}}
    - {namespace: b, count: 10, requests: {cpu: "3", memory: 1Gi}}
    """
)


def test_drf_paper_example_gives_a_3_and_b_2():
    # Ghodsi et al. NSDI'11 §4: <1 CPU, 4 GB> vs <3 CPU, 1 GB> on <9, 18>: A 3, B 2.
    sim = runner.run_scenario(scenario.parse_scenario(DRF_PAPER))
    report = runner.build_report(sim)
    assert report["tenants"]["a"]["running"] == 3
    assert report["tenants"]["b"]["running"] == 2
    assert report["tenants"]["a"]["pending"] == 7
    assert report["tenants"]["a"]["dominantShare"] == pytest.approx(2 / 3, abs=1e-4)
    assert report["tenants"]["b"]["dominantShare"] == pytest.approx(2 / 3, abs=1e-4)


def test_without_gate_first_come_takes_everything():
    # The same workload under a plain packing policy: a's 10 pods come first and
    # take memory until none is left (4 pods = 16Gi), then b fits 2 more by CPU? no:
    # CPU 9 - 4 = 5 → b gets 1 (3 CPU) and memory 16 + 1 = 17Gi ≤ 18: a 4, b 1.
    sim = runner.run_scenario(scenario.parse_scenario(DRF_PAPER), policy="bestfit")
    report = runner.build_report(sim)
    assert (report["tenants"]["a"]["running"], report["tenants"]["b"]["running"]) == (4, 1)


def test_limit_rejects_at_admission():
    text = DRF_PAPER.replace(
        "{name: b, namespaces: [b], weight: 1}",
        '{name: b, namespaces: [b], weight: 1, limit: {cpu: "6"}}',
    )
    report = runner.build_report(runner.run_scenario(scenario.parse_scenario(text)))
    # b may hold at most 6 CPU in running + pending pods: 2 admitted, 8 rejected
    assert report["tenants"]["b"]["rejected"] == 8
    assert report["tenants"]["b"]["running"] + report["tenants"]["b"]["pending"] == 2


def test_departures_free_room_for_pending_pods():
    text = textwrap.dedent(
        """
        apiVersion: fairshare.io/v1alpha1
        kind: Scenario
        config: {apiVersion: fairshare.io/v1alpha1, kind: FairShareConfig,
                 tenants: [{name: a, namespaces: [a]}]}
        nodes: [{name: n, allocatable: {cpu: "2", memory: 8Gi, nvidia.com/gpu: "1"}}]
        workload:
        - {namespace: a, count: 3, requests: {cpu: "1", nvidia.com/gpu: "1"}, duration: 10}
        """
    )
    sim = runner.run_scenario(scenario.parse_scenario(text))
    # one GPU, three 1-GPU pods of 10 s each: they run one after another
    assert sim.counters["a"].completed == 3
    assert sim.counters["a"].pending == 0


def test_fractional_pods_share_devices():
    text = textwrap.dedent(
        """
        apiVersion: fairshare.io/v1alpha1
        kind: Scenario
        config: {apiVersion: fairshare.io/v1alpha1, kind: FairShareConfig,
                 tenants: [{name: a, namespaces: [a]}]}
        nodes: [{name: n, allocatable: {cpu: "32", memory: 64Gi, nvidia.com/gpu: "2"}}]
        workload:
        - {namespace: a, count: 5, requests: {cpu: "1"},
           annotations: {fairshare.io/gpu-fraction: "0.5"}}
        """
    )
    sim = runner.run_scenario(scenario.parse_scenario(text))
    # two devices hold four halves; the fifth waits; no device above 1000 milli
    assert sim.counters["a"].running == 4 and sim.counters["a"].pending == 1
    assert all(v == 0.0 for v in sim.state.node_devices(0)[:2])
    per_device: dict[int, float] = {}
    for pod in sim.state.pods.values():
        for dev, milli in pod.devices:
            per_device[dev] = per_device.get(dev, 0.0) + milli
    assert per_device == {0: 1000.0, 1: 1000.0}
    # Two shared GPUs of two pods each, as the extender's ledger keeps them.
    assert sorted(len(g.members) for g in sim.state.groups.values()) == [2, 2]
    assert {g.slot for g in sim.state.groups.values()} == {0, 1}


def test_unhealthy_nodes_get_no_gpu_pods():
    text = textwrap.dedent(
        """
        apiVersion: fairshare.io/v1alpha1
        kind: Scenario
        config: {apiVersion: fairshare.io/v1alpha1, kind: FairShareConfig,
                 tenants: [{name: a, namespaces: [a]}]}
        nodes:
        - {name: sick, allocatable: {cpu: "8", nvidia.com/gpu: "8"}, unhealthy: "GpuUnhealthy"}
        - {name: well, allocatable: {cpu: "8", nvidia.com/gpu: "1"}}
        workload:
        - {namespace: a, count: 2, requests: {cpu: "1", nvidia.com/gpu: "1"}}
        - {namespace: a, count: 1, requests: {cpu: "1"}}
        """
    )
    sim = runner.run_scenario(scenario.parse_scenario(text))
    nodes = {p.name: p.node for p in sim.state.pods.values()}
    assert nodes["a-0-0"] == "well"
    assert "a-0-1" not in nodes  # the sick node's free GPUs are not used
    assert nodes["a-1-0"] in {"sick", "well"}  # CPU-only pods may still go there


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (DRF_PAPER.replace("count: 10, requests", "count: 0, requests", 1), "workload[0].count"),
        (
            DRF_PAPER.replace('cpu: "1", memory: 4Gi', 'cpu: "one", memory: 4Gi'),
            "workload[0].requests",
        ),
        (DRF_PAPER.replace("[a], weight: 1}", "[a], weight: 0}"), "config.tenants[0].weight"),
        (DRF_PAPER.replace("kind: Scenario", "kind: Scenery"), "kind"),
        (DRF_PAPER + "bogus: 1\n", "bogus"),
    ],
    ids=["count-zero", "bad-quantity", "weight-zero", "wrong-kind", "extra-key"],
)
def test_invalid_scenarios_give_field_paths(tmp_path, capsys, text, path):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    assert cli.main(["simulate", str(f)]) == 1
    err = capsys.readouterr().err
    assert path in err
    assert "Traceback" not in err


def test_demo_runs_and_writes_a_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert cli.main(["simulate", "--demo", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    text = capsys.readouterr().out
    for tenant in ("research", "nlp", "serving", "default"):
        assert tenant in report["tenants"]
        assert tenant in text
    c = report["cluster"]
    assert c["nodes"] == 6 and c["gpus"] == 24
    assert 0 < c["gpuAllocationRatio"] <= 1
    # nlp's hard limit of 12 GPUs: 6 × 2-GPU training pods would be 12, plus 4 × 0.5
    # serving pods → the last two serving pods are rejected at admission
    assert report["tenants"]["nlp"]["rejected"] >= 1


def test_missing_trace_names_its_source(tmp_path, capsys):
    assert cli.main(["simulate", "--trace", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert "alibaba/clusterdata" in err and "cluster-trace-gpu-v2023" in err
