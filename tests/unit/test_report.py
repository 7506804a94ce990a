"""`fairshare status` / `explain`: the report built from the servers' own trackers.

The cluster is a snapshot of API objects fed to the extender's ``Cache`` and the
webhook's ``UsageTracker`` exactly as the CLI feeds them after listing a live cluster.
Two tenants on one 4-GPU node: a holds 2 GPUs and has a third pod pending, b has three
1-GPU pods pending. The fair allocation over that demand is 0.5 each, so a's pending pod
(0.75 after) is held by the gate while b waits, and a's limit of 3 GPUs is reached.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairshare import report
from fairshare.config.loading import config_from_mapping
from fairshare.state.snapshot import Snapshot
from fairshare_cli import live
from fairshare_cli import main as cli
from tests.unit.test_state_objects import node, pod

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "a", "namespaces": ["a"], "limit": {"nvidia.com/gpu": "3"}},
            {"name": "b", "namespaces": ["b"], "guaranteed": {"nvidia.com/gpu": "1"}},
        ],
    }
)


def namespace(name: str) -> dict[str, Any]:
    return {"kind": "Namespace", "metadata": {"name": name, "labels": {}}}


def snapshot(extra_pods: list[dict[str, Any]] | None = None) -> Snapshot:
    pods = [
        pod("a-1", ns="a", gpu=1, node_name="n1"),
        pod("a-2", ns="a", gpu=1, node_name="n1"),
        pod("a-3", ns="a", gpu=1, phase="Pending"),
        *(pod(f"b-{i}", ns="b", gpu=1, phase="Pending") for i in (1, 2, 3)),
        *(extra_pods or []),
    ]
    return Snapshot(
        CONFIG,
        {
            "Namespace": [namespace("a"), namespace("b")],
            "Node": [node("n1", gpus=4)],
            "Pod": pods,
        },
    )


def status(snap: Snapshot) -> dict[str, Any]:
    tracker, usage = live.feed_trackers(snap)
    seen = tracker.snapshot(snap.config)
    return report.build_status(
        config=snap.config,
        state=seen.state,
        pending=list(seen.queue),
        mix=seen.mix,
        quota=usage,
    )


def tenant(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in data["tenants"] if t["name"] == name)


def gpu_row(t: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in t["resources"] if r["resource"] == "nvidia.com/gpu")


def test_status_counts_shares_and_the_held_pod() -> None:
    data = status(snapshot())
    a, b = tenant(data, "a"), tenant(data, "b")
    assert a["pods"] == {"running": 2, "pending": 1, "held": 1}
    assert b["pods"] == {"running": 0, "pending": 3, "held": 0}
    assert (a["dominantShare"], a["fairShare"]) == (0.5, 0.5)
    assert (b["dominantShare"], b["fairShare"]) == (0.0, 0.5)
    # used = bound (the extender's shares); quotaUsed = the webhook's count (pending too).
    assert gpu_row(a) == {
        "resource": "nvidia.com/gpu",
        "used": "2",
        "quotaUsed": "3",
        "guaranteed": None,
        "limit": "3",
    }
    assert gpu_row(b)["guaranteed"] == "1" and gpu_row(b)["quotaUsed"] == "3"
    assert a["namespaces"] == ["a"]
    (held,) = data["heldPods"]
    assert held["pod"] == "a/a-3"
    assert held["reason"] == "tenant a above its fair share (0.75 > 0.50) while b waits"
    assert (held["shareAfter"], held["fairShare"], held["waitingFor"]) == (0.75, 0.5, "b")
    assert sorted(p["pod"] for p in data["pendingPods"]) == ["b/b-1", "b/b-2", "b/b-3"]
    c = data["cluster"]
    assert (c["gpus"], c["gpusAllocated"], c["gpuAllocationRatio"]) == (4, 2, 0.5)
    (n1,) = data["nodes"]
    holders = [d["holders"] for d in n1["devices"]]
    assert holders == [{"a": 1.0}, {"a": 1.0}, {}, {}]


def test_status_without_contenders_holds_nothing() -> None:
    snap = snapshot()
    snap.objects["Pod"] = [
        p for p in snap.objects["Pod"] if not p["metadata"]["name"].startswith("b-")
    ]
    data = status(snap)
    assert data["heldPods"] == []
    assert tenant(data, "a")["pods"] == {"running": 2, "pending": 1, "held": 0}


def test_pods_behind_scheduling_gates_are_named() -> None:
    snap = snapshot()
    for p in snap.objects["Pod"]:
        if p["metadata"]["name"] == "b-1":
            p["spec"]["schedulingGates"] = [{"name": "hold"}]
    tracker, usage = live.feed_trackers(snap)
    seen = tracker.snapshot(snap.config)
    data = report.build_status(
        config=snap.config,
        state=seen.state,
        pending=list(seen.queue),
        mix=seen.mix,
        quota=usage,
        scheduling_gated=live.scheduling_gated(snap),
    )
    reasons = {p["pod"]: p["reason"] for p in data["pendingPods"]}
    assert reasons["b/b-1"] == (
        "has spec.schedulingGates (not scheduled yet); fits; waiting for the scheduler"
    )
    assert reasons["b/b-2"] == "fits; waiting for the scheduler"


def test_a_pod_that_fits_nowhere_is_pending_not_held() -> None:
    data = status(snapshot([pod("b-big", ns="b", gpu=8, phase="Pending")]))
    big = next(p for p in data["pendingPods"] if p["pod"] == "b/b-big")
    assert big["fitsNodes"] == 0
    assert "Insufficient nvidia.com/gpu" in big["reason"]


def test_status_text_and_html_show_the_same_numbers() -> None:
    data = status(snapshot())
    text = report.render_status_text(data)
    assert "TENANT a  weight 1  dominant share 0.5000  fair share 0.5000" in text
    assert "2 running, 1 pending, 1 held by the gate" in text
    assert "a/a-3: tenant a above its fair share (0.75 > 0.50) while b waits" in text
    assert "GPUs 2/4 allocated (50.0%)" in text
    page = report.render_status_html(data, refresh=7)
    assert '<meta http-equiv="refresh" content="7">' in page
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "tenant a above its fair share (0.75 &gt; 0.50) while b waits" in page


def test_html_escapes_names() -> None:
    data = status(snapshot())
    data["heldPods"][0]["pod"] = "<img src=x onerror=alert(1)>"
    page = report.render_status_html(data)
    assert "<img" not in page and "&lt;img src=x" in page


def explain(snap: Snapshot, target: dict[str, Any]) -> dict[str, Any]:
    tracker, usage = live.feed_trackers(snap)
    return live.explain_report(snap, tracker, usage, target)


def test_explain_a_held_pod() -> None:
    snap = snapshot()
    target = next(p for p in snap.objects["Pod"] if p["metadata"]["name"] == "a-3")
    data = explain(snap, target)
    assert data["tenant"] == "a" and data["tenantSource"] == "namespaces"
    # Its own GPU is left out of the count: as if created now, 2 used + 1 <= 3.
    assert data["webhook"]["allowed"] is True
    (gpu,) = [q for q in data["webhook"]["quota"] if q["resource"] == "nvidia.com/gpu"]
    assert gpu == {
        "resource": "nvidia.com/gpu",
        "used": "2",
        "requested": "1",
        "limit": "3",
        "headroom": "1",
        "fits": True,
    }
    ext = data["extender"]
    assert ext["verdict"] == (
        "held by the fair-share gate: tenant a above its fair share (0.75 > 0.50) while b waits"
    )
    assert ext["gate"]["currentShare"] == 0.5 and ext["gate"]["waitingFor"] == "b"
    assert ext["nodes"] == [{"node": "n1", "fits": True, "reason": ""}]
    text = report.render_explain_text(data)
    assert "WEBHOOK (admission now): allowed" in text
    assert "current share 0.5000, after this pod 0.7500, fair share 0.5000" in text


def test_explain_a_new_pod_over_the_limit_and_too_big() -> None:
    new = pod("a-4", ns="a", gpu=5, phase="Pending")
    del new["metadata"]["uid"]
    new["metadata"]["uid"] = "explain:a/a-4"
    data = explain(snapshot(), new)
    wh = data["webhook"]
    assert wh["allowed"] is False
    assert (
        "tenant a would exceed its nvidia.com/gpu limit: 3 used + 5 requested > 3"
        in (wh["message"])
    )
    (n1,) = data["extender"]["nodes"]
    assert n1["fits"] is False and n1["unresolvable"] is True
    assert n1["reason"].startswith("Insufficient nvidia.com/gpu (free 2, requested 5)")
    assert data["extender"]["verdict"] == (
        "pending: can never fit: asks more than any node has (largest node: nvidia.com/gpu 4)"
    )


def test_explain_names_health_and_model_reasons_per_node() -> None:
    snap = snapshot()
    sick = node("n2", gpus=4, conditions=[{"type": "GpuUnhealthy", "status": "True"}])
    other = node("n3", gpus=4)
    other["metadata"]["labels"]["nvidia.com/gpu.product"] = "H100"
    snap.objects["Node"] += [sick, other]
    new = pod(
        "a-5", ns="a", gpu=1, phase="Pending", annotations={"fairshare.io/gpu-models": "A100"}
    )
    new["metadata"]["uid"] = "explain:a/a-5"
    nodes = {n["node"]: n for n in explain(snap, new)["extender"]["nodes"]}
    assert nodes["n1"]["fits"] is True
    assert nodes["n2"]["reason"] == "GPU unhealthy: condition GpuUnhealthy=True"
    assert nodes["n3"]["reason"] == "GPU model H100 not in A100"
    assert nodes["n2"]["unresolvable"] and nodes["n3"]["unresolvable"]


def test_explain_names_selector_and_taint_reasons_per_node() -> None:
    """A node the pod's selector or an untolerated taint rules out is named with that
    reason (it used to be listed as fitting, judged on resources alone)."""
    snap = snapshot()
    zoned = node("n2", gpus=4)
    zoned["metadata"]["labels"]["zone"] = "west"
    tainted = node("n3", gpus=4, taints=[{"key": "team", "value": "x", "effect": "NoSchedule"}])
    tainted["metadata"]["labels"]["zone"] = "east"
    snap.objects["Node"] += [zoned, tainted]
    new = pod("a-6", ns="a", gpu=1, phase="Pending")
    new["metadata"]["uid"] = "explain:a/a-6"
    new["spec"]["nodeSelector"] = {"zone": "east"}
    data = explain(snap, new)["extender"]
    nodes = {n["node"]: n for n in data["nodes"]}
    assert nodes["n1"] == {
        "node": "n1",
        "fits": False,
        "reason": "node didn't match Pod's node selector (zone=east; the node has no zone)",
        "unresolvable": True,
    }
    assert nodes["n2"]["reason"].endswith("(zone=east; the node has zone=west)")
    assert nodes["n3"]["reason"] == "node had untolerated taint {team=x:NoSchedule}"
    assert data["fitsNodes"] == 0 and data["verdict"] == (
        "pending: can never fit: no node it may use (node selector, required affinity, "
        "taints, GPU models) would hold it even empty"
    )
    new["spec"]["tolerations"] = [{"key": "team", "operator": "Exists"}]
    nodes = {n["node"]: n for n in explain(snap, new)["extender"]["nodes"]}
    assert nodes["n3"]["fits"] is True and nodes["n2"]["fits"] is False


def test_explain_a_bound_pod() -> None:
    snap = snapshot()
    target = next(p for p in snap.objects["Pod"] if p["metadata"]["name"] == "a-1")
    assert explain(snap, target)["extender"] == {"boundTo": "n1"}


# -- the command line, without a cluster -------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairshare_cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    out = run_cli("status", "--kubeconfig", str(tmp_path / "none"))
    assert out.returncode == 1
    assert out.stderr == f"error: kubeconfig {tmp_path / 'none'} not found (pass --kubeconfig)\n"


def test_unreachable_api_is_one_line(tmp_path: Path) -> None:
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig))
    for command in (["status"], ["explain", "a/b"]):
        out = run_cli(*command, "--kubeconfig", str(path))
        assert out.returncode == 1
        assert out.stderr.startswith(
            "error: cannot reach the Kubernetes API at https://127.0.0.1:1"
        )
        assert out.stderr.count("\n") == 1 and out.stdout == ""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("kind: Service\nmetadata: {name: x}\n", "expected one object of kind: Pod"),
        ("kind: Pod\nmetadata: {}\n", "metadata.name is missing"),
        ("kind: Pod\n  bad: [", "cannot read"),
    ],
)
def test_explain_file_errors(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(body)
    args = cli.build_parser().parse_args(["explain", "-f", str(path)])
    with pytest.raises(live.FairshareError, match=message):
        live._explain_target(args, snapshot())


def test_explain_target_not_found() -> None:
    args = cli.build_parser().parse_args(["explain", "a/nope"])
    with pytest.raises(live.FairshareError, match=r"^pod a/nope not found$"):
        live._explain_target(args, snapshot())


def test_yaml_output_round_trips() -> None:
    data = status(snapshot())
    assert yaml.safe_load(yaml.safe_dump(data, sort_keys=False)) == data


def test_table_cells_show_sevenths_as_decimals() -> None:
    from fairshare.report_render import _cell

    assert _cell("29/7") == "~4.143"
    assert _cell("0.5") == "0.5"
    assert _cell("1536Mi") == "1536Mi"
    assert _cell(None) == "-"


def test_a_pod_whose_selector_matches_no_node_says_so() -> None:
    nowhere = pod("b-zone", ns="b", gpu=1, phase="Pending")
    nowhere["spec"]["nodeSelector"] = {"zone": "nowhere"}
    data = status(snapshot([nowhere]))
    entry = next(p for p in data["pendingPods"] if p["pod"] == "b/b-zone")
    assert entry["fitsNodes"] == 0
    assert entry["reason"] == (
        "no node passes its node selector, required node affinity and tolerations"
    )


def test_status_and_explain_name_the_blocked_pod_under_hold_for_blocked_tenants() -> None:
    """One 4-GPU node; a holds 3 GPUs and waits with a fourth, b waits with a 2-GPU pod
    that fits no node now (1 GPU free) but would fit the node drained. With
    ``holdForBlockedTenants`` a's pod is held, and status and explain name b's pod and
    its shape; without it a's pod is only pending (nothing of b fits now)."""
    pods = [
        *(pod(f"a-{i}", ns="a", gpu=1, node_name="n1") for i in (1, 2, 3)),
        pod("a-4", ns="a", gpu=1, phase="Pending"),
        pod("b-1", ns="b", gpu=2, phase="Pending"),
    ]
    objs = {"Namespace": [namespace("a"), namespace("b")], "Node": [node("n1")], "Pod": pods}
    on = CONFIG.model_copy(update={"hold_for_blocked_tenants": True})
    blocked = "b/b-1 (nvidia.com/gpu 2, cpu 1)"

    data = status(Snapshot(on, objs))
    (held,) = data["heldPods"]
    assert (held["pod"], held["waitingFor"], held["blockedPod"]) == ("a/a-4", "b", blocked)
    assert held["reason"] == (
        "tenant a above its fair share (1.00 > 0.50) while b waits (holdForBlockedTenants: "
        f"its pod {blocked} fits no node now but would fit a drained one)"
    )
    assert f"a/a-4: {held['reason']}" in report.render_status_text(data)

    snap = Snapshot(on, objs)
    ext = explain(snap, pods[3])["extender"]
    assert ext["verdict"] == f"held by the fair-share gate: {held['reason']}"
    assert ext["gate"]["blockedPod"] == blocked
    text = report.render_explain_text(explain(snap, pods[3]))
    assert f"waiting for b (its blocked pod {blocked}: fits no node now" in text

    off = status(Snapshot(CONFIG, objs))
    assert off["heldPods"] == []
