#!/usr/bin/env python3
"""Run fairshare against the local control plane of tools/e2e/cluster.py.

    python tools/e2e/dev.py up     [--state-dir .e2e] [--config FILE] [--nodes 2] [--gpus 8]
    python tools/e2e/dev.py down   [--state-dir .e2e]
    python tools/e2e/dev.py status [--state-dir .e2e]
    python tools/e2e/dev.py restart-extender [--state-dir .e2e]
    python tools/e2e/dev.py restart-webhook [--state-dir .e2e]

`up` brings the cluster up (cluster.py up, a no-op when it is already up), then:

* namespace `fairshare-system` and ConfigMap `fairshare-config` (key `config.yaml`: FILE,
  or a small default for development), and fairshare's DeviceClass
  (manifests/base/deviceclass.yaml);
* a CA and a serving certificate (IP SAN 127.0.0.1) for each server, from fairshare.tls;
* `fairshare webhook` and `fairshare extender` as background processes on free loopback
  ports, watching the ConfigMap (logs in <state>/run/logs/fairshare-*.log), waited for on
  their /readyz;
* MutatingWebhookConfiguration and ValidatingWebhookConfiguration `fairshare-dev`, by URL
  (https://127.0.0.1:<port>/mutate|/validate) with the caBundle;
* kube-scheduler restarted with a KubeSchedulerConfiguration that names the extender
  (filter, prioritize, preempt, bind; nodeCacheCapable; no managedResources, so every pod
  goes through it; ignorable: false);
* `--nodes N` (default 2; 0 for none) kwok GPU nodes `dev-gpu-0`.. of `--gpus` (8) A100s
  each, created if missing, so that pods created next can be scheduled (the e2e fixtures
  call `start` and make their own nodes).

`down` undoes all of that (the scheduler gets back its default configuration) and leaves
the cluster running; `make cluster-down` stops the cluster. The processes run in their own
sessions, so they outlive this script; their pids, ports and files are in
<state>/dev/dev.json. `up` on a healthy setup only applies a new --config.

Admission never opens. `up` over a setup that is not healthy (a server died, a re-run) and
`restart-webhook` never delete the webhook configurations: the new servers start on new
ports, and only once the new webhook is ready (its first list of the cluster done) are the
configurations updated in place (URL, caBundle), kube-apiserver is seen calling the new
webhook, and the old processes are stopped. Until then the configurations keep pointing at
the old webhook, alive or dead; with failurePolicy Fail a dead one refuses pods, it never
lets them through. (Only the config guard `config.fairshare.io` is taken out, and only
when a dead webhook would refuse the ConfigMap write the new servers need.) The serving
certificates are kept while they are valid, so the caBundle does not change under a
running webhook. In the overlap both webhooks answer with their own in-memory
reservations; a tenant at its limit is refused by both.

The pytest fixtures import this file too: `start`, `stop`, `restart_extender`,
`restart_webhook`, `status`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CLUSTER_PY = HERE / "cluster.py"
DEFAULT_STATE_DIR = ROOT / ".e2e"

SYSTEM_NAMESPACE = "fairshare-system"
CONFIGMAP = "fairshare-config"
CONFIG_KEY = "config.yaml"
WEBHOOK_NAME = "fairshare-dev"
RESERVATION_NAMESPACE = "fairshare-reservation"
"""Where the extender puts reservation pods (gpuSharing.reservation.namespace, default)."""
EXCLUDED_NAMESPACES = (
    "kube-system",
    "kube-public",
    "kube-node-lease",
    SYSTEM_NAMESPACE,
    RESERVATION_NAMESPACE,
)
SERVERS = ("webhook", "extender")
READY_TIMEOUT = 60.0

DEFAULT_CONFIG = """\
# fairshare dev config (tools/e2e/dev.py): namespaces labelled fairshare.io/tenant=<name>
# join a tenant; everything else belongs to the tenant "default".
apiVersion: fairshare.io/v1alpha1
kind: FairShareConfig
tenants:
- name: team-a
  weight: 1
  limit:
    nvidia.com/gpu: "8"
- name: team-b
  weight: 1
