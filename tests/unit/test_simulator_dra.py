"""The simulator's DRA node pools (``fairshare.simulator.drapool``): capacity counted by
``fairshare.dra``, claims of whole GPUs, MIG partitions and shares, the mixed-fleet
scenario, and one-line validation errors."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from fairshare import dra
from fairshare.simulator import drapool, runner, scenario
from fairshare_cli import main as cli

SCENARIO = Path(__file__).parents[2] / "fairshare/simulator/scenarios/dra-mixed.yaml"

BASE = """\
apiVersion: fairshare.io/v1alpha1
kind: Scenario
config:
  apiVersion: fairshare.io/v1alpha1
  kind: FairShareConfig
  tenants:
  - {name: a, namespaces: [a], weight: 1}
  - {name: b, namespaces: [b], weight: 1}
nodes:
- name: n
  allocatable: {cpu: "64", memory: 256Gi, pods: "110"}
  dra: {partitionable: 1}
- name: s
  allocatable: {cpu: "64", memory: 256Gi, pods: "110"}
  dra: {shareable: 1}
workload:
"""


def test_slices_count_one_gpu_per_physical_gpu_and_partitions_at_their_fraction():
    slices = drapool.node_slices("n", gpus=2, partitionable=1, shareable=1)
    got = dra.slice_capacity(
        slices, drapool.device_classes(), dra.GPU_DEVICE_CLASSES | {"mig.nvidia.com"}
    )
    assert dict(got.node_gpus) == {"n": 4}
    fractions = {k[2]: d.fraction for k, d in got.devices.items()}
    assert fractions["gpu-2-mig-19-0-1"] == Fraction(1, 7)
    assert fractions["gpu-2-mig-14-0-2"] == Fraction(2, 7)
    assert fractions["gpu-2-mig-9-4-4"] == Fraction(3, 7)
    assert got.devices[(drapool.DRIVER, "n", "gpu-3")].shareable


def test_the_allocator_honours_counters_and_shared_capacity():
    alloc = drapool.Allocator()
    alloc.add_slices(drapool.node_slices("n", partitionable=1, shareable=1))
    seven = [alloc.allocate("n", drapool.MIG_CLASS, 1, "1g.10gb", None) for _ in range(8)]
    assert all(seven[:7]) and seven[7] is None  # 7 placements of 1g.10gb, no eighth
    # The partitioned GPU is not free as a whole; the shareable one is, once.
    whole = alloc.allocate("n", drapool.GPU_CLASS, 1, None, None)
    assert whole is not None and whole[0]["device"] == "gpu-1"
    assert alloc.allocate("n", drapool.GPU_CLASS, 1, None, Fraction(2**30)) is None
    alloc.release("n", whole)
    half = alloc.allocate("n", drapool.GPU_CLASS, 1, None, Fraction(40 * 2**30))
    assert half is not None and half[0]["consumedCapacity"] == {"memory": "40Gi"}


def test_claims_count_their_fraction_and_parts_of_a_gpu_share_one_slot():
    text = BASE + (
        "- {namespace: a, count: 7, claim: {mig: 1g.10gb}}\n"
        "- {namespace: b, count: 2, claim: {memory: 40Gi}}\n"
        "- {namespace: b, name: late, claim: {memory: 20Gi}}\n"
    )
    sim = runner.run_scenario(scenario.parse_scenario(text))
    st = sim.state
    usage = {t: st.usage_of(t)[st.gpu_col] / 1000 for t in ("a", "b")}
    # Seven 1g.10gb hold the MIG GPU exactly (rounded up to whole milli-GPU, the seventh
    # did not fit); two 40Gi shares hold the shareable GPU; the 20Gi share waits.
    assert usage["a"] == 1.0 and usage["b"] == 1.0
    groups = {p.group for p in st.pods.values()}
    assert all(g.startswith(drapool.GROUP_PREFIX) for g in groups) and len(groups) == 2
    assert set(sim.pending) == {"late-0"}
    # The pending share counts a quarter of a GPU in its tenant's demand.
    assert sim.pods["late-0"].demand.gpu.per_device == Fraction(1, 4)


def test_the_mixed_fleet_scenario_runs_with_sensible_shares(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert cli.main(["simulate", str(SCENARIO), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    c = report["cluster"]
    assert c["nodes"] == 6 and c["gpus"] == 40  # 16 device-plugin GPUs, 24 DRA GPUs
    assert c["gpuAllocationRatio"] > 0.95 and c["jainIndex"] > 0.95
    t = report["tenants"]
    assert t["research"]["allocated"]["nvidia.com/gpu"] == "16"
    assert t["vision"]["allocated"]["nvidia.com/gpu"] == "16"
    assert t["serving"]["allocated"]["nvidia.com/gpu"] == "4"  # 8 x 1/4 + 4 x 1/2
    assert t["inference"]["running"] == 20  # 14 x 1/7 + 6 x 2/7 on 4 MIG GPUs
    assert "inference" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("edit", "path", "message"),
    [
        (
            ("dra: {partitionable: 1}", "dra: {}"),
            "nodes[0].dra",
            "at least one GPU",
        ),
        (
            ('pods: "110"}', 'pods: "110", nvidia.com/gpu: "8"}'),
            "nodes[0].dra",
            "no nvidia.com/gpu allocatable",
        ),
        (
            ("workload:\n", "workload:\n- {namespace: a, claim: {mig: 4g.40gb}}\n"),
            "workload[0].claim.mig",
            "unknown MIG profile '4g.40gb'",
        ),
        (
            ("workload:\n", "workload:\n- {namespace: a, claim: {mig: 1g.10gb, memory: 1Gi}}\n"),
            "workload[0].claim",
            "a share by memory",
        ),
        (
            (
                "workload:\n",
                'workload:\n- {namespace: a, requests: {nvidia.com/gpu: "1"}, claim: {gpus: 1}}\n',
            ),
            "workload[0].claim",
            "by its claim or by nvidia.com/gpu",
        ),
        (
            ("  dra: {partitionable: 1}\n", "", "  dra: {shareable: 1}\n", ""),
            "workload[0].claim",
            "no node group publishes DRA GPUs",
        ),
    ],
    ids=["empty-pool", "device-plugin-too", "unknown-profile", "mig-and-memory", "both", "no-pool"],
)
def test_invalid_dra_scenarios_are_one_line_with_their_field(tmp_path, capsys, edit, path, message):
    text = BASE
    for old, new in zip(edit[::2], edit[1::2], strict=True):
        text = text.replace(old, new)
    if "claim" not in text:
        text += "- {namespace: a, claim: {gpus: 1}}\n"
    f = tmp_path / "s.yaml"
    f.write_text(text)
    assert cli.main(["simulate", str(f)]) == 1
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if path in ln)
    assert message in line, err
    assert "Traceback" not in err
