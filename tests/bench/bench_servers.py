"""The extender and the webhook alone on loopback, driven by a separate load generator.

    python -m tests.bench.bench_servers [--quick] [--sizes 1000 5000 10000] [--reps 3]
                                        [--no-webhook] [--no-write] [--extender-tls]

Each server runs as its own process from the real command line (``fairshare extender``
/ ``fairshare webhook --state FILE``) over a synthetic Kubernetes ``List``: N GPU nodes
× 8 GPUs (NVIDIA feature-discovery labels), ``PODS_PER_NODE`` bound pods per node
(0–2 GPUs each, some CPU-only) across four tenants. ``tests.bench.loadgen`` runs as
another process and keeps its connections alive.

Extender: ``/filter`` and ``/prioritize`` with the nodeCacheCapable body (``NodeNames``,
``Nodes: null``) for a pending 1-GPU pod, at 500 candidates and with every node a
candidate; one request at a time (kube-scheduler calls an extender sequentially from
its scheduling cycle). ``--extender-tls``: over HTTPS, as with ``enableHTTPS``.
Client-side latency is exact; server-side latency comes from the extender's own
``fairshare_extender_request_duration_seconds`` histogram (difference of two scrapes,
interpolated inside buckets as Prometheus' ``histogram_quantile`` does).

Webhook: over TLS (``fairshare certs``), HTTP/1.1 keep-alive: admissions/s at saturation
(closed loop, 8 connections) and p50/p99 at a fixed offered load of 1,000/s (open loop,
latency from the scheduled send time). Pod CREATE reviews with distinct names, so the
validating side makes real reservations.

Figures are medians (min–max) over ``--reps`` repetitions of each cell; never asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.bench import common
from tests.bench.common import cell, fmt_num, progress, spread

SIZES = (1_000, 5_000, 10_000)
GPUS_PER_NODE = 8
PODS_PER_NODE = 4
TENANTS = ("team-a", "team-b", "team-c", "team-d")
SEED = 7
CANDIDATES = 500

CONFIG = """\
apiVersion: fairshare.io/v1alpha1
kind: FairShareConfig
tenants:
- {name: team-a, namespaces: [team-a], weight: 1, limit: {nvidia.com/gpu: "100000"}}
- {name: team-b, namespaces: [team-b], weight: 1, limit: {nvidia.com/gpu: "100000"}}
- {name: team-c, namespaces: [team-c], weight: 2}
- {name: team-d, namespaces: [team-d], weight: 4}
"""


def node(name: str) -> dict[str, Any]:
    res = {
        "cpu": "96",
        "memory": "768Gi",
        "pods": "110",
        "ephemeral-storage": "2Ti",
        "nvidia.com/gpu": str(GPUS_PER_NODE),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(GPUS_PER_NODE),
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
            },
        },
        "spec": {},
        "status": {
            "capacity": res,
            "allocatable": res,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(name: str, ns: str, gpus: int, *, node_name: str | None, uid: str) -> dict[str, Any]:
    limits = {"cpu": "4", "memory": "32Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example.com/train:1",
                "resources": {"limits": limits, "requests": dict(limits)},
            }
        ],
        "schedulerName": "default-scheduler",
        "restartPolicy": "Never",
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid,
            "labels": {"app": name.rsplit("-", 1)[0]},
        },
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def state_list(n: int, seed: int = SEED) -> dict[str, Any]:
    rng = random.Random(seed)
    items: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": t, "labels": {"kubernetes.io/metadata.name": t}},
        }
        for t in TENANTS
    ]
    k = 0
    for i in range(n):
        name = f"gpu-{i:05d}"
        items.append(node(name))
        free = GPUS_PER_NODE
        for _ in range(PODS_PER_NODE):
            gpus = min(free, rng.choice((0, 1, 1, 2)))
            free -= gpus
            ns = rng.choice(TENANTS)
            items.append(
                pod(
                    f"job-{k:06d}",
                    ns,
                    gpus,
                    node_name=name,
                    uid=f"00000000-0000-4000-8000-{k:012d}",
                )
            )
            k += 1
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}


def pending_pod(i: int) -> dict[str, Any]:
    return pod(
        f"pending-{i}", TENANTS[i % 2], 1, node_name=None, uid=f"11111111-0000-4000-8000-{i:012d}"
    )


def extender_bodies(n: int, cands: int, reps: int = 8) -> bytes:
    rng = random.Random(SEED + cands)
    names = [f"gpu-{i:05d}" for i in range(n)]
    lines = []
    for j in range(reps):
        chosen = names if cands >= n else rng.sample(names, cands)
        body = {"Pod": pending_pod(j % 4), "Nodes": None, "NodeNames": chosen}
        lines.append(json.dumps(body, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


def admission_bodies(k: int) -> bytes:
    lines = []
    for i in range(k):
        ns = TENANTS[i % 2]
        obj = pod(f"bench-{i:06d}", ns, 1, node_name=None, uid=f"22222222-0000-4000-8000-{i:012d}")
        obj["metadata"]["creationTimestamp"] = "2026-12-02T16:40:00Z"
        del obj["status"]
        review = {
            "kind": "AdmissionReview",
            "apiVersion": "admission.k8s.io/v1",
            "request": {
                "uid": f"33333333-0000-4000-8000-{i:012d}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "name": obj["metadata"]["name"],
                "namespace": ns,
                "operation": "CREATE",
                "userInfo": {"username": "bench@example.com", "groups": ["system:authenticated"]},
                "object": obj,
                "oldObject": None,
                "dryRun": False,
                "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
            },
        }
        lines.append(json.dumps(review, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


def loadgen(port: int, path: str, bodies: Path, *extra: str) -> dict[str, Any]:
    argv = [common.PY, "-m", "tests.bench.loadgen", "--port", str(port), "--path", path]
    argv += ["--bodies", str(bodies), *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=common.ROOT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"loadgen failed: {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def scrape(url: str, ctx: Any = None) -> str:
    with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
        text: str = r.read().decode()
        return text


# -- extender ------------------------------------------------------------------------------


def bench_extender(
    sizes: tuple[int, ...], reps: int, seconds: float, work: Path, tls: bool = False
) -> list[dict[str, Any]]:
    """``tls``: the extender serves HTTPS (``--tls-cert``), the load generator verifies it
    and keeps its connection, as kube-scheduler does with ``enableHTTPS``."""
    import ssl

    rows: list[dict[str, Any]] = []
    cfg = work / "config.yaml"
    cfg.write_text(CONFIG)
    ctx = None
    tls_args: list[str] = []
    serve_tls: list[str] = []
    if tls:
        certs = work / "ext-certs"
        ca = common.make_certs(certs)
        ctx = ssl.create_default_context(cafile=str(ca))
        tls_args = ["--tls-ca", str(ca)]
        serve_tls = ["--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key")]
    for n in sizes:
        st = work / f"state-{n}.json"
        st.write_text(json.dumps(state_list(n), separators=(",", ":")))
        port = common.free_port()
        argv = [common.PY, "-m", "fairshare_cli", "extender", "--config", str(cfg)]
        argv += ["--state", str(st), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--log-level", "WARNING", *serve_tls]
        t0 = time.monotonic()
        proc = common.start(argv, work / f"extender-{n}.log")
        try:
            base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
            common.wait_http(f"{base}/readyz", 300, ctx=ctx, proc=proc)
            startup = time.monotonic() - t0
            rss0 = common.rss_mib(proc.pid)
            progress(
                f"extender: {n:,} nodes, {n * PODS_PER_NODE:,} pods loaded in {startup:.1f}s, "
                f"RSS {rss0:.0f} MiB"
            )
            for cands in (CANDIDATES, n):
                bodies = work / f"ext-{n}-{cands}.jsonl"
                bodies.write_bytes(extender_bodies(n, cands))
                for verb in ("filter", "prioritize"):
                    client: list[dict[str, Any]] = []
                    server_p50: list[float] = []
                    server_p99: list[float] = []
                    for _ in range(reps):
                        label = f'verb="{verb}"'
                        name = "fairshare_extender_request_duration_seconds"
                        h0 = common.histogram_from_metrics(
                            scrape(f"{base}/metrics", ctx), name, label
                        )
                        r = loadgen(
                            port,
                            f"/{verb}",
                            bodies,
                            *tls_args,
                            "--mode=closed",
                            "--concurrency=1",
                            f"--duration={seconds}",
                            "--warmup=0.3",
                        )
                        h1 = common.histogram_from_metrics(
                            scrape(f"{base}/metrics", ctx), name, label
                        )
                        d = common.histogram_delta(h0, h1)
                        server_p50.append(common.histogram_quantile(d, 0.5))
                        server_p99.append(common.histogram_quantile(d, 0.99))
                        client.append(r)
                    row = {
                        "tls": tls,
                        "nodes": n,
                        "pods": n * PODS_PER_NODE,
                        "verb": verb,
                        "candidates": cands,
                        "reps": reps,
                        "requests_per_rep": [r["requests"] for r in client],
                        "errors": sum(r["errors"] for r in client),
                        "client_p50_s": spread(r["p50_s"] for r in client),
                        "client_p99_s": spread(r["p99_s"] for r in client),
                        "server_p50_s": spread(server_p50),
                        "server_p99_s": spread(server_p99),
                        "calls_per_s": spread(r["throughput"] for r in client),
                        "startup_s": startup,
                    }
                    rows.append(row)
                    progress(
                        f"extender {verb:10s} {n:6,} nodes {cands:6,} cand: client p50 "
                        f"{cell(row['client_p50_s'])} p99 {cell(row['client_p99_s'])}, "
                        f"server p99 {cell(row['server_p99_s'])}"
                    )
            rows.append(
                {
                    "nodes": n,
                    "pods": n * PODS_PER_NODE,
                    "verb": "memory",
                    "rss_mib_after_load": rss0,
                    "peak_rss_mib": common.peak_rss_mib(proc.pid),
                    "startup_s": startup,
                }
            )
        finally:
            common.stop(proc)
    return rows


# -- webhook -------------------------------------------------------------------------------


def bench_webhook(n: int, reps: int, seconds: float, rate: float, work: Path) -> dict[str, Any]:
    import ssl

    cfg = work / "config.yaml"
    cfg.write_text(CONFIG)
    st = work / f"state-{n}.json"
    if not st.exists():
        st.write_text(json.dumps(state_list(n), separators=(",", ":")))
    certs = work / "certs"
    common.make_certs(certs)
    ca = next(p for p in (certs / "ca.crt", certs / "ca.pem") if p.exists())
    cert = certs / "tls.crt"
    key = certs / "tls.key"
    port = common.free_port()
    argv = [common.PY, "-m", "fairshare_cli", "webhook", "--config", str(cfg), "--state", str(st)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(cert)]
    argv += ["--tls-key", str(key), "--log-level", "WARNING"]
    bodies = work / "admission.jsonl"
    bodies.write_bytes(admission_bodies(4000))
    proc = common.start(argv, work / "webhook.log")
    ctx = ssl.create_default_context(cafile=str(ca))
    out: dict[str, Any] = {"nodes": n, "pods": n * PODS_PER_NODE, "reps": reps, "rate": rate}
    try:
        base = f"https://127.0.0.1:{port}"
        common.wait_http(f"{base}/readyz", 300, ctx=ctx, proc=proc)
        tls = ["--tls-ca", str(ca)]
        for path in ("/validate", "/mutate"):
            sat: list[dict[str, Any]] = []
            srv_cpu: list[float] = []
            fixed: list[dict[str, Any]] = []
            srv_p99: list[float] = []
            for _ in range(reps):
                c0, t0 = common.cpu_seconds(proc.pid), time.monotonic()
                r = loadgen(
                    port,
                    path,
                    bodies,
                    *tls,
                    "--mode=closed",
                    "--concurrency=8",
                    f"--duration={seconds}",
                    "--warmup=0.5",
                )
                wall = time.monotonic() - t0
                srv_cpu.append((common.cpu_seconds(proc.pid) - c0) / wall)
                sat.append(r)
                name = "fairshare_admission_duration_seconds"
                h0 = common.histogram_from_metrics(scrape(f"{base}/metrics", ctx), name, "CREATE")
                f = loadgen(
                    port,
                    path,
                    bodies,
                    *tls,
                    "--mode=open",
                    "--concurrency=32",
                    f"--rate={rate}",
                    f"--duration={seconds}",
                    "--warmup=0.5",
                )
                h1 = common.histogram_from_metrics(scrape(f"{base}/metrics", ctx), name, "CREATE")
                srv_p99.append(common.histogram_quantile(common.histogram_delta(h0, h1), 0.99))
                fixed.append(f)
            out[path.strip("/")] = {
                "saturation_per_s": spread(r["throughput"] for r in sat),
                "saturation_p50_s": spread(r["p50_s"] for r in sat),
                "saturation_p99_s": spread(r["p99_s"] for r in sat),
                "server_cpu_util_at_saturation": spread(srv_cpu),
                "loadgen_cpu_util_at_saturation": spread(r["client_cpu_util"] for r in sat),
                "fixed_achieved_per_s": spread(r["throughput"] for r in fixed),
                "fixed_p50_s": spread(r["p50_s"] for r in fixed),
                "fixed_p99_s": spread(r["p99_s"] for r in fixed),
                "fixed_server_p99_s": spread(srv_p99),
                "errors": sum(r["errors"] for r in sat + fixed),
                "requests": sum(r["requests"] for r in sat + fixed),
            }
            o = out[path.strip("/")]
            progress(
                f"webhook {path}: saturation {cell(o['saturation_per_s'], fmt_num)}/s, "
                f"at {rate:.0f}/s p50 {cell(o['fixed_p50_s'])} p99 {cell(o['fixed_p99_s'])}"
            )
    finally:
        common.stop(proc)
    return out


# -- report --------------------------------------------------------------------------------


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    ext = data["extender"]
    lines = [
        "## Extender and webhook servers alone (loopback)",
        "",
        f"Machine: {m['cpu_count']} cores ({m['cpu_model']}); load average at start "
        f"{m['loadavg_at_start']}. Each server is one `fairshare` process over a synthetic "
        f"`--state` List ({GPUS_PER_NODE} GPUs per node, {PODS_PER_NODE} bound pods per "
        f"node, 4 tenants); a separate `tests.bench.loadgen` process, keep-alive. "
        f"Medians (min–max) over {data['reps']} repetitions of {data['seconds']:.0f} s each.",
        "",
        "### Extender: one call at a time, nodeCacheCapable (`NodeNames`) body, 1-GPU pod"
        + (", over TLS (keep-alive)" if data.get("extender_tls") else ", plain HTTP"),
        "",
        "Client = loadgen wall time per call (HTTP + JSON both ways). Server = the "
        "extender's own latency histogram (decode → verb, before encoding the answer), "
        "interpolated within buckets. Aims (judged on the client p99): p99 < 1 ms at 500 "
        "candidates, < 5 ms at 5,000.",
        "",
        "| nodes | verb | candidates | client p50 | client p99 | server p50 | server p99 "
        "| aim (p99) |",
        "|---:|---|---:|---|---|---|---|---|",
    ]
    for r in ext:
        if r["verb"] == "memory":
            continue
        lim = {500: 1e-3, 5000: 5e-3}.get(r["candidates"])
        aim = ""
        if lim is not None:
            p99 = r["client_p99_s"]["median"]
            aim = f"< {lim * 1e3:.0f} ms " + ("met" if p99 is not None and p99 < lim else "missed")
        lines.append(
            f"| {r['nodes']:,} | {r['verb']} | {r['candidates']:,} | {cell(r['client_p50_s'])} "
            f"| {cell(r['client_p99_s'])} | {cell(r['server_p50_s'])} "
            f"| {cell(r['server_p99_s'])} | {aim} |"
        )
    mem = [r for r in ext if r["verb"] == "memory"]
    if mem:
        lines += [
            "",
            "Extender memory and start-up (state read from the List file):",
            "",
            "| nodes | pods | start-up to ready | RSS after load | peak RSS |",
            "|---:|---:|---|---|---|",
        ]
        for r in mem:
            lines.append(
                f"| {r['nodes']:,} | {r['pods']:,} | {r['startup_s']:.1f} s "
                f"| {r['rss_mib_after_load']:.0f} MiB | {r['peak_rss_mib']:.0f} MiB |"
            )
    wh = data.get("webhook")
    if wh:
        lines += [
            "",
            f"### Webhook: one process, TLS 1.2+ keep-alive, pod CREATE reviews "
            f"({wh['nodes']:,}-node state, {wh['pods']:,} pods)",
            "",
            "Saturation: closed loop, 8 connections. Fixed load: open loop at "
            f"{wh['rate']:,.0f}/s, latency from the scheduled send time, 32 connections. "
            "Server CPU = the webhook process' CPU seconds per wall second (1.0 = one core). "
            "Aims: ≥ 2,000/s; p99 < 10 ms at 1,000/s.",
            "",
            "| endpoint | admissions/s at saturation | server CPU | loadgen CPU | p99 at "
            "saturation | achieved at fixed load | p50 at fixed load | p99 at fixed load "
            "| server p99 (histogram) | errors |",
            "|---|---|---|---|---|---|---|---|---|---:|",
        ]
        for ep in ("validate", "mutate"):
            o = wh[ep]
            lines.append(
                f"| /{ep} | {cell(o['saturation_per_s'], fmt_num)} "
                f"| {cell(o['server_cpu_util_at_saturation'], lambda x: f'{x:.2f}')} "
                f"| {cell(o['loadgen_cpu_util_at_saturation'], lambda x: f'{x:.2f}')} "
                f"| {cell(o['saturation_p99_s'])} | {cell(o['fixed_achieved_per_s'], fmt_num)} "
                f"| {cell(o['fixed_p50_s'])} | {cell(o['fixed_p99_s'])} "
                f"| {cell(o['fixed_server_p99_s'])} | {o['errors']} of {o['requests']:,} |"
            )
    return "\n".join(lines)


def run(
    quick: bool,
    sizes: tuple[int, ...] | None = None,
    reps: int | None = None,
    *,
    webhook: bool = True,
    write: bool = True,
    extender_tls: bool = False,
) -> str:
    sizes = sizes or ((1_000,) if quick else SIZES)
    reps = reps or (1 if quick else 3)
    seconds = 1.0 if quick else 3.0
    if quick:
        common.set_quick(True)
    data: dict[str, Any] = {
        "machine": common.machine(),
        "reps": reps,
        "seconds": seconds,
        "sizes": list(sizes),
        "quick": quick,
        "extender_tls": extender_tls,
    }
    work = Path(tempfile.mkdtemp(prefix="fairshare-bench-"))
    try:
        data["extender"] = bench_extender(sizes, reps, seconds, work, extender_tls)
        if webhook:
            data["webhook"] = bench_webhook(sizes[0], reps, 2.0 if quick else 4.0, 1000.0, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    md = markdown(data)
    print(md)
    if write:
        jpath, mpath = common.write_results("servers", data, md)
        print(f"\nwrote {jpath} and {mpath}")
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", type=int, nargs="+", default=None)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-webhook", action="store_true", help="the extender only")
    p.add_argument("--no-write", action="store_true", help="print only, write no results")
    p.add_argument(
        "--extender-tls",
        action="store_true",
        help="the extender serves HTTPS (kube-scheduler's enableHTTPS)",
    )
    args = p.parse_args(argv)
    run(
        args.quick,
        tuple(args.sizes) if args.sizes else None,
        args.reps,
        webhook=not args.no_webhook,
        write=not args.no_write,
        extender_tls=args.extender_tls,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