"""


def log(msg: str) -> None:
    print(f"[dev {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cluster_module() -> ModuleType:
    """tools/e2e/cluster.py, imported by path (shared with tests/e2e/conftest.py)."""
    name = "fairshare_e2e_cluster"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, CLUSTER_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class DevError(Exception):
    """A failure with a message meant for the user."""


@dataclass
class Handles:
    """What `start` started: enough to reach, restart and stop it (saved as dev.json)."""

    state_dir: str
    cluster_created: str
    kubeconfig: str
    kubectl: str
    webhook_port: int
    extender_port: int
    webhook_pid: int
    extender_pid: int
    webhook_ca: str
    extender_ca: str
    scheduler_config: str
    config_file: str
    # The client certificate kube-scheduler presents to the extender (the servers run with
    # --client-ca when the cluster has one; "" on a cluster without, e.g. kind).
    client_ca: str = ""
    scheduler_client_cert: str = ""
    scheduler_client_key: str = ""

    def url(self, server: str, path: str = "") -> str:
        port = self.webhook_port if server == "webhook" else self.extender_port
        return f"https://127.0.0.1:{port}{path}"

    def ca(self, server: str) -> str:
        return self.webhook_ca if server == "webhook" else self.extender_ca

    def pid(self, server: str) -> int:
        return self.webhook_pid if server == "webhook" else self.extender_pid

    def client_context(self, server: str) -> Any:
        """An SSLContext trusting `server`'s CA and presenting a client certificate the
        servers accept (what a caller of /validate or /filter needs under --client-ca)."""
        import ssl

        ctx = ssl.create_default_context(cafile=self.ca(server))
        if self.scheduler_client_cert:
            ctx.load_cert_chain(self.scheduler_client_cert, self.scheduler_client_key)
        return ctx


class Layout:
    """Files of the dev setup under <state>/dev (outside run/, which `cluster.py down`
    empties, so a later `up` or `down` still finds stale processes)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.dir = state_dir / "dev"
        self.handles = self.dir / "dev.json"
        self.config = self.dir / "config.yaml"
        self.scheduler_config = self.dir / "kube-scheduler.json"
        self.logs = state_dir / "run" / "logs"

    def certs(self, server: str) -> Path:
        return self.dir / "certs" / server

    def log(self, server: str) -> Path:
        return self.logs / f"fairshare-{server}.log"


# --------------------------------------------------------------------------------------------
# Cluster access


def run_cluster_py(state_dir: Path, *args: str, timeout: float = 300) -> None:
    proc = subprocess.run(
        [sys.executable, str(CLUSTER_PY), *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise DevError(f"cluster.py {args[0]} failed:\n{proc.stdout}{proc.stderr}")


def cluster_state(state_dir: Path) -> dict[str, Any]:
    mod = cluster_module()
    state = mod.load_state(mod.Paths(state_dir))
    if state is None or state.get("external_kubeconfig"):
        raise DevError(f"no local cluster in {state_dir}: run `make cluster-up` first")
    return dict(state)


def cluster_healthy(state_dir: Path) -> bool:
    mod = cluster_module()
    state = mod.load_state(mod.Paths(state_dir))
    if state is None or state.get("external_kubeconfig"):
        return False
    return bool(mod.cluster_is_healthy(state))


def kubectl(
    state: dict[str, Any], *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [state["kubectl"], f"--kubeconfig={state['kubeconfig']}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check and proc.returncode != 0:
        raise DevError(f"kubectl {' '.join(args)}: {proc.stdout}{proc.stderr}")
    return proc


def apply(state: dict[str, Any], *objects: dict[str, Any]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    kubectl(state, "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))


def configmap(config_yaml: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
        "data": {CONFIG_KEY: config_yaml},
    }


REQUEUE_DEVICE_CLASS = ROOT / "manifests" / "base" / "deviceclass.yaml"


def ensure_config(state: dict[str, Any], config_yaml: str) -> None:
    """Namespace fairshare-system and the ConfigMap (created or replaced), the
    reservation pods' namespace and ServiceAccount, and fairshare's DeviceClass that the
    extender annotates to requeue pods DRA refused (the extender runs with the cluster's
    admin credentials here, so no RBAC is needed)."""
    import yaml

    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}}
    reservations = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": RESERVATION_NAMESPACE},
    }
    reporter = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "fairshare-gpu-reporter", "namespace": RESERVATION_NAMESPACE},
    }
    device_class = yaml.safe_load(REQUEUE_DEVICE_CLASS.read_text(encoding="utf-8"))
    apply(state, namespace, configmap(config_yaml), reservations, reporter, device_class)
    ensure_podgroup_crd(state)


DEV_NODES = 2
DEV_GPUS = 8
DEV_NODE_PREFIX = "dev-gpu-"


def dev_gpu_node(name: str, gpus: int) -> dict[str, Any]:
    """A fake GPU node that kwok runs (its annotation), with the allocatable and the labels
    NVIDIA's device plugin and GPU feature discovery give an A100 80GB node."""
    amounts = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti",
               "nvidia.com/gpu": str(gpus)}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
            },
        },
        # A Node created with its status keeps it (kubelets register this way); kwok
        # fills in the conditions and heartbeats.
        "status": {"capacity": dict(amounts), "allocatable": dict(amounts)},
    }


def ensure_gpu_nodes(state: dict[str, Any], count: int, gpus: int) -> list[str]:
    """``count`` kwok GPU nodes ``dev-gpu-0``.. of ``gpus`` GPUs each; existing ones are
    left as they are (a re-run keeps the pods on them). Returns the names created."""
    names = [f"{DEV_NODE_PREFIX}{k}" for k in range(count)]
    have = kubectl(state, "get", "nodes", "-o", "name", check=False).stdout.split()
    new = [n for n in names if f"node/{n}" not in have]
    if new:
        doc = {"apiVersion": "v1", "kind": "List", "items": [dev_gpu_node(n, gpus) for n in new]}
        kubectl(state, "create", "-f", "-", input=json.dumps(doc))
        kubectl(state, "wait", "--for=condition=Ready", "--timeout=60s",
                *(f"node/{n}" for n in new))  # fmt: skip
    return new


PODGROUP_CRD = ROOT / "manifests" / "gangs" / "podgroup-crd.yaml"


