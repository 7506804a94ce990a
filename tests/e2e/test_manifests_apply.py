"""The shipped manifests against the real control plane (issue 6).

1. The second-scheduler overlay, rendered by `kubectl kustomize`, is server-side applied
   to the real kube-apiserver and every object must be accepted (schema, defaulting,
   validation and admission all run).

   Only the harmless objects are applied for real: the Namespace (when it does not exist
   yet), ServiceAccounts and RBAC. Everything else goes through `--dry-run=server`, which
   runs the same validation and admission but persists nothing, because the cluster is
   shared with the other e2e tests (and with other runs against the same cluster):

   - the ValidatingWebhookConfiguration has `failurePolicy: Fail` and points at a Service
     with no endpoints, so for real it would refuse every pod create in the cluster;
   - the Deployments and the certificate Job would create pods that the shared
     kube-scheduler places on other tests' kwok nodes;
   - the ConfigMap `fairshare-system/fairshare-config` is the one the e2e servers of
     tools/e2e/dev.py watch: applying the example config would reload them mid-test.

   The real objects are deleted again when the module ends (the Namespace only if this
   module created it and nothing else has started using it).

2. `kubectl auth can-i --as=system:serviceaccount:fairshare-system:<sa>` against the
   applied RBAC: each ServiceAccount can do what its server needs and nothing more.

3. A second kube-scheduler process runs the shipped KubeSchedulerConfiguration (the
   ConfigMap the overlay generates), with only the cluster-specific parts rewritten: the
   kubeconfig, the extender URL (a dummy loopback URL), its CA file (a freshly generated
   CA) and the leader-election Lease. That Lease is created beforehand with a placeholder
   holder, so the test scheduler stays a standby candidate and never schedules a pod (the
   shared kube-scheduler is left alone). It must pass /healthz and log no config error.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairshare import tls
from tests.gotools import skip_or_fail

from .conftest import ROOT, Cluster, cluster_module, unique

pytestmark = pytest.mark.e2e

OVERLAY = ROOT / "manifests" / "overlays" / "second-scheduler"
NAMESPACE = "fairshare-system"
RESERVATION_NAMESPACE = "fairshare-reservation"
REPORTER = "fairshare-gpu-reporter"
FIELD_MANAGER = "fairshare-e2e-manifests"
SA_PREFIX = f"system:serviceaccount:{NAMESPACE}:"

# Applied for real: harmless, and needed for the `auth can-i` checks.
REAL_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}

# What a rejected or unreadable KubeSchedulerConfiguration makes kube-scheduler print.
CONFIG_ERRORS = (
    "strict decoding error",
    "unknown field",
    "invalid configuration",
    "couldn't load",
    "failed to load",
    "error decoding",
    "no kind",
    "Error: ",
)


# --------------------------------------------------------------------------------------------
# Rendering and applying


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


@pytest.fixture(scope="module")
def rendered(cluster: Cluster) -> list[dict[str, Any]]:
    """The overlay as kubectl's kustomize renders it."""
    proc = cluster.kubectl("kustomize", str(OVERLAY), timeout=120)
    objects = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    assert objects, "kubectl kustomize rendered nothing"
    return objects


def server_side_apply(
    cluster: Cluster, objects: list[dict[str, Any]], *, dry_run: bool
) -> list[dict[str, Any]]:
    """Server-side apply `objects`; the objects the API server returned."""
    args = ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-o", "json", "-f", "-"]
    if dry_run:
        # Objects the e2e servers own (their ConfigMap) have other field managers; a dry
        # run may take them over, since nothing is persisted.
        args[1:1] = ["--dry-run=server", "--force-conflicts"]
    doc = {"apiVersion": "v1", "kind": "List", "items": objects}
    proc = cluster.kubectl(*args, input=json.dumps(doc), timeout=120)
    out = json.loads(proc.stdout)
    return list(out["items"]) if out.get("kind") == "List" else [out]


def namespace_exists(cluster: Cluster, name: str) -> bool:
    return cluster.kubectl("get", "namespace", name, check=False).returncode == 0


