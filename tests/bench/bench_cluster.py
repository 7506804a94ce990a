"""Through the real control plane: scheduler throughput and admission overhead.

    python -m tests.bench.bench_cluster [--quick] [--nodes 1000] [--pods 5000] [--reps 2]
                                        [--state-dir .e2e-bench] [--keep-cluster]
                                        [--no-hami] [--profile [SECONDS]]

Uses its own local control plane (``tools/e2e/cluster.py up --state-dir .e2e-bench``:
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok; binaries from
``tools/e2e/build-bins.sh``), never the e2e tests' ``.e2e``. kwok is slowed for the bench
(``--node-lease-seconds 600 --node-heartbeat-seconds 600``: node leases renewed every
150 s instead of 10 s, condition heartbeats every 600–900 s instead of 60–90 s;
kube-controller-manager's node monitor grace period follows the lease, 610 s; kwok's
node stage and lease parallelism 16 instead of 4, ``--kwok-parallelism 16``;
kube-controller-manager's API QPS 200 instead of 20, ``--controller-qps 200``): at 5,000
nodes the default lease renewals alone are 500 writes/s, more than two cores serve, new
nodes wait on 4 kwok workers for their first status, and the node lifecycle controller
adds and removes each new node's not-ready taint at 20 requests/s (10,000 patches).

(a) **Scheduler throughput.** N kwok GPU nodes (8 × ``nvidia.com/gpu`` each, GPU
feature-discovery labels, and registered for HAMi: ``hami.io/node-nvidia-register`` +
``hami.io/node-handshake``, which nothing else reads) and M pods (75 % ask 1 GPU, 25 %
ask 2; 1 CPU, 2 GiB), the same pods in every round, created by an asyncio client (50 in
flight). Four kube-scheduler configurations, alternating within each repetition,
kube-scheduler restarted between rounds: the default profile; our extender with filter +
prioritize (nodeCacheCapable, weight 5, ignorable false, http on 127.0.0.1); the same
plus bind; HAMi's scheduler extender (filter + bind, as its Helm chart configures it,
built from HAMi's sources at bench time: ``tests/bench/hami_round.py`` says how, and what
was changed; left out, with the reason printed, where it cannot be built). The extenders
are real processes with API watches (``fairshare extender --kubeconfig``; HAMi's
``scheduler``). ``percentageOfNodesToScore`` is left at its default. kube-scheduler's
client QPS/burst is raised to 500/1000 in all configurations (the default 50/100 caps
binding at ~50 pods/s and would hide the difference), HAMi's client too. Pods/s = M /
(first create sent → last pod seen bound on a watch, client clock); the 1 s-resolution
server timestamps (creationTimestamp → PodScheduled) are kept in the JSON as a
cross-check. Pods are deleted (grace 0) between rounds. In HAMi's rounds, every pod's
GPUs (its ``hami.io/vgpu-devices-allocated``) are checked: as many as asked, on its node,
none given twice.

**Per-pod budget.** For every round: CPU milliseconds per bound pod of each process, and
API requests per bound pod by verb and resource (the round's delta of kube-apiserver's
``apiserver_request_total``, every client included: the bench's own creates and watch are
the same in every configuration) and by client group (flow schema). ``--profile``: a
kube-apiserver and a kube-scheduler CPU profile (``/debug/pprof/profile``, summarised with
``go tool pprof -top``) and a py-spy recording of the extender, taken during the first
fairshare round (filter + prioritize + bind), saved under ``bench/results/profiles/``.

(b) **Admission overhead.** Pod creates (pods name an unknown scheduler, so nothing but
admission runs) in three namespaces, same run, alternating: none; a ResourceQuota on the
namespace (Kubernetes' built-in admission); our webhook (mutate + validate, registered by
URL with ``caBundle``, ``failurePolicy: Fail``, TLS). Latency of one create at a time
(p50/p99), then creates/s and latency with 50 in flight.

Medians (min–max) over the repetitions; printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import random
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from tests.bench import budget, common, hami_round, profiles
from tests.bench.common import cell, fmt_ms, fmt_num, percentile, progress, spread

CLUSTER_PY = common.ROOT / "tools" / "e2e" / "cluster.py"
BUILD_BINS = common.ROOT / "tools" / "e2e" / "build-bins.sh"
NODE_PREFIX = "bench-gpu-"
NODE_LABEL = "fairshare-bench"
SCHED_NS = "bench-sched"
ADM_NS = {"none": "bench-adm-none", "quota": "bench-adm-quota", "webhook": "bench-adm-webhook"}
WEBHOOK_LABEL = "fairshare-bench-webhook"
CONCURRENCY = 50
PAUSE = "registry.k8s.io/pause:3.10"
QPS, BURST = 500, 1000
BENCH_LEASE_SECONDS = 600
BENCH_HEARTBEAT_SECONDS = 600
BENCH_KWOK_PARALLELISM = 16
BENCH_CONTROLLER_QPS = 200
KINDS = ("default", "extender", "extender+bind", "extender+pick", "hami")
LABELS = {
    "default": "default profile",
    "extender": "+ fairshare filter, prioritize",
    "extender+bind": "+ fairshare filter, prioritize, bind",
    "extender+pick": "+ fairshare filter (--pick-in-filter), bind",
    "hami": "+ HAMi filter, bind",
}
PROCESSES = ("kube-apiserver", "etcd", "kube-scheduler", "extender", "hami", "kwok")
DEFAULT_PODS = 1500
"""Not 5,000: on this 2-core machine the extender rounds run at ~10-15 pods/s (see the
report), so 4 extender rounds of 5,000 pods alone would take ~25 minutes. ``--pods 5000``."""

CONFIG = f"""\
apiVersion: fairshare.io/v1alpha1
kind: FairShareConfig
tenants:
- {{name: bench, namespaces: [{SCHED_NS}]}}
- {{name: bench-adm, namespaces: [{ADM_NS["webhook"]}], limit: {{nvidia.com/gpu: "1000000"}}}}
"""


# -- the API, with a plain aiohttp client (cheap per request) -------------------------------


class Api:
    def __init__(self, server: str, pki: Path) -> None:
        self.server = server
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.ctx = ctx
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=200),
            timeout=aiohttp.ClientTimeout(total=120),
        )

    async def close(self) -> None:
        await self.session.close()

    async def text(self, path: str) -> str:
        async with self.session.get(self.server + path) as r:
            data = await r.text()
            if r.status != 200:
                raise RuntimeError(f"GET {path}: {r.status} {data[:300]!r}")
            return data

    async def call(
        self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)
    ) -> tuple[int, Any]:
        async with self.session.request(method, self.server + path, json=body) as r:
            data = await r.read()
            if r.status not in ok:
                raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
            return r.status, json.loads(data) if data else None


async def bounded(n: int, coros: list[Any]) -> list[Any]:
    sem = asyncio.Semaphore(n)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    return {name: common.cpu_seconds(pid) for name, pid in pids.items()}


def cpu_delta(before: dict[str, float], after: dict[str, float], per: int) -> dict[str, float]:
    """CPU milliseconds per item (pod) spent by each process between two snapshots."""
    return {k: round((after[k] - before[k]) * 1e3 / max(per, 1), 3) for k in before}


def component_pids(state: dict[str, Any]) -> dict[str, int]:
    return {name: int(c["pid"]) for name, c in state.get("components", {}).items()}


# -- manifests -----------------------------------------------------------------------------


def node_index(name: str) -> int:
    return int(name.removeprefix(NODE_PREFIX))


def node_manifest(name: str, now: float | None = None) -> dict[str, Any]:
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    res["nvidia.com/gpu"] = "8"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                NODE_LABEL: "true",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
            },
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                **hami_round.node_annotations(node_index(name), 8, now or time.time()),
            },
        },
        "spec": {},
        "status": {"capacity": dict(res), "allocatable": dict(res), "conditions": []},
    }


def cores_busy_line(
    rounds: Mapping[str, tuple[float | None, Sequence[float | None]]], cores: int | None
) -> list[str]:
    """One sentence: pods/s × CPU ms per pod (all measured processes) per round, the
    cores those processes kept busy. Near the machine's core count in every round, the
    rounds were CPU-bound, and their pods/s ratio is the inverse of their CPU per pod."""
    parts = []
    for label, (rate, cpu) in rounds.items():
        ms = [c for c in cpu if c is not None and not math.isnan(c)]
        if rate and ms:
            parts.append(f"{label} {rate * sum(ms) / 1000:.2f}")
    if not parts:
        return []
    return [
        "Cores kept busy by these processes (pods/s × CPU ms per pod, all of them): "
        + "; ".join(parts)
        + (f" (the machine has {cores})" if cores else "")
        + ". Where every round is near the core count, the rounds were CPU-bound: "
        "pods/s then goes as the inverse of the CPU per pod."
    ]


def pod_manifest(name: str, gpus: int, scheduler: str | None = None) -> dict[str, Any]:
    limits = {"cpu": "1", "memory": "2Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": PAUSE, "resources": {"limits": limits}}],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def workload(m: int, seed: int = 42) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"p-{i:05d}", 2 if rng.random() < 0.25 else 1) for i in range(m)]


def scheduler_config(kind: str, ext_port: int) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"qps": QPS, "burst": BURST},
    }
    if kind != "default":
        ext: dict[str, Any] = {
            "urlPrefix": f"http://127.0.0.1:{ext_port}",
            "filterVerb": "filter",
            "enableHTTPS": False,
            "nodeCacheCapable": True,
            "ignorable": False,
            "httpTimeout": "5s",
        }
        if kind != "extender+pick":  # --pick-in-filter: filter leaves one node, no scoring
            ext.update(prioritizeVerb="prioritize", weight=5)
        if kind in ("extender+bind", "extender+pick"):
            ext["bindVerb"] = "bind"
        cfg["extenders"] = [ext]
    return cfg


# -- cluster lifecycle ---------------------------------------------------------------------


def cluster_py(*args: str, state_dir: Path, timeout: float = 300) -> None:
    argv = [common.PY, str(CLUSTER_PY), *args, "--state-dir", str(state_dir)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"cluster.py {args[0]} failed:\n{proc.stdout}{proc.stderr[-3000:]}")


def ensure_bins() -> None:
    proc = subprocess.run(["bash", str(BUILD_BINS)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"build-bins.sh failed: {proc.stderr[-2000:]}")


def load_state(state_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state_dir / "run" / "state.json").read_text())
    return data


def ready_timeout(n: int) -> float:
    """Seconds to wait for ``n`` new kwok nodes to be Ready: 600, or 0.25 s a node."""
    return max(600.0, 0.25 * n)


async def ensure_nodes(api: Api, n: int) -> float:
    t0 = time.monotonic()
    _, have = await api.call("GET", f"/api/v1/nodes?labelSelector={NODE_LABEL}%3Dtrue")
    names = {i["metadata"]["name"] for i in have["items"]}
    want = {f"{NODE_PREFIX}{i:05d}" for i in range(n)}
    extra = sorted(names - want)
    missing = sorted(want - names)
    await bounded(
        CONCURRENCY, [api.call("DELETE", f"/api/v1/nodes/{x}", ok=(200, 404)) for x in extra]
    )
    await bounded(
        CONCURRENCY, [api.call("POST", "/api/v1/nodes", node_manifest(x)) for x in missing]
    )
    # Nodes of a kept cluster made before they were registered for HAMi.
    unregistered = [
        i["metadata"]["name"]
        for i in have["items"]
        if i["metadata"]["name"] in want
        and hami_round.ANN_REGISTER not in (i["metadata"].get("annotations") or {})
    ]
    now = time.time()
    await bounded(
        CONCURRENCY,
        [
            merge_patch(
                api,
                f"/api/v1/nodes/{x}",
                {"metadata": {"annotations": hami_round.node_annotations(node_index(x), 8, now)}},
            )
            for x in unregistered
        ],
    )
    progress(
        f"nodes: {len(missing)} created, {len(extra)} deleted, {len(unregistered)} "
        "registered for HAMi; waiting for Ready"
    )
    while True:
        _, have = await api.call("GET", f"/api/v1/nodes?labelSelector={NODE_LABEL}%3Dtrue")
        ready = 0
        for item in have["items"]:
            conds = {c["type"]: c["status"] for c in item.get("status", {}).get("conditions", [])}
            taints = [t["key"] for t in item.get("spec", {}).get("taints") or []]
            if conds.get("Ready") == "True" and not any("not-ready" in t for t in taints):
                ready += 1
        if ready >= n and len(have["items"]) == n:
            return time.monotonic() - t0
        if time.monotonic() - t0 > ready_timeout(n):
            raise RuntimeError(f"only {ready}/{n} bench nodes Ready after {ready_timeout(n):.0f}s")
        await asyncio.sleep(2)


async def merge_patch(api: Api, path: str, body: Any, ok: tuple[int, ...] = (200,)) -> int:
    async with api.session.patch(
        api.server + path,
        data=json.dumps(body),
        headers={"Content-Type": "application/merge-patch+json"},
    ) as r:
        data = await r.read()
        if r.status not in ok:
            raise RuntimeError(f"PATCH {path}: {r.status} {data[:300]!r}")
        return r.status


async def ensure_namespace(api: Api, name: str, labels: dict[str, str] | None = None) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    body["metadata"]["labels"] = labels or {}
    status, _ = await api.call("POST", "/api/v1/namespaces", body, ok=(201, 409))
    if status == 409 and labels:
        patch = {"metadata": {"labels": labels}}
        async with api.session.patch(
            api.server + f"/api/v1/namespaces/{name}",
            data=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        ) as r:
            await r.read()
    # Pods need the namespace's default ServiceAccount (ServiceAccount admission).
    for _ in range(240):
        st, _ = await api.call(
            "GET", f"/api/v1/namespaces/{name}/serviceaccounts/default", ok=(200, 404)
        )
        if st == 200:
            return
        await asyncio.sleep(0.25)
    raise RuntimeError(f"no default ServiceAccount in {name}")


async def clear_pods(api: Api, ns: str) -> float:
    """Delete every pod of ``ns`` (grace 0, one DELETE each, 50 in flight: a
    deletecollection of thousands of pods outlives the API server's request timeout)."""
    t0 = time.monotonic()
    opts = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
    while True:
        _, lst = await api.call("GET", f"/api/v1/namespaces/{ns}/pods")
        names = [p["metadata"]["name"] for p in lst["items"]]
        if not names:
            return time.monotonic() - t0
        if time.monotonic() - t0 > 600:
            raise RuntimeError(f"{len(names)} pods in {ns} not gone after 600s")
        await bounded(
            CONCURRENCY,
            [
                api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{n}", opts, ok=(200, 404))
                for n in names
            ],
        )
        await asyncio.sleep(0.5)


# -- (a) scheduler throughput --------------------------------------------------------------


async def watch_bound(
    api: Api, ns: str, rv: str, bound: dict[str, float], stop: asyncio.Event, errors: list[str]
) -> None:
    """Record, per pod name, when a watch first shows it with ``spec.nodeName``
    (``common.follow_pods``: resumed, relisted after a failure)."""

    def on_pod(obj: dict[str, Any]) -> None:
        if obj.get("spec", {}).get("nodeName"):
            bound.setdefault(obj.get("metadata", {}).get("name"), time.monotonic())

    await common.follow_pods(api, ns, rv, on_pod, stop, errors)


def _ts(s: str | None) -> float | None:
    if not s:
        return None
    return dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


async def scheduling_round(
    api: Api,
    pods: list[tuple[str, int]],
    timeout: float,
    ext_base: str | None,
    pids: dict[str, int],
    scheduler: str | None = None,
    hami: bool = False,
    profile: Any = None,
) -> dict[str, Any]:
    """One round: create ``pods`` (with ``scheduler`` as schedulerName), wait until all
    are bound. ``hami``: run the device plugin stand-in and check HAMi's assignments.
    ``profile``: a coroutine function (started when the creates start) taking profiles."""
    _, lst = await api.call("GET", f"/api/v1/namespaces/{SCHED_NS}/pods?limit=1")
    rv0 = lst["metadata"]["resourceVersion"]
    bound: dict[str, float] = {}
    stop = asyncio.Event()
    watch_errors: list[str] = []
    listed_late: list[str] = []
    stall = 90.0
    watcher = asyncio.create_task(watch_bound(api, SCHED_NS, rv0, bound, stop, watch_errors))
    standin_stats = hami_round.StandinStats()
    standin = (
        asyncio.create_task(
            hami_round.device_plugin_standin(api, SCHED_NS, rv0, stop, standin_stats)
        )
        if hami
        else None
    )
    await asyncio.sleep(0.3)
    metrics0 = await scrape_ext(api, ext_base)
    api0 = await api.text("/metrics")
    path = f"/api/v1/namespaces/{SCHED_NS}/pods"
    cpu0 = cpu_snapshot(pids)
    t_first = time.monotonic()
    profiling = asyncio.create_task(profile()) if profile else None
    await bounded(
        CONCURRENCY, [api.call("POST", path, pod_manifest(n, g, scheduler)) for n, g in pods]
    )
    t_created = time.monotonic()
    bound_at_created = len(bound)
    m = len(pods)
    last_progress = time.monotonic()
    seen, seen_at = 0, time.monotonic()
    while len(bound) < m and time.monotonic() - t_first < timeout:
        await asyncio.sleep(0.2)
        if len(bound) != seen:
            seen, seen_at = len(bound), time.monotonic()
        if time.monotonic() - last_progress > 10:
            last_progress = time.monotonic()
            progress(f"  … {len(bound)}/{m} bound after {time.monotonic() - t_first:.0f}s")
        if time.monotonic() - seen_at > 20:
            # No binding seen for 20 s: check the API directly (a stalled watch?).
            _, lst = await api.call("GET", f"/api/v1/namespaces/{SCHED_NS}/pods")
            now = time.monotonic()
            extra = [
                p["metadata"]["name"]
                for p in lst["items"]
                if p.get("spec", {}).get("nodeName") and p["metadata"]["name"] not in bound
            ]
            for name in extra:
                bound[name] = now
                listed_late.append(name)
            if not extra and now - seen_at > stall:
                progress(f"  no binding for {stall:.0f}s: ending the round as incomplete")
                break
            seen, seen_at = len(bound), now if extra else seen_at
    cpu1 = cpu_snapshot(pids)
    api1 = await api.text("/metrics")
    stop.set()
    for task in (watcher, standin):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    metrics1 = await scrape_ext(api, ext_base)
    profiles = None
    if profiling is not None:
        try:
            profiles = await profiling
        except Exception as exc:
            profiles = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    times = sorted(bound.values())
    done = len(times)
    t_last = times[-1] if times else t_first
    # Cross-check from the server's own (1 s resolution) timestamps.
    _, full = await api.call("GET", path)
    created = [_ts(p["metadata"].get("creationTimestamp")) for p in full["items"]]
    sched = [
        _ts(c.get("lastTransitionTime"))
        for p in full["items"]
        for c in p.get("status", {}).get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") == "True"
    ]
    created_f = [x for x in created if x is not None]
    sched_f = [x for x in sched if x is not None]
    server_span = (max(sched_f) - min(created_f)) if sched_f and created_f else None
    per_node: dict[str, int] = {}
    for p in full["items"]:
        nn = p.get("spec", {}).get("nodeName")
        if nn:
            per_node[nn] = per_node.get(nn, 0) + 1
    out: dict[str, Any] = {
        "pods": m,
        "bound": done,
        "complete": done == m,
        "create_s": t_created - t_first,
        "span_s": t_last - t_first,
        "pods_per_s": done / (t_last - t_first) if done and t_last > t_first else 0.0,
        "server_span_s": server_span,
        "server_pods_per_s": (len(sched_f) / server_span) if server_span else None,
        "nodes_used": len(per_node),
        "bound_when_creates_done": bound_at_created,
        "rate_after_creates": (done - bound_at_created) / (t_last - t_created)
        if t_last > t_created
        else None,
        "cpu_ms_per_pod": cpu_delta(cpu0, cpu1, done),
        "watch_errors": watch_errors[:5],
        "bound_seen_only_by_list": len(listed_late),
        "listed_total": len(full["items"]),
    }
    try:
        out["api"] = budget.summarise_round(api0, api1, done)
    except ValueError as exc:
        out["api"] = {"error": str(exc)}
    if hami:
        want = dict(pods)
        out["hami"] = hami_round.check_assignments(full["items"], want) | {
            "standin": dataclasses.asdict(standin_stats) | {"errors": standin_stats.errors[:5]}
        }
    if profiles is not None:
        out["profiles"] = profiles
    if not out["complete"]:
        _, evs = await api.call(
            "GET", f"/api/v1/namespaces/{SCHED_NS}/events?fieldSelector=reason%3DFailedScheduling"
        )
        msgs = sorted({str(e.get("message", ""))[:300] for e in evs.get("items", [])})
        out["failed_scheduling"] = msgs[:5]
        progress(f"  not all bound; FailedScheduling: {msgs[:3]}")
    if ext_base and metrics0 is not None and metrics1 is not None:
        out["extender"] = ext_summary(metrics0, metrics1)
    return out


async def scrape_ext(api: Api, base: str | None) -> str | None:
    if not base:
        return None
    async with api.session.get(f"{base}/metrics", ssl=False) as r:
        return await r.text()


def ext_summary(before: str, after: str) -> dict[str, Any]:
    name = "fairshare_extender_request_duration_seconds"
    out: dict[str, Any] = {}
    for verb in ("filter", "prioritize", "bind"):
        label = f'verb="{verb}"'
        d = common.histogram_delta(
            common.histogram_from_metrics(before, name, label),
            common.histogram_from_metrics(after, name, label),
        )
        calls = d[-1][1] if d else 0.0
        if calls:
            out[verb] = {
                "calls": calls,
                "p50_s": common.histogram_quantile(d, 0.5),
                "p99_s": common.histogram_quantile(d, 0.99),
            }
    return out


@dataclasses.dataclass
class Peers:
    """The extender processes of the scheduler rounds."""

    ext_port: int
    ext_pid: int
    hami: hami_round.Hami | None = None
    hami_port: int = 0
    hami_pid: int = 0
    hami_skipped: str | None = None
    start_pick: Any = None
    """() -> (a ``--pick-in-filter`` extender, ready; its port), for its rounds only."""
    pick_proc: Any = None


async def clear_hami_locks(api: Api) -> int:
    """Remove node locks left by HAMi's binds (none when its stand-in kept up)."""
    _, have = await api.call("GET", f"/api/v1/nodes?labelSelector={NODE_LABEL}%3Dtrue")
    locked = [
        i["metadata"]["name"]
        for i in have["items"]
        if hami_round.ANN_LOCK in (i["metadata"].get("annotations") or {})
    ]
    body = {"metadata": {"annotations": {hami_round.ANN_LOCK: None}}}
    await bounded(CONCURRENCY, [merge_patch(api, f"/api/v1/nodes/{n}", body) for n in locked])
    return len(locked)


def extender_argv(work: Path, state_dir: Path, port: int) -> list[str]:
    argv = [common.PY, "-m", "fairshare_cli", "extender", "--config", str(work / "config.yaml")]
    argv += ["--kubeconfig", str(state_dir / "kubeconfig"), "--host", "127.0.0.1"]
    return [*argv, "--port", str(port), "--log-level", "WARNING"]


def start_pick_extender(work: Path, state_dir: Path) -> tuple[Any, int]:
    """A second extender, with ``--pick-in-filter``, started (and synced) for one round."""
    port = common.free_port()
    argv = [*extender_argv(work, state_dir, port), "--pick-in-filter"]
    proc = common.start(argv, state_dir / "bench-extender-pick.log")
    common.wait_http(f"http://127.0.0.1:{port}/readyz", 120, None, proc)
    return proc, port


async def bench_scheduler(
    api: Api,
    state_dir: Path,
    m: int,
    reps: int,
    peers: Peers,
    work: Path,
    profiler: Any = None,
) -> list[dict[str, Any]]:
    await ensure_namespace(api, SCHED_NS)
    await clear_pods(api, SCHED_NS)
    pods = workload(m)
    rows = []
    kinds = [k for k in KINDS if k != "hami" or peers.hami is not None]
    current = None
    for rep in range(reps):
        for kind in kinds:
            cfg = work / f"sched-{kind.replace('+', '-')}.json"
            if kind == "hami":
                assert peers.hami is not None
                sched_cfg = peers.hami.scheduler_config(peers.hami_port)
                scheduler = peers.hami.scheduler_name
            else:
                sched_cfg = scheduler_config(kind, peers.ext_port)
                scheduler = None
            cfg.write_text(json.dumps(sched_cfg, indent=2))
            pick = None
            ext_port, ext_pid = peers.ext_port, peers.ext_pid
            if kind == "extender+pick":
                pick, ext_port = await asyncio.to_thread(peers.start_pick)
                peers.pick_proc = pick
                ext_pid = pick.pid
                sched_cfg = scheduler_config(kind, ext_port)
                cfg.write_text(json.dumps(sched_cfg, indent=2))
                current = None  # its port is new each time: restart kube-scheduler
            if current != kind:
                t0 = time.monotonic()
                await asyncio.to_thread(
                    cluster_py,
                    "restart-scheduler",
                    "--scheduler-config",
                    str(cfg),
                    state_dir=state_dir,
                )
                progress(f"kube-scheduler restarted with {kind} ({time.monotonic() - t0:.1f}s)")
                current = kind
                await asyncio.sleep(2)  # let its informers sync the nodes
            ext_base = f"http://127.0.0.1:{ext_port}" if kind.startswith("ext") else None
            pids = component_pids(load_state(state_dir)) | {"extender": ext_pid}
            if peers.hami_pid:
                pids["hami"] = peers.hami_pid
            prof = None
            if profiler is not None and kind == "extender+bind" and rep == 0:
                prof = profiler
            # A round ends at this limit even if pods are still being bound: 5 pods/s for
            # the default profile and fairshare, 1 pod/s for HAMi (3-6 pods/s measured).
            timeout = max(300.0, m / 1.0) if kind == "hami" else max(120.0, m / 5.0)
            r = await scheduling_round(
                api, pods, timeout, ext_base, pids, scheduler, kind == "hami", prof
            )
            r.update({"config": kind, "rep": rep})
            rows.append(r)
            extra = ""
            if "hami" in r:
                h = r["hami"]
                extra = (
                    f"; HAMi devices {'OK' if h['ok'] else 'WRONG'} ({h['devices']} GPUs on "
                    f"{h['pods_checked']} pods, {h['n_duplicates']} given twice), stand-in "
                    f"released {h['standin']['locks_released']} locks"
                )
            progress(
                f"scheduler {kind:14s} rep {rep + 1}/{reps}: {r['bound']}/{m} bound, "
                f"{r['pods_per_s']:.1f} pods/s (creates took {r['create_s']:.1f}s, "
                f"{r['bound_when_creates_done']} bound by then); CPU ms/pod "
                f"{r['cpu_ms_per_pod']}{extra}"
            )
            cleared = await clear_pods(api, SCHED_NS)
            progress(f"  pods deleted in {cleared:.1f}s")
            common.stop(pick)
            if kind == "hami":
                left = await clear_hami_locks(api)
                r["hami"]["locks_left"] = left
                if left:
                    progress(f"  {left} HAMi node locks were left; removed")
            await asyncio.sleep(3)  # let the extenders' watches catch the deletes
    return rows


def make_profiler(api: Api, state_dir: Path, ext_pid: int, seconds: float) -> Any:
    """A coroutine function profiling kube-apiserver, kube-scheduler and the extender
    for ``seconds`` at once; files under bench/results/profiles/<date>[-quick]/."""

    async def run() -> dict[str, Any]:
        out = common.RESULTS / "profiles" / common.result_paths()[0].stem
        out.mkdir(parents=True, exist_ok=True)
        state = load_state(state_dir)
        sched = f"https://127.0.0.1:{state['components']['kube-scheduler']['port']}"
        names = ("kube-apiserver", "kube-scheduler", "extender")
        got = await asyncio.gather(
            profiles.go_profile(api.session, api.server, seconds, out / "kube-apiserver.pprof"),
            profiles.go_profile(api.session, sched, seconds, out / "kube-scheduler.pprof"),
            profiles.pyspy_profile(ext_pid, seconds, out / "extender.pyspy.txt"),
            return_exceptions=True,
        )
        res: dict[str, Any] = {"seconds": seconds, "dir": str(out)}
        for name, g in zip(names, got, strict=True):
            res[name] = {"error": f"{type(g).__name__}: {g}"} if isinstance(g, BaseException) else g
        progress(f"  profiles written to {out}")
        return res

    return run


async def hami_nodes(api: Api, metrics_port: int) -> int:
    """How many nodes HAMi's extender has registered (its own device metrics)."""
    async with api.session.get(f"http://127.0.0.1:{metrics_port}/metrics", ssl=False) as r:
        text = await r.text()
    samples = budget.parse_samples(text, "hami_gpu_memory_limit_bytes")
    return len({labels.get("node") for labels, _ in samples})


async def start_hami(
    api: Api, state_dir: Path, work: Path, kube_version: str, nodes: int
) -> tuple[hami_round.Hami, int, Any] | str:
    """HAMi's extender running against the bench cluster, or the reason it cannot be."""
    try:
        progress("HAMi: building/locating its scheduler (cached) and rendering its chart")
        hami = await asyncio.to_thread(hami_round.prepare, kube_version)
    except hami_round.HamiUnavailable as exc:
        return str(exc)
    port, mport = common.free_port(), common.free_port()
    dev = work / "hami-device-config.yaml"
    dev.write_text(hami.device_config)
    env = dict(os.environ) | hami.env | {"KUBECONFIG": str(state_dir / "kubeconfig")}
    argv = hami.argv(port, mport, dev)
    log = state_dir / "bench-hami.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=work, env=env
    )
    try:
        await asyncio.to_thread(
            common.wait_http, f"http://127.0.0.1:{port}/healthz", 120, None, proc
        )
    except RuntimeError as exc:
        common.stop(proc)
        tail = log.read_text(errors="replace")[-800:]
        return f"HAMi's scheduler did not come up: {exc}; log tail: {tail}"
    # It registers the nodes from their annotations every 15 s: wait for all of them, so
    # its first round does not start on an empty device cache.
    t0 = time.monotonic()
    seen = 0
    while time.monotonic() - t0 < 180:
        with contextlib.suppress(Exception):
            seen = await hami_nodes(api, mport)
        if seen >= nodes:
            break
        await asyncio.sleep(1)
    else:
        common.stop(proc)
        return f"HAMi's scheduler registered only {seen}/{nodes} nodes in 180 s"
    progress(f"HAMi registered {seen} nodes in {time.monotonic() - t0:.1f}s")
    hami.notes.append(" ".join([Path(argv[0]).name, *argv[1:]]).replace(str(work) + "/", ""))
    progress(f"HAMi's extender up on 127.0.0.1:{port} (pid {proc.pid})")
    return hami, port, proc


