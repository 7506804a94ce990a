"""Fixtures and helpers for the end-to-end tests.

The session fixture `cluster` brings up the local control plane of tools/e2e/cluster.py
(etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok on 127.0.0.1) once for
the whole run and stops it at the end. A cluster that is already up (`make cluster-up`) is
reused and left running. With `E2E_KUBECONFIG=path` the tests run against that cluster
instead (for example a kind cluster), with a local kwok process (from `make cluster-bins`)
that makes the fake GPU nodes there; with `E2E_KEEP_CLUSTER=1` the local cluster is left up.

Without the binaries (`make cluster-bins`, needs Go) the e2e tests are skipped, except in
strict mode (`FAIRSHARE_STRICT` or `CI` set, as `make test` and .ci/run do): then they fail.

Every item under tests/e2e is marked `e2e` and runs after all other tests.

Helpers (import them with `from .conftest import ...`): `gpu_node_manifest`,
`create_gpu_node`, `gpu_pod_manifest`, `wait_for`, `wait_node_ready`, `wait_pod`,
`wait_pod_phase`, `wait_pod_gone`, `wait_event`. Fixtures: `cluster`, `api` (a
kubernetes_asyncio ApiClient), `namespace` (a fresh namespace with its `default`
ServiceAccount), `make_gpu_node` (creates kwok GPU nodes and deletes them afterwards).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from tests.gotools import strict

E2E_DIR = Path(__file__).resolve().parent
ROOT = E2E_DIR.parent.parent
CLUSTER_PY = ROOT / "tools" / "e2e" / "cluster.py"
STATE_DIR = Path(os.environ.get("E2E_STATE_DIR") or ROOT / ".e2e").resolve()

KWOK_ANNOTATIONS = {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}
GPU = "nvidia.com/gpu"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
POOL = "fairshare-e2e/pool"
"""The node label the scheduling scenes select their nodes by (kept off other tests' nodes)."""
ANN_FRACTION = "fairshare.io/gpu-fraction"
ANN_DEVICES = "fairshare.io/gpu-devices"
MakeNode = Callable[..., Awaitable[client.V1Node]]
"""The ``make_gpu_node`` fixture's type."""
TenantNamespace = Callable[[str], Awaitable[str]]
"""The ``tenant_namespace`` fixture's type."""

UP_TIMEOUT = 300.0
DOWN_TIMEOUT = 120.0

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Ordering and markers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark everything under tests/e2e `e2e` and move it after all other tests (the
    burst test last of all)."""
    e2e: list[pytest.Item] = []
    rest: list[pytest.Item] = []
    for item in items:
        (e2e if E2E_DIR in Path(item.path).parents else rest).append(item)
    for item in e2e:
        item.add_marker(pytest.mark.e2e)
    # The burst loads the cluster with thousands of pods: last, after every other e2e test.
    e2e.sort(key=lambda item: Path(item.path).name == "test_burst.py")
    items[:] = rest + e2e


# Lines the reliability tests (test_faults.py, test_replicas.py) record about the faults
# they injected and survived; printed in the terminal summary of the run.
FAULT_SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FAULT_SUMMARY:
        terminalreporter.section("faults injected and survived")
        for line in FAULT_SUMMARY:
            terminalreporter.write_line(f"- {line}")


# --------------------------------------------------------------------------------------------
# The cluster


def in_ci() -> bool:
    """Strict mode (tests/gotools.py): what could be built here must run, not skip."""
    return strict()


def cluster_module() -> ModuleType:
    """tools/e2e/cluster.py, imported by path (it is a script, not a package)."""
    name = "fairshare_e2e_cluster"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, CLUSTER_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_cluster_py(
    *args: str, timeout: float, state_dir: Path = STATE_DIR
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CLUSTER_PY), *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Cluster:
    kubeconfig: Path
    kubectl_path: str
    managed: bool  # True: our local control plane; False: E2E_KUBECONFIG
    state: dict[str, Any] = field(default_factory=dict)
    kube_version: str | None = None  # the pinned version the local binaries were built at

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raises AssertionError with its output on failure."""
        proc = subprocess.run(
            [self.kubectl_path, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
            )
        return proc

    async def api_client(self) -> client.ApiClient:
        """A new kubernetes_asyncio ApiClient; the caller closes it (`async with`)."""
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        return client.ApiClient(configuration=cfg)

    def restart_scheduler(self, scheduler_config: Path) -> None:
        """Run kube-scheduler with another KubeSchedulerConfiguration (local cluster only)."""
        if not self.managed:
            _skip_or_fail("restarting kube-scheduler needs the local control plane")
        proc = run_cluster_py(
            "restart-scheduler", "--scheduler-config", str(scheduler_config), timeout=120
        )
        if proc.returncode != 0:
            raise AssertionError(f"restart-scheduler failed:\n{proc.stdout}{proc.stderr}")
        self.state = cluster_module().load_state(cluster_module().Paths(STATE_DIR)) or {}

    def log_path(self, component: str) -> Path | None:
        comp = self.state.get("components", {}).get(component)
        return Path(comp["log"]) if comp else None


def _skip_or_fail(msg: str) -> None:
    if in_ci():
        pytest.fail(
            f"strict mode (FAIRSHARE_STRICT or CI set), so the e2e tests must run: {msg}",
            pytrace=False,
        )
    pytest.skip(msg)


def _external_cluster(kubeconfig: str) -> Iterator[Cluster]:
    """E2E_KUBECONFIG: an existing cluster; a local kwok (state in .e2e/external) makes the
    fake GPU nodes there unless E2E_EXTERNAL_KWOK=0 (e.g. kwok already runs in-cluster)."""
    path = Path(kubeconfig).expanduser().resolve()
    if not path.is_file():
        pytest.fail(f"E2E_KUBECONFIG={kubeconfig} does not exist", pytrace=False)
    mod = cluster_module()
    bins = mod.find_bin_dir(STATE_DIR)
    kubectl = str(bins / "kubectl") if (bins / "kubectl").exists() else shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("E2E_KUBECONFIG is set but no kubectl found (PATH or .e2e/bin)")
    run_kwok = os.environ.get("E2E_EXTERNAL_KWOK", "1") != "0"
    kwok_state = STATE_DIR / "external"
    if run_kwok:
        if mod.missing_binaries(bins, ("kwok",)):
            _skip_or_fail(
                f"no kwok binary in {bins}: run `make cluster-bins` (needs Go), or set "
                "E2E_EXTERNAL_KWOK=0 if kwok already manages the cluster's fake nodes"
            )
        proc = run_cluster_py("up", "--kubeconfig", str(path), timeout=120, state_dir=kwok_state)
        if proc.returncode != 0:
            pytest.fail(f"starting kwok failed:\n{proc.stdout}{proc.stderr}", pytrace=False)
    yield Cluster(kubeconfig=path, kubectl_path=kubectl, managed=False)
    if run_kwok:
        run_cluster_py("down", timeout=DOWN_TIMEOUT, state_dir=kwok_state)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    external = os.environ.get("E2E_KUBECONFIG")
    if external:
        yield from _external_cluster(external)
        return

    mod = cluster_module()
    bins = mod.find_bin_dir(STATE_DIR)
    missing = mod.missing_binaries(bins)
    if missing:
        msg = (
            f"e2e control-plane binaries missing in {bins} ({', '.join(missing)}): build them "
            "with `make cluster-bins` (needs Go >= 1.26; cached per version), or set "
            "E2E_KUBECONFIG to run against an existing cluster"
        )
        _skip_or_fail(msg)

    was_up = run_cluster_py("status", timeout=30).returncode == 0
    t0 = time.monotonic()
    proc = run_cluster_py("up", timeout=UP_TIMEOUT)
    if proc.returncode != 0:
        pytest.fail(f"cluster.py up failed:\n{proc.stdout}{proc.stderr}", pytrace=False)
    if not was_up:
        sys.stderr.write(f"\n[e2e] control plane up in {time.monotonic() - t0:.1f}s\n")
    state = mod.load_state(mod.Paths(STATE_DIR)) or {}
    yield Cluster(
        kubeconfig=Path(state["kubeconfig"]),
        kubectl_path=state["kubectl"],
        managed=True,
        state=state,
        kube_version=mod.read_versions().get("KUBE_VERSION"),
    )
    if was_up or os.environ.get("E2E_KEEP_CLUSTER"):
        return
    proc = run_cluster_py("down", timeout=DOWN_TIMEOUT)
    if proc.returncode != 0:
        pytest.fail(f"cluster.py down failed:\n{proc.stdout}{proc.stderr}", pytrace=False)


@pytest.fixture(autouse=True)
def control_plane_survives(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each e2e test on the local control plane: every component still runs. One
    that died (e.g. a kube-apiserver restarted by a fault test and gone again) is started
    again with its own flags and the test errors with the component's last log lines, so
    one failure stays one failure instead of every later test erroring without an API."""
    yield
    if "cluster" not in request.fixturenames:
        return
    cluster: Cluster = request.getfixturevalue("cluster")
    if not cluster.managed:
        return
    mod = cluster_module()
    paths = mod.Paths(STATE_DIR)
    state = mod.load_state(paths) or {}
    dead = {
        name: comp
        for name, comp in state.get("components", {}).items()
        if not mod.pid_alive(comp["pid"])
    }
    if not dead:
        return
    report = []
    for name, comp in dead.items():
        report.append(f"{name} (pid {comp['pid']}) died; last lines of {comp['log']}:")
        report.append(mod.tail(Path(comp["log"]), 30))
        try:
            mod.restart_component(paths, name)
            report.append(f"{name} started again for the tests that follow")
        except mod.ClusterError as exc:
            report.append(f"{name} could not be started again: {exc}")
    pytest.fail("\n".join(report), pytrace=False)


@pytest.fixture
async def api(cluster: Cluster) -> AsyncIterator[client.ApiClient]:
    async with await cluster.api_client() as api_client:
        yield api_client


@pytest.fixture
async def namespace(api: client.ApiClient) -> AsyncIterator[str]:
    """A fresh namespace whose `default` ServiceAccount exists; deleted afterwards."""
    core = client.CoreV1Api(api)
    ns = await core.create_namespace({"metadata": {"generateName": "e2e-"}})
    name: str = ns.metadata.name

    async def default_sa() -> bool:
        try:
            await core.read_namespaced_service_account("default", name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    await wait_for(default_sa, timeout=60, what=f"ServiceAccount {name}/default")
    yield name
    try:
        await core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
async def make_gpu_node(
    api: client.ApiClient,
) -> AsyncIterator[Callable[..., Awaitable[client.V1Node]]]:
    """`await make_gpu_node(name, gpus=8, ...)`: a kwok GPU node, Ready and schedulable.

    Takes the arguments of `gpu_node_manifest` plus `wait_ready=True` and `timeout=60`.
    The nodes are deleted when the test ends.
    """
    created: list[str] = []

    async def make(
        name: str, *args: Any, wait_ready: bool = True, timeout: float = 60.0, **kwargs: Any
    ) -> client.V1Node:
        node = await create_gpu_node(api, name, *args, **kwargs)
        created.append(name)
        if wait_ready:
            node = await wait_node_ready(api, name, timeout=timeout)
        return node

    yield make
    core = client.CoreV1Api(api)
    for name in created:
        try:
            await core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def all_gone() -> bool:
        for name in created:
            try:
                await core.read_node(name)
                return False
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return True

    await wait_for(all_gone, timeout=30, what=f"deletion of nodes {created}")


# --------------------------------------------------------------------------------------------
# Manifests


def unique(prefix: str) -> str:
    """`prefix-<6 hex>`: a name no other test (or earlier run on a kept cluster) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def gpu_node_manifest(
    name: str,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    labels: dict[str, str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    *,
    gpu_product: str = "NVIDIA-A100-SXM4-80GB",
    gpu_memory_mib: int = 81920,
    pods: str = "110",
    ephemeral_storage: str = "1Ti",
    taints: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    extra_resources: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Node that kwok manages, with `nvidia.com/gpu` capacity and the labels NVIDIA GPU
    feature discovery puts on a GPU node. `conditions` are extra node conditions (e.g.
    `{"type": "GpuUnhealthy", "status": "True", "reason": "XidError"}`); kwok adds the
    kubelet's own (Ready, MemoryPressure, ...) and keeps extra ones across heartbeats.
    `extra_resources` are more allocatable entries (e.g. MIG slices,
    `{"nvidia.com/mig-1g.10gb": "7"}`); with `gpus=0` and some, no `nvidia.com/gpu`."""
    resources = {
        "cpu": cpu,
        "memory": memory,
        "pods": pods,
        "ephemeral-storage": ephemeral_storage,
        GPU: str(gpus),
    }
    if extra_resources:
        if not gpus:
            del resources[GPU]
        resources.update(extra_resources)
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.product": gpu_product,
        "nvidia.com/gpu.memory": str(gpu_memory_mib),
    }
    node_labels.update(labels or {})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    extra_conditions = [
        {"lastHeartbeatTime": now, "lastTransitionTime": now, "reason": "", "message": ""} | c
        for c in (conditions or [])
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": KWOK_ANNOTATIONS | (annotations or {}),
        },
        "spec": {"taints": taints} if taints else {},
        # Node create keeps status (kubelets register this way); kwok's node-initialize
        # stage keeps capacity/allocatable/extra conditions and fills in the rest.
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": extra_conditions,
        },
    }


async def create_gpu_node(
    api: client.ApiClient, name: str, *args: Any, **kwargs: Any
) -> client.V1Node:
    return await client.CoreV1Api(api).create_node(gpu_node_manifest(name, *args, **kwargs))


def gpu_pod_manifest(
    name: str,
    gpus: int | str = 1,
    *,
    cpu: str = "100m",
    memory: str = "128Mi",
    node: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    scheduler_name: str | None = None,
) -> dict[str, Any]:
    """A single-container pod asking for `gpus` nvidia.com/gpu (limits == requests).
    `node` pins it with a kubernetes.io/hostname nodeSelector (the scheduler still decides)."""
    limits = {"cpu": cpu, "memory": memory}
    if gpus:
        limits[GPU] = str(gpus)
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": dict(limits)}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": spec,
    }


# --------------------------------------------------------------------------------------------
# Waiting (every wait is bounded)


async def wait_for(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout: float,
    what: str,
    interval: float = 0.25,
) -> T:
    """Call `probe` until it returns something truthy and return that; AssertionError naming
    `what` (and the last value seen) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}: {last!r}")
        await asyncio.sleep(interval)


def condition(obj: Any, type_: str) -> Any | None:
    for cond in (obj.status.conditions if obj.status else None) or []:
        if cond.type == type_:
            return cond
    return None


async def wait_node_ready(
    api: client.ApiClient, name: str, *, timeout: float = 60.0, schedulable: bool = True
) -> client.V1Node:
    """Node Ready=True and, with `schedulable`, without the not-ready taint that
    kube-controller-manager removes once the node is Ready."""
    core = client.CoreV1Api(api)

    async def probe() -> client.V1Node | None:
        node = await core.read_node(name)
        ready = condition(node, "Ready")
        if ready is None or ready.status != "True":
            return None
        taints = (node.spec.taints if node.spec else None) or []
        if schedulable and any(t.key == NOT_READY_TAINT for t in taints):
            return None
        return node

    return await wait_for(probe, timeout=timeout, what=f"node {name} Ready")


async def wait_pod(
    api: client.ApiClient,
    namespace: str,
    name: str,
    predicate: Callable[[client.V1Pod], bool],
    *,
    timeout: float = 60.0,
    what: str = "condition",
) -> client.V1Pod:
    core = client.CoreV1Api(api)

    async def probe() -> client.V1Pod | None:
        pod = await core.read_namespaced_pod(name, namespace)
        return pod if predicate(pod) else None

    return await wait_for(probe, timeout=timeout, what=f"pod {namespace}/{name} {what}")


async def wait_pod_phase(
    api: client.ApiClient, namespace: str, name: str, phase: str, *, timeout: float = 60.0
) -> client.V1Pod:
    return await wait_pod(
        api,
        namespace,
        name,
        lambda p: p.status is not None and p.status.phase == phase,
        timeout=timeout,
        what=f"phase {phase}",
    )


async def wait_pod_gone(
    api: client.ApiClient, namespace: str, name: str, *, timeout: float = 30.0
) -> None:
    core = client.CoreV1Api(api)

    async def probe() -> bool:
        try:
            await core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    await wait_for(probe, timeout=timeout, what=f"pod {namespace}/{name} to be gone")


async def wait_event(
    api: client.ApiClient,
    namespace: str,
    *,
    involved_name: str,
    reason: str,
    contains: str | None = None,
    timeout: float = 60.0,
) -> client.CoreV1Event:
    """The first core/v1 Event about `involved_name` with `reason` (and `contains` in its
    message). kube-scheduler records events.k8s.io/v1 Events; the core API serves them too."""
    core = client.CoreV1Api(api)

    async def probe() -> client.CoreV1Event | None:
        events = await core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={involved_name},reason={reason}"
        )
        for event in events.items:
            if contains is None or contains in (event.message or ""):
                return event
        return None

    what = f"event {reason}" + (f" mentioning {contains!r}" if contains else "")
    return await wait_for(probe, timeout=timeout, what=f"{what} for {namespace}/{involved_name}")


# --------------------------------------------------------------------------------------------
# fairshare on the cluster (tools/e2e/dev.py): the webhook and the extender as local
# processes, registered by URL with the real kube-apiserver and kube-scheduler.

DEV_PY = ROOT / "tools" / "e2e" / "dev.py"
TENANT_LABEL = "fairshare.io/tenant"
RELOAD_METRIC = "fairshare_config_reloads_total"
CONFIG_HEAD = "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n"
# What the servers run with between tests: no tenants, every namespace in "default".
BASE_CONFIG = CONFIG_HEAD + "tenants: []\n"


def dev_module() -> ModuleType:
    """tools/e2e/dev.py, imported by path."""
    name = "fairshare_e2e_dev"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DEV_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class FairshareDev:
    """The running webhook and extender (`handles`: ports, pids, CA files)."""

    cluster: Cluster
    handles: Any
    state_dir: Path = STATE_DIR

    def metric(self, server: str, name: str) -> float:
        return float(dev_module().metric(self.handles, server, name))

    def extender_status(self) -> dict[str, Any]:
        """The extender's ``/status.json``: what it sees (held and pending pods)."""
        return dict(dev_module().extender_status(self.handles))

    async def wait_extender_node(
        self, name: str, *, present: bool = True, healthy: bool | None = None, timeout: float = 30
    ) -> None:
        """Wait until the extender's own view (``/status.json``) has node ``name``
        (``present``), with that health (``healthy``), or not at all: its node watch has
        caught up, however slow the machine."""

        async def seen() -> bool:
            status = await asyncio.to_thread(self.extender_status)
            node = next((n for n in status["nodes"] if n["name"] == name), None)
            if not present:
                return node is None
            return node is not None and (healthy is None or node["healthy"] is healthy)

        what = f"the extender to see node {name} " + (
            "gone" if not present else f"healthy={healthy}" if healthy is not None else ""
        )
        await wait_for(seen, timeout=timeout, what=what.strip())

    def log_path(self, server: str) -> Path:
        return Path(dev_module().Layout(self.state_dir).log(server))

    def restart_extender(self, *extra_args: str) -> None:
        self.handles = dev_module().restart_extender(self.state_dir, extra_args)

    async def current_config_text(self, api: client.ApiClient) -> str:
        dev = dev_module()
        cm = await client.CoreV1Api(api).read_namespaced_config_map(
            dev.CONFIGMAP, dev.SYSTEM_NAMESPACE
        )
        return str((cm.data or {}).get(dev.CONFIG_KEY, ""))

    async def set_config(self, api: client.ApiClient, yaml_text: str, timeout: float = 20) -> None:
        """Replace the ConfigMap's config.yaml and wait until both servers reloaded it
        (their `fairshare_config_reloads_total` went up). A config equal to the one in
        force (the servers compare parsed configs) returns at once."""
        from fairshare.config.loading import parse_config

        dev = dev_module()
        new = parse_config(yaml_text)
        old_text = await self.current_config_text(api)
        try:
            unchanged = parse_config(old_text) == new
        except Exception:
            unchanged = False
        before = {s: await asyncio.to_thread(self.metric, s, RELOAD_METRIC) for s in dev.SERVERS}
        await client.CoreV1Api(api).patch_namespaced_config_map(
            dev.CONFIGMAP, dev.SYSTEM_NAMESPACE, {"data": {dev.CONFIG_KEY: yaml_text}}
        )
        if unchanged:
            return

        async def reloaded() -> bool:
            for server in dev.SERVERS:
                now = await asyncio.to_thread(self.metric, server, RELOAD_METRIC)
                if now <= before[server]:
                    return False
            return True

        await wait_for(reloaded, timeout=timeout, what="both servers to reload the config")


@pytest.fixture(scope="session")
def fairshare_dev(cluster: Cluster) -> Iterator[FairshareDev]:
    """fairshare webhook + extender wired into the local control plane, once per run.

    Left running if it was already up (`make dev-up`); otherwise stopped at the end (webhook
    configurations removed, kube-scheduler back to its default configuration)."""
    if not cluster.managed:
        _skip_or_fail(
            "fairshare e2e tests need the local control plane (the apiserver and scheduler "
            "call the servers on 127.0.0.1 and the scheduler is restarted with the extender)"
        )
    dev = dev_module()
    was_up = bool(dev.status(STATE_DIR).get("up"))
    t0 = time.monotonic()
    try:
        handles = dev.start(STATE_DIR, BASE_CONFIG, cluster=False)
    except dev.DevError as exc:
        pytest.fail(f"dev.py up failed: {exc}", pytrace=False)
    if not was_up:
        sys.stderr.write(f"\n[e2e] fairshare up in {time.monotonic() - t0:.1f}s\n")
    cluster.state = cluster_module().load_state(cluster_module().Paths(STATE_DIR)) or {}
    yield FairshareDev(cluster=cluster, handles=handles)
    if not was_up:
        dev.stop(STATE_DIR)


@pytest.fixture
async def fairshare(
    fairshare_dev: FairshareDev, api: client.ApiClient
) -> AsyncIterator[FairshareDev]:
    """`fairshare_dev`, with the base config (no tenants) put back after the test.

    Also makes sure kube-scheduler still calls the extender: `cluster.py up` (the `cluster`
    fixture of another run on the same state dir) restarts it with its default config."""
    await asyncio.to_thread(dev_module().ensure_scheduler, fairshare_dev.state_dir)
    yield fairshare_dev
    await fairshare_dev.set_config(api, BASE_CONFIG)


@pytest.fixture
async def fresh_extender(fairshare: FairshareDev) -> FairshareDev:
    """`fairshare` with a freshly started extender: no pending pods of earlier tests in its
    queue (use it with ``pytest.mark.usefixtures("fresh_extender")``)."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


async def webhook_knows_tenant(api: client.ApiClient, namespace: str, tenant: str) -> bool:
    """Has the webhook seen `namespace`'s tenant label? A server-side dry run of a pod
    comes back with the tenant label the mutating webhook adds."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "tenant-probe"},
        "spec": {"containers": [{"name": "main", "image": PAUSE_IMAGE}]},
    }
    try:
        pod = await client.CoreV1Api(api).create_namespaced_pod(namespace, probe, dry_run="All")
    except ApiException as exc:
        if exc.status in (403, 404):  # namespace or its ServiceAccount not there yet
            return False
        raise
    return bool((pod.metadata.labels or {}).get(TENANT_LABEL) == tenant)


@pytest.fixture
async def tenant_namespace(
    fairshare: FairshareDev, api: client.ApiClient
) -> AsyncIterator[Callable[[str], Awaitable[str]]]:
    """`await tenant_namespace("team-a")`: a namespace labelled fairshare.io/tenant=team-a
    that the webhook already resolves to that tenant; deleted (and waited for) afterwards."""
    core = client.CoreV1Api(api)
    created: list[str] = []

    async def make(tenant: str) -> str:
        ns = await core.create_namespace(
            {"metadata": {"generateName": f"{tenant}-", "labels": {TENANT_LABEL: tenant}}}
        )
        name: str = ns.metadata.name
        created.append(name)

        async def known() -> bool:
            return await webhook_knows_tenant(api, name, tenant)

        await wait_for(known, timeout=30, what=f"the webhook to see namespace {name}")
        return name

    yield make

    async def delete(name: str) -> None:
        # Pods first (kwok finishes their deletion at once), then the namespace, whose
        # finalisation by kube-controller-manager takes seconds and is not waited for.
        try:
            await core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            await core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

        async def no_pods() -> bool:
            return not (await core.list_namespaced_pod(name)).items

        await wait_for(no_pods, timeout=60, what=f"the pods of namespace {name} to be gone")

    await asyncio.gather(*(delete(n) for n in created))
