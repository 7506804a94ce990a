"""The pure parts of the cluster benchmark: kube-apiserver metrics into a per-pod budget,
HAMi's node and pod annotations, the chart-rendered HAMi command line, profile summaries,
and the bench-only control plane settings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender import hami
from tests.bench import budget, hami_round, profiles

ROOT = Path(__file__).resolve().parents[2]

METRICS_BEFORE = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 10
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 100
apiserver_request_total_other{verb="GET"} 5
apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",priority_level="exempt"} 50
apiserver_flowcontrol_dispatched_requests_total{flow_schema="kube-scheduler",priority_level="workload-high"} 7
"""  # noqa: E501

METRICS_AFTER = """\
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 30
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 24
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 100
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="PATCH",version="v1"} 1e1
apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",priority_level="exempt"} 90
apiserver_flowcontrol_dispatched_requests_total{flow_schema="kube-scheduler",priority_level="workload-high"} 27
"""  # noqa: E501


def test_request_counts_sum_codes_and_key_by_verb_resource_group_subresource() -> None:
    got = budget.request_counts(METRICS_AFTER)
    assert got == {
        "POST pods": 32.0,
        "POST pods/binding": 24.0,
        "PUT leases.coordination.k8s.io": 100.0,
        "PATCH nodes": 10.0,
    }
    # A metric whose name only starts like it is not read as it.
    assert "GET -" not in budget.request_counts(METRICS_BEFORE)


def test_round_summary_is_the_delta_per_pod_and_drops_what_did_not_move() -> None:
    out = budget.summarise_round(METRICS_BEFORE, METRICS_AFTER, pods=20)
    assert out["requests_per_pod"] == {
        "POST pods": pytest.approx(22 / 20),
        "POST pods/binding": pytest.approx(1.0),
        "PATCH nodes": pytest.approx(0.5),
    }
    assert out["flow_schema_per_pod"] == {"exempt": 2.0, "kube-scheduler": 1.0}
    assert budget.per_pod({"x": 3.0}, 0) == {}


def test_a_counter_that_went_down_or_an_unreadable_sample_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="went down"):
        budget.delta({"POST pods": 5.0}, {"POST pods": 1.0})
    with pytest.raises(ValueError, match="unreadable"):
        budget.parse_samples('apiserver_request_total{verb="GET" 3\n', "apiserver_request_total")
    with pytest.raises(ValueError, match="not a number"):
        budget.parse_samples('apiserver_request_total{verb="GET"} x\n', "apiserver_request_total")


def test_budget_tables_render_rows_columns_and_totals() -> None:
    cpu = budget.cpu_table(
        ["default", "fairshare"],
        {
            "default": {"kube-apiserver": 5.0, "extender": None},
            "fairshare": {"kube-apiserver": 20.0, "extender": 12.5},
        },
        ["kube-apiserver", "extender"],
    )
    assert cpu[0] == "| CPU ms per pod | default | fairshare |"
    assert cpu[2] == "| kube-apiserver | 5.00 | 20.00 |"
    assert cpu[3] == "| extender | – | 12.50 |"
    assert cpu[-1] == "| **all of these** | 5.00 | 32.50 |"
    req = budget.requests_table(
        ["default", "fairshare"],
        {
            "default": {"POST pods": 1.0, "POST pods/binding": 1.0},
            "fairshare": {"POST pods": 1.0, "PATCH pods": 2.0},
        },
        n=2,
    )
    # Top 2 keys by their largest value in any column; missing cells are 0.
    assert req[2:4] == ["| `PATCH pods` | 0.00 | 2.00 |", "| `POST pods` | 1.00 | 1.00 |"]
    assert req[-1] == "| **all requests** | 2.00 | 3.00 |"