def ensure_podgroup_crd(state: dict[str, Any]) -> None:
    """The coscheduling PodGroup CRD (``manifests/gangs``), created when the cluster has
    none, so gangs of that convention can be sized by a PodGroup (the native
    ``scheduling.k8s.io/v1alpha2`` PodGroup is served by the control plane itself)."""
    found = kubectl(
        state, "get", "crd", "podgroups.scheduling.x-k8s.io", "--ignore-not-found", "-o", "name"
    ).stdout
    if not found.strip():
        import yaml

        crd = yaml.safe_load(PODGROUP_CRD.read_text(encoding="utf-8"))
        apply(state, crd)


# --------------------------------------------------------------------------------------------
# Webhook configurations and the scheduler config


def _b64(path: str | Path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def _webhook(name: str, url: str, ca: str, **extra: Any) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "timeoutSeconds": 5,
        "matchPolicy": "Equivalent",
        "clientConfig": {"url": url, "caBundle": ca},
    }
    hook.update(extra)
    return hook


# GPUs requested through DRA count against tenant limits (webhook/review.py).
DRA_RULE: dict[str, Any] = {
    "apiGroups": ["resource.k8s.io"],
    "apiVersions": ["v1"],
    "operations": ["CREATE"],
    "resources": ["resourceclaims", "resourceclaimtemplates"],
    "scope": "Namespaced",
}


def _pod_rules(resources: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": resources,
            "scope": "Namespaced",
        }
    ]


def webhook_configurations(h: Handles) -> list[dict[str, Any]]:
    ca = _b64(h.webhook_ca)
    tenants_only = {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": list(EXCLUDED_NAMESPACES),
            }
        ]
    }
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_NAME},
        "webhooks": [
            _webhook(
                "pods.fairshare.io",
                h.url("webhook", "/mutate"),
                ca,
                failurePolicy="Ignore",
                reinvocationPolicy="IfNeeded",
                rules=_pod_rules(["pods"]),
                namespaceSelector=tenants_only,
            )
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_NAME},
        "webhooks": [
            _webhook(
                "pods.fairshare.io",
                h.url("webhook", "/validate"),
                ca,
                failurePolicy="Fail",
                rules=[*_pod_rules(["pods", "persistentvolumeclaims"]), DRA_RULE],
                namespaceSelector=tenants_only,
            ),
            _webhook(
                "config.fairshare.io",
                h.url("webhook", "/validate"),
                ca,
                failurePolicy="Fail",
                rules=[
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["configmaps"],
                        "scope": "Namespaced",
                    }
                ],
                namespaceSelector={
                    "matchLabels": {"kubernetes.io/metadata.name": SYSTEM_NAMESPACE}
                },
                matchConditions=[
                    {
                        "name": "fairshare-config-only",
                        "expression": f'object != null && object.metadata.name == "{CONFIGMAP}"',
                    }
                ],
            ),
        ],
    }
    return [mutating, validating]


def extender_tls(h: Handles) -> dict[str, str]:
    """kube-scheduler's tlsConfig for the extender: its CA, and the client certificate
    the extender's --client-ca asks for when the cluster has one."""
    out = {"caData": _b64(h.extender_ca)}
    if h.scheduler_client_cert:
        out |= {"certData": _b64(h.scheduler_client_cert), "keyData": _b64(h.scheduler_client_key)}
    return out


def scheduler_configuration(h: Handles) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        # Retry unschedulable pods quickly: the tests wait for contention to settle.
        "podInitialBackoffSeconds": 1,
        "podMaxBackoffSeconds": 2,
        "extenders": [
            {
                "urlPrefix": h.url("extender"),
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "preemptVerb": "preempt",
                "bindVerb": "bind",
                "weight": 5,
                "enableHTTPS": True,
                "tlsConfig": extender_tls(h),
                "nodeCacheCapable": True,
                "ignorable": False,
                "httpTimeout": "5s",
            }
        ],
    }


def scheduler_is_ours(state: dict[str, Any], h: Handles) -> bool:
    mod = cluster_module()
    if state.get("scheduler_config_source") != h.scheduler_config:
        return False
    comp = state["components"].get("kube-scheduler")
    return comp is not None and mod.pid_alive(comp["pid"], comp["argv"][0])


# --------------------------------------------------------------------------------------------
# Processes

# Popen objects of the servers this process started (kept so they are reaped, never GC'd
# while running).
_children: dict[int, subprocess.Popen[bytes]] = {}


def server_argv(layout: Layout, state: dict[str, Any], server: str, port: int) -> list[str]:
    certs = layout.certs(server)
    return [
        sys.executable,
        "-m",
        "fairshare_cli",
        server,
        f"--kubeconfig={state['kubeconfig']}",
        f"--configmap={SYSTEM_NAMESPACE}/{CONFIGMAP}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--tls-cert={certs / 'tls.crt'}",
        f"--tls-key={certs / 'tls.key'}",
        f"--not-ready-after={NOT_READY_AFTER}",
        *([f"--client-ca={client_ca}"] if (client_ca := client_ca_file(state)) else []),
    ]