# -- (b) admission overhead ----------------------------------------------------------------


def webhook_configs(port: int, ca: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    def hook(name: str, path: str) -> dict[str, Any]:
        return {
            "name": name,
            "clientConfig": {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            },
            "rules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                }
            ],
            "namespaceSelector": {"matchLabels": {WEBHOOK_LABEL: "on"}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
        }

    mut = hook("mutate.bench.fairshare.io", "/mutate")
    mut["reinvocationPolicy"] = "IfNeeded"
    return (
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "fairshare-bench"},
            "webhooks": [mut],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "fairshare-bench"},
            "webhooks": [hook("validate.bench.fairshare.io", "/validate")],
        },
    )


async def register_webhooks(api: Api, port: int, ca: bytes) -> None:
    mut, val = webhook_configs(port, ca)
    base = "/apis/admissionregistration.k8s.io/v1"
    for kind, body in (
        ("mutatingwebhookconfigurations", mut),
        ("validatingwebhookconfigurations", val),
    ):
        await api.call("DELETE", f"{base}/{kind}/fairshare-bench", ok=(200, 404))
        await api.call("POST", f"{base}/{kind}", body)


async def unregister_webhooks(api: Api) -> None:
    base = "/apis/admissionregistration.k8s.io/v1"
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        with contextlib.suppress(Exception):
            await api.call("DELETE", f"{base}/{kind}/fairshare-bench", ok=(200, 404))