def test_hami_register_annotation_is_read_by_fairshares_hami_reader() -> None:
    text = hami_round.register_annotation(7, 8)
    raw = json.loads(text)
    assert "index" not in raw[0] and raw[1]["index"] == 1  # Go's omitempty on index 0
    devices = hami.parse_register(text)
    assert [d.index for d in devices] == list(range(8))
    assert {d.devmem for d in devices} == {hami_round.GPU_MEM_MIB}
    assert all(d.health and d.count == hami_round.SPLIT for d in devices)
    assert len({d.id for d in devices}) == 8
    assert {hami_round.uuid_node_index(d.id) for d in devices} == {7}
    assert hami_round.handshake_annotation(0).startswith("Requesting_19")


def _pod(name: str, node: str | None, value: str | None) -> dict[str, object]:
    ann = {hami_round.ANN_ALLOCATED: value} if value is not None else {}
    return {"metadata": {"name": name, "annotations": ann}, "spec": {"nodeName": node}}


def test_hami_assignment_check_finds_duplicates_wrong_counts_and_foreign_gpus() -> None:
    g = hami_round.gpu_uuid
    ok = [
        _pod("a", "bench-gpu-00001", f"{g(1, 0)},NVIDIA,81920,100:;"),
        _pod("b", "bench-gpu-00001", f"{g(1, 1)},NVIDIA,81920,100:{g(1, 2)},NVIDIA,81920,100:;"),
        _pod("c", None, None),  # not bound: not checked
    ]
    res = hami_round.check_assignments(ok, {"a": 1, "b": 2, "c": 1})
    assert res["ok"] and res["pods_checked"] == 2 and res["devices"] == 3
    bad = [
        *ok[:2],
        _pod("d", "bench-gpu-00001", f"{g(1, 0)},NVIDIA,81920,100:;"),  # given twice
        _pod("e", "bench-gpu-00002", f"{g(1, 3)},NVIDIA,81920,100:;"),  # another node's
        _pod("f", "bench-gpu-00002", f"{g(2, 0)},NVIDIA,81920,100:;"),  # asked for 2
        _pod("h", "bench-gpu-00002", None),
    ]
    res = hami_round.check_assignments(bad, {"a": 1, "b": 2, "d": 1, "e": 1, "f": 2, "h": 1})
    assert not res["ok"]
    assert (res["n_duplicates"], res["n_foreign"], res["n_wrong_count"]) == (1, 1, 1)
    assert res["no_annotation"] == ["h"]
    assert hami_round.check_assignments([], {})["ok"] is False
    with pytest.raises(ValueError, match="want <id>"):
        hami_round.parse_pod_devices("GPU-x,NVIDIA:;")
    assert hami_round.parse_pod_devices(";GPU-x,NVIDIA,1,0:;;") == [[], ["GPU-x"]]


RENDERED = [
    {
        "kind": "ConfigMap",
        "data": {
            "config.yaml": (
                "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                "leaderElection: {leaderElect: true}\nprofiles:\n- schedulerName: hami-scheduler\n"
                "extenders:\n- urlPrefix: http://127.0.0.1:80\n  enableHTTPS: false\n"
                "  filterVerb: filter\n  bindVerb: bind\n  nodeCacheCapable: true\n"
                "  managedResources:\n  - {name: nvidia.com/gpu, ignoredByScheduler: true}\n"
            )
        },
    },
    {"kind": "ConfigMap", "data": {"device-config.yaml": "nvidia:\n  deviceSplitCount: 10\n"}},
    {
        "kind": "Deployment",
        "spec": {"template": {"spec": {"containers": [
            {"name": "kube-scheduler", "command": ["kube-scheduler", "--config=/c.yaml"]},
            {
                "name": "vgpu-scheduler-extender",
                "env": [{"name": "HAMI_NODELOCK_EXPIRE", "value": "5m"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {}}}],
                "command": ["scheduler", "--http_bind=0.0.0.0:80",
                            "--scheduler-name=hami-scheduler",
                            "--metrics-bind-address=:9395", "--node-scheduler-policy=binpack",
                            "--device-config-file=/device-config.yaml", "--leader-elect=true",
                            "--leader-elect-resource-name=hami-scheduler", "--debug", "-v=4"],
            },
        ]}}},
    },
]  # fmt: skip


