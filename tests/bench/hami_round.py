"""HAMi's scheduler extender as a configuration of the cluster benchmark.

Nothing of HAMi is in the repository: ``tools/hami/build-scheduler.sh`` builds its
``./cmd/scheduler`` (cached outside the clone, with a copy of its Helm chart) and this
module renders that chart with helm (``tools/helm/build.sh``) for what a Helm install
runs: the extender's command line, its mandatory device config, and the
KubeSchedulerConfiguration with HAMi's extender (filter + bind, nodeCacheCapable,
``managedResources`` with ``ignoredByScheduler``). Rendered with
``scheduler.admissionWebhook.enabled=false`` so the extender is reached over plain HTTP,
as fairshare's is in the same benchmark. Changed from the chart, for the local control
plane: listen/metrics addresses on 127.0.0.1, leader election off (one replica), the
device config file's path, kubeconfig from ``KUBECONFIG`` (HAMi has no flag), the chart's
``--debug -v=4`` dropped (fairshare runs at WARNING), and ``--kube-qps=500
--kube-burst=1000`` (the chart sets neither; HAMi's client default of 5/10 would cap it
near 0.5 pods/s; kube-scheduler gets 500/1000 in every configuration).

The nodes are registered as HAMi's device plugin registers them (node annotations
``hami.io/node-nvidia-register``, a JSON list of the GPUs, and ``hami.io/node-handshake``).
kwok runs no kubelet, hence no device plugin: :func:`device_plugin_standin` does what the
plugin's Allocate does for a bound pod: bind phase ``allocating`` → ``success``, then
release the node lock ``hami.io/mutex.lock`` held for that pod (a merge patch carrying the
node's resourceVersion, so a lock taken meanwhile by another bind is never removed). It
acts at once: a best case for HAMi.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench import common

BUILD = common.ROOT / "tools" / "hami" / "build-scheduler.sh"
HELM_BUILD = common.ROOT / "tools" / "helm" / "build.sh"
HAMI_VERSION = "v2.9.0"
ANN_REGISTER = "hami.io/node-nvidia-register"
ANN_HANDSHAKE = "hami.io/node-handshake"
ANN_ALLOCATED = "hami.io/vgpu-devices-allocated"
ANN_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ANN_PHASE = "hami.io/bind-phase"
ANN_LOCK = "hami.io/mutex.lock"
GPU_TYPE = "NVIDIA-A100-SXM4-80GB"
GPU_MEM_MIB = 81920
SPLIT = 10
"""The chart's ``devicePlugin.deviceSplitCount``: tasks that may share one GPU."""
QPS, BURST = 500, 1000
DROPPED_FLAGS = ("--debug", "-v=", "--leader-elect-resource-")


class HamiUnavailable(RuntimeError):
    """HAMi's extender cannot be run here (the message says why); the round is left out."""


# -- the nodes, as HAMi's device plugin registers them ------------------------------------


def gpu_uuid(node_index: int, gpu: int) -> str:
    """A UUID-shaped GPU id that names its node and slot (``GPU-0000000g-…-<node>``)."""
    return f"GPU-{gpu:08x}-0000-4000-8000-{node_index:012x}"


def uuid_node_index(uuid: str) -> int:
    """The node index :func:`gpu_uuid` put into ``uuid``; ValueError for any other id."""
    parts = uuid.split("-")
    if len(parts) != 6 or parts[0] != "GPU":
        raise ValueError(f"not a bench GPU id: {uuid!r}")
    return int(parts[5], 16)


def register_annotation(node_index: int, gpus: int) -> str:
    """``hami.io/node-nvidia-register``: the JSON list HAMi's ``MarshalNodeDevices``
    writes, one entry per GPU, zero values left out as Go's ``omitempty`` does."""
    out = []
    for i in range(gpus):
        dev: dict[str, Any] = {"id": gpu_uuid(node_index, i)}
        if i:
            dev["index"] = i
        dev.update(
            count=SPLIT,
            devmem=GPU_MEM_MIB,
            devcore=100,
            type=GPU_TYPE,
            mode="hami-core",
            health=True,
        )
        out.append(dev)
    return json.dumps(out, separators=(",", ":"))