async def webhook_active(api: Api) -> bool:
    """A dry-run create in the webhook namespace comes back with the tenant label."""
    body = pod_manifest("probe", 1, "bench-unscheduled")
    path = f"/api/v1/namespaces/{ADM_NS['webhook']}/pods?dryRun=All"
    for _ in range(120):
        _, out = await api.call("POST", path, body, ok=(200, 201, 500))
        if (out or {}).get("metadata", {}).get("labels", {}).get("fairshare.io/tenant"):
            return True
        await asyncio.sleep(0.5)
    return False


async def create_many(api: Api, ns: str, names: list[str], conc: int) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{ns}/pods"
    lat: list[float] = []

    async def one(name: str) -> None:
        t0 = time.perf_counter()
        await api.call("POST", path, pod_manifest(name, 1, "bench-unscheduled"))
        lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await bounded(conc, [one(n) for n in names])
    wall = time.perf_counter() - t0
    return {
        "n": len(names),
        "concurrency": conc,
        "creates_per_s": len(names) / wall,
        "p50_s": percentile(lat, 50),
        "p99_s": percentile(lat, 99),
    }


async def scrape_webhook(port: int, ctx: ssl.SSLContext) -> str:
    return await asyncio.to_thread(
        lambda: (
            __import__("urllib.request")
            .request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10, context=ctx)
            .read()
            .decode()
        )
    )