def test_hami_command_and_scheduler_config_come_from_the_rendered_chart() -> None:
    parts = hami_round.from_rendered(RENDERED)
    h = hami_round.Hami(binary=Path("/c/hami-scheduler"), chart=Path("/c/chart"), **parts)
    assert h.env == {"HAMI_NODELOCK_EXPIRE": "5m"}
    assert h.argv(8080, 8081, Path("/w/dev.yaml")) == [
        "/c/hami-scheduler",
        "--http_bind=127.0.0.1:8080",
        "--scheduler-name=hami-scheduler",
        "--metrics-bind-address=127.0.0.1:8081",
        "--node-scheduler-policy=binpack",
        "--device-config-file=/w/dev.yaml",
        "--leader-elect=false",
        "--kube-qps=500",
        "--kube-burst=1000",
    ]
    cfg = h.scheduler_config(8080)
    assert cfg["profiles"] == [{"schedulerName": "hami-scheduler"}]
    (ext,) = cfg["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:8080" and ext["bindVerb"] == "bind"
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}]
    with pytest.raises(hami_round.HamiUnavailable, match="did not render"):
        hami_round.from_rendered(RENDERED[:2])


def test_hami_lock_owner() -> None:
    assert hami_round.lock_owner("2026-12-03T10:00:00Z,bench-sched,p-00001") == (
        "bench-sched",
        "p-00001",
    )
    assert hami_round.lock_owner("2026-12-03T10:00:00Z") is None
    assert hami_round.lock_owner(None) is None


PPROF_TOP = """\
File: kube-apiserver
Type: cpu
Duration: 20s, Total samples = 31.20s (156.00%)
Showing nodes accounting for 12.5s, 40.06% of 31.20s total
Dropped 1200 nodes (cum <= 0.16s)
      flat  flat%   sum%        cum   cum%
     2.10s  6.73%  6.73%      2.50s  8.01%  runtime.mallocgc
   850ms  2.72%  9.46%   9.80s 31.41%  encoding/json.(*decodeState).object
      0     0%  9.46%     12.30s 39.42%  net/http.(*conn).serve
"""


def test_pprof_top_rows_are_parsed_with_units() -> None:
    rows = profiles.parse_pprof_top(PPROF_TOP)
    assert [r["function"] for r in rows] == [
        "runtime.mallocgc",
        "encoding/json.(*decodeState).object",
        "net/http.(*conn).serve",
    ]
    assert rows[1]["flat_s"] == pytest.approx(0.85) and rows[1]["cum_pct"] == 31.41
    assert rows[2]["flat_s"] == 0 and rows[2]["cum_s"] == pytest.approx(12.3)
    assert len(profiles.parse_pprof_top(PPROF_TOP, 1)) == 1
    assert profiles.go_package("k8s.io/apiserver/pkg/storage/etcd3.(*store).Get") == (
        "k8s.io/apiserver/pkg/storage/etcd3"
    )
    assert profiles.go_package("runtime.spanClass.sizeclass (inline)") == "runtime"
    assert profiles.go_package("p256MulInternal") == "(assembly)"
    assert profiles.go_package("encoding/json.(*decodeState).object") == "encoding/json"
    assert profiles.by_package(rows) == [
        {"package": "runtime", "flat_pct": 6.7},
        {"package": "encoding/json", "flat_pct": 2.7},
        {"package": "net/http", "flat_pct": 0.0},
    ]


