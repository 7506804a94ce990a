"""Chargeback on the real control plane, read back through a real Prometheus server
(issue 45): the report equals the pods' lifetimes x shares x prices.

Two elected extender replicas behind the round-robin proxy of test_replicas.py (as in
test_extender_replicas.py); a Prometheus server (built from the Prometheus Go module like
promtool, tools/prometheus/build.sh) scrapes both every second, and a stand-in inference
server the test runs, whose vLLM-named token counters move only when the test serves a
request. The chargeback recording rules (manifests/monitoring/chargeback-rules.yaml) are
loaded too. The scripted run, about two minutes of wall time:

* team-a: a whole H100 (it also serves the stand-in's model) and a whole T4;
* team-b: 0.5 and 0.25 of one T4 (fractions), two 1g.10gb MIG slices of an A100;
* team-c: a 40Gi share of an 80Gi DRA GPU (consumable capacity), priced by the
  ``nvidia.com/gpu`` fallback (a DRA-only node has no GPU feature discovery label);
* the follower replica is restarted; the 0.25 pod ends; the leader is SIGKILLed and the
  other replica takes over; team-b then gets a whole H100; everything ends.

Then ``fairshare chargeback -o json`` over the run: per tenant GPU-hours and cost within
1 % of the truth the test measured itself (bound -> deleted, times the share it asked,
times the price of its node's GPU model), no GPU above 1 at any sample, the idle
remainder of each shared GPU billed to its holders (team-c: half its GPU), the H100 the
run leaves unheld as cluster idle, tenants + cluster idle = the cluster total, and the
tokens exactly those served. Bad input is one error line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests import nvidia_dra as nv
from tests.gotools import built_tool

from .conftest import (
    ANN_FRACTION,
    CONFIG_HEAD,
    GPU,
    POOL,
    STATE_DIR,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    cluster_module,
    dev_module,
    unique,
    wait_for,
)
from .test_dra_partitions import SliceNode, claim_pod, device_class, mig_class, slice_node, template
from .test_extender_replicas import TIMINGS, lease_holder, stand_in_pod
from .test_faults import pod
from .test_replicas import RoundRobinProxy

pytestmark = pytest.mark.e2e

__all__ = ["device_class", "mig_class", "slice_node"]  # fixtures used by name

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests" / "monitoring" / "chargeback-rules.yaml"
FAIRSHARE = Path(sys.executable).with_name("fairshare")
H100, T4, A100 = "NVIDIA-H100-80GB-HBM3", "Tesla-T4", "NVIDIA-A100-SXM4-80GB"
PRICES = {H100: 4.0, T4: 0.5, A100: 3.0}
FALLBACK = 2.0  # pricing.resources nvidia.com/gpu: the DRA node (no product label)
MIG = "nvidia.com/mig-1g.10gb"
MODEL = "llama-e2e"
TOLERANCE = 0.01
SCRAPE, STEP = "500ms", "0.5"  # the report's step is the scrape interval
BUSY, FB_USED_MIB = 0.6, 20480


# ------------------------------------------------------------------- stand-in inference


class TokenServer:
    """A tiny HTTP server exposing vLLM's token counters (``serve(p, g)`` adds tokens) and
    dcgm-exporter's activity and memory of the serving pod's GPU."""

    def __init__(self) -> None:
        self.prompt = 0
        self.generated = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer.lock:
                    body = (
                        "# TYPE vllm:prompt_tokens_total counter\n"
                        f'vllm:prompt_tokens_total{{model_name="{MODEL}",engine="0"}} '
                        f"{outer.prompt}\n"
                        "# TYPE vllm:generation_tokens_total counter\n"
                        f'vllm:generation_tokens_total{{model_name="{MODEL}",engine="0"}} '
                        f"{outer.generated}\n"
                        # What dcgm-exporter reports of the GPU the serving pod holds.
                        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n"
                        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="GPU-e2e"}} {BUSY}\n'
                        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
                        f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-e2e"}} {FB_USED_MIB}\n'
                    ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, prompt: int, generated: int) -> None:
        with self.lock:
            self.prompt += prompt
            self.generated += generated

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ------------------------------------------------------------------- Prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def prometheus(
    tmp: Path, extenders: list[int], tokens: tuple[int, dict[str, str]]
) -> Iterator[str]:
    """A Prometheus server scraping the extender replicas (HTTPS, the dev CA) and the token
    server (with the pod labels a pod scrape would attach) every second, the chargeback
    rules loaded; its base URL."""
    binary = built_tool("prometheus")
    ca = Path(dev_module().Layout(STATE_DIR).certs("extender")) / "ca.crt"
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    (tmp / "rules.yaml").write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
    config = {
        "global": {
            "scrape_interval": SCRAPE,
            "evaluation_interval": "1s",
            "scrape_timeout": SCRAPE,
        },
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {
                "job_name": "fairshare-extender",
                "scheme": "https",
                "tls_config": {"ca_file": str(ca)},
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in extenders]}],
            },
            {
                "job_name": "inference",
                "static_configs": [{"targets": [f"127.0.0.1:{tokens[0]}"], "labels": tokens[1]}],
            },
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(
                    "Prometheus did not start: " + (tmp / "prometheus.log").read_text()[-2000:]
                )
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def instant(url: str, query: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
        return list(json.loads(r.read())["data"]["result"])


def targets_up(url: str) -> int:
    return sum(float(s["value"][1]) for s in instant(url, "up") if s["value"][1] == "1")


# ------------------------------------------------------------------- extender replicas


class Replicas:
    """Two elected extenders behind a proxy kube-scheduler calls; ``restart(i)``."""

    def __init__(self, lease: str, label_pods: list[str]) -> None:
        self.lease = lease
        self.label_pods = label_pods
        self.ports: list[int] = []
        self.pids: list[int] = []
        self.proxy: RoundRobinProxy | None = None

    def args(self, i: int) -> tuple[str, ...]:
        lease = f"{dev_module().SYSTEM_NAMESPACE}/{self.lease}"
        return (
            "--lease",
            lease,
            *TIMINGS,
            "--identity",
            f"replica-{i}",
            "--leader-label-pod",
            self.label_pods[i],
        )

    def start(self, i: int) -> int:
        return int(
            dev_module().start_extra_extender(
                STATE_DIR, self.ports[i], extra_args=self.args(i), name=f"extender-chargeback-{i}"
            )
        )

    async def __aenter__(self) -> Replicas:
        mod = cluster_module()
        while len(self.ports) < 2:
            p = mod.free_port()
            if p not in self.ports:
                self.ports.append(p)
        for i in range(2):
            self.pids.append(await asyncio.to_thread(self.start, i))
        self.proxy = RoundRobinProxy(self.ports)
        url = f"https://127.0.0.1:{await self.proxy.start()}"
        await asyncio.to_thread(dev_module().set_scheduler_extender_url, STATE_DIR, url)
        return self

    async def restart(self, i: int) -> None:
        await asyncio.to_thread(dev_module().stop_server, "extender-replica", self.pids[i])
        self.pids[i] = await asyncio.to_thread(self.start, i)

    def kill(self, i: int) -> None:
        os.kill(self.pids[i], signal.SIGKILL)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(dev_module().set_scheduler_extender_url, STATE_DIR, None)
        if self.proxy is not None:
            await self.proxy.close()
        for pid in self.pids:
            await asyncio.to_thread(dev_module().stop_server, "extender-replica", pid)


# ------------------------------------------------------------------- the run


class Lifetimes:
    """Bound -> deleted per pod, as the test sees it: the bind when a watch of the pods
    shows it (milliseconds late), the end just before the test deletes the pod."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.bound: dict[tuple[str, str], float] = {}
        self.ended: dict[tuple[str, str], float] = {}

    async def watch(self, ns: str) -> None:
        while True:  # cancelled by the test; a watch that times out starts again
            w = watch.Watch()
            async with w.stream(self.core.list_namespaced_pod, ns, timeout_seconds=300) as s:
                async for event in s:
                    p = event["object"]
                    key = (ns, p.metadata.name)
                    if p.spec.node_name and key not in self.bound:
                        self.bound[key] = time.time()

    async def end(self, ns: str, name: str) -> None:
        self.ended[(ns, name)] = time.time()
        await self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)

    def seconds(self, ns: str, name: str) -> float:
        return self.ended[(ns, name)] - self.bound[(ns, name)]