def webhook_summary(before: str, after: str) -> dict[str, Any]:
    name = "fairshare_admission_duration_seconds"
    d = common.histogram_delta(
        common.histogram_from_metrics(before, name, "CREATE"),
        common.histogram_from_metrics(after, name, "CREATE"),
    )
    return {
        "calls": d[-1][1] if d else 0,
        "p50_s": common.histogram_quantile(d, 0.5),
        "p99_s": common.histogram_quantile(d, 0.99),
    }


async def bench_admission(
    api: Api, state_dir: Path, reps: int, seq: int, burst: int, work: Path
) -> dict[str, Any]:
    state = load_state(state_dir)
    kc = state_dir / "kubeconfig"
    certs = work / "certs"
    common.make_certs(certs)
    ca = (certs / "ca.crt").read_bytes()
    port = common.free_port()
    cfg = work / "config.yaml"
    argv = [common.PY, "-m", "fairshare_cli", "webhook", "--config", str(cfg)]
    argv += ["--kubeconfig", str(kc)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(certs / "tls.crt")]
    argv += ["--tls-key", str(certs / "tls.key"), "--log-level", "WARNING"]
    await ensure_namespace(api, ADM_NS["none"])
    await ensure_namespace(api, ADM_NS["quota"])
    await ensure_namespace(api, ADM_NS["webhook"], {WEBHOOK_LABEL: "on"})
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "bench"},
        "spec": {
            "hard": {
                "pods": "1000000",
                "requests.cpu": "1000000",
                "requests.memory": "100000Ti",
                "limits.cpu": "1000000",
                "limits.memory": "100000Ti",
                "requests.nvidia.com/gpu": "1000000",
            }
        },
    }
    await api.call(
        "POST", f"/api/v1/namespaces/{ADM_NS['quota']}/resourcequotas", quota, ok=(201, 409)
    )
    proc = common.start(argv, work / "webhook.log")
    out: dict[str, Any] = {"reps": reps, "sequential": seq, "burst": burst, "rounds": []}
    try:
        sctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        await asyncio.to_thread(
            common.wait_http, f"https://127.0.0.1:{port}/readyz", 120, sctx, proc
        )
        await register_webhooks(api, port, ca)
        if not await webhook_active(api):
            raise RuntimeError("the webhook never answered for the bench namespace")
        for ns in ADM_NS.values():
            await clear_pods(api, ns)
        # The quota controller must have computed status.used before creates are judged.
        for _ in range(120):
            _, q = await api.call(
                "GET", f"/api/v1/namespaces/{ADM_NS['quota']}/resourcequotas/bench"
            )
            if (q.get("status") or {}).get("hard"):
                break
            await asyncio.sleep(0.5)
        k = 0
        for rep in range(reps):
            for mode, ns in ADM_NS.items():
                names = [f"a-{k}-{i:05d}" for i in range(seq + burst)]
                k += 1
                pids = component_pids(state) | {"webhook": proc.pid}
                s = await create_many(api, ns, names[:seq], 1)
                h0 = await scrape_webhook(port, sctx)
                c0 = cpu_snapshot(pids)
                b = await create_many(api, ns, names[seq:], CONCURRENCY)
                b["cpu_ms_per_create"] = cpu_delta(c0, cpu_snapshot(pids), burst)
                if mode == "webhook":
                    b["webhook_server"] = webhook_summary(h0, await scrape_webhook(port, sctx))
                out["rounds"].append({"mode": mode, "rep": rep, "sequential": s, "burst": b})
                progress(
                    f"admission {mode:8s} rep {rep + 1}/{reps}: one at a time p50 "
                    f"{fmt_ms(s['p50_s'])} p99 {fmt_ms(s['p99_s'])}; {CONCURRENCY} in flight "
                    f"{b['creates_per_s']:.0f}/s p99 {fmt_ms(b['p99_s'])}"
                )
                await clear_pods(api, ns)
    finally:
        await unregister_webhooks(api)
        common.stop(proc)
    return out