def handshake_annotation(now: float) -> str:
    """``Requesting_<local time as Go's time.DateTime>``, what the device plugin writes."""
    return "Requesting_" + dt.datetime.fromtimestamp(now).strftime("%Y-%m-%d %H:%M:%S")


def node_annotations(node_index: int, gpus: int, now: float) -> dict[str, str]:
    return {
        ANN_REGISTER: register_annotation(node_index, gpus),
        ANN_HANDSHAKE: handshake_annotation(now),
    }


# -- what HAMi assigned ---------------------------------------------------------------------


def parse_pod_devices(value: str) -> list[list[str]]:
    """GPU ids per container of ``hami.io/vgpu-devices-allocated``: per device
    ``<id>,<type>,<mem>,<cores>:``, each container closed by ``;``."""
    out: list[list[str]] = []
    for container in value.split(";"):
        ids = []
        for dev in container.split(":"):
            if not dev.strip():
                continue
            fields = dev.split(",")
            if len(fields) < 4:
                raise ValueError(f"device entry {dev!r}: want <id>,<type>,<mem>,<cores>")
            ids.append(fields[0])
        out.append(ids)
    while out and not out[-1]:
        out.pop()
    return out


def check_assignments(pods: Iterable[Mapping[str, Any]], want: Mapping[str, int]) -> dict[str, Any]:
    """Did HAMi give every bound pod the GPUs it asked for, on its own node, none twice?
    ``want``: GPUs asked per pod name. Lists (a few names each) of what is wrong."""
    owner: dict[str, str] = {}
    dup: list[str] = []
    wrong_count: list[str] = []
    no_annotation: list[str] = []
    foreign: list[str] = []
    checked = devices = 0
    for pod in pods:
        meta = pod.get("metadata", {})
        name = meta.get("name", "?")
        node = pod.get("spec", {}).get("nodeName")
        if not node or name not in want:
            continue
        checked += 1
        ann = meta.get("annotations") or {}
        value = ann.get(ANN_ALLOCATED) or ann.get(ANN_TO_ALLOCATE)
        if not value:
            no_annotation.append(name)
            continue
        ids = [i for c in parse_pod_devices(value) for i in c]
        devices += len(ids)
        if len(ids) != want[name]:
            wrong_count.append(f"{name}: {len(ids)} for {want[name]}")
        for i in ids:
            try:
                on = uuid_node_index(i)
            except ValueError:
                on = -1
            if not node.endswith(f"{on:05d}"):
                foreign.append(f"{name}: {i} not on {node}")
            if i in owner:
                dup.append(f"{i}: {owner[i]} and {name}")
            owner[i] = name
    return {
        "pods_checked": checked,
        "devices": devices,
        "duplicates": dup[:5],
        "n_duplicates": len(dup),
        "wrong_count": wrong_count[:5],
        "n_wrong_count": len(wrong_count),
        "no_annotation": no_annotation[:5],
        "n_no_annotation": len(no_annotation),
        "foreign": foreign[:5],
        "n_foreign": len(foreign),
        "ok": checked > 0 and not (dup or wrong_count or no_annotation or foreign),
    }


# -- building and configuring HAMi's extender ---------------------------------------------


