"""Peak memory of the extender holding a large cluster.

    python -m tests.bench.bench_memory [--quick] [--sizes 1000:10000 10000:100000]

For each ``NODES:PODS`` size a synthetic Kubernetes ``List`` is written (GPU nodes of
four shapes with NVIDIA feature-discovery labels; pods across six tenants and twelve
namespaces, shaped like ``kubectl get pods -o json`` output without ``managedFields``:
owner references, env, a service-account volume, tolerations, status conditions and
container statuses). Most pods are bound: whole-GPU pods (1, 2, 4 or 8 devices),
fractional pods (``fairshare.io/gpu-fraction`` 1/4 or 1/2) and CPU-only pods, every
fractional pod and half of the whole-GPU pods carrying the ``fairshare.io/gpu-devices``
annotation the extender's bind writes; the pods that did not fit stay pending.

The real ``fairshare extender --state FILE`` process reads it, and once ``/readyz``
answers a few filter and prioritize calls are sent (500 candidates and every node, a
fractional and a whole-GPU pod) so every cache the verbs build exists. Then the
process' ``VmHWM`` (peak resident set) and ``VmRSS`` are read from ``/proc``. Aim:
peak under 500 MiB at 10,000 nodes and 100,000 pods. Figures, never asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.bench import common
from tests.bench.common import progress

SIZES = ((1_000, 10_000), (10_000, 100_000))
QUICK_SIZES = ((1_000, 10_000),)
AIM_MIB = 500.0
SEED = 11

# (share of nodes, GPUs, GPU memory MiB, product, cpu cores, memory GiB)
SHAPES = (
    (0.40, 8, 81920, "NVIDIA-A100-SXM4-80GB", 128, 1024),
    (0.20, 8, 81559, "NVIDIA-H100-80GB-HBM3", 192, 2048),
    (0.25, 4, 23034, "NVIDIA-L4", 64, 256),
    (0.15, 2, 15360, "Tesla-T4", 32, 128),
)
TENANTS = ("vision", "speech", "nlp", "recsys", "research", "platform")
NAMESPACES = tuple(f"{t}-{kind}" for t in TENANTS for kind in ("train", "serve"))
# (share of pods, whole GPUs, fraction in quarters (0 = none), cpu, memory GiB)
POD_KINDS = (
    (0.30, 1, 0, 8, 64),
    (0.10, 2, 0, 16, 128),
    (0.04, 4, 0, 32, 256),
    (0.01, 8, 0, 64, 512),
    (0.25, 0, 1, 2, 16),
    (0.15, 0, 2, 4, 32),
    (0.15, 0, 0, 1, 4),
)

CONFIG = "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\ntenants:\n" + "".join(
    f"- {{name: {t}, namespaces: [{t}-train, {t}-serve], weight: {1 + k % 3}}}\n"
    for k, t in enumerate(TENANTS)
)


def node(name: str, shape: tuple[float, int, int, str, int, int]) -> dict[str, Any]:
    _, gpus, mem_mib, product, cpu, mem_gib = shape
    res = {
        "cpu": str(cpu),
        "memory": f"{mem_gib}Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        "nvidia.com/gpu": str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-{name}",
            "resourceVersion": "1",
            "creationTimestamp": "2026-11-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": product.lower(),
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(mem_mib),
            },
        },
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "capacity": res,
            "allocatable": res,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficient"},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"},
            ],
            "nodeInfo": {"kubeletVersion": "v1.36.3", "containerRuntimeVersion": "containerd"},
        },
    }


def pod(
    k: int,
    ns: str,
    kind: tuple[float, int, int, int, int],
    *,
    node_name: str | None,
    devices: str | None,
) -> dict[str, Any]:
    _, whole, quarters, cpu, mem_gib = kind
    name = f"job-{k:06d}-worker"
    requests = {"cpu": str(cpu), "memory": f"{mem_gib}Gi"}
    if whole:
        requests["nvidia.com/gpu"] = str(whole)
    annotations = {"kubectl.kubernetes.io/default-container": "main"}
    if quarters:
        annotations["fairshare.io/gpu-fraction"] = f"{quarters}/4"
    if devices:
        annotations["fairshare.io/gpu-devices"] = devices
    uid = f"00000000-0000-4000-8000-{k:012d}"
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example.com/ml/train:2026.11",
                "command": ["python", "-m", "train"],
                "args": ["--config", "/etc/job/config.yaml"],
                "env": [
                    {"name": "JOB_NAME", "value": f"job-{k:06d}"},
                    {"name": "NCCL_DEBUG", "value": "WARN"},
                    {"name": "OMP_NUM_THREADS", "value": str(cpu)},
                ],
                "resources": {"requests": requests, "limits": dict(requests)},
                "volumeMounts": [
                    {
                        "name": "kube-api-access",
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "readOnly": True,
                    }
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "volumes": [
            {
                "name": "kube-api-access",
                "projected": {
                    "sources": [{"serviceAccountToken": {"path": "token"}}],
                    "defaultMode": 420,
                },
            }
        ],
        "restartPolicy": "Never",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    }
    status: dict[str, Any] = {"phase": "Pending", "qosClass": "Guaranteed"}
    if node_name:
        spec["nodeName"] = node_name
        status = {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "PodScheduled")
            ],
            "hostIP": "10.1.0.1",
            "podIP": f"10.2.{k // 250 % 256}.{k % 250}",
            "startTime": "2026-12-01T10:00:00Z",
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example.com/ml/train:2026.11",
                    "imageID": "registry.example.com/ml/train@sha256:" + "0" * 64,
                    "containerID": f"containerd://{k:064x}",
                    "started": True,
                    "state": {"running": {"startedAt": "2026-12-01T10:00:05Z"}},
                }
            ],
            "qosClass": "Guaranteed",
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"job-{k:06d}-",
            "namespace": ns,
            "uid": uid,
            "resourceVersion": str(1000 + k),
            "creationTimestamp": "2026-12-01T09:59:58Z",
            "labels": {
                "app.kubernetes.io/name": "train",
                "batch.kubernetes.io/job-name": f"job-{k:06d}",
                "batch.kubernetes.io/controller-uid": f"ctl-{k:08d}",
            },
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": f"job-{k:06d}",
                    "uid": f"ctl-{k:08d}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
        "status": status,
    }


def _choose(rng: random.Random, table: tuple[Any, ...]) -> Any:
    x, acc = rng.random(), 0.0
    for row in table:
        acc += row[0]
        if x < acc:
            return row
    return table[-1]


def state_list(n_nodes: int, n_pods: int, seed: int = SEED) -> dict[str, Any]:
    """The synthetic List: namespaces, nodes, then pods (bound where they fit)."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
        }
        for ns in NAMESPACES
    ]
    names, shapes = [], []
    for i in range(n_nodes):
        shape = _choose(rng, SHAPES)
        name = f"gpu-{i:05d}"
        items.append(node(name, shape))
        names.append(name)
        shapes.append(shape)
    # Free quarters per device and free CPU per node, to place pods consistently.
    dev_free = [[4] * s[1] for s in shapes]
    cpu_free = [s[4] for s in shapes]
    bound = 0
    for k in range(n_pods):
        kind = _choose(rng, POD_KINDS)
        _, whole, quarters, cpu, _ = kind
        placed: tuple[str, str | None] | None = None
        for _attempt in range(8):
            i = rng.randrange(n_nodes)
            if cpu_free[i] < cpu:
                continue
            devs = dev_free[i]
            if whole:
                free = [d for d, q in enumerate(devs) if q == 4][:whole]
                if len(free) < whole:
                    continue
                for d in free:
                    devs[d] = 0
                ann = ",".join(f"{d}:1000" for d in free) if rng.random() < 0.5 else None
                placed = (names[i], ann)
            elif quarters:
                fits = sorted((q, d) for d, q in enumerate(devs) if q >= quarters)
                if not fits:
                    continue
                d = fits[0][1]
                devs[d] -= quarters
                placed = (names[i], f"{d}:{quarters * 250}")
            else:
                placed = (names[i], None)
            cpu_free[i] -= cpu
            break
        ns = rng.choice(NAMESPACES)
        node_name, devices = placed if placed is not None else (None, None)
        bound += placed is not None
        items.append(pod(k, ns, kind, node_name=node_name, devices=devices))
    return {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": items,
        "bound": bound,
    }