# -- report --------------------------------------------------------------------------------


def summarise(data: dict[str, Any]) -> None:
    sched = data.get("scheduler") or []
    by: dict[str, list[dict[str, Any]]] = {}
    for r in sched:
        by.setdefault(r["config"], []).append(r)
    summ = {}
    base = spread(r["pods_per_s"] for r in by.get("default", []))
    for kind, rows in by.items():
        ratios = []
        for r in rows:
            d = [x for x in by.get("default", []) if x["rep"] == r["rep"]]
            if d and d[0]["pods_per_s"]:
                ratios.append(r["pods_per_s"] / d[0]["pods_per_s"])
        cpu_keys = sorted({k for r in rows for k in r.get("cpu_ms_per_pod", {})})
        s = {
            "cpu_ms_per_pod": {
                k: spread(r["cpu_ms_per_pod"].get(k) for r in rows) for k in cpu_keys
            },
            "rate_after_creates": spread(r["rate_after_creates"] for r in rows),
            "pods_per_s": spread(r["pods_per_s"] for r in rows),
            "server_pods_per_s": spread(r["server_pods_per_s"] for r in rows),
            "ratio_vs_default_same_rep": spread(ratios),
            "complete": all(r["complete"] for r in rows),
            "bound": [r["bound"] for r in rows],
        }
        for verb in ("filter", "prioritize", "bind"):
            vals = [r["extender"][verb] for r in rows if verb in r.get("extender", {})]
            if vals:
                s[f"ext_{verb}_p50_s"] = spread(v["p50_s"] for v in vals)
                s[f"ext_{verb}_p99_s"] = spread(v["p99_s"] for v in vals)
                s[f"ext_{verb}_calls"] = spread(v["calls"] for v in vals)
        for key in ("requests_per_pod", "flow_schema_per_pod"):
            per = [r["api"][key] for r in rows if key in r.get("api", {})]
            names = sorted({k for d in per for k in d})
            s[key] = {k: spread(d.get(k, 0.0) for d in per)["median"] for k in names}
        checks = [r["hami"] for r in rows if "hami" in r]
        if checks:
            per = [
                {k: v / max(r["bound"], 1) for k, v in r["hami"]["standin"]["requests"].items()}
                for r in rows
                if "hami" in r
            ]
            s["standin_requests_per_pod"] = {
                k: spread(d.get(k, 0.0) for d in per)["median"]
                for k in sorted({k for d in per for k in d})
            }
            s["hami_devices_ok"] = all(c["ok"] for c in checks)
            s["hami_checks"] = [
                {k: c[k] for k in ("pods_checked", "devices", "n_duplicates", "n_wrong_count",
                                   "n_no_annotation", "n_foreign")}
                for c in checks
            ]  # fmt: skip
        summ[kind] = s
    data["scheduler_summary"] = summ
    data["scheduler_default_pods_per_s"] = base
    adm = data.get("admission") or {}
    asum = {}
    for mode in ADM_NS:
        rows = [r for r in adm.get("rounds", []) if r["mode"] == mode]
        if rows:
            cpu_keys = sorted({k for r in rows for k in r["burst"].get("cpu_ms_per_create", {})})
            asum[mode] = {
                "cpu_ms_per_create": {
                    k: spread(r["burst"]["cpu_ms_per_create"].get(k) for r in rows)
                    for k in cpu_keys
                },
                "webhook_server_p50_s": spread(
                    r["burst"]["webhook_server"]["p50_s"]
                    for r in rows
                    if "webhook_server" in r["burst"]
                ),
                "webhook_server_p99_s": spread(
                    r["burst"]["webhook_server"]["p99_s"]
                    for r in rows
                    if "webhook_server" in r["burst"]
                ),
                "seq_p50_s": spread(r["sequential"]["p50_s"] for r in rows),
                "seq_p99_s": spread(r["sequential"]["p99_s"] for r in rows),
                "burst_per_s": spread(r["burst"]["creates_per_s"] for r in rows),
                "burst_p50_s": spread(r["burst"]["p50_s"] for r in rows),
                "burst_p99_s": spread(r["burst"]["p99_s"] for r in rows),
            }
    data["admission_summary"] = asum