def config_text(tenants: list[str]) -> str:
    body: dict[str, Any] = {
        "tenants": [{"name": t} for t in tenants],
        "pricing": {
            "resources": {GPU: FALLBACK, "cpu": 0.04},
            "gpuModels": PRICES,
        },
    }
    return CONFIG_HEAD + yaml.safe_dump(body, sort_keys=False)


def mig_pod(name: str, pool: str, slices: int) -> dict[str, Any]:
    p = pod(name, node_selector={POOL: pool})
    p["spec"]["containers"][0]["resources"]["limits"][MIG] = str(slices)
    return p


def chargeback(url: str, start: float, end: float, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(FAIRSHARE),
            "chargeback",
            "--from",
            f"{start:.3f}",
            "--to",
            f"{end:.3f}",
            "--prometheus",
            url,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def wait_bound(core: client.CoreV1Api, ns: str, names: list[str]) -> None:
    async def bound() -> bool:
        pods = {p.metadata.name: p for p in (await core.list_namespaced_pod(ns)).items}
        return all(n in pods and pods[n].spec.node_name for n in names)

    await wait_for(bound, timeout=60, what=f"{names} in {ns} to bind")


@pytest.fixture
async def token_server() -> AsyncIterator[TokenServer]:
    server = TokenServer()
    yield server
    server.close()


async def test_chargeback_report_equals_lifetimes_times_shares_times_prices(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    make_gpu_node: MakeNode,
    slice_node: SliceNode,
    token_server: TokenServer,
    tmp_path: Path,
) -> None:
    tenants = {k: unique(f"cb{k}") for k in "abc"}
    await fairshare.set_config(api, config_text(list(tenants.values())))
    ns = {k: await tenant_namespace(t) for k, t in tenants.items()}
    pools = {k: unique(f"cb{k}") for k in ("h100", "t4", "mig", "dra")}
    nodes = {k: f"{p}-0" for k, p in pools.items() if k != "dra"}
    await make_gpu_node(nodes["h100"], gpus=2, gpu_product=H100, labels={POOL: pools["h100"]})
    await make_gpu_node(nodes["t4"], gpus=2, gpu_product=T4, labels={POOL: pools["t4"]})
    await make_gpu_node(
        nodes["mig"],
        gpus=0,
        gpu_product=A100,
        labels={POOL: pools["mig"]},
        extra_resources={MIG: "7"},
    )
    nodes["dra"] = await slice_node(pools["dra"], [nv.shareable_slice(unique("cbdra"), 1)])
    core = client.CoreV1Api(api)
    await client.ResourceV1Api(api).create_namespaced_resource_claim_template(
        ns["c"], template("half", nv.GPU_CLASS, memory="40Gi")
    )

    # (key, namespace, pod, share, price)
    plan: list[tuple[str, str, str, float, float]] = [
        ("a", ns["a"], "h100-whole", 1.0, PRICES[H100]),
        ("a", ns["a"], "t4-whole", 1.0, PRICES[T4]),
        ("b", ns["b"], "t4-half", 0.5, PRICES[T4]),
        ("b", ns["b"], "t4-quarter", 0.25, PRICES[T4]),
        ("b", ns["b"], "a100-mig", 2 / 7, PRICES[A100]),
        ("c", ns["c"], "dra-share", 0.5, FALLBACK),
        ("b", ns["b"], "h100-late", 1.0, PRICES[H100]),
    ]
    manifests = {
        "h100-whole": pod("h100-whole", gpus=1, node_selector={POOL: pools["h100"]}),
        "t4-whole": pod("t4-whole", gpus=1, node_selector={POOL: pools["t4"]}),
        "t4-half": pod(
            "t4-half", annotations={ANN_FRACTION: "0.5"}, node_selector={POOL: pools["t4"]}
        ),
        "t4-quarter": pod(
            "t4-quarter", annotations={ANN_FRACTION: "0.25"}, node_selector={POOL: pools["t4"]}
        ),
        "a100-mig": mig_pod("a100-mig", pools["mig"], 2),
        "dra-share": claim_pod("dra-share", pools["dra"], "half"),
        "h100-late": pod("h100-late", gpus=1, node_selector={POOL: pools["h100"]}),
    }
    system = dev_module().SYSTEM_NAMESPACE
    lease = unique("cb-lease")
    stand_ins = [f"{lease}-{i}" for i in range(2)]
    for name in stand_ins:
        await core.create_namespaced_pod(system, stand_in_pod(name))
    life = Lifetimes(core)
    watchers = [asyncio.create_task(life.watch(n)) for n in ns.values()]
    events: dict[str, float] = {}
    try:
        async with Replicas(lease, [f"{system}/{n}" for n in stand_ins]) as reps:
            token_labels = {"namespace": ns["a"], "pod": "h100-whole"}
            with prometheus(tmp_path, reps.ports, (token_server.port, token_labels)) as url:
                await asyncio.to_thread(
                    lambda: wait_for_sync(lambda: targets_up(url) >= 3, "3 targets up")
                )
                start = time.time()
                first = [n for _, _, n, _, _ in plan if n != "h100-late"]
                for _, namespace, name, _, _ in plan[:-1]:
                    await core.create_namespaced_pod(namespace, manifests[name])
                for key in "abc":
                    await wait_bound(core, ns[key], [n for k, _, n, _, _ in plan[:-1] if k == key])

                async def seen() -> bool:
                    return set(first) <= {n for _, n in life.bound}

                await wait_for(seen, timeout=10, what="the watch to see the binds")
                holder = await wait_for(
                    lambda: lease_holder(api, lease), timeout=30, what="a leader"
                )
                leader = int(holder[-1])
                token_server.serve(1200, 3400)
                await asyncio.sleep(20)
                # The recording rule live: team-b's T4 cost per hour is its shares x price.
                rule = await asyncio.to_thread(
                    instant,
                    url,
                    f'tenant_gpu_model:fairshare_gpu_cost_per_hour:sum{{tenant="{tenants["b"]}"}}',
                )
                by_model = {s["metric"]["gpu_model"]: float(s["value"][1]) for s in rule}
                assert by_model.get(T4) == pytest.approx(0.75 * PRICES[T4]), rule
                assert by_model.get(A100) == pytest.approx(2 / 7 * PRICES[A100]), rule

                await reps.restart(1 - leader)  # the follower restarts
                events["restart"] = time.time() - start
                await asyncio.sleep(15)
                token_server.serve(800, 2100)
                await life.end(ns["b"], "t4-quarter")
                await asyncio.sleep(10)
                reps.kill(leader)  # SIGKILL: the other replica takes over
                events["kill"] = time.time() - start

                async def took_over() -> bool:
                    return await lease_holder(api, lease) == f"replica-{1 - leader}"

                await wait_for(took_over, timeout=60, what="the other replica to lead")
                events["failover"] = time.time() - start
                await core.create_namespaced_pod(ns["b"], manifests["h100-late"])
                await wait_bound(core, ns["b"], ["h100-late"])
                token_server.serve(500, 1500)
                await asyncio.sleep(50)
                for _, namespace, name, _, _ in plan:
                    if (namespace, name) not in life.ended:
                        await life.end(namespace, name)
                await asyncio.sleep(4)  # a few scrapes after the last pod is gone
                end = time.time()

                out = await asyncio.to_thread(
                    chargeback, url, start - 2, end, "--step", STEP, "-o", "json"
                )
                assert out.returncode == 0, out.stdout + out.stderr
                report = json.loads(out.stdout)
                table = await asyncio.to_thread(chargeback, url, start - 2, end, "--step", STEP)
                csv_out = await asyncio.to_thread(
                    chargeback, url, start - 2, end, "--step", STEP, "-o", "csv"
                )
                page = await asyncio.to_thread(
                    chargeback, url, start - 2, end, "--step", STEP, "-o", "html"
                )
                empty = await asyncio.to_thread(chargeback, url, start - 7200, start - 3600)
    finally:
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        with contextlib.suppress(ApiException):
            await client.CoordinationV1Api(api).delete_namespaced_lease(lease, system)
        for name in stand_ins:
            with contextlib.suppress(ApiException):
                await core.delete_namespaced_pod(name, system, grace_period_seconds=0)

    # The truth, from what the test saw: lifetime x share x price.
    truth_hours: dict[str, float] = {}
    truth_cost: dict[str, float] = {}
    for key, namespace, name, share, price in plan:
        hours = life.seconds(namespace, name) * share / 3600
        truth_hours[tenants[key]] = truth_hours.get(tenants[key], 0.0) + hours
        truth_cost[tenants[key]] = truth_cost.get(tenants[key], 0.0) + hours * price
    # What OpenCost would charge the same pods from requests alone (COST.md): whole GPUs
    # as asked; a fraction billed as a whole GPU when it asks nvidia.com/gpu: 1
    # (time-slicing, HAMi); MIG slices and DRA claims ask no nvidia.com/gpu: not billed.
    opencost: dict[str, float] = {}
    for key, namespace, name, share, price in plan:
        billed = 0.0 if name in ("a100-mig", "dra-share") else math.ceil(share)
        hours = life.seconds(namespace, name) / 3600
        opencost[tenants[key]] = opencost.get(tenants[key], 0.0) + billed * hours * price
    rows = {t["tenant"]: t for t in report["tenants"]}
    lines = []
    for tenant in tenants.values():
        got_h, got_c = rows[tenant]["gpuHours"], rows[tenant]["gpuCost"]
        lines.append(
            f"{tenant}: {got_h:.6f} GPU-h (truth {truth_hours[tenant]:.6f}), "
            f"cost {got_c:.6f} (truth {truth_cost[tenant]:.6f}), idle "
            f"{rows[tenant]['idleGpuHours']:.6f} GPU-h / {rows[tenant]['idleCost']:.6f}; "
            f"OpenCost from requests: {opencost[tenant]:.6f}"
        )
    b = tenants["b"]
    t4_fractions = sum(
        (1 - share) * life.seconds(namespace, name) / 3600 * price
        for key, namespace, name, share, price in plan
        if name in ("t4-half", "t4-quarter")
    )
    unbilled = {
        name: share * life.seconds(namespace, name) / 3600 * price
        for key, namespace, name, share, price in plan
        if name in ("a100-mig", "dra-share")
    }
    lines.append(
        f"OpenCost vs fairshare for {b}: T4 fractions billed whole +{t4_fractions:.6f}, "
        f"unbilled MIG {unbilled['a100-mig']:.6f}, DRA share {unbilled['dra-share']:.6f}"
    )
    summary = "\n".join(lines)
    print(f"\n[chargeback] events {events}\n{summary}\n{table.stdout}")
    for tenant in tenants.values():
        assert rows[tenant]["gpuHours"] == pytest.approx(truth_hours[tenant], rel=TOLERANCE), (
            summary
        )
        assert rows[tenant]["gpuCost"] == pytest.approx(truth_cost[tenant], rel=TOLERANCE), summary
    cluster = report["cluster"]
    assert cluster["maxGpuLoad"] <= 1.0 + 1e-9, cluster
    # The idle rule: a shared GPU's remainder goes to its holders (team-c: the other half
    # of its DRA GPU); whole GPUs leave none; a GPU nobody holds is cluster idle.
    dra_hours = life.seconds(ns["c"], "dra-share") / 3600
    assert rows[tenants["c"]]["idleGpuHours"] == pytest.approx(0.5 * dra_hours, rel=TOLERANCE)
    assert rows[tenants["a"]]["idleGpuHours"] == pytest.approx(0.0, abs=1e-6)
    assert rows[tenants["b"]]["idleGpuHours"] > 0  # the T4 it shares, the MIG GPU
    assert cluster["idleGpuHours"] > 0  # the second H100 before h100-late
    # Everything reconciles: tenants (allocated + idle) + cluster idle = cluster total.
    assert cluster["billedGpuCost"] == pytest.approx(cluster["gpuCost"], rel=1e-6)
    # Tokens: exactly what the stand-in served, on team-a's deployment.
    (dep,) = [d for d in report["deployments"] if d["model"] == MODEL]
    assert dep["tokens"] == 1200 + 3400 + 800 + 2100 + 500 + 1500
    assert dep["tenant"] == tenants["a"]
    assert rows[tenants["a"]]["costPerMillionTokens"] == pytest.approx(
        rows[tenants["a"]]["cost"] / dep["tokens"] * 1e6, rel=1e-3
    )
    # DCGM beside allocation: the serving pod's H100 was measured 60 % busy, 20 GiB used.
    (h100_a,) = [
        m for m in report["byGpuModel"] if m["tenant"] == tenants["a"] and m["gpuModel"] == H100
    ]
    assert h100_a["usageRatio"] == pytest.approx(BUSY), h100_a
    assert rows[tenants["a"]]["gpuMemoryUsedMiB"] == pytest.approx(FB_USED_MIB)
    assert rows[tenants["b"]]["usageRatio"] is None  # not measured: no figure, not 0
    assert page.returncode == 0 and page.stdout.startswith("<!doctype html>")
    assert all(t in page.stdout for t in tenants.values())
    assert csv_out.returncode == 0 and csv_out.stdout.startswith("tenant,gpu_model,")
    assert empty.returncode == 1 and empty.stderr.startswith("error: no fairshare chargeback")
    assert "Traceback" not in empty.stderr


def wait_for_sync(probe: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_an_unreachable_prometheus_is_one_error_line() -> None:
    out = subprocess.run(
        [
            str(FAIRSHARE),
            "chargeback",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--prometheus",
            f"http://127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1
    assert out.stderr.startswith("error: Prometheus at http://127.0.0.1:")
    assert "unreachable" in out.stderr and out.stderr.count("\n") == 1