@dataclass
class Hami:
    binary: Path
    chart: Path
    scheduler_name: str
    extender: dict[str, Any]
    """The chart's extender entry (its urlPrefix is replaced by the bench's)."""
    device_config: str
    command: list[str]
    """The chart's extender command line, before the bench's changes."""
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def scheduler_config(self, port: int) -> dict[str, Any]:
        ext = dict(self.extender)
        ext["urlPrefix"] = f"http://127.0.0.1:{port}"
        ext["enableHTTPS"] = False
        return {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"qps": QPS, "burst": BURST},
            "profiles": [{"schedulerName": self.scheduler_name}],
            "extenders": [ext],
        }

    def argv(self, port: int, metrics_port: int, device_config: Path) -> list[str]:
        return bench_argv(self.binary, self.command, port, metrics_port, device_config)


def bench_argv(
    binary: Path, command: list[str], port: int, metrics_port: int, device_config: Path
) -> list[str]:
    """The chart's command line with the bench's changes (see the module docstring)."""
    out = [str(binary)]
    for arg in command[1:]:
        if arg.startswith(DROPPED_FLAGS):
            continue
        if arg.startswith("--http_bind="):
            arg = f"--http_bind=127.0.0.1:{port}"
        elif arg.startswith("--metrics-bind-address="):
            arg = f"--metrics-bind-address=127.0.0.1:{metrics_port}"
        elif arg.startswith("--device-config-file="):
            arg = f"--device-config-file={device_config}"
        elif arg.startswith("--leader-elect="):
            arg = "--leader-elect=false"
        out.append(arg)
    return [*out, f"--kube-qps={QPS}", f"--kube-burst={BURST}"]


def _run(argv: list[str], what: str, timeout: float) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HamiUnavailable(f"{what}: {exc}") from None
    if proc.returncode != 0:
        raise HamiUnavailable(f"{what} failed: {proc.stderr.strip()[-600:]}")
    return proc.stdout


def render_chart(helm: str, chart: Path, kube_version: str) -> dict[str, Any]:
    """The chart's scheduler ConfigMaps and Deployment, rendered (webhook off: HTTP)."""
    import yaml

    out = _run(
        [
            helm,
            "template",
            "hami",
            str(chart),
            "--kube-version",
            kube_version,
            "--set",
            "scheduler.admissionWebhook.enabled=false",
            "-s",
            "templates/scheduler/configmap.yaml",
            "-s",
            "templates/scheduler/device-configmap.yaml",
            "-s",
            "templates/scheduler/deployment.yaml",
        ],
        "helm template (HAMi's chart)",
        300,
    )
    docs = [d for d in yaml.safe_load_all(out) if d]
    return from_rendered(docs)