def profile_markdown(prof: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"#### Where the CPU goes: profiles of {prof.get('seconds', '?'):.0f} s during the "
        "first fairshare round (filter + prioritize + bind)",
        "",
        f"Files in `{common._portable(str(prof.get('dir', '')))}` (Go: `go tool pprof`; "
        "extender: py-spy collapsed stacks, `--nonblocking`). Top 10 by own (flat / self) "
        "CPU, then by cumulative / inclusive:",
    ]
    for name in ("kube-apiserver", "kube-scheduler", "extender"):
        p = prof.get(name) or {}
        lines += ["", f"**{name}**" + (f" ({p['header']})" if p.get("header") else "")]
        if p.get("error"):
            lines += ["", f"not profiled: {p['error']}"]
            continue
        if "top_flat" in p:
            pk = ", ".join(f"`{x['package']}` {x['flat_pct']:.0f} %" for x in p.get("packages", []))
            lines += ["", f"Own CPU by package: {pk}."]
            lines += ["", "| flat % | function | | cum % | function |", "|---:|---|---|---:|---|"]
            for a, b in zip(p["top_flat"][:10], p["top_cum"][:10], strict=False):
                lines.append(
                    f"| {a['flat_pct']:.1f} | `{a['function']}` | | {b['cum_pct']:.1f} "
                    f"| `{b['function']}` |"
                )
        elif "self" in p:
            pk = ", ".join(f"{x['function']} {x['pct']:.0f} %" for x in p.get("packages", [])[:8])
            lines += [
                "",
                f"{p['samples']} samples. Own CPU by package: {pk}.",
                "",
                "| self % | function | | inclusive % | fairshare's functions |",
                "|---:|---|---|---:|---|",
            ]
            for a, b in zip(p["self"][:10], p["inclusive"][:10], strict=False):
                lines.append(
                    f"| {a['pct']:.1f} | `{a['function']}` | | {b['pct']:.1f} | `{b['function']}` |"
                )
    return lines


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "## Through the real control plane (kube-apiserver + kube-scheduler + kwok)",
        "",
        f"Machine: {m['cpu_count']} cores ({m['cpu_model']}); every component (etcd, "
        "kube-apiserver, controller-manager, kube-scheduler, kwok, our servers and the "
        f"client) shares them. Kubernetes {data.get('kube_version', '?')}. "
        f"Other kube-apiservers running during the run: {len(data['other_apiservers'])} "
        f"({'contention possible' if data['other_apiservers'] else 'none'}).",
    ]
    summ = data.get("scheduler_summary") or {}
    kinds = [k for k in KINDS if k in summ]
    if summ:
        tune = data.get("kwok_tuning") or {}
        lines += [
            "",
            f"### Scheduler throughput: {data['nodes']:,} kwok GPU nodes (8 GPUs), "
            f"{data['pods']:,} pods (75 % 1 GPU, 25 % 2 GPUs), {data['reps']} repetitions, "
            "configurations alternating",
            "",
            "Pods/s = pods / (first create sent → last pod seen bound), client clock; "
            f"pods created {CONCURRENCY} in flight. Ratio = pods/s ÷ the default profile's "
            "in the same repetition. kube-scheduler client QPS/burst "
            f"{QPS}/{BURST} in all configurations; percentageOfNodesToScore default. "
            "Extender latencies: fairshare's own histogram during the round (5000 ms = at "
            "or beyond its top bucket, i.e. ≥ 5 s). Aim: ≥ 0.75× default. kwok slowed for "
            f"the bench: node leases {tune.get('node_lease_seconds', '?')} s (renewed every "
            f"{(tune.get('node_lease_seconds') or 0) // 4} s), condition heartbeats every "
            f"{tune.get('node_heartbeat_seconds', '?')}–"
            f"{(tune.get('node_heartbeat_seconds') or 0) * 3 // 2} s, node monitor grace "
            f"period {tune.get('node_monitor_grace_period_s', '?')} s, kwok node stage and lease "
            f"parallelism {tune.get('kwok_parallelism', 4)}, kube-controller-manager API QPS "
            f"{tune.get('controller_qps', 20)} (it taints and untaints every new node).",
            "",
            "| kube-scheduler | pods/s | ratio vs default | all bound | extender filter "
            "p50 / p99 | prioritize p50 / p99 | bind p50 / p99 |",
            "|---|---|---|---|---|---|---|",
        ]
        for kind in kinds:
            s = summ[kind]

            def v(verb: str, s: dict[str, Any] = s) -> str:
                if f"ext_{verb}_p50_s" not in s:
                    return "–"
                return f"{fmt_ms(s[f'ext_{verb}_p50_s']['median'])} / " + fmt_ms(
                    s[f"ext_{verb}_p99_s"]["median"]
                )

            ratio = s["ratio_vs_default_same_rep"]
            rtxt = "1 (baseline)" if kind == "default" else cell(ratio, lambda x: f"{x:.2f}×")
            lines.append(
                f"| {LABELS[kind]} | {cell(s['pods_per_s'], lambda x: f'{x:.1f}')} | {rtxt} "
                f"| {'yes' if s['complete'] else 'NO ' + str(s['bound'])} | {v('filter')} "
                f"| {v('prioritize')} | {v('bind')} |"
            )
        if data.get("hami_skipped"):
            lines += ["", f"HAMi's extender was left out of this run: {data['hami_skipped']}"]
        elif "hami" in summ:
            h = summ["hami"]
            checks = h.get("hami_checks") or []
            standin = h.get("standin_requests_per_pod") or {}
            stext = ", ".join(f"`{k}` {v:.2f}" for k, v in sorted(standin.items()))
            lines += [
                "",
                "HAMi: its scheduler (`./cmd/scheduler`, "
                f"{hami_round.HAMI_VERSION}) as its Helm chart runs it "
                "(`tests/bench/hami_round.py` lists what the bench changes), with "
                f"`--kube-qps={hami_round.QPS} --kube-burst={hami_round.BURST}` (the chart "
                "sets neither; the client default 5/10 caps it near 0.5 pods/s); its device "
                "plugin's part played by the bench at once (a best case for HAMi). GPUs it "
                "assigned: "
                + (
                    "every pod got as many as it asked, on its node, none given twice"
                    if h.get("hami_devices_ok")
                    else f"NOT all correct: {checks}"
                )
                + f" ({', '.join(str(c['devices']) for c in checks)} GPUs). The device "
                f"plugin stand-in's own requests per pod, included in the HAMi column below "
                f"(a device plugin makes them too): {stext or '–'}.",
            ]
        rss = [
            f"fairshare extender {data['extender_peak_rss_mib']:.0f} MiB"
            if data.get("extender_peak_rss_mib")
            else "",
            f"HAMi's extender {data['hami_peak_rss_mib']:.0f} MiB"
            if data.get("hami_peak_rss_mib")
            else "",
        ]
        if any(rss):
            lines += ["", "Peak RSS over the run: " + ", ".join(x for x in rss if x) + "."]
    if summ:
        lines += [
            "",
            "#### Per-pod budget",
            "",
            "CPU milliseconds per scheduled pod during the round (all pods' create → bind "
            "→ kwok status updates; /proc of each process), median of the repetitions. "
            "Both extenders run through every round (an idle one still follows the pods "
            "on its watches):",
            "",
            *budget.cpu_table(
                [LABELS[k] for k in kinds],
                {
                    LABELS[k]: {
                        proc: summ[k]["cpu_ms_per_pod"].get(proc, {}).get("median")
                        for proc in PROCESSES
                    }
                    for k in kinds
                },
                [p for p in PROCESSES if any(p in summ[k]["cpu_ms_per_pod"] for k in kinds)],
            ),
            "",
            *cores_busy_line(
                {
                    LABELS[k]: (
                        summ[k]["pods_per_s"].get("median"),
                        [
                            summ[k]["cpu_ms_per_pod"].get(proc, {}).get("median")
                            for proc in PROCESSES
                        ],
                    )
                    for k in kinds
                },
                data.get("machine", {}).get("cpu_count"),
            ),
            "",
            "kube-apiserver requests per scheduled pod, by verb and resource (the round's "
            "delta of `apiserver_request_total`, every client: the bench's own create and "
            "watch are in every column), median of the repetitions:",
            "",
            *budget.requests_table(
                [LABELS[k] for k in kinds],
                {LABELS[k]: summ[k].get("requests_per_pod") or {} for k in kinds},
            ),
            "",
            "The same requests by client group (kube-apiserver's flow schemas: "
            "`kube-scheduler`; `exempt` = system:masters clients: the bench, both extenders, "
            "the HAMi stand-in, kwok; `kube-controller-manager`, `service-accounts`...):",
            "",
            *budget.requests_table(
                [LABELS[k] for k in kinds],
                {LABELS[k]: summ[k].get("flow_schema_per_pod") or {} for k in kinds},
                8,
            ),
            "",
            "Binding rate once all creates were sent (the scheduler's own pace when "
            "creation is not the limit): "
            + "; ".join(
                f"{LABELS[k]} {cell(summ[k]['rate_after_creates'], lambda x: f'{x:.1f}')}"
                for k in kinds
            )
            + " pods/s.",
        ]
    prof = next((r["profiles"] for r in data.get("scheduler") or [] if r.get("profiles")), None)
    if prof:
        lines += profile_markdown(prof)
    asum = data.get("admission_summary") or {}
    if asum:
        adm = data["admission"]
        lines += [
            "",
            f"### Admission overhead: pod creates through kube-apiserver, {adm['reps']} "
            "repetitions, modes alternating",
            "",
            f"One at a time: {adm['sequential']} creates, latency per create (client). "
            f"{CONCURRENCY} in flight: {adm['burst']} creates. Pods name an unknown scheduler "
            "(admission only). Webhook = `fairshare webhook` mutate + validate over TLS, "
            "registered by URL with caBundle. Aim: webhook adds < 5 ms at p99.",
            "",
            "| admission | p50 one at a time | p99 one at a time | p99 added vs none "
            f"| creates/s ({CONCURRENCY} in flight) | p50 | p99 |",
            "|---|---|---|---|---|---|---|",
        ]
        none99 = (asum.get("none") or {}).get("seq_p99_s", {}).get("median")
        for mode, s in asum.items():
            p99 = s["seq_p99_s"]["median"]
            added = "–" if mode == "none" or none99 is None else fmt_ms(p99 - none99)
            label = {
                "none": "none",
                "quota": "ResourceQuota (built-in)",
                "webhook": "fairshare webhook",
            }[mode]
            lines.append(
                f"| {label} | {cell(s['seq_p50_s'])} | {cell(s['seq_p99_s'])} | {added} "
                f"| {cell(s['burst_per_s'], fmt_num)} | {cell(s['burst_p50_s'])} "
                f"| {cell(s['burst_p99_s'])} |"
            )
    if asum:
        comps = ["kube-apiserver", "etcd", "webhook"]
        lines += [
            "",
            f"CPU milliseconds per create ({CONCURRENCY} in flight), and the webhook's own "
            "handler latency (its histogram, mutate and validate calls together):",
            "",
            "| admission | " + " | ".join(comps) + " | webhook handler p50 / p99 |",
            "|---|" + "---:|" * len(comps) + "---|",
        ]
        for mode, s in asum.items():
            cpu = s.get("cpu_ms_per_create", {})
            vals = [
                f"{cpu[c]['median']:.2f}" if c in cpu and cpu[c]["median"] is not None else "–"
                for c in comps
            ]
            srv = "–"
            if s["webhook_server_p50_s"]["median"] is not None:
                srv = (
                    f"{fmt_ms(s['webhook_server_p50_s']['median'])} / "
                    f"{fmt_ms(s['webhook_server_p99_s']['median'])}"
                )
            lines.append(f"| {mode} | " + " | ".join(vals) + f" | {srv} |")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------