# /readyz of the dev servers fails after this many seconds without the API (the default
# is 10 s; shorter here so the apiserver-outage test sees it drop and recover quickly).
NOT_READY_AFTER = 2.0


def client_ca_file(state: dict[str, Any]) -> str:
    """The cluster's client CA (cluster.py writes one), or "" (an external cluster)."""
    pki = state.get("pki_dir")
    if pki and (Path(pki) / "client-ca.crt").is_file():
        return str(Path(pki) / "client-ca.crt")
    return ""


def _spawn(argv: list[str], path: Path) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session, appending its output to the log `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    env = cluster_module().child_env()
    env["PYTHONUNBUFFERED"] = "1"
    with open(path, "ab") as out:
        out.write(f"\n=== {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            close_fds=True,
        )
    _children[proc.pid] = proc
    return proc


def start_server(
    layout: Layout,
    state: dict[str, Any],
    server: str,
    port: int,
    extra_args: tuple[str, ...] = (),
) -> int:
    argv = [*server_argv(layout, state, server, port), *extra_args]
    return _spawn(argv, layout.log(server)).pid


def _alive(pid: int) -> bool:
    proc = _children.get(pid)
    if proc is not None:
        return proc.poll() is None
    return bool(pid) and bool(cluster_module().pid_alive(pid)) and _is_fairshare(pid)


def _is_fairshare(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # `python -m fairshare_cli SERVER` (`python -m fairshare` before the CLI left the core).
    return any(a in (b"fairshare_cli", b"fairshare") for a in argv[:3])


def stop_server(server: str, pid: int) -> None:
    if not pid or not _alive(pid):
        return
    with contextlib.suppress(cluster_error()):
        cluster_module().stop_process(f"fairshare {server}", pid, None, timeout=10.0)
    proc = _children.pop(pid, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def cluster_error() -> type[Exception]:
    error: type[Exception] = cluster_module().ClusterError
    return error


def server_ready(h: Handles, server: str) -> tuple[bool, str]:
    mod = cluster_module()
    import ssl

    ctx = ssl.create_default_context(cafile=h.ca(server))
    try:
        status, body = mod.http_get(h.url(server, "/readyz"), ctx)
    except (OSError, ssl.SSLError) as exc:
        return False, str(exc)
    return status == 200, body.strip()


def wait_ready(layout: Layout, h: Handles, server: str, timeout: float = READY_TIMEOUT) -> float:
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < timeout:
        if not _alive(h.pid(server)):
            raise DevError(
                f"fairshare {server} exited; last lines of {layout.log(server)}:\n"
                + cluster_module().tail(layout.log(server))
            )
        ok, last = server_ready(h, server)
        if ok:
            return time.monotonic() - t0
        time.sleep(0.2)
    raise DevError(f"fairshare {server} not ready after {timeout:.0f}s ({last})")


def metric(h: Handles, server: str, name: str) -> float:
    """The sum of the samples of metric `name` on `server`'s /metrics (0 if absent)."""
    import ssl

    ctx = ssl.create_default_context(cafile=h.ca(server))
    _, body = cluster_module().http_get(h.url(server, "/metrics"), ctx)
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def extender_status(h: Handles) -> dict[str, Any]:
    """The extender's own view (``GET /status.json``): tenants, held and pending pods."""
    import ssl

    ctx = ssl.create_default_context(cafile=h.ca("extender"))
    code, body = cluster_module().http_get(h.url("extender", "/status.json"), ctx)
    if code != 200:
        raise DevError(f"extender /status.json answered {code}: {body[:200]}")
    data: dict[str, Any] = json.loads(body)
    return data


# --------------------------------------------------------------------------------------------
# Handles file


def load_handles(layout: Layout) -> Handles | None:
    try:
        data = json.loads(layout.handles.read_text())
    except (FileNotFoundError, ValueError):
        return None
    try:
        return Handles(**data)
    except TypeError:
        return None


def save_handles(layout: Layout, h: Handles) -> None:
    layout.dir.mkdir(parents=True, exist_ok=True)
    tmp = layout.handles.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(h), indent=2) + "\n")
    tmp.replace(layout.handles)


def healthy(layout: Layout, h: Handles, state: dict[str, Any]) -> bool:
    if h.cluster_created != state.get("created") or h.kubeconfig != state.get("kubeconfig"):
        return False
    return all(_alive(h.pid(s)) and server_ready(h, s)[0] for s in SERVERS)


# --------------------------------------------------------------------------------------------
# Commands (also the fixtures' API)


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    import fcntl

    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / ".dev.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def start(
    state_dir: Path = DEFAULT_STATE_DIR, config_yaml: str | None = None, *, cluster: bool = True
) -> Handles:
    """Bring everything up (idempotent) and return the handles.

    `cluster=False` expects the cluster to be up already (the pytest fixture starts it).
    `config_yaml` replaces the ConfigMap's content; None keeps what is there (or writes the
    dev default when there is nothing).
    """
    state_dir = Path(state_dir).resolve()
    layout = Layout(state_dir)
    if cluster and not cluster_healthy(state_dir):
        # Only when needed: `cluster.py up` on a healthy cluster would give kube-scheduler
        # its default configuration back.
        run_cluster_py(state_dir, "up")
    with _locked(state_dir):
        state = cluster_state(state_dir)
        h = load_handles(layout)
        if h is not None and healthy(layout, h, state):
            if config_yaml is not None:
                ensure_config(state, config_yaml)
            if not scheduler_is_ours(state, h):
                log("restarting kube-scheduler with the extender")
                run_cluster_py(
                    state_dir, "restart-scheduler", "--scheduler-config", h.scheduler_config
                )
            log(f"fairshare already up (webhook :{h.webhook_port}, extender :{h.extender_port})")
            return h
        if h is not None and h.cluster_created != state.get("created"):
            # Another cluster: its webhook configurations and scheduler are not ours.
            log("stopping fairshare processes of an earlier cluster")
            _stop(layout, h, None, restore_scheduler=False)
            h = None
        if h is not None:
            log("replacing a fairshare setup that is not healthy (webhooks stay registered)")
        return _start(layout, state, config_yaml, previous=h)


def _start(
    layout: Layout,
    state: dict[str, Any],
    config_yaml: str | None,
    previous: Handles | None = None,
) -> Handles:
    """Start new servers and hand over to them; `previous` (its processes alive or not)
    stays registered until the new webhook is ready, then is stopped."""
    t0 = time.monotonic()
    layout.dir.mkdir(parents=True, exist_ok=True)
    if config_yaml is None:
        current = kubectl(
            state, "-n", SYSTEM_NAMESPACE, "get", "configmap", CONFIGMAP, "-o", "json", check=False
        )
        if current.returncode == 0:
            config_yaml = json.loads(current.stdout).get("data", {}).get(CONFIG_KEY)
    if config_yaml is None:
        config_yaml = DEFAULT_CONFIG
    layout.config.write_text(config_yaml)
    ensure_config_registered(state, config_yaml)
    for server in SERVERS:
        ensure_certs(layout, server)
    mod = cluster_module()
    taken = {previous.webhook_port, previous.extender_port} if previous else set()
    ports: dict[str, int] = {}
    for server in SERVERS:
        port = mod.free_port()
        while port in taken:
            port = mod.free_port()
        ports[server] = port
        taken.add(port)
    h = Handles(
        state_dir=str(layout.state_dir),
        cluster_created=str(state.get("created")),
        kubeconfig=state["kubeconfig"],
        kubectl=state["kubectl"],
        webhook_port=ports["webhook"],
        extender_port=ports["extender"],
        webhook_pid=0,
        extender_pid=0,
        webhook_ca=str(layout.certs("webhook") / "ca.crt"),
        extender_ca=str(layout.certs("extender") / "ca.crt"),
        scheduler_config=str(layout.scheduler_config),
        config_file=str(layout.config),
    )
    if client_ca := client_ca_file(state):
        pki = Path(client_ca).parent
        h.client_ca = client_ca
        h.scheduler_client_cert = str(pki / "scheduler-client.crt")
        h.scheduler_client_key = str(pki / "scheduler-client.key")
    try:
        h.webhook_pid = start_server(layout, state, "webhook", h.webhook_port)
        h.extender_pid = start_server(layout, state, "extender", h.extender_port)
        for server in SERVERS:
            took = wait_ready(layout, h, server)
            log(f"fairshare {server} ready on {h.url(server)} ({took:.1f}s)")
        # Updated in place: the webhooks stay registered throughout (never deleted here).
        apply(state, *webhook_configurations(h))
        save_handles(layout, h)
        if previous is not None and _alive(previous.webhook_pid):
            wait_webhook_called(h, state)
        layout.scheduler_config.write_text(json.dumps(scheduler_configuration(h), indent=2))
        run_cluster_py(
            layout.state_dir, "restart-scheduler", "--scheduler-config", h.scheduler_config
        )
    except BaseException:
        log(f"startup failed; stopping what was started (logs in {layout.logs})")
        for server in SERVERS:
            with contextlib.suppress(Exception):
                stop_server(server, h.pid(server))
        if previous is not None:
            # The registrations may already name the new (now stopped) webhook: with
            # failurePolicy Fail that refuses pods. `up` again or `down` cleans up.
            save_handles(layout, previous)
        else:
            layout.handles.unlink(missing_ok=True)
        raise
    if previous is not None:
        for server in SERVERS:
            stop_server(server, previous.pid(server))
    log(f"fairshare up in {time.monotonic() - t0:.1f}s")
    return h


def ensure_certs(layout: Layout, server: str, min_valid: float = 86400.0) -> None:
    """Keep `server`'s CA and serving certificate while they are valid for another
    `min_valid` seconds (a running webhook and its registered caBundle stay in step);
    mint new ones otherwise."""
    import datetime as dt

    from cryptography import x509

    from fairshare import tls

    certs = layout.certs(server)
    try:
        ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
        leaf = x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes())
        leaf.verify_directly_issued_by(ca)
        left = leaf.not_valid_after_utc - dt.datetime.now(dt.UTC)
        if (certs / "tls.key").is_file() and left.total_seconds() > min_valid:
            return
    except Exception as exc:  # missing, unreadable, not issued by the CA (InvalidSignature)
        log(f"new certificates for {server} ({type(exc).__name__})")
    tls.write_certs(
        certs,
        service=f"fairshare-{server}",
        namespace=SYSTEM_NAMESPACE,
        ip_addresses=("127.0.0.1",),
    )


def ensure_config_registered(state: dict[str, Any], config_yaml: str) -> None:
    """`ensure_config` while the webhook configurations stay registered.

    The config guard (`config.fairshare.io`) may point at a webhook that is gone; it then
    refuses the ConfigMap write that the new servers need to start. Only in that case it
    alone is taken out of the validating configuration (the pod webhooks stay; the full
    configuration is applied again once the new webhook is ready). A refusal by a live
    guard (an invalid config) is an error."""
    try:
        ensure_config(state, config_yaml)
        return
    except DevError as exc:
        if "failed calling webhook" not in str(exc) or "config.fairshare.io" not in str(exc):
            raise
    log("the config guard points at a webhook that is gone; unregistering it alone")
    drop_config_guard(state)
    ensure_config(state, config_yaml)


def drop_config_guard(state: dict[str, Any]) -> None:
    """Remove the webhook `config.fairshare.io` from the validating configuration."""
    found = kubectl(
        state, "get", "validatingwebhookconfiguration", WEBHOOK_NAME, "-o", "json", check=False
    )
    if found.returncode != 0:
        return
    hooks = json.loads(found.stdout).get("webhooks") or []
    for i, hook in enumerate(hooks):
        if hook.get("name") == "config.fairshare.io":
            patch = [
                {"op": "test", "path": f"/webhooks/{i}/name", "value": "config.fairshare.io"},
                {"op": "remove", "path": f"/webhooks/{i}"},
            ]
            kubectl(
                state,
                "patch",
                "validatingwebhookconfiguration",
                WEBHOOK_NAME,
                "--type=json",
                "-p",
                json.dumps(patch),
            )
            return


ADMISSION_METRIC = "fairshare_admission_requests_total"


def wait_webhook_called(h: Handles, state: dict[str, Any], timeout: float = 15.0) -> float:
    """Until kube-apiserver calls the webhook of `h` (its configuration informer has the
    new URL): server-side dry runs of a pod in namespace `default` until the new webhook's
    admission counter has counted both of a probe's calls (mutate and validate). Seconds
    it took; a DevError after `timeout`."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "fairshare-dev-probe-"},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    }
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        before = metric(h, "webhook", ADMISSION_METRIC)
        kubectl(
            state,
            "-n",
            "default",
            "create",
            "--dry-run=server",
            "-f",
            "-",
            input=json.dumps(probe),
            check=False,
        )
        if metric(h, "webhook", ADMISSION_METRIC) - before >= 2:
            return time.monotonic() - t0
        time.sleep(0.1)
    raise DevError(f"kube-apiserver did not call the webhook at {h.url('webhook')} in {timeout}s")


def delete_webhook_configurations(state: dict[str, Any]) -> None:
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        kubectl(state, "delete", kind, WEBHOOK_NAME, "--ignore-not-found", check=False)


def _stop(
    layout: Layout, h: Handles, state: dict[str, Any] | None, *, restore_scheduler: bool
) -> None:
    if state is not None:
        delete_webhook_configurations(state)
        if restore_scheduler and scheduler_is_ours(state, h):
            mod = cluster_module()
            paths = mod.Paths(layout.state_dir)
            with mod.locked(paths):
                mod.do_restart_scheduler(paths, None)  # the default configuration
    for server in SERVERS:
        stop_server(server, h.pid(server))
    layout.handles.unlink(missing_ok=True)


def stop(state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """Remove the webhook configurations, give kube-scheduler its default configuration
    back and stop both servers. The cluster keeps running."""
    state_dir = Path(state_dir).resolve()
    layout = Layout(state_dir)
    with _locked(state_dir):
        h = load_handles(layout)
        if h is None:
            log("fairshare is not up; nothing to stop")
            return
        try:
            state: dict[str, Any] | None = cluster_state(state_dir)
            if state is not None and state.get("created") != h.cluster_created:
                state = None  # another cluster: its scheduler and webhooks are not ours
        except DevError:
            state = None
        _stop(layout, h, state, restore_scheduler=True)
        log("fairshare stopped")


def restart_extender(
    state_dir: Path = DEFAULT_STATE_DIR, extra_args: tuple[str, ...] = ()
) -> Handles:
    """Stop the extender and start a new one on the same port (the scheduler keeps its
    configuration), with `extra_args` (e.g. `--pick-in-filter`; not remembered: the next
    restart drops them); returns once it is ready again."""
    state_dir = Path(state_dir).resolve()
    layout = Layout(state_dir)
    with _locked(state_dir):
        h = load_handles(layout)
        if h is None:
            raise DevError("fairshare is not up: run `make dev-up` first")
        state = cluster_state(state_dir)
        stop_server("extender", h.extender_pid)
        h.extender_pid = start_server(layout, state, "extender", h.extender_port, extra_args)
        save_handles(layout, h)
        took = wait_ready(layout, h, "extender")
        log(f"fairshare extender restarted ({took:.1f}s)")
        return h


def restart_webhook(
    state_dir: Path = DEFAULT_STATE_DIR, *, in_place: bool = False, kubeconfig: str = ""
) -> Handles:
    """Replace the webhook process; returns once the new one answers.

    Default, a handover that leaves no gap: a new webhook on a new port, waited for on
    its /readyz (its first list of the cluster done), the configurations updated in place
    to its URL, kube-apiserver seen calling it, and only then the old one stopped.
    `in_place=True` does what a kubelet does to a crashed container behind a Service:
    stop the old process and start a new one on the same port (the registrations never
    change; until it answers, failurePolicy Fail refuses pods, and its first answers come
    before its first list of the cluster is complete). `kubeconfig`: the new webhook's
    credentials instead of the cluster's (e.g. a test's ServiceAccount with less RBAC)."""
    state_dir = Path(state_dir).resolve()
    layout = Layout(state_dir)
    with _locked(state_dir):
        h = load_handles(layout)
        if h is None:
            raise DevError("fairshare is not up: run `make dev-up` first")
        state = cluster_state(state_dir)
        server_state = {**state, "kubeconfig": kubeconfig} if kubeconfig else state
        t0 = time.monotonic()
        if in_place:
            stop_server("webhook", h.webhook_pid)
            h.webhook_pid = start_server(layout, server_state, "webhook", h.webhook_port)
            save_handles(layout, h)
            wait_ready(layout, h, "webhook")
            log(f"fairshare webhook restarted in place ({time.monotonic() - t0:.1f}s)")
            return h
        old = Handles(**asdict(h))
        port = cluster_module().free_port()
        while port in (h.webhook_port, h.extender_port):
            port = cluster_module().free_port()
        h.webhook_port = port
        h.webhook_pid = start_server(layout, server_state, "webhook", port)
        try:
            wait_ready(layout, h, "webhook")
            apply(state, *webhook_configurations(h))
            save_handles(layout, h)
            took = wait_webhook_called(h, state)
        except BaseException:
            stop_server("webhook", h.webhook_pid)
            raise
        stop_server("webhook", old.webhook_pid)
        log(
            f"fairshare webhook handed over to :{port} ({time.monotonic() - t0:.1f}s; "
            f"called by kube-apiserver {took:.1f}s after the configurations were updated)"
        )
        return h


def start_extra_webhook(
    state_dir: Path,
    port: int,
    *,
    certs_dir: Path | None = None,
    extra_args: tuple[str, ...] = (),
    name: str = "webhook-extra",
) -> int:
    """Start one more `fairshare webhook` (e.g. a second replica, or one whose certificate
    a test rotates) on `port`, with the certificate in `certs_dir` (default: the dev
    webhook's) and `extra_args` (e.g. `--shared-reservations fairshare-system`). Not
    registered anywhere and not recorded in dev.json: the caller stops it with
    `stop_extra_webhook`. Returns its pid once its /readyz answers 200."""
    return start_extra_server(
        state_dir, "webhook", port, certs_dir=certs_dir, extra_args=extra_args, name=name
    )


def start_extra_extender(
    state_dir: Path, port: int, *, extra_args: tuple[str, ...] = (), name: str = "extender-extra"
) -> int:
    """Start one more `fairshare extender` on `port` with the dev extender's certificate
    (e.g. replicas with `--lease`); `set_scheduler_extender_url` points kube-scheduler at
    it (or at a proxy in front of several). Stop it with `stop_server`."""
    return start_extra_server(state_dir, "extender", port, extra_args=extra_args, name=name)


def start_extra_server(
    state_dir: Path,
    server: str,
    port: int,
    *,
    certs_dir: Path | None = None,
    extra_args: tuple[str, ...] = (),
    name: str,
) -> int:
    """One more `fairshare <server>` on `port` (see `start_extra_webhook`); its pid once
    its /readyz answers 200."""
    state_dir = Path(state_dir).resolve()
    layout = Layout(state_dir)
    state = cluster_state(state_dir)
    certs = Path(certs_dir) if certs_dir is not None else layout.certs(server)
    argv = server_argv(layout, state, server, port)
    argv = [a for a in argv if not a.startswith(("--tls-cert=", "--tls-key="))]
    argv += [f"--tls-cert={certs / 'tls.crt'}", f"--tls-key={certs / 'tls.key'}", *extra_args]
    path = layout.logs / f"fairshare-{name}.log"
    proc = _spawn(argv, path)
    import ssl

    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    deadline = time.monotonic() + READY_TIMEOUT
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DevError(f"{name} exited; last lines of {path}:\n{cluster_module().tail(path)}")
        try:
            status, last = cluster_module().http_get(f"https://127.0.0.1:{port}/readyz", ctx)
            if status == 200:
                return proc.pid
        except (OSError, ssl.SSLError) as exc:
            last = str(exc)
        time.sleep(0.2)
    stop_server(name, proc.pid)
    raise DevError(f"{name} not ready after {READY_TIMEOUT:.0f}s ({last})")


def stop_extra_webhook(pid: int) -> None:
    """Stop a webhook started by `start_extra_webhook` (SIGTERM, then SIGKILL)."""
    stop_server("webhook-extra", pid)


def set_scheduler_extender_url(state_dir: Path, url: str | None) -> None:
    """Restart kube-scheduler with the extender at `url` (e.g. a proxy in front of
    several replicas; same CA and client certificate), or with the dev extender again
    (None). Returns once kube-scheduler has restarted."""
    state_dir = Path(state_dir).resolve()
    layout = Layout(state_dir)
    with _locked(state_dir):
        h = load_handles(layout)
        if h is None:
            raise DevError("fairshare is not up: run `make dev-up` first")
        if url is None:
            run_cluster_py(state_dir, "restart-scheduler", "--scheduler-config", h.scheduler_config)
            return
        config = scheduler_configuration(h)
        config["extenders"][0]["urlPrefix"] = url
        path = layout.dir / "kube-scheduler-elsewhere.json"
        path.write_text(json.dumps(config, indent=2))
        run_cluster_py(state_dir, "restart-scheduler", "--scheduler-config", str(path))


def set_pod_webhook_url(state_dir: Path, url: str | None) -> None:
    """Point the validating webhook `pods.fairshare.io` of `fairshare-dev` at `url`
    (None: back at the dev webhook's /validate). The other webhooks are left alone."""
    state_dir = Path(state_dir).resolve()
    h = load_handles(Layout(state_dir))
    if h is None:
        raise DevError("fairshare is not up: run `make dev-up` first")
    state = cluster_state(state_dir)
    target = url or h.url("webhook", "/validate")
    patch = [
        {"op": "test", "path": "/webhooks/0/name", "value": "pods.fairshare.io"},
        {"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": target},
    ]
    kubectl(
        state,
        "patch",
        "validatingwebhookconfiguration",
        WEBHOOK_NAME,
        "--type=json",
        "-p",
        json.dumps(patch),
    )


def ensure_scheduler(state_dir: Path = DEFAULT_STATE_DIR) -> bool:
    """Restart kube-scheduler with the extender if something (e.g. `cluster.py up` without
    --scheduler-config, from another run on the same state dir) gave it another config.
    True if it had to."""
    state_dir = Path(state_dir).resolve()
    layout = Layout(state_dir)
    with _locked(state_dir):
        h = load_handles(layout)
        if h is None:
            raise DevError("fairshare is not up: run `make dev-up` first")
        if scheduler_is_ours(cluster_state(state_dir), h):
            return False
        log("kube-scheduler runs without the extender; restarting it with the extender")
        run_cluster_py(state_dir, "restart-scheduler", "--scheduler-config", h.scheduler_config)
        return True


def status(state_dir: Path = DEFAULT_STATE_DIR) -> dict[str, Any]:
    layout = Layout(Path(state_dir).resolve())
    h = load_handles(layout)
    if h is None:
        return {"up": False}
    out: dict[str, Any] = {"up": True, "handles": asdict(h)}
    for server in SERVERS:
        ok, detail = server_ready(h, server) if _alive(h.pid(server)) else (False, "not running")
        out[server] = {"ready": ok, "detail": detail, "url": h.url(server)}
        out["up"] = out["up"] and ok
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dev.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    cmds = {}
    for name, help_ in (
        ("up", "start the cluster (if needed), fairshare, and wire them together"),
        ("down", "unwire and stop fairshare (the cluster keeps running)"),
        ("status", "show whether the servers are ready"),
        ("restart-extender", "restart the extender on the same port"),
        ("restart-webhook", "hand over to a new webhook process without a gap"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
        cmds[name] = p
    cmds["up"].add_argument("--config", type=Path, help="a FairShareConfig file for the ConfigMap")
    cmds["up"].add_argument(
        "--nodes",
        type=int,
        default=DEV_NODES,
        help=f"kwok GPU nodes {DEV_NODE_PREFIX}0.. to create if missing (default "
        f"{DEV_NODES}; 0 for none)",
    )
    cmds["up"].add_argument(
        "--gpus", type=int, default=DEV_GPUS, help=f"GPUs per node (default {DEV_GPUS})"
    )
    args = parser.parse_args(argv)
    state_dir = args.state_dir.expanduser().resolve()
    try:
        if args.cmd == "up":
            if args.nodes < 0 or args.gpus < 0:
                parser.error("--nodes and --gpus must be 0 or more")
            text = args.config.read_text() if args.config else None
            h = start(state_dir, text)
            made = ensure_gpu_nodes(cluster_state(state_dir), args.nodes, args.gpus)
            if made:
                print(f"nodes:    {', '.join(made)} ({args.gpus} GPUs each, kwok)")
            print(f"webhook:  {h.url('webhook')}  (log {Layout(state_dir).log('webhook')})")
            print(f"extender: {h.url('extender')}  (log {Layout(state_dir).log('extender')})")
            print(f"kubectl:  {h.kubectl} --kubeconfig {h.kubeconfig}")
        elif args.cmd == "down":
            stop(state_dir)
        elif args.cmd == "restart-extender":
            restart_extender(state_dir)
        elif args.cmd == "restart-webhook":
            restart_webhook(state_dir)
        else:
            info = status(state_dir)
            print(json.dumps(info, indent=2))
            return 0 if info["up"] else 1
    except (DevError, cluster_error()) as exc:
        print(f"dev.py {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