def from_rendered(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pick the pieces the bench uses out of the chart's rendered documents."""
    import yaml

    cfg = device = None
    command: list[str] | None = None
    env: dict[str, str] = {}
    for d in docs:
        data = d.get("data") or {}
        if d.get("kind") == "ConfigMap" and "config.yaml" in data:
            cfg = yaml.safe_load(data["config.yaml"])
        elif d.get("kind") == "ConfigMap" and "device-config.yaml" in data:
            device = data["device-config.yaml"]
        elif d.get("kind") == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                cmd = c.get("command") or []
                if cmd and any(a.startswith("--http_bind") for a in cmd):
                    command = list(cmd) + list(c.get("args") or [])
                    env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
    if cfg is None or device is None or command is None:
        raise HamiUnavailable(
            "HAMi's chart did not render a scheduler ConfigMap, device ConfigMap and "
            "extender container (chart layout changed?)"
        )
    profiles = cfg.get("profiles") or [{}]
    exts = cfg.get("extenders") or []
    if len(exts) != 1 or not profiles[0].get("schedulerName"):
        raise HamiUnavailable(f"unexpected KubeSchedulerConfiguration in HAMi's chart: {cfg}")
    return {
        "scheduler_name": profiles[0]["schedulerName"],
        "extender": exts[0],
        "device_config": device,
        "command": command,
        "env": env,
    }


def prepare(kube_version: str) -> Hami:
    """Build (or find cached) HAMi's scheduler and render its chart; HamiUnavailable
    with the reason when either cannot be done here."""
    out = _run(["bash", str(BUILD), HAMI_VERSION], "tools/hami/build-scheduler.sh", 3600)
    binary = Path(out.strip().splitlines()[-1])
    helm_out = _run(["bash", str(HELM_BUILD)], "tools/helm/build.sh", 3600)
    helm = helm_out.strip().splitlines()[-1]
    chart = binary.parent / "chart"
    parts = render_chart(helm, chart, kube_version)
    return Hami(binary=binary, chart=chart, **parts)


# -- the device plugin's part, on kwok -----------------------------------------------------


@dataclass
class StandinStats:
    pods: int = 0
    locks_released: int = 0
    lock_conflicts: int = 0
    not_holder: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    """The stand-in's own API requests by ``VERB resource`` (budget.request_key's form)."""
    errors: list[str] = field(default_factory=list)

    def count(self, key: str) -> None:
        self.requests[key] = self.requests.get(key, 0) + 1


def lock_owner(value: str | None) -> tuple[str, str] | None:
    """(namespace, name) of ``hami.io/mutex.lock: <RFC 3339>,<ns>,<name>``; None for a
    missing or time-only lock."""
    if not value:
        return None
    parts = value.split(",")
    return (parts[1], parts[2]) if len(parts) == 3 else None


async def device_plugin_standin(
    api: Any, ns: str, rv: str, stop: asyncio.Event, stats: StandinStats, workers: int = 8
) -> None:
    """Watch ``ns``'s pods from ``rv``; for each bound pod in bind phase ``allocating``:
    PATCH it to ``success``, then release its node's lock if this pod holds it. ``api`` is
    bench_cluster's ``Api`` (aiohttp session, ``call``)."""
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    seen: set[str] = set()

    async def handle(name: str, node: str) -> None:
        merge = {"Content-Type": "application/merge-patch+json"}
        body = {"metadata": {"annotations": {ANN_PHASE: "success"}}}
        stats.count("PATCH pods")
        async with api.session.patch(
            f"{api.server}/api/v1/namespaces/{ns}/pods/{name}", data=json.dumps(body), headers=merge
        ) as r:
            await r.read()
            if r.status != 200:
                stats.errors.append(f"PATCH pod {name}: {r.status}")
                return
        stats.pods += 1
        for _ in range(10):
            stats.count("GET nodes")
            _, n = await api.call("GET", f"/api/v1/nodes/{node}")
            meta = n["metadata"]
            if lock_owner((meta.get("annotations") or {}).get(ANN_LOCK)) != (ns, name):
                stats.not_holder += 1
                return
            unlock: dict[str, Any] = {
                "metadata": {
                    "resourceVersion": meta["resourceVersion"],
                    "annotations": {ANN_LOCK: None},
                }
            }
            stats.count("PATCH nodes")
            async with api.session.patch(
                f"{api.server}/api/v1/nodes/{node}", data=json.dumps(unlock), headers=merge
            ) as r:
                await r.read()
                if r.status == 200:
                    stats.locks_released += 1
                    return
                if r.status != 409:
                    stats.errors.append(f"PATCH node {node}: {r.status}")
                    return
                stats.lock_conflicts += 1
        stats.errors.append(f"node {node}: lock of {name} not released after 10 conflicts")

    async def worker() -> None:
        while True:
            name, node = await queue.get()
            try:
                await handle(name, node)
            except Exception as exc:
                stats.errors.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
            finally:
                queue.task_done()

    def on_pod(obj: dict[str, Any]) -> None:
        meta = obj.get("metadata", {})
        node = obj.get("spec", {}).get("nodeName")
        phase = (meta.get("annotations") or {}).get(ANN_PHASE)
        name = meta.get("name", "")
        if node and phase == "allocating" and name not in seen:
            seen.add(name)
            queue.put_nowait((name, node))

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    try:
        await common.follow_pods(api, ns, rv, on_pod, stop, stats.errors, what="watch: ")
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