async def run_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    state_dir = args.state_dir.resolve()
    data: dict[str, Any] = {
        "machine": common.machine(),
        "nodes": args.nodes,
        "pods": args.pods,
        "reps": args.reps,
        "quick": args.quick,
        "state_dir": str(state_dir),
    }
    progress("building/locating control-plane binaries (cached)")
    await asyncio.to_thread(ensure_bins)
    t0 = time.monotonic()
    up = ["up", "--node-lease-seconds", str(BENCH_LEASE_SECONDS)]
    up += ["--node-heartbeat-seconds", str(BENCH_HEARTBEAT_SECONDS)]
    up += ["--kwok-parallelism", str(BENCH_KWOK_PARALLELISM)]
    up += ["--controller-qps", str(BENCH_CONTROLLER_QPS)]
    if args.profile:
        up.append("--apiserver-profiling")
    data["kwok_tuning"] = {
        "node_lease_seconds": BENCH_LEASE_SECONDS,
        "node_heartbeat_seconds": BENCH_HEARTBEAT_SECONDS,
        "node_monitor_grace_period_s": BENCH_LEASE_SECONDS + 10,
        "kwok_parallelism": BENCH_KWOK_PARALLELISM,
        "controller_qps": BENCH_CONTROLLER_QPS,
    }
    await asyncio.to_thread(cluster_py, *up, state_dir=state_dir, timeout=600)
    progress(f"control plane up in {time.monotonic() - t0:.1f}s ({state_dir})")
    state = load_state(state_dir)
    with contextlib.suppress(Exception):
        ver = (common.ROOT / "tools" / "e2e" / "versions.env").read_text()
        data["kube_version"] = next(
            x.split("=", 1)[1] for x in ver.splitlines() if x.startswith("KUBE_VERSION")
        )
    data["other_apiservers"] = common.other_apiservers(state_dir)
    api = Api(state["server"], Path(state["pki_dir"]))
    ext = None
    hami_proc = None
    peers = None
    try:
        took = await ensure_nodes(api, args.nodes)
        progress(f"{args.nodes} nodes Ready in {took:.1f}s")
        await asyncio.sleep(5)  # node lifecycle controller settles before the first round
        (work / "config.yaml").write_text(CONFIG)
        if not args.skip_scheduler:
            ext_port = common.free_port()
            argv = extender_argv(work, state_dir, ext_port)
            prof = os.environ.get("FAIRSHARE_BENCH_PROFILE")
            if prof:  # a cProfile dump of the extender, written when it stops
                argv[1:3] = ["-m", "cProfile", "-o", f"{prof}/extender.prof", "-m", "fairshare_cli"]
            ext = common.start(argv, state_dir / "bench-extender.log")
            await asyncio.to_thread(
                common.wait_http, f"http://127.0.0.1:{ext_port}/readyz", 120, None, ext
            )
            peers = Peers(ext_port, ext.pid)
            peers.start_pick = lambda: start_pick_extender(work, state_dir)
            if args.no_hami:
                peers.hami_skipped = "--no-hami"
            else:
                got = await start_hami(
                    api, state_dir, work, data.get("kube_version", "v1.36.3"), args.nodes
                )
                if isinstance(got, str):
                    peers.hami_skipped = got
                    progress(f"HAMi round left out: {got}")
                else:
                    peers.hami, peers.hami_port, hami_proc = got
                    peers.hami_pid = hami_proc.pid
                    data["hami_command"] = peers.hami.notes
            data["hami_skipped"] = peers.hami_skipped
            profiler = None
            if args.profile:
                profiler = make_profiler(api, state_dir, ext.pid, args.profile)
            data["scheduler"] = await bench_scheduler(
                api, state_dir, args.pods, args.reps, peers, work, profiler
            )
            data["extender_peak_rss_mib"] = common.peak_rss_mib(ext.pid)
            if hami_proc is not None:
                data["hami_peak_rss_mib"] = common.peak_rss_mib(hami_proc.pid)
            common.stop(hami_proc)
            hami_proc = None
            common.stop(ext)
            ext = None
            cluster_py(
                "restart-scheduler",
                "--scheduler-config",
                str(work / "sched-default.json"),
                state_dir=state_dir,
            )
        if not args.skip_admission:
            data["admission"] = await bench_admission(
                api, state_dir, args.reps, args.seq, args.burst, work
            )
    finally:
        common.stop(ext)
        common.stop(hami_proc)
        if peers is not None:
            common.stop(peers.pick_proc)
        await api.close()
    data["other_apiservers_end"] = common.other_apiservers(state_dir)
    return data