def delete_objects(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": objects}
    cluster.kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-",
        input=json.dumps(doc), check=False, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def applied(cluster: Cluster, rendered: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Apply the overlay: RBAC and ServiceAccounts for real, the rest as a server dry run.

    Yields {"real": [...], "dry": [...], "created_namespace": bool} with the objects the
    API server returned; removes the real ones afterwards."""
    namespaces = [o for o in rendered if o["kind"] == "Namespace"]
    created_namespace = False
    real: list[dict[str, Any]] = []
    to_delete: list[dict[str, Any]] = []
    # The dev servers' reservation pods run as this ServiceAccount: keep it if it was there.
    reporter_existed = (
        cluster.kubectl(
            "-n", RESERVATION_NAMESPACE, "get", "serviceaccount", REPORTER, check=False
        ).returncode
        == 0
    )
    try:
        if not namespace_exists(cluster, NAMESPACE):
            real += server_side_apply(cluster, namespaces, dry_run=False)
            created_namespace = True
        else:
            real += server_side_apply(cluster, namespaces, dry_run=True)
        rbac = [o for o in rendered if o["kind"] in REAL_KINDS]
        to_delete = [
            o
            for o in rbac
            if not (reporter_existed and o["kind"] == "ServiceAccount"
                    and o["metadata"]["name"] == REPORTER)
        ]  # fmt: skip
        real += server_side_apply(cluster, rbac, dry_run=False)
        rest = [o for o in rendered if o["kind"] not in REAL_KINDS | {"Namespace"}]
        dry = server_side_apply(cluster, rest, dry_run=True)
        yield {"real": real, "dry": dry, "created_namespace": created_namespace}
    finally:
        if to_delete:
            delete_objects(cluster, to_delete)
        if created_namespace and not _namespace_in_use(cluster):
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def _namespace_in_use(cluster: Cluster) -> bool:
    """Has something else (tools/e2e/dev.py) put objects into fairshare-system meanwhile?"""
    proc = cluster.kubectl("-n", NAMESPACE, "get", "configmaps,secrets,pods", "-o", "name")
    names = [n for n in proc.stdout.split() if not n.endswith("/kube-root-ca.crt")]
    return bool(names)


def test_every_rendered_object_is_accepted(
    rendered: list[dict[str, Any]], applied: dict[str, Any]
) -> None:
    returned = applied["real"] + applied["dry"]
    want = sorted(object_key(o) for o in rendered)
    got = sorted(object_key(o) for o in returned)
    assert got == want
    kinds = {o["kind"] for o in rendered}
    assert {
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
        "RoleBinding", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget", "Job",
        "NetworkPolicy", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
    } <= kinds  # fmt: skip
    # The API server defaulted and kept what the manifests ask for.
    for obj in returned:
        if obj["kind"] == "Deployment":
            template = obj["spec"]["template"]["spec"]
            for container in template["containers"]:
                ctx = container["securityContext"]
                assert ctx["allowPrivilegeEscalation"] is False, obj["metadata"]["name"]
                assert ctx["readOnlyRootFilesystem"] is True, obj["metadata"]["name"]
        if obj["kind"] == "ValidatingWebhookConfiguration":
            for hook in obj["webhooks"]:
                assert hook["admissionReviewVersions"] == ["v1"]
                assert hook["sideEffects"] == "None"


def test_rbac_objects_really_exist(cluster: Cluster, applied: dict[str, Any]) -> None:
    for obj in applied["real"]:
        if obj["kind"] not in REAL_KINDS:
            continue
        kind, namespace, name = object_key(obj)
        args = ["get", kind.lower(), name] + (["-n", namespace] if namespace else [])
        cluster.kubectl(*args)


def test_webhook_configurations_were_not_persisted(
    cluster: Cluster, applied: dict[str, Any]
) -> None:
    """The dry run must not leave a fail-closed webhook behind in the shared cluster."""
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        proc = cluster.kubectl("get", kind, "fairshare", check=False)
        assert proc.returncode != 0 and "NotFound" in proc.stderr, proc.stdout


# --------------------------------------------------------------------------------------------
# kubectl auth can-i


def can_i(cluster: Cluster, sa: str, verb: str, resource: str, *scope: str) -> bool:
    proc = cluster.kubectl(
        "auth", "can-i", verb, resource, f"--as={SA_PREFIX}{sa}", *scope, check=False
    )
    answer = proc.stdout.strip().splitlines()[-1:] or [""]
    assert answer[0] in ("yes", "no"), f"can-i {verb} {resource}: {proc.stdout}{proc.stderr}"
    return answer[0] == "yes"


@pytest.fixture(scope="module")
def rbac_ready(cluster: Cluster, applied: dict[str, Any]) -> Cluster:
    """The RBAC authorizer's cache has the new bindings."""
    deadline = time.monotonic() + 30
    while not can_i(cluster, "fairshare-webhook", "list", "pods", "-A"):
        if time.monotonic() > deadline:
            raise AssertionError("RBAC bindings did not take effect within 30s")
        time.sleep(0.5)
    return cluster


ALL = ("-A",)
SYS = ("-n", NAMESPACE)
ELSEWHERE = ("-n", "kube-system")
BINDING = ("-A", "--subresource=binding")
EVICTION = ("-A", "--subresource=eviction")

CAN = [
    ("fairshare-webhook", "list", "pods", ALL),
    ("fairshare-webhook", "watch", "pods", ALL),
    ("fairshare-webhook", "list", "namespaces", ALL),
    ("fairshare-webhook", "list", "persistentvolumeclaims", ALL),
    ("fairshare-webhook", "watch", "nodes", ALL),
    # Shared admission reservations: Leases fairshare-reservations-<tenant>.
    ("fairshare-webhook", "create", "leases", SYS),
    ("fairshare-webhook", "update", "leases", SYS),
    ("fairshare-webhook", "watch", "configmaps", SYS),
    ("fairshare-extender", "create", "pods", BINDING),
    ("fairshare-extender", "patch", "pods", ALL),
    ("fairshare-extender", "list", "nodes", ALL),
    # The quarantine (health.quarantine, opt-in) cordons and uncordons failed GPU nodes and
    # drains them through the Eviction API; the gang recovery evicts too. Never delete.
    ("fairshare-extender", "patch", "nodes", ()),
    ("fairshare-extender", "create", "pods", EVICTION),
    ("fairshare-extender", "watch", "persistentvolumeclaims", ALL),
    ("fairshare-reclaimer", "watch", "persistentvolumeclaims", ALL),
    ("fairshare-extender", "create", "events", ALL),
    ("fairshare-extender", "watch", "configmaps", SYS),
    ("fairshare-extender", "update", "leases", SYS),
    ("fairshare-extender", "create", "leases", SYS),
    # Handoff "reservation": the pods' GPU ConfigMaps, and reservation pods in their namespace.
    ("fairshare-extender", "create", "configmaps", ALL),
    ("fairshare-extender", "create", "pods", ("-n", RESERVATION_NAMESPACE)),
    ("fairshare-extender", "delete", "pods", ("-n", RESERVATION_NAMESPACE)),
    ("fairshare-certs", "create", "secrets", SYS),
    ("fairshare-certs", "update", "secrets/fairshare-webhook-tls", SYS),
    ("fairshare-certs", "get", "secrets/fairshare-client-ca", SYS),
    ("fairshare-certs", "update", "secrets/fairshare-scheduler-client", SYS),
    ("fairshare-certs", "patch", "validatingwebhookconfigurations/fairshare", ()),
    ("fairshare-certs", "patch", "mutatingwebhookconfigurations/fairshare", ()),
    ("fairshare-scheduler", "create", "pods", BINDING),
    ("fairshare-scheduler", "update", "leases/fairshare-scheduler", SYS),
]
CANNOT = [
    ("fairshare-webhook", "update", "configmaps/fairshare-config", SYS),
    ("fairshare-webhook", "create", "leases", ELSEWHERE),
    ("fairshare-webhook", "delete", "pods", ALL),
    ("fairshare-webhook", "delete", "pods", SYS),
    ("fairshare-webhook", "create", "pods", ALL),
    ("fairshare-webhook", "patch", "pods", ALL),
    ("fairshare-webhook", "get", "secrets", ALL),
    ("fairshare-webhook", "get", "secrets", SYS),
    ("fairshare-webhook", "list", "secrets", ALL),
    ("fairshare-webhook", "create", "pods", BINDING),
    ("fairshare-webhook", "delete", "configmaps", SYS),
    ("fairshare-webhook", "update", "configmaps", ELSEWHERE),
    ("fairshare-webhook", "list", "configmaps", ELSEWHERE),
    ("fairshare-extender", "delete", "pods", ALL),
    ("fairshare-extender", "update", "leases", ELSEWHERE),
    ("fairshare-extender", "get", "secrets", ALL),
    ("fairshare-extender", "list", "secrets", SYS),
    ("fairshare-extender", "delete", "nodes", ()),
    ("fairshare-extender", "update", "configmaps", SYS),
    ("fairshare-extender", "update", "configmaps", ALL),
    ("fairshare-extender", "create", "pods", ALL),
    ("fairshare-certs", "get", "secrets", ELSEWHERE),
    ("fairshare-certs", "get", "secrets", ("-n", "default")),
    ("fairshare-certs", "list", "secrets", ALL),
    ("fairshare-certs", "list", "secrets", SYS),
    ("fairshare-certs", "get", "secrets/some-other-secret", SYS),
    ("fairshare-certs", "delete", "secrets/fairshare-webhook-tls", SYS),
    ("fairshare-certs", "patch", "validatingwebhookconfigurations/someone-else", ()),
    ("fairshare-certs", "list", "pods", ALL),
    ("fairshare-scheduler", "get", "secrets", ALL),
]


def _case_id(case: tuple[str, str, str, tuple[str, ...]]) -> str:
    sa, verb, resource, scope = case
    names = {(): "cluster", ALL: "all", BINDING: "binding-all", EVICTION: "eviction-all"}
    where = names[scope] if scope in names else scope[-1]
    return f"{sa.removeprefix('fairshare-')}-{verb}-{resource}-{where}"


@pytest.mark.parametrize("case", CAN, ids=_case_id)
def test_service_account_can(
    rbac_ready: Cluster, case: tuple[str, str, str, tuple[str, ...]]
) -> None:
    sa, verb, resource, scope = case
    assert can_i(rbac_ready, sa, verb, resource, *scope), f"{sa} should be able to {verb}"


@pytest.mark.parametrize("case", CANNOT, ids=_case_id)
def test_service_account_cannot(
    rbac_ready: Cluster, case: tuple[str, str, str, tuple[str, ...]]
) -> None:
    sa, verb, resource, scope = case
    assert not can_i(rbac_ready, sa, verb, resource, *scope), f"{sa} must not {verb}"


# --------------------------------------------------------------------------------------------
# kube-scheduler with the shipped KubeSchedulerConfiguration


def shipped_scheduler_config(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    """config.yaml of the generated ConfigMap fairshare-scheduler-config-<hash>."""
    (cm,) = (
        o
        for o in rendered
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("fairshare-scheduler-")
    )
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    return dict(config)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rewrite_for_test(
    config: dict[str, Any],
    *,
    kubeconfig: Path,
    ca_file: Path,
    client_pair: tuple[Path, Path],
    lease: str,
    lease_ns: str,
) -> dict[str, Any]:
    """Only the cluster-specific fields change; everything else is the shipped config."""
    out = json.loads(json.dumps(config))
    out["clientConnection"] = {**(out.get("clientConnection") or {}), "kubeconfig": str(kubeconfig)}
    (extender,) = out["extenders"]
    extender["urlPrefix"] = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    cert, key = client_pair
    extender["tlsConfig"] = {
        **extender["tlsConfig"],
        "caFile": str(ca_file),
        "certFile": str(cert),
        "keyFile": str(key),
    }
    election = out["leaderElection"]
    assert election["leaderElect"] is True
    election.update(resourceName=lease, resourceNamespace=lease_ns)
    return out


def placeholder_lease(name: str, namespace: str) -> dict[str, Any]:
    """A Lease held by someone else for an hour: the test scheduler stays a candidate."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "holderIdentity": "fairshare-e2e-placeholder",
            "leaseDurationSeconds": 3600,
            "acquireTime": now,
            "renewTime": now,
        },
    }


def healthz(port: int) -> tuple[int, str]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(f"https://127.0.0.1:{port}/healthz", timeout=3) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


def scheduler_binary(cluster: Cluster) -> Path:
    mod = cluster_module()
    binary = Path(mod.find_bin_dir(ROOT / ".e2e")) / "kube-scheduler"
    if not binary.exists():
        found = shutil.which("kube-scheduler")
        if found is None:
            skip_or_fail("no kube-scheduler binary (make cluster-bins)")
        binary = Path(found)
    return binary


def config_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if any(e in line for e in CONFIG_ERRORS)]


def test_kube_scheduler_accepts_the_shipped_configuration(
    cluster: Cluster, rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    binary = scheduler_binary(cluster)
    ca_pem, _key = tls.make_ca("fairshare-e2e-extender-ca", days=1, now=dt.datetime.now(dt.UTC))
    ca_file = tmp_path / "extender-ca.crt"
    ca_file.write_bytes(ca_pem)
    client = tls.write_client_certs(tmp_path / "client")
    client_pair = client.clients["scheduler-client"]
    lease, lease_ns = unique("fairshare-scheduler-e2e"), "kube-system"
    config = rewrite_for_test(
        shipped_scheduler_config(rendered),
        kubeconfig=cluster.kubeconfig,
        ca_file=ca_file,
        client_pair=client_pair,
        lease=lease,
        lease_ns=lease_ns,
    )
    config_path = tmp_path / "scheduler-config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    # 1. kube-scheduler's own loader: decode strictly, default, validate, print, exit.
    effective = tmp_path / "effective.yaml"
    proc = subprocess.run(
        [str(binary), f"--config={config_path}", f"--write-config-to={effective}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"kube-scheduler refused the config:\n{proc.stderr}"
    (ext,) = yaml.safe_load(effective.read_text())["extenders"]
    assert ext["filterVerb"] == "filter" and ext["bindVerb"] == "bind", ext
    # --write-config-to omits false values (omitempty).
    assert not ext.get("ignorable", False) and ext["nodeCacheCapable"] is True, ext
    assert "managedResources" not in ext or not ext["managedResources"], ext

    # 2. Run it next to the shared scheduler, as a standby candidate for its own Lease.
    cluster.kubectl(
        "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-",
        input=json.dumps(placeholder_lease(lease, lease_ns)),
    )  # fmt: skip
    port = free_port()
    log_path = tmp_path / "kube-scheduler.log"
    argv = [
        str(binary),
        f"--config={config_path}",
        f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={tmp_path / 'certs'}",
        "--v=2",
    ]
    proc_handle: subprocess.Popen[bytes] | None = None
    try:
        with log_path.open("wb") as log:
            proc_handle = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 60
        last: tuple[int, str] | str = "not started"
        while True:
            if proc_handle.poll() is not None:
                raise AssertionError(
                    f"kube-scheduler exited {proc_handle.returncode}:\n{log_path.read_text()}"
                )
            try:
                last = healthz(port)
            except (OSError, ssl.SSLError) as exc:
                last = str(exc)
            if last == (200, "ok"):
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no healthy /healthz in 60s ({last}):\n{log_path.read_text()}"
                )
            time.sleep(0.5)
        # It read the leader-election section: it waits for the (placeholder's) Lease.
        deadline = time.monotonic() + 20
        while f"{lease_ns}/{lease}" not in log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"no leader election on {lease_ns}/{lease}"
            time.sleep(0.5)
        assert proc_handle.poll() is None, "kube-scheduler exited"
        text = log_path.read_text(errors="replace")
        assert not config_errors(text), "\n".join(config_errors(text))
        holder = cluster.kubectl(
            "-n", lease_ns, "get", "lease", lease, "-o", "jsonpath={.spec.holderIdentity}"
        ).stdout
        assert holder == "fairshare-e2e-placeholder", "the test scheduler must stay standby"
    finally:
        if proc_handle is not None and proc_handle.poll() is None:
            os.killpg(proc_handle.pid, signal.SIGTERM)
            try:
                proc_handle.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc_handle.pid, signal.SIGKILL)
                proc_handle.wait(timeout=15)
        cluster.kubectl("-n", lease_ns, "delete", "lease", lease, "--ignore-not-found", check=False)


def test_config_error_detection_catches_a_bad_field(
    cluster: Cluster, rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The negative control: kube-scheduler refuses a misspelt extender field, so the
    acceptance above means something."""
    binary = scheduler_binary(cluster)
    config = shipped_scheduler_config(rendered)
    config["extenders"][0]["filterVerbb"] = "filter"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [str(binary), f"--config={path}", f"--write-config-to={tmp_path / 'out.yaml'}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert config_errors(proc.stderr), proc.stderr
