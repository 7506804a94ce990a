"""GPU health signals → the healthy fleet: which signals are fatal, what leaves the
capacity fair shares divide, and whether the guarantees are still covered."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pytest

from fairshare import cluster_shares, dra
from fairshare.config.schema import FairShareConfig, HealthPolicy
from fairshare.fleet import fleet_health
from fairshare.hardware import read_node_health
from fairshare.state import objects
from fairshare.state.cluster import ClusterState
from fairshare.state.objects import ResourceIndex

POLICY = HealthPolicy()


def node(
    name: str = "n1",
    *,
    gpus: int = 8,
    capacity: int | None = None,
    conditions: list[dict[str, Any]] | None = None,
    taints: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": taints or []}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus if capacity is None else capacity)},
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi"},
            "conditions": conditions or [],
        },
    }


# -- signals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "status"),
    [
        ("SysLogsGPUFallenOff", "True"),  # NVSentinel syslog monitor
        ("GpuMemWatch", "True"),  # NVSentinel DCGM monitor (set only when fatal)
        ("GPUXIDErrors", "True"),  # AKS Node Problem Detector plugin
        ("AcceleratedHardwareReady", "False"),  # EKS node monitoring agent
        ("XidCriticalError", "True"),  # fairshare's earlier default
    ],
)
def test_every_reporters_fatal_condition_takes_the_gpus_out(condition: str, status: str) -> None:
    reading = read_node_health(
        node(conditions=[{"type": condition, "status": status, "reason": "Xid79"}]), POLICY
    )
    assert not reading.healthy
    assert reading.reason == f"condition {condition}={status} (Xid79)"


def test_a_condition_back_to_normal_is_healthy() -> None:
    conditions = [
        {"type": "SysLogsGPUFallenOff", "status": "False"},
        {"type": "AcceleratedHardwareReady", "status": "True"},
        {"type": "Ready", "status": "True"},
    ]
    reading = read_node_health(node(conditions=conditions), POLICY)
    assert reading.healthy and not reading.warnings


def test_a_non_fatal_signal_is_a_warning_and_keeps_the_node_in_service() -> None:
    reading = read_node_health(
        node(conditions=[{"type": "NVSwitchNonFatalError", "status": "True"}]), POLICY
    )
    assert reading.healthy
    assert reading.warnings == ("condition NVSwitchNonFatalError=True",)


def test_nvsentinel_taint_and_cordon_are_fatal_and_name_the_remediator() -> None:
    taint = {"key": "nvidia.com/gpu-error", "value": "fatal", "effect": "NoExecute"}
    reading = read_node_health(node(taints=[taint]), POLICY)
    assert reading.fatal == ("taint nvidia.com/gpu-error=fatal:NoExecute",)
    assert reading.no_execute
    cordoned = node(labels={"k8saas.nvidia.com/cordon-by": "NVSentinel"}, unschedulable=True)
    reading = read_node_health(cordoned, POLICY)
    assert reading.remediator == "k8saas.nvidia.com/cordon-by=NVSentinel"
    assert not reading.healthy
    # The label without the cordon (uncordoned by hand) is no fault.
    labelled = node(labels={"k8saas.nvidia.com/cordon-by": "NVSentinel"})
    assert read_node_health(labelled, POLICY).healthy


def test_device_plugin_unhealthy_devices_are_counted_and_leave_the_rest_in_service() -> None:
    reading = read_node_health(node(gpus=6, capacity=8), POLICY)
    assert reading.healthy and reading.unhealthy_devices == 2


def test_malformed_signals_are_skipped_not_raised() -> None:
    bad: dict[str, Any] = {
        "metadata": "x",
        "spec": {"taints": ["not-a-map", {"key": 3}]},
        "status": {"conditions": [None, {"type": ["x"], "status": "True"}], "capacity": []},
    }
    reading = read_node_health(bad, POLICY)
    assert reading.healthy and reading.unhealthy_devices == 0


def test_signals_are_configurable() -> None:
    policy = HealthPolicy(unhealthy_conditions=("MyGpuCheck",), unhealthy_taints=())
    taint = {"key": "nvidia.com/gpu-error", "value": "fatal", "effect": "NoSchedule"}
    assert read_node_health(node(taints=[taint]), policy).healthy
    sick = node(conditions=[{"type": "MyGpuCheck", "status": "True"}])
    assert not read_node_health(sick, policy).healthy


# -- capacity on the healthy fleet -------------------------------------------------------


def config(**tenants: str) -> FairShareConfig:
    return FairShareConfig.model_validate(
        {
            "tenants": [
                {"name": name, "namespaces": [name], "guaranteed": {"nvidia.com/gpu": g}}
                for name, g in tenants.items()
            ]
        }
    )


def cluster(cfg: FairShareConfig, *nodes: dict[str, Any]) -> ClusterState:
    state = ClusterState(ResourceIndex(cfg.resource_names()))
    for n in nodes:
        objects.apply_node(state, n, cfg)
    return state


def test_a_failed_node_leaves_the_gpu_capacity_but_keeps_its_cpu() -> None:
    cfg = config(a="4", b="4")
    sick = node("n2", conditions=[{"type": "GpuMemWatch", "status": "True"}])
    state = cluster(cfg, node("n1"), sick)
    g, c = state.gpu_col, state.index.column("cpu")
    assert state.total_capacity()[g] == 8000
    assert state.total_capacity(include_failed=True)[g] == 16000
    assert state.total_capacity()[c] == state.total_capacity(include_failed=True)[c]
    assert state.total_free()[g] == 8000
    state.set_health("n2", True)
    assert state.total_capacity()[g] == 16000


def test_fair_shares_divide_the_gpus_in_service() -> None:
    cfg = config(a="0", b="0")
    state = cluster(cfg, node("n1"), node("n2"))
    demand = {t: state.index.kernel_vector({"nvidia.com/gpu": Fraction(16)}) for t in "ab"}
    before = cluster_shares.fair_shares_for(state, cfg, demand)
    assert before["a"].allocation[state.gpu_col] == pytest.approx(8000)
    state.set_health("n2", False, "condition SysLogsXIDError=True")
    after = cluster_shares.fair_shares_for(state, cfg, demand)
    assert after["a"].allocation[state.gpu_col] == pytest.approx(4000)
    assert after["a"].share == pytest.approx(0.5)


def test_guarantees_beyond_the_healthy_fleet_are_reported_and_scaled_pro_rata() -> None:
    cfg = config(a="6", b="4")
    state = cluster(cfg, node("n1"), node("n2"))
    assert not fleet_health(state, cfg).uncovered
    state.set_health("n2", False, "taint nvidia.com/gpu-xid-error=true:NoSchedule")
    fleet = fleet_health(state, cfg)
    (gpu,) = fleet.uncovered
    assert (gpu.resource, gpu.guaranteed, gpu.in_service) == ("nvidia.com/gpu", 10.0, 8.0)
    assert gpu.ratio == pytest.approx(0.8)
    demand = {t: state.index.kernel_vector({"nvidia.com/gpu": Fraction(8)}) for t in "ab"}
    fair = cluster_shares.fair_shares_for(state, cfg, demand)
    # Starts of 6 and 4 over 8 GPUs: both scaled by 0.8, nothing left to fill.
    assert fair["a"].allocation[state.gpu_col] == pytest.approx(4800)
    assert fair["b"].allocation[state.gpu_col] == pytest.approx(3200)


def test_fleet_names_failed_nodes_and_the_tenants_they_cost() -> None:
    cfg = config(a="0", b="0")
    state = cluster(
        cfg,
        node("n1", gpus=6, capacity=8),
        node("n2"),
        node("n3", conditions=[{"type": "CSPMaintenance", "status": "True"}]),
    )
    row = state.index.kernel_vector({"nvidia.com/gpu": Fraction(3)})
    state.bind(uid="p1", node="n2", row=row, devices=[(0, 1000), (1, 1000), (2, 1000)], tenant="a")
    state.set_health("n2", False, "condition GpuNvlinkWatch=True")
    fleet = fleet_health(state, cfg)
    assert (fleet.gpus, fleet.gpus_in_service, fleet.gpus_failed) == (22.0, 14.0, 8.0)
    assert fleet.unhealthy_devices == 2
    assert fleet.tenants_on_failed == {"a": 3.0}
    assert [(n.name, n.failed, n.gpus) for n in fleet.nodes] == [
        ("n1", False, 2),
        ("n2", True, 8.0),
        ("n3", False, 0),
    ]
    assert fleet.warned_nodes == 1


def test_a_warning_lowers_the_health_score_flag_but_keeps_the_node_in_service() -> None:
    cfg = config(a="0")
    warned = node("n2", conditions=[{"type": "NVSwitchNonFatalError", "status": "True"}])
    state = cluster(cfg, node("n1"), warned)
    assert list(state.healthy) == [1, 2]
    assert list(state.clean_flags()) == [1, 0]
    assert state.total_capacity()[state.gpu_col] == 16000


# -- DRA device taints, effect by effect ------------------------------------------------


def _slice(*taints: dict[str, Any] | None) -> dict[str, Any]:
    devices = []
    for i, taint in enumerate(taints):
        dev: dict[str, Any] = {"name": f"gpu-{i}", "attributes": {}}
        if taint is not None:
            dev["taints"] = [taint]
        devices.append(dev)
    return {
        "metadata": {"name": "s1"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


GPU_CLASS = {
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
}


def _capacity(slice_: dict[str, Any], rules: dict[str, Any] | None = None) -> dra.SliceCapacity:
    book = dra.SliceBook({"s1": slice_}, {"gpu.nvidia.com": GPU_CLASS}, rules or {})
    book.recount(("gpu.nvidia.com",), {})
    return book.capacity


def test_dra_device_taints_count_by_effect() -> None:
    xid = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    lost = {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoExecute"}
    unmonitored = {"key": "gpu.nvidia.com/unmonitored", "effect": "None"}
    cap = _capacity(_slice(None, xid, lost, unmonitored))
    assert cap.node_gpus == {"n1": 2}  # the clean GPU and the informational one
    assert cap.tainted == {"n1": 2}
    assert cap.warned == {"n1": 1}


def test_a_device_taint_rule_of_effect_none_warns_and_one_of_noschedule_takes_out() -> None:
    def rule(effect: str) -> dict[str, Any]:
        return {
            "metadata": {"name": f"r-{effect}"},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"},
                "taint": {"key": "example.com/check", "effect": effect},
            },
        }

    warned = _capacity(_slice(None, None), {"r": rule("None")})
    assert (warned.node_gpus, warned.warned, warned.tainted) == ({"n1": 2}, {"n1": 1}, {})
    out = _capacity(_slice(None, None), {"r": rule("NoSchedule")})
    assert (out.node_gpus, out.warned, out.tainted) == ({"n1": 1}, {}, {"n1": 1})


def test_apply_node_turns_dra_counts_into_health() -> None:
    cfg = config(a="0")
    state = ClusterState(ResourceIndex(cfg.resource_names()))
    bare = node("n1", gpus=0)
    objects.apply_node(state, bare, cfg, dra_gpus=3, dra_tainted=1, dra_warned=1)
    info = state.nodes[0]
    assert info.unhealthy_gpus == 1
    assert info.health_warning == "1 GPU(s) with an informational DRA device taint"
    assert state.healthy[0] == 2
    assert state.total_capacity()[state.gpu_col] == 3000


def test_status_text_and_page_show_the_failed_node_and_uncovered_guarantees() -> None:
    from fairshare import report
    from fairshare.report_render import render_status_html, render_status_text

    cfg = config(a="6", b="4")
    state = cluster(cfg, node("n1"), node("n2"))
    row = state.index.kernel_vector({"nvidia.com/gpu": Fraction(2)})
    state.bind(uid="p1", node="n2", row=row, devices=[(0, 1000), (1, 1000)], tenant="b")
    healthy = report.build_status(config=cfg, state=state, pending=[], mix=None)
    assert "HEALTH" not in render_status_text(healthy)
    assert "GPU health" not in render_status_html(healthy)
    state.set_health("n2", False, "condition SysLogsGPUFallenOff=True")
    data = report.build_status(config=cfg, state=state, pending=[], mix=None)
    assert data["health"]["tenantsOnFailedHardware"] == {"b": 2.0}
    text = render_status_text(data)
    assert "HEALTH  8 GPU(s) in service, 8 failed" in text
    assert re.search(r"n2 +failed +8 +b 2 +condition SysLogsGPUFallenOff=True", text), text
    assert "guarantees of nvidia.com/gpu not covered: 10 guaranteed, 8 in service (80%)" in text
    page = render_status_html(data)
    assert "<b class=bad id=gpus-failed>8</b>" in page and "id=guarantees-uncovered" in page