def run(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 nodes, 300 pods, 1 repetition")
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--pods", type=int, default=None)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--seq", type=int, default=None, help="creates one at a time per round")
    p.add_argument("--burst", type=int, default=None, help="creates 50 in flight per round")
    p.add_argument("--state-dir", type=Path, default=common.ROOT / ".e2e-bench")
    p.add_argument("--keep-cluster", action="store_true", help="leave the control plane up")
    p.add_argument("--skip-scheduler", action="store_true")
    p.add_argument("--skip-admission", action="store_true")
    p.add_argument("--no-hami", action="store_true", help="leave HAMi's extender out")
    p.add_argument(
        "--profile",
        type=float,
        nargs="?",
        const=20.0,
        default=None,
        metavar="SECONDS",
        help="profile kube-apiserver, kube-scheduler and the extender for SECONDS (default "
        "20) during the first fairshare round (filter + prioritize + bind)",
    )
    args = p.parse_args(argv)
    q = args.quick
    if q:
        common.set_quick(True)
    args.nodes = args.nodes or (100 if q else 1000)
    args.pods = args.pods or (300 if q else DEFAULT_PODS)
    args.reps = args.reps or (1 if q else 2)
    args.seq = args.seq or (50 if q else 200)
    args.burst = args.burst or (200 if q else 1000)
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="fairshare-bench-cluster-"))
    try:
        data = asyncio.run(run_async(args, work))
    finally:
        if not args.keep_cluster:
            with contextlib.suppress(Exception):
                cluster_py("down", state_dir=args.state_dir.resolve(), timeout=120)
                progress("control plane stopped")
    summarise(data)
    md = markdown(data)
    jpath, mpath = common.write_results("cluster", data, md)
    print(md)
    print(f"\nwrote {jpath} and {mpath}")
    return md


def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
