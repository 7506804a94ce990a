#!/usr/bin/env python3
"""Run a real, local Kubernetes control plane as host processes on loopback.

    python tools/e2e/cluster.py up     [--state-dir .e2e] [--scheduler-config FILE]
    python tools/e2e/cluster.py up     --kubeconfig FILE [--state-dir .e2e/external]
    python tools/e2e/cluster.py down   [--state-dir .e2e] [--purge-logs]
    python tools/e2e/cluster.py status [--state-dir .e2e] [--json]
    python tools/e2e/cluster.py restart-scheduler --scheduler-config FILE [--state-dir .e2e]

`up` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (built by
`make cluster-bins`, see tools/e2e/build-bins.sh) on free 127.0.0.1 ports, waits until each
one reports healthy and writes:

    <state>/kubeconfig                 admin kubeconfig (client cert in group system:masters)
    <state>/run/state.json             ports, pids, paths (CA cert and key included)
    <state>/run/pki/                   CA, serving and client certificates, service-account key
    <state>/run/logs/<component>.log   one log per component (kept by `down`)

The processes run in their own sessions, so they outlive this script; `down` stops them
(SIGTERM, then SIGKILL) and removes everything but the logs. `up` on a healthy cluster is a
no-op (it only restarts kube-scheduler when a different --scheduler-config is given); `up`
over a half-dead cluster cleans it up first.

kwok manages the Nodes annotated `kwok.x-k8s.io/node=fake` (it keeps their Lease and
conditions fresh) and drives the Pods bound to them: Pending -> Running, Job-owned pods
Running -> Succeeded (after the duration in the pod annotation
`pod-complete.stage.kwok.x-k8s.io/delay`, e.g. "30s", if present), and deleted pods are removed
(there is no kubelet to finish a graceful deletion).

`up --kubeconfig FILE` uses an existing cluster instead (for example kind): it only runs kwok
against it, with the same stages, so the fake GPU nodes work there too.

Only the standard library and `cryptography` are needed; PyYAML is used (when installed) only
to read a YAML --scheduler-config.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import datetime as dt
import fcntl
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_STATE_DIR = ROOT / ".e2e"
STATE_VERSION = 1
LOOPBACK = "127.0.0.1"

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)
# Start order; `down` stops them in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

FEATURE_GATES: Final = "DRADeviceTaintRules=true,GenericWorkload=true,GangScheduling=true"
"""Off-by-default v1.36 features the control plane turns on, so that fairshare is tested
against them too: DeviceTaintRules (beta, behind an off-by-default beta API) and the
native pod-group API with kube-scheduler's gang cycle (alpha). Nothing else changes for
pods and devices that do not use them."""
RUNTIME_CONFIG: Final = "resource.k8s.io/v1beta2=true,scheduling.k8s.io/v1alpha2=true"
"""The API versions those features are served in (DeviceTaintRule, Workload/PodGroup)."""

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
POD_CIDR = "10.244.0.0/16"  # kwok hands pod IPs out of this range
FAKE_NODE_IP = "10.250.0.1"  # InternalIP kwok reports for its nodes (nothing listens there)
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node=fake"
NODE_LEASE_SECONDS = 40
NODE_HEARTBEAT_SECONDS = 60


@dataclass(frozen=True)
class Tuning:
    """Settings of `up` that the e2e tests leave at their defaults; the cluster benchmark
    changes them (`tests/bench/bench_cluster.py`): at thousands of kwok nodes, the node
    leases (renewed every lease/4 s, as a kubelet does) and heartbeats take the cores."""

    node_lease_seconds: int = NODE_LEASE_SECONDS
    """kwok's `--node-lease-duration-seconds`; kube-controller-manager's
    `--node-monitor-grace-period` follows it (lease + 10 s) when it is above the default."""
    node_heartbeat_seconds: int = NODE_HEARTBEAT_SECONDS
    """Delay of the node condition heartbeat stage: between this and 1.5× this."""
    apiserver_profiling: bool = False
    """kube-apiserver's `--profiling` (/debug/pprof)."""
    kwok_parallelism: int = 0
    """kwok's nodePlayStageParallelism and nodeLeaseParallelism (0: kwok's default, 4)."""
    controller_qps: int = 0
    """kube-controller-manager's `--kube-api-qps` (burst twice that; 0: its default, 20):
    its node lifecycle controller adds and removes every new node's not-ready taint."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Tuning:
        return cls(**(data or {}))


START_TIMEOUT = {
    "etcd": 30.0,
    "kube-apiserver": 90.0,
    "kube-controller-manager": 60.0,
    "kube-scheduler": 60.0,
    "kwok": 60.0,
}
STOP_TIMEOUT = 10.0
RESTART_ATTEMPTS = 3  # restart_component: starts of a component that exits during startup


class ClusterError(Exception):
    """A failure with a message meant for the user (printed without a traceback)."""


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Binaries


def read_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    path = HERE / "versions.env"
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                versions[key.strip()] = value.strip().strip("'\"")
    return versions


def cache_bin_dir() -> Path | None:
    """The per-version cache that tools/e2e/build-bins.sh fills (see its `cache=` line)."""
    v = read_versions()
    if not {"KUBE_VERSION", "ETCD_VERSION", "KWOK_VERSION"} <= v.keys():
        return None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = f"k8s-{v['KUBE_VERSION']}_etcd-{v['ETCD_VERSION']}_kwok-{v['KWOK_VERSION']}"
    return cache / "fairshare" / "e2e" / key / "bin"


def find_bin_dir(state_dir: Path | None = None) -> Path:
    """$E2E_BIN_DIR, else <state>/bin (the link build-bins.sh makes), else the version cache."""
    env = os.environ.get("E2E_BIN_DIR")
    if env:
        return Path(env).expanduser().resolve()
    link = (state_dir or DEFAULT_STATE_DIR) / "bin"
    if link.exists():
        return link.resolve()
    cached = cache_bin_dir()
    return cached if cached is not None else link


def missing_binaries(bin_dir: Path, names: tuple[str, ...] = BINARIES) -> list[str]:
    return [b for b in names if not os.access(bin_dir / b, os.X_OK)]


def require_binaries(bin_dir: Path, names: tuple[str, ...] = BINARIES) -> None:
    missing = missing_binaries(bin_dir, names)
    if missing:
        raise ClusterError(
            f"binaries missing in {bin_dir}: {', '.join(missing)}; run `make cluster-bins` "
            "(builds them from Go modules, needs Go >= 1.26) or set E2E_BIN_DIR"
        )


# --------------------------------------------------------------------------------------------
# PKI (cryptography)


def _pki() -> Any:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:  # pragma: no cover - depends on the interpreter used
        raise ClusterError(
            "the `cryptography` package is required: run with the project venv "
            "(.venv/bin/python, `make install`)"
        ) from exc
    return x509, hashes, serialization, ec, rsa, ExtendedKeyUsageOID, NameOID


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


@dataclass(frozen=True)
class CertSpec:
    name: str
    common_name: str
    organizations: tuple[str, ...] = ()
    server: bool = False
    client: bool = False
    dns: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()
    ca: str = "ca"


CERTS = (
    CertSpec(
        "apiserver",
        "kube-apiserver",
        server=True,
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=(LOOPBACK, SERVICE_IP),
    ),
    CertSpec(
        "kube-controller-manager-serving",
        "kube-controller-manager",
        server=True,
        dns=("localhost",),
        ips=(LOOPBACK,),
    ),
    CertSpec(
        "kube-scheduler-serving", "kube-scheduler", server=True, dns=("localhost",), ips=(LOOPBACK,)
    ),
    # Client identities. The scheduler and controller-manager use the identities the RBAC
    # bootstrap policy grants (as kubeadm sets them up); kwok acts as an admin.
    CertSpec("admin", "e2e-admin", ("system:masters",), client=True),
    CertSpec("kube-controller-manager", "system:kube-controller-manager", client=True),
    CertSpec("kube-scheduler", "system:kube-scheduler", client=True),
    CertSpec("kwok", "kwok-controller", ("system:masters",), client=True),
    # The apiserver's identity towards aggregated API servers; its CA is what the
    # controller-manager and scheduler read from kube-system/extension-apiserver-authentication.
    CertSpec("front-proxy-client", "front-proxy-client", client=True, ca="front-proxy-ca"),
    # What kube-apiserver presents to the fairshare webhook and kube-scheduler to the
    # extender; both servers run with --client-ca=client-ca.crt (a CA of its own, so no
    # cluster user certificate opens them).
    CertSpec("apiserver-client", "kube-apiserver-webhook-client", client=True, ca="client-ca"),
    CertSpec("scheduler-client", "kube-scheduler-extender-client", client=True, ca="client-ca"),
)


def _key_usage(x509: Any, *, ca: bool) -> Any:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def generate_pki(pki: Path) -> None:
    """CA + front-proxy CA, the certificates in CERTS, and the service-account key pair."""
    x509, hashes, serialization, ec, rsa, eku, name_oid = _pki()
    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    not_before = now - dt.timedelta(hours=1)
    no_enc = serialization.NoEncryption()
    pkcs8 = serialization.PrivateFormat.PKCS8
    pem = serialization.Encoding.PEM

    cas: dict[str, tuple[Any, Any, Any]] = {}
    for ca, cn in (
        ("ca", "fairshare-e2e-ca"),
        ("front-proxy-ca", "fairshare-e2e-front-proxy-ca"),
        ("client-ca", "fairshare-e2e-client-ca"),
    ):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, cn)])
        ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(x509, ca=True), critical=True)
            .add_extension(ca_ski, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        (pki / f"{ca}.crt").write_bytes(ca_cert.public_bytes(pem))
        _write_private(pki / f"{ca}.key", ca_key.private_bytes(pem, pkcs8, no_enc))
        cas[ca] = (ca_key, ca_name, ca_ski)

    for spec in CERTS:
        ca_key, ca_name, ca_ski = cas[spec.ca]
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(name_oid.ORGANIZATION_NAME, o) for o in spec.organizations]
        attrs.append(x509.NameAttribute(name_oid.COMMON_NAME, spec.common_name))
        usages = ([eku.SERVER_AUTH] if spec.server else []) + (
            [eku.CLIENT_AUTH] if spec.client else []
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(x509, ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                critical=False,
            )
        )
        if spec.dns or spec.ips:
            sans: list[Any] = [x509.DNSName(d) for d in spec.dns]
            sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in spec.ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        (pki / f"{spec.name}.crt").write_bytes(cert.public_bytes(pem))
        _write_private(pki / f"{spec.name}.key", key.private_bytes(pem, pkcs8, no_enc))

    write_admission_config(pki)

    # Service-account token signing key (RSA; the same PEM serves KCM and the apiserver).
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    trad = serialization.PrivateFormat.TraditionalOpenSSL
    _write_private(pki / "sa.key", sa.private_bytes(pem, trad, no_enc))
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    (pki / "sa.pub").write_bytes(sa.public_key().public_bytes(pem, spki))


def write_admission_config(pki: Path) -> None:
    """kube-apiserver's --admission-control-config-file: admission webhooks get the
    apiserver-client certificate (user "*": the dev webhook's port is only known later)."""
    from fairshare import tls  # the project venv runs this script

    kubeconfig = tls.admission_kubeconfig(
        "*", str(pki / "apiserver-client.crt"), str(pki / "apiserver-client.key")
    )
    (pki / "admission-kubeconfig.json").write_text(json.dumps(kubeconfig, indent=2))
    config = tls.admission_configuration(str(pki / "admission-kubeconfig.json"))
    (pki / "admission-config.json").write_text(json.dumps(config, indent=2))


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A self-contained kubeconfig (certificates embedded) for client identity `user`."""
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: fairshare-e2e
  cluster:
    server: {server}
    certificate-authority-data: {_b64(pki / "ca.crt")}
users:
- name: {user}
  user:
    client-certificate-data: {_b64(pki / f"{user}.crt")}
    client-key-data: {_b64(pki / f"{user}.key")}
contexts:
- name: fairshare-e2e
  context:
    cluster: fairshare-e2e
    user: {user}
current-context: fairshare-e2e
"""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(path)


# --------------------------------------------------------------------------------------------
# kwok stages (our own, written against the kwok v0.8.0 Stage API: kwok.x-k8s.io/v1alpha1,
# `spec.selector.matchExpressions[].jq`, `spec.delay`, `spec.steps[].patch|delete`).
# Node and Pod status patches are strategic merges, so conditions merge by `type`: a condition
# a test adds (e.g. GpuUnhealthy) survives the heartbeat, and capacity/allocatable set on the
# Node are kept.

_NODE_CONDITIONS = """\
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

KWOK_STAGES = (
    """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: fairshare-node-initialize
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - jq:
        key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
        operator: NotIn
        values: ["True"]
  steps:
  - patch:
      subresource: status
      root: status
      template: |
        {{ $now := Now }}
        {{ $since := or .metadata.creationTimestamp $now }}
"""
    + "\n".join("        " + line for line in _NODE_CONDITIONS.splitlines())
    + """
        {{ $hasIP := false }}{{ $hasName := false }}
        {{ range .status.addresses }}
        {{ if eq .type "InternalIP" }}{{ $hasIP = true }}{{ end }}
        {{ if eq .type "Hostname" }}{{ $hasName = true }}{{ end }}
        {{ end }}
        {{ if or (not $hasIP) (not $hasName) }}
        addresses:
        {{ if not $hasIP }}{{ with NodeIP }}
        - address: {{ . | Quote }}
          type: InternalIP
        {{ end }}{{ end }}
        {{ if not $hasName }}
        - address: {{ .metadata.name | Quote }}
          type: Hostname
        {{ end }}
        {{ end }}
        allocatable:
        {{ with .status.allocatable }}
        {{ YAML . 1 }}
        {{ else }}
          cpu: "32"
          memory: 256Gi
          pods: "110"
        {{ end }}
        capacity:
        {{ with .status.capacity }}
        {{ YAML . 1 }}
        {{ else }}
          cpu: "32"
          memory: 256Gi
          pods: "110"
        {{ end }}
        {{ $info := .status.nodeInfo }}
        {{ $kwok := printf "kwok-%s" Version }}
        nodeInfo:
          architecture: {{ or $info.architecture "amd64" }}
          operatingSystem: {{ or $info.operatingSystem "linux" }}
          containerRuntimeVersion: {{ or $info.containerRuntimeVersion $kwok }}
          kernelVersion: {{ or $info.kernelVersion $kwok }}
          kubeletVersion: {{ or $info.kubeletVersion $kwok }}
          kubeProxyVersion: {{ or $info.kubeProxyVersion $kwok }}
          bootID: {{ or $info.bootID `""` }}
          machineID: {{ or $info.machineID `""` }}
          osImage: {{ or $info.osImage `""` }}
          systemUUID: {{ or $info.systemUUID `""` }}
        phase: Running
""",
    # Liveness comes from the node Lease (kwok renews it every NODE_LEASE_SECONDS/4); this
    # refreshes the condition heartbeat now and then, as a kubelet does.
    """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: fairshare-node-heartbeat
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - jq: {key: .status.phase, operator: In, values: [Running]}
    - jq:
        key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
        operator: In
        values: ["True"]
  delay:
    durationMilliseconds: @HEARTBEAT_MS@
    jitterDurationMilliseconds: @JITTER_MS@
  immediateNextStage: true
  steps:
  - patch:
      subresource: status
      root: status
      template: |
        {{ $now := Now }}
        {{ $since := or .metadata.creationTimestamp $now }}
"""
    + "\n".join("        " + line for line in _NODE_CONDITIONS.splitlines())
    + "\n",
    """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: fairshare-pod-ready
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - jq: {key: .metadata.deletionTimestamp, operator: DoesNotExist}
    - jq: {key: .status.phase, operator: In, values: [Pending]}
    - jq:
        key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
        operator: NotIn
        values: ["True"]
  steps:
  - patch:
      subresource: status
      root: status
      template: |
        {{ $now := Now }}
        conditions:
        - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
        - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
        - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
        {{ range .spec.readinessGates }}
        - {type: {{ .conditionType | Quote }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
        {{ end }}
        containerStatuses:
        {{ range .spec.containers }}
        - name: {{ .name | Quote }}
          image: {{ .image | Quote }}
          ready: true
          started: true
          restartCount: 0
          state:
            running:
              startedAt: {{ $now | Quote }}
        {{ end }}
        initContainerStatuses:
        {{ range .spec.initContainers }}
        - name: {{ .name | Quote }}
          image: {{ .image | Quote }}
          ready: true
          restartCount: 0
          {{ if eq .restartPolicy "Always" }}
          started: true
          state:
            running:
              startedAt: {{ $now | Quote }}
          {{ else }}
          state:
            terminated:
              exitCode: 0
              reason: Completed
              startedAt: {{ $now | Quote }}
              finishedAt: {{ $now | Quote }}
          {{ end }}
        {{ end }}
        {{ with NodeIPsWith .spec.nodeName }}
        hostIP: {{ index . 0 | Quote }}
        hostIPs:
        {{ range . }}
        - ip: {{ . | Quote }}
        {{ end }}
        {{ end }}
        {{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
        podIP: {{ index . 0 | Quote }}
        podIPs:
        {{ range . }}
        - ip: {{ . | Quote }}
        {{ end }}
        {{ end }}
        phase: Running
        startTime: {{ $now | Quote }}
""",  # noqa: E501
    # Only Job-owned pods finish; everything else keeps running until deleted.
    """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: fairshare-pod-complete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - jq: {key: .metadata.deletionTimestamp, operator: DoesNotExist}
    - jq: {key: .status.phase, operator: In, values: [Running]}
    - jq: {key: '.metadata.ownerReferences.[].kind', operator: In, values: [Job]}
  delay:
    durationMilliseconds: 0
    durationFrom:
      jq: {expression: '.metadata.annotations["pod-complete.stage.kwok.x-k8s.io/delay"]'}
  steps:
  - patch:
      subresource: status
      root: status
      template: |
        {{ $now := Now }}
        conditions:
        - {type: ContainersReady, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
        - {type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
        containerStatuses:
        {{ range .spec.containers }}
        - name: {{ .name | Quote }}
          image: {{ .image | Quote }}
          ready: false
          started: false
          restartCount: 0
          state:
            terminated:
              exitCode: 0
              reason: Completed
              startedAt: {{ $now | Quote }}
              finishedAt: {{ $now | Quote }}
        {{ end }}
        phase: Succeeded
""",  # noqa: E501
    # No kubelet: finish graceful deletions at once.
    """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: fairshare-pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - jq: {key: .metadata.deletionTimestamp, operator: Exists}
  steps:
  - delete: true
""",
)


def kwok_config(heartbeat_seconds: int = NODE_HEARTBEAT_SECONDS, parallelism: int = 0) -> str:
    ms = heartbeat_seconds * 1000
    docs = list(KWOK_STAGES)
    if parallelism > 0:
        docs.insert(
            0,
            # With a KwokConfiguration, kwok leaves unset parallelisms at 0 (and refuses
            # them): pods keep kwok's default, 4.
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n"
            f"  nodePlayStageParallelism: {parallelism}\n"
            f"  nodeLeaseParallelism: {parallelism}\n"
            "  podPlayStageParallelism: 4\n",
        )
    text = "---\n".join(docs)
    return text.replace("@HEARTBEAT_MS@", str(ms)).replace("@JITTER_MS@", str(ms * 3 // 2))


# --------------------------------------------------------------------------------------------
# Processes


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: the kernel never hands
    those to outgoing connections, so a component restarted on the same port (a fault
    test) cannot find it taken by some client socket meanwhile."""
    low = max(1024, min(_ephemeral_low(), 65536) - 12000)
    high = max(low + 1000, _ephemeral_low() - 1)
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # fall back to the kernel's
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int, exe: str | None = None) -> bool:
    """True if `pid` runs (not a zombie) and, when given, its argv[0] is `exe`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return exe is None
    if stat[stat.rindex(")") + 2 :].startswith(("Z", "X")):
        return False
    if exe is not None:
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
        except OSError:
            return False
        return argv0 == exe
    return True


def child_env(home: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    no_proxy = {"127.0.0.1", "localhost", "::1"}
    for key in ("NO_PROXY", "no_proxy"):
        no_proxy.update(p for p in env.get(key, "").split(",") if p)
    env["NO_PROXY"] = env["no_proxy"] = ",".join(sorted(no_proxy))
    if home is not None:
        env["HOME"] = str(home)
    return env


def start_process(name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        out.write(f"\n=== {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own session: survives this script, killable as a group
            close_fds=True,
        )
    _children[proc.pid] = proc
    return proc.pid


# Processes started by this invocation (so we can reap them if we stop them ourselves).
_children: dict[int, subprocess.Popen[bytes]] = {}


def _reaped(pid: int) -> bool:
    proc = _children.get(pid)
    return proc is not None and proc.poll() is not None


def stop_process(name: str, pid: int, exe: str | None, timeout: float = STOP_TIMEOUT) -> None:
    if _reaped(pid) or not pid_alive(pid, exe):
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if _reaped(pid) or not pid_alive(pid, exe):
                return
            time.sleep(0.05)
        if sig == signal.SIGTERM:
            log(f"{name} (pid {pid}) ignored SIGTERM for {timeout:.0f}s; sending SIGKILL")
    raise ClusterError(f"could not stop {name} (pid {pid})")


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------------------------
# Health checks


def http_get(url: str, ctx: ssl.SSLContext | None, timeout: float = 3.0) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"User-Agent": "fairshare-e2e-cluster"})
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def tls_context(pki: Path, client: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if client:
        ctx.load_cert_chain(str(pki / f"{client}.crt"), str(pki / f"{client}.key"))
    return ctx


def health_url(name: str, port: int) -> str:
    return {
        "etcd": f"http://{LOOPBACK}:{port}/health",
        "kube-apiserver": f"https://{LOOPBACK}:{port}/readyz",
        "kube-controller-manager": f"https://{LOOPBACK}:{port}/healthz",
        "kube-scheduler": f"https://{LOOPBACK}:{port}/readyz",
        "kwok": f"http://{LOOPBACK}:{port}/healthz",
    }[name]


def check_health(name: str, port: int, pki: Path | None) -> tuple[bool, str]:
    url = health_url(name, port)
    ctx = tls_context(pki, "admin") if pki is not None and url.startswith("https") else None
    try:
        status, body = http_get(url, ctx)
    except (OSError, ssl.SSLError) as exc:
        return False, f"{url}: {exc}"
    if status != 200:
        return False, f"{url}: HTTP {status}: {body.strip()[-500:]}"
    if name == "etcd":
        try:
            healthy = json.loads(body).get("health") == "true"
        except ValueError:
            healthy = False
        return healthy, body.strip()
    return body.strip() == "ok", body.strip()[-200:]


def wait_healthy(name: str, pid: int, port: int, pki: Path | None, log_path: Path) -> float:
    t0 = time.monotonic()
    deadline = t0 + START_TIMEOUT[name]
    last = ""
    while True:
        if _reaped(pid) or not pid_alive(pid):
            raise ClusterError(
                f"{name} exited during startup; last lines of {log_path}:\n{tail(log_path)}"
            )
        ok, last = check_health(name, port, pki)
        if ok:
            return time.monotonic() - t0
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{name} not healthy after {START_TIMEOUT[name]:.0f}s ({last}); "
                f"last lines of {log_path}:\n{tail(log_path)}"
            )
        time.sleep(0.2)


def wait_api_ready(server: str, pki: Path, path: str, timeout: float = 60.0) -> None:
    """Wait until GET `path` on the apiserver (as admin) returns 200."""
    deadline = time.monotonic() + timeout
    ctx = tls_context(pki, "admin")
    last = ""
    while time.monotonic() < deadline:
        try:
            status, body = http_get(server + path, ctx)
        except (OSError, ssl.SSLError) as exc:
            status, body = 0, str(exc)
        if status == 200:
            return
        last = f"HTTP {status}: {body.strip()[-300:]}"
        time.sleep(0.25)
    raise ClusterError(f"GET {path} did not succeed within {timeout:.0f}s ({last})")


# --------------------------------------------------------------------------------------------
# State


@dataclass
class Paths:
    state_dir: Path

    @property
    def run(self) -> Path:
        return self.state_dir / "run"

    @property
    def state_file(self) -> Path:
        return self.run / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.run / "pki"

    @property
    def logs(self) -> Path:
        return self.run / "logs"

    @property
    def lock(self) -> Path:
        return self.state_dir / ".cluster.lock"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def component_kubeconfig(self, user: str) -> Path:
        return self.run / "kubeconfigs" / f"{user}.kubeconfig"


@contextlib.contextmanager
def locked(paths: Paths) -> Iterator[None]:
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    with open(paths.lock, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another cluster.py on {paths.state_dir} ...")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def load_state(paths: Paths) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(paths.state_file.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ClusterError(f"{paths.state_file} is corrupt ({exc}); remove {paths.run}") from exc
    return state


def save_state(paths: Paths, state: dict[str, Any]) -> None:
    paths.run.mkdir(parents=True, exist_ok=True)
    tmp = paths.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(paths.state_file)


def component_status(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    pki = Path(state["pki_dir"]) if state.get("pki_dir") else None
    out: dict[str, dict[str, Any]] = {}
    for name in state.get("expected", COMPONENTS):
        comp = state["components"].get(name)
        if comp is None:
            out[name] = {"running": False, "healthy": False, "detail": "not started"}
            continue
        running = pid_alive(comp["pid"], comp["argv"][0])
        healthy, detail = check_health(name, comp["port"], pki) if running else (False, "")
        out[name] = {
            "pid": comp["pid"],
            "port": comp["port"],
            "running": running,
            "healthy": healthy,
            "detail": detail if not healthy else "ok",
        }
    return out


# --------------------------------------------------------------------------------------------
# Component command lines


def load_scheduler_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
        }
    try:
        text = path.read_text()
    except OSError as exc:
        raise ClusterError(f"cannot read scheduler config {path}: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError:
        try:
            import yaml
        except ImportError as exc:
            raise ClusterError(
                f"{path} is YAML: install PyYAML (it is in the project venv) or pass JSON"
            ) from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ClusterError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != "KubeSchedulerConfiguration":
        raise ClusterError(f"{path} is not a KubeSchedulerConfiguration document")
    return data


def write_scheduler_config(paths: Paths, source: Path | None) -> Path:
    """Copy of `source` (or a default config) with clientConnection.kubeconfig filled in."""
    data = load_scheduler_config(source)
    conn = data.get("clientConnection") or {}
    conn["kubeconfig"] = str(paths.component_kubeconfig("kube-scheduler"))
    data["clientConnection"] = conn
    data.setdefault("leaderElection", {"leaderElect": False})
    out = paths.run / "kube-scheduler.config.json"
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out


def argv_for(
    name: str,
    bins: Path,
    paths: Paths,
    ports: dict[str, int],
    kubeconfig: Path | None = None,
    tuning: Tuning = Tuning(),
) -> list[str]:
    pki = paths.pki
    kc = paths.component_kubeconfig
    if name == "etcd":
        client = f"http://{LOOPBACK}:{ports['etcd']}"
        peer = f"http://{LOOPBACK}:{ports['etcd-peer']}"
        return [
            str(bins / "etcd"),
            "--name=e2e",
            f"--data-dir={paths.run / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=e2e={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",
            "--auto-compaction-retention=1",
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        return [
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://{LOOPBACK}:{ports['etcd']}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={ports['kube-apiserver']}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--admission-control-config-file={pki / 'admission-config.json'}",
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            f"--cert-dir={paths.run / 'apiserver-certs'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            # The `kubernetes` Service cannot point at a loopback endpoint; nothing needs it.
            "--endpoint-reconciler-type=none",
            f"--profiling={'true' if tuning.apiserver_profiling else 'false'}",
            f"--feature-gates={FEATURE_GATES}",
            f"--runtime-config={RUNTIME_CONFIG}",
        ]
    if name == "kube-controller-manager":
        return [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={kc('kube-controller-manager')}",
            f"--authentication-kubeconfig={kc('kube-controller-manager')}",
            f"--authorization-kubeconfig={kc('kube-controller-manager')}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={ports['kube-controller-manager']}",
            f"--tls-cert-file={pki / 'kube-controller-manager-serving.crt'}",
            f"--tls-private-key-file={pki / 'kube-controller-manager-serving.key'}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*",
            "--profiling=false",
            f"--feature-gates={FEATURE_GATES}",
            *(
                [f"--node-monitor-grace-period={tuning.node_lease_seconds + 10}s"]
                if tuning.node_lease_seconds > NODE_LEASE_SECONDS
                else []
            ),
            *(
                [
                    f"--kube-api-qps={tuning.controller_qps}",
                    f"--kube-api-burst={2 * tuning.controller_qps}",
                ]
                if tuning.controller_qps > 0
                else []
            ),
        ]
    if name == "kube-scheduler":
        return [
            str(bins / "kube-scheduler"),
            f"--config={paths.run / 'kube-scheduler.config.json'}",
            f"--authentication-kubeconfig={kc('kube-scheduler')}",
            f"--authorization-kubeconfig={kc('kube-scheduler')}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={ports['kube-scheduler']}",
            f"--tls-cert-file={pki / 'kube-scheduler-serving.crt'}",
            f"--tls-private-key-file={pki / 'kube-scheduler-serving.key'}",
            f"--feature-gates={FEATURE_GATES}",
            "--v=2",
        ]
    if name == "kwok":
        return [
            str(bins / "kwok"),
            f"--kubeconfig={kubeconfig or kc('kwok')}",
            f"--config={paths.run / 'kwok.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}",
            "--manage-nodes-with-label-selector=",
            f"--node-lease-duration-seconds={tuning.node_lease_seconds}",
            f"--cidr={POD_CIDR}",
            f"--node-ip={FAKE_NODE_IP}",
            f"--server-address={LOOPBACK}:{ports['kwok']}",
        ]
    raise AssertionError(f"unknown component {name}")


def start_component(
    name: str,
    state: dict[str, Any],
    paths: Paths,
    bins: Path,
    ports: dict[str, int],
    kubeconfig: Path | None = None,
) -> None:
    argv = argv_for(name, bins, paths, ports, kubeconfig, Tuning.from_dict(state.get("tuning")))
    home = paths.run / "kwok-home" if name == "kwok" else None  # ignore any ~/.kwok/kwok.yaml
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)
    log_path = paths.log(name)
    pid = start_process(name, argv, log_path, child_env(home))
    state["components"][name] = {
        "pid": pid,
        "port": ports[name],
        "argv": argv,
        "log": str(log_path),
        "health": health_url(name, ports[name]),
    }
    if name == "etcd":
        state["components"][name]["peer_port"] = ports["etcd-peer"]
    save_state(paths, state)  # record the pid before waiting, so `down` can always find it
    pki = Path(state["pki_dir"]) if state.get("pki_dir") else None
    took = wait_healthy(name, pid, ports[name], pki, log_path)
    log(f"{name} healthy on {LOOPBACK}:{ports[name]} (pid {pid}, {took:.1f}s)")


# --------------------------------------------------------------------------------------------
# Commands


def cluster_is_healthy(state: dict[str, Any]) -> bool:
    return all(s["healthy"] for s in component_status(state).values())


def do_up(
    paths: Paths,
    scheduler_config: Path | None,
    external: Path | None = None,
    tuning: Tuning = Tuning(),
) -> int:
    existing = load_state(paths)
    if existing is not None and Tuning.from_dict(existing.get("tuning")) != tuning:
        log("the running cluster has other settings (lease, heartbeat, profiling); restarting")
        do_down(paths, purge_logs=False)
        existing = None
    if existing is not None and existing.get("external_kubeconfig") != (
        str(external) if external else None
    ):
        log("the running cluster is a different one; tearing it down first")
        do_down(paths, purge_logs=False)
        existing = None
    if external is not None:
        if scheduler_config is not None:
            raise ClusterError("--scheduler-config applies to the local control plane only")
        return do_up_external(paths, external, existing)
    if existing is not None:
        if cluster_is_healthy(existing):
            wanted = str(scheduler_config) if scheduler_config else None
            if wanted != existing.get("scheduler_config_source"):
                log("cluster already up; restarting kube-scheduler with the new config")
                return do_restart_scheduler(paths, scheduler_config)
            log(f"cluster already up (kubeconfig: {paths.kubeconfig})")
            return 0
        log("found a cluster that is not healthy; tearing it down first")
        do_down(paths, purge_logs=False)

    bins = find_bin_dir(paths.state_dir)
    require_binaries(bins)
    if scheduler_config is not None:
        load_scheduler_config(scheduler_config)  # fail before starting anything

    t0 = time.monotonic()
    for sub in ("pki", "etcd", "kubeconfigs", "apiserver-certs", "kwok-home"):
        shutil.rmtree(paths.run / sub, ignore_errors=True)
    paths.run.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    for name in COMPONENTS:  # fresh logs for a fresh cluster
        paths.log(name).write_bytes(b"")
    generate_pki(paths.pki)
    used: set[int] = set()
    ports: dict[str, int] = {}
    for name in (*COMPONENTS, "etcd-peer"):
        port = free_port()
        while port in used:
            port = free_port()
        used.add(port)
        ports[name] = port

    server = f"https://{LOOPBACK}:{ports['kube-apiserver']}"
    paths.component_kubeconfig("x").parent.mkdir(parents=True, exist_ok=True)
    for user in ("admin", "kube-controller-manager", "kube-scheduler", "kwok"):
        write_kubeconfig(paths.component_kubeconfig(user), server, paths.pki, user)
    (paths.run / "kwok.yaml").write_text(
        kwok_config(tuning.node_heartbeat_seconds, tuning.kwok_parallelism)
    )
    write_scheduler_config(paths, scheduler_config)

    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "state_dir": str(paths.state_dir),
        "bin_dir": str(bins),
        "kubectl": str(bins / "kubectl"),
        "kubeconfig": str(paths.kubeconfig),
        "server": server,
        "pki_dir": str(paths.pki),
        "ca_cert": str(paths.pki / "ca.crt"),
        "ca_key": str(paths.pki / "ca.key"),
        "service_cidr": SERVICE_CIDR,
        "pod_cidr": POD_CIDR,
        "kwok_node_annotation": KWOK_NODE_ANNOTATION,
        "scheduler_config_source": str(scheduler_config) if scheduler_config else None,
        "scheduler_config": str(paths.run / "kube-scheduler.config.json"),
        "tuning": tuning.as_dict(),
        "components": {},
    }
    save_state(paths, state)
    try:
        for name in COMPONENTS:
            start_component(name, state, paths, bins, ports)
            if name == "kube-apiserver":
                write_kubeconfig(paths.kubeconfig, server, paths.pki, "admin")
        # kube-controller-manager answers /healthz before its controllers run; a cluster is
        # usable once the serviceaccount controller has made `default/default`.
        wait_api_ready(server, paths.pki, "/api/v1/namespaces/default/serviceaccounts/default")
    except BaseException:
        log(f"startup failed; stopping what was started (logs kept in {paths.logs})")
        with contextlib.suppress(ClusterError):
            stop_all(state)
        remove_state(paths, purge_logs=False)
        raise
    state["up_seconds"] = round(time.monotonic() - t0, 1)
    save_state(paths, state)
    log(f"cluster up in {state['up_seconds']:.1f}s; export KUBECONFIG={paths.kubeconfig}")
    return 0


def do_up_external(paths: Paths, kubeconfig: Path, existing: dict[str, Any] | None) -> int:
    """An existing cluster (e.g. kind) from `kubeconfig`: run only kwok against it, so the
    tests get the same fake GPU nodes there."""
    if existing is not None:
        if cluster_is_healthy(existing):
            log(f"kwok already running against {kubeconfig}")
            return 0
        log("kwok is not healthy; restarting it")
        do_down(paths, purge_logs=False)
    if not kubeconfig.is_file():
        raise ClusterError(f"kubeconfig {kubeconfig} does not exist")
    bins = find_bin_dir(paths.state_dir)
    require_binaries(bins, ("kwok",))
    paths.run.mkdir(parents=True, exist_ok=True)
    paths.log("kwok").parent.mkdir(parents=True, exist_ok=True)
    paths.log("kwok").write_bytes(b"")
    (paths.run / "kwok.yaml").write_text(kwok_config())
    kubectl = bins / "kubectl"
    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "state_dir": str(paths.state_dir),
        "bin_dir": str(bins),
        "kubectl": str(kubectl) if kubectl.exists() else shutil.which("kubectl"),
        "kubeconfig": str(kubeconfig),
        "external_kubeconfig": str(kubeconfig),
        "pki_dir": None,
        "kwok_node_annotation": KWOK_NODE_ANNOTATION,
        "expected": ["kwok"],
        "components": {},
    }
    save_state(paths, state)
    try:
        start_component("kwok", state, paths, bins, {"kwok": free_port()}, kubeconfig)
    except BaseException:
        with contextlib.suppress(ClusterError):
            stop_all(state)
        remove_state(paths, purge_logs=False, state=state)
        raise
    return 0


def stop_all(state: dict[str, Any], only: tuple[str, ...] = COMPONENTS) -> None:
    errors = []
    for name in reversed(COMPONENTS):
        comp = state.get("components", {}).get(name)
        if comp is None or name not in only:
            continue
        try:
            stop_process(name, comp["pid"], comp["argv"][0])
        except ClusterError as exc:
            errors.append(str(exc))
    if errors:
        raise ClusterError("; ".join(errors))


def remove_state(paths: Paths, purge_logs: bool, state: dict[str, Any] | None = None) -> None:
    if state is None or not state.get("external_kubeconfig"):
        paths.kubeconfig.unlink(missing_ok=True)
    if purge_logs:
        shutil.rmtree(paths.run, ignore_errors=True)
        return
    if paths.run.is_dir():
        for entry in paths.run.iterdir():
            if entry == paths.logs:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def do_down(paths: Paths, purge_logs: bool) -> int:
    state = load_state(paths)
    if state is None:
        log(f"no cluster state in {paths.run}; nothing to stop")
    else:
        stop_all(state)
        log("cluster stopped")
    remove_state(paths, purge_logs, state)
    return 0


def do_status(paths: Paths, as_json: bool) -> int:
    state = load_state(paths)
    if state is None:
        if as_json:
            print(json.dumps({"up": False}))
        else:
            print(f"no cluster (no {paths.state_file})")
        return 1
    status = component_status(state)
    healthy = all(s["healthy"] for s in status.values())
    if as_json:
        print(json.dumps({"up": healthy, "state": state, "components": status}, indent=2))
        return 0 if healthy else 1
    for name, s in status.items():
        flag = "healthy" if s["healthy"] else ("running" if s["running"] else "DOWN")
        where = f"pid {s.get('pid', '-')}, {LOOPBACK}:{s.get('port', '-')}"
        detail = "" if s["healthy"] else f"  {s['detail']}"
        print(f"{name:24} {flag:8} {where}{detail}")
    print(f"kubeconfig: {state['kubeconfig']}")
    print(f"kubectl:    {state['kubectl']}")
    return 0 if healthy else 1


def do_restart_scheduler(paths: Paths, scheduler_config: Path | None) -> int:
    state = load_state(paths)
    if state is None:
        raise ClusterError("no cluster is up: run `make cluster-up` first")
    if state.get("external_kubeconfig"):
        raise ClusterError("restart-scheduler applies to the local control plane only")
    load_scheduler_config(scheduler_config)
    comp = state["components"].get("kube-scheduler")
    if comp is not None:
        stop_process("kube-scheduler", comp["pid"], comp["argv"][0])
    bins = Path(state["bin_dir"])
    write_scheduler_config(paths, scheduler_config)
    state["scheduler_config_source"] = str(scheduler_config) if scheduler_config else None
    ports = {"kube-apiserver": state["components"]["kube-apiserver"]["port"]}
    ports["kube-scheduler"] = comp["port"] if comp is not None else free_port()
    paths.log("kube-scheduler").parent.mkdir(parents=True, exist_ok=True)
    start_component("kube-scheduler", state, paths, bins, ports)
    return 0


def restart_component(paths: Paths, name: str, down_seconds: float = 0.0) -> float:
    """Stop one component of the local control plane and start it again with the same argv
    (same flags, same ports) after `down_seconds`; returns the seconds until it was healthy
    again. For fault tests (e.g. a kube-apiserver outage while clients watch)."""
    state = load_state(paths)
    if state is None or state.get("external_kubeconfig"):
        raise ClusterError("no local cluster is up")
    comp = state["components"].get(name)
    if comp is None:
        raise ClusterError(f"{name} is not part of this cluster")
    t0 = time.monotonic()
    stop_process(name, comp["pid"], comp["argv"][0])
    time.sleep(down_seconds)
    home = paths.run / "kwok-home" if name == "kwok" else None
    pki = Path(state["pki_dir"]) if state.get("pki_dir") else None
    for attempt in range(1, RESTART_ATTEMPTS + 1):
        comp["pid"] = start_process(name, list(comp["argv"]), paths.log(name), child_env(home))
        save_state(paths, state)
        try:
            wait_healthy(name, comp["pid"], comp["port"], pki, paths.log(name))
            break
        except ClusterError as exc:
            # A restarted component can exit during startup for reasons that pass: e.g.
            # kube-apiserver exits when a post-start hook (RBAC or priority-class bootstrap)
            # times out on a loaded machine. Start it again rather than leave the cluster
            # without it; a component that keeps failing is reported with its log.
            if attempt == RESTART_ATTEMPTS or pid_alive(comp["pid"]):
                raise
            log(f"{name} exited during restart (attempt {attempt}); starting it again: {exc}")
    took = time.monotonic() - t0
    log(f"{name} restarted (pid {comp['pid']}, {took:.1f}s)")
    return took


def signal_component(paths: Paths, name: str, sig: int) -> int:
    """Send `sig` (e.g. SIGSTOP/SIGCONT to make etcd unreachable for a while) to one
    component; returns its pid."""
    state = load_state(paths)
    if state is None:
        raise ClusterError("no cluster is up")
    comp = state["components"].get(name)
    if comp is None or not pid_alive(comp["pid"], comp["argv"][0]):
        raise ClusterError(f"{name} is not running")
    os.kill(comp["pid"], sig)
    return int(comp["pid"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cluster.py", description="Local Kubernetes control plane for the e2e tests."
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        p.add_argument(
            "--state-dir",
            type=Path,
            default=DEFAULT_STATE_DIR,
            help=f"where kubeconfig and run/ live (default: {DEFAULT_STATE_DIR})",
        )
        return p

    up = add("up", "start the control plane (no-op if it is already up)")
    up.add_argument("--scheduler-config", type=Path, help="a KubeSchedulerConfiguration file")
    up.add_argument(
        "--kubeconfig",
        type=Path,
        help="use this existing cluster (e.g. kind) instead: start only kwok against it",
    )
    up.add_argument(
        "--node-lease-seconds",
        type=int,
        default=NODE_LEASE_SECONDS,
        help="kwok's node lease duration (renewed every lease/4 s); above the default, "
        "kube-controller-manager's node monitor grace period becomes lease + 10 s",
    )
    up.add_argument(
        "--node-heartbeat-seconds",
        type=int,
        default=NODE_HEARTBEAT_SECONDS,
        help="seconds between kwok's node condition heartbeats (N to 1.5 N)",
    )
    up.add_argument(
        "--apiserver-profiling", action="store_true", help="serve kube-apiserver /debug/pprof"
    )
    up.add_argument(
        "--kwok-parallelism",
        type=int,
        default=0,
        help="kwok's node stage and lease parallelism (default: kwok's own, 4)",
    )
    up.add_argument(
        "--controller-qps",
        type=int,
        default=0,
        help="kube-controller-manager's API QPS, burst twice that (default: its own, 20)",
    )
    down = add("down", "stop the control plane and remove its state (logs are kept)")
    down.add_argument("--purge-logs", action="store_true", help="also remove run/logs")
    status = add("status", "show component health; exit status 0 only if all are healthy")
    status.add_argument("--json", action="store_true")
    rs = add("restart-scheduler", "restart kube-scheduler with another configuration")
    rs.add_argument("--scheduler-config", type=Path, required=True)

    args = parser.parse_args(argv)
    paths = Paths(args.state_dir.expanduser().resolve())
    sched = getattr(args, "scheduler_config", None)
    if sched is not None:
        sched = sched.expanduser().resolve()
    ext = getattr(args, "kubeconfig", None)
    if ext is not None:
        ext = ext.expanduser().resolve()
    commands: dict[str, Callable[[], int]] = {
        "up": lambda: do_up(
            paths,
            sched,
            ext,
            Tuning(
                args.node_lease_seconds,
                args.node_heartbeat_seconds,
                args.apiserver_profiling,
                args.kwok_parallelism,
                args.controller_qps,
            ),
        ),
        "down": lambda: do_down(paths, args.purge_logs),
        "status": lambda: do_status(paths, args.json),
        "restart-scheduler": lambda: do_restart_scheduler(paths, sched),
    }
    try:
        if args.cmd == "status":
            return commands["status"]()
        with locked(paths):
            return commands[args.cmd]()
    except ClusterError as exc:
        print(f"cluster.py {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