def _pending_probe(j: int, whole: int) -> dict[str, Any]:
    kind = POD_KINDS[0] if whole else POD_KINDS[5]
    p = pod(900_000 + j, NAMESPACES[j % len(NAMESPACES)], kind, node_name=None, devices=None)
    return p


def _post(url: str, body: dict[str, Any]) -> float:
    data = json.dumps(body, separators=(",", ":")).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
    return time.perf_counter() - t0


def _status_kib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return float(line.split()[1])
    return float("nan")


def measure(n_nodes: int, n_pods: int, work: Path) -> dict[str, Any]:
    cfg = work / "config.yaml"
    cfg.write_text(CONFIG)
    doc = state_list(n_nodes, n_pods)
    bound = doc.pop("bound")
    st = work / f"state-{n_nodes}-{n_pods}.json"
    st.write_text(json.dumps(doc, separators=(",", ":")))
    del doc
    size = st.stat().st_size
    port = common.free_port()
    argv = [common.PY, "-m", "fairshare_cli", "extender", "--config", str(cfg), "--state", str(st)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]
    t0 = time.monotonic()
    proc = common.start(argv, work / f"extender-{n_nodes}.log")
    try:
        base = f"http://127.0.0.1:{port}"
        common.wait_http(f"{base}/readyz", 600, proc=proc)
        startup = time.monotonic() - t0
        hwm_load = _status_kib(proc.pid, "VmHWM") / 1024
        rss_load = _status_kib(proc.pid, "VmRSS") / 1024
        rng = random.Random(SEED)
        names = [f"gpu-{i:05d}" for i in range(n_nodes)]
        calls: list[float] = []
        for j in range(4):
            for cands in (500, n_nodes):
                chosen = names if cands >= n_nodes else rng.sample(names, cands)
                body = {"Pod": _pending_probe(j, j % 2), "Nodes": None, "NodeNames": chosen}
                for verb in ("filter", "prioritize"):
                    calls.append(_post(f"{base}/{verb}", body))
        return {
            "nodes": n_nodes,
            "pods": n_pods,
            "bound_pods": bound,
            "state_file_mib": size / 2**20,
            "bytes_per_pod_json": size / max(1, n_pods + n_nodes),
            "startup_s": startup,
            "peak_rss_mib_after_load": hwm_load,
            "rss_mib_after_load": rss_load,
            "peak_rss_mib": _status_kib(proc.pid, "VmHWM") / 1024,
            "rss_mib": _status_kib(proc.pid, "VmRSS") / 1024,
            "verb_calls": len(calls),
            "slowest_call_s": max(calls),
        }
    finally:
        common.stop(proc)


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "## Extender memory (`tests.bench.bench_memory`)",
        "",
        f"Machine: {m['cpu_count']} cores ({m['cpu_model']}), Python {m['python']}. One "
        "`fairshare extender --state FILE` process over a synthetic List (GPU nodes of four "
        "shapes, 2-8 GPUs; pods as `kubectl get -o json` writes them without managedFields, "
        "six tenants, twelve namespaces, whole, fractional and CPU-only). Read after "
        "`/readyz` and 16 filter/prioritize calls (500 candidates and every node). "
        f"Aim: peak < {AIM_MIB:.0f} MiB at 10,000 nodes and 100,000 pods.",
        "",
        "| nodes | pods (bound) | state file | start-up to ready | peak RSS (VmHWM) "
        "| RSS after the calls | aim |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in data["rows"]:
        aim = ""
        if r["nodes"] >= 10_000:
            aim = f"< {AIM_MIB:.0f} MiB " + ("met" if r["peak_rss_mib"] < AIM_MIB else "missed")
        lines.append(
            f"| {r['nodes']:,} | {r['pods']:,} ({r['bound_pods']:,}) "
            f"| {r['state_file_mib']:.0f} MiB ({r['bytes_per_pod_json']:,.0f} B/object) "
            f"| {r['startup_s']:.1f} s | {r['peak_rss_mib']:.0f} MiB | {r['rss_mib']:.0f} MiB "
            f"| {aim} |"
        )
    return "\n".join(lines)


def run(
    quick: bool, sizes: tuple[tuple[int, int], ...] | None = None, *, write: bool = True
) -> str:
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    if quick:
        common.set_quick(True)
    data: dict[str, Any] = {"machine": common.machine(), "rows": []}
    work = Path(tempfile.mkdtemp(prefix="fairshare-bench-mem-"))
    try:
        for n_nodes, n_pods in sizes:
            row = measure(n_nodes, n_pods, work)
            data["rows"].append(row)
            progress(
                f"memory: {n_nodes:,} nodes, {n_pods:,} pods: peak {row['peak_rss_mib']:.0f} MiB"
                f", RSS {row['rss_mib']:.0f} MiB, ready in {row['startup_s']:.1f}s"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    md = markdown(data)
    if write:
        common.write_results("memory", data, md)
    print(md)
    return md


def _size(text: str) -> tuple[int, int]:
    nodes, _, pods = text.partition(":")
    return int(nodes), int(pods)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", type=_size, nargs="+", default=None, help="NODES:PODS ...")
    p.add_argument("--no-write", action="store_true", help="print only, write no results")
    args = p.parse_args(argv)
    run(args.quick, tuple(args.sizes) if args.sizes else None, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