def test_collapsed_stacks_give_self_and_inclusive_tops() -> None:
    text = (
        "run (asyncio/runners.py:1);handle (fairshare/app.py:10);dumps (json/encoder.py:5) 6\n"
        "run (asyncio/runners.py:1);handle (fairshare/app.py:12);fit (extender/f.py:3) 3\n"
        "run (asyncio/runners.py:1);handle (fairshare/app.py:10);handle (fairshare/app.py:11) 1\n"
    )
    out = profiles.collapsed_top(text, 2)
    assert out["samples"] == 10
    assert out["self"] == [
        {"function": "dumps (json/encoder.py)", "samples": 6, "pct": 60.0},
        {"function": "fit (extender/f.py)", "samples": 3, "pct": 30.0},
    ]
    # Inclusive: this project's functions only, once per stack even when they recurse.
    assert out["inclusive"] == [
        {"function": "handle (fairshare/app.py)", "samples": 10, "pct": 100.0},
        {"function": "fit (extender/f.py)", "samples": 3, "pct": 30.0},
    ]
    assert [p["function"] for p in out["packages"]] == ["json", "extender"]
    with pytest.raises(ValueError, match="without a count"):
        profiles.collapsed_top("main (a.py:1) x\n")


def _cluster_py() -> Any:
    """tools/e2e/cluster.py, imported by path as the e2e conftest does."""
    name = "fairshare_e2e_cluster"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "e2e" / "cluster.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_bench_tuning_slows_kwok_and_follows_with_the_grace_period_defaults_unchanged(
    tmp_path: Path,
) -> None:
    cluster = _cluster_py()
    paths = cluster.Paths(tmp_path)
    ports = dict.fromkeys(
        (
            "etcd",
            "etcd-peer",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        ),
        1,
    )
    bins = tmp_path / "bin"

    def argv(name: str, **kw: object) -> list[str]:
        tuning = cluster.Tuning(**kw)
        return list(cluster.argv_for(name, bins, paths, ports, None, tuning))

    assert "--node-lease-duration-seconds=40" in argv("kwok")
    assert not any("node-monitor-grace" in a for a in argv("kube-controller-manager"))
    assert "--profiling=false" in argv("kube-apiserver")
    assert "--node-lease-duration-seconds=600" in argv("kwok", node_lease_seconds=600)
    assert "--node-monitor-grace-period=610s" in argv(
        "kube-controller-manager", node_lease_seconds=600
    )
    assert "--profiling=true" in argv("kube-apiserver", apiserver_profiling=True)
    assert not any("kube-api-qps" in a for a in argv("kube-controller-manager"))
    kcm = argv("kube-controller-manager", controller_qps=200)
    assert "--kube-api-qps=200" in kcm and "--kube-api-burst=400" in kcm
    default = cluster.kwok_config()
    assert "durationMilliseconds: 60000" in default
    assert "jitterDurationMilliseconds: 90000" in default
    slow = cluster.kwok_config(600)
    assert "durationMilliseconds: 600000" in slow and "jitterDurationMilliseconds: 900000" in slow
    assert "@" not in slow.split("kind: Stage")[2].split("steps:")[0]
    assert "KwokConfiguration" not in slow
    docs = list(yaml.safe_load_all(cluster.kwok_config(600, 16)))
    assert docs[0]["kind"] == "KwokConfiguration"
    assert docs[0]["options"] == {
        "nodePlayStageParallelism": 16,
        "nodeLeaseParallelism": 16,
        "podPlayStageParallelism": 4,
    }
    assert [d["kind"] for d in docs[1:]] == ["Stage"] * (len(docs) - 1)


def test_cores_busy_multiplies_the_rate_by_the_cpu_of_every_process():
    from tests.bench.bench_cluster import cores_busy_line

    (line,) = cores_busy_line(
        {"default": (180.0, [5.0, 3.0, None, 2.0]), "ours": (75.0, [8.0, 16.0])}, 2
    )
    assert "default 1.80" in line and "ours 1.80" in line and "has 2" in line
    assert cores_busy_line({"x": (0.0, [1.0])}, 2) == []
