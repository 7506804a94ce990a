"""`helm install` of charts/fairshare on a real control plane, and its RBAC.

The chart installs fail-closed admission webhooks and the fairness ConfigMap that the
shared e2e cluster's fairshare servers watch, so it is installed on a control plane of its
own (tools/e2e/cluster.py in a temporary state directory, the same binaries), for real:
every object must be accepted by kube-apiserver (schema, defaulting, validation,
admission), then exist; the release is `deployed`. The servers' pods cannot run there (no
image, no nodes), which `helm install` without `--wait` does not need. `kubectl auth
can-i` then checks the installed RBAC: what each ServiceAccount needs, and not more.
Finally `helm uninstall` removes every object again.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gotools import built_tool, skip_or_fail

from .conftest import ROOT, Cluster, run_cluster_py

pytestmark = pytest.mark.e2e

CHART = ROOT / "charts" / "fairshare"
NS = "fairshare-system"
SA = f"system:serviceaccount:{NS}:"


def helm_binary() -> str:
    return built_tool("helm")


@pytest.fixture(scope="module")
def own_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """A second local control plane, only for this module (needs the shared one's binaries,
    which the `cluster` fixture checked)."""
    if not cluster.managed:
        skip_or_fail("the helm install test starts its own local control plane")
    state = Path(tempfile.mkdtemp(prefix="fairshare-helm-e2e-"))
    up = run_cluster_py("up", timeout=300, state_dir=state)
    if up.returncode != 0:
        run_cluster_py("down", timeout=120, state_dir=state)
        pytest.fail(f"second control plane did not start:\n{up.stdout}{up.stderr}")
    try:
        own = Cluster(
            kubeconfig=state / "kubeconfig", kubectl_path=cluster.kubectl_path, managed=True
        )
        servers = [
            yaml.safe_load(c.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
            for c in (cluster, own)
        ]
        assert servers[0] != servers[1], servers  # not the shared cluster
        yield own
    finally:
        run_cluster_py("down", "--purge-logs", timeout=120, state_dir=state)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def installed(own_cluster: Cluster) -> Iterator[dict[str, Any]]:
    helm = helm_binary()
    kc = str(own_cluster.kubeconfig)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [helm, "--kubeconfig", kc, *args], capture_output=True, text=True, timeout=300
        )

    rendered = run("template", "fairshare", str(CHART), "-n", NS, "--set", "createNamespace=false")
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    out = run(
        "install", "fairshare", str(CHART), "-n", NS, "--create-namespace",
        "--set", "createNamespace=false",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    yield {"helm": run, "objects": objects, "install": out.stdout}
    gone = run("uninstall", "fairshare", "-n", NS)
    assert gone.returncode == 0, gone.stderr


def test_release_is_deployed_and_every_object_exists(
    own_cluster: Cluster, installed: dict[str, Any]
) -> None:
    status = installed["helm"]("status", "fairshare", "-n", NS, "-o", "yaml")
    assert status.returncode == 0, status.stderr
    assert yaml.safe_load(status.stdout)["info"]["status"] == "deployed"
    objects = installed["objects"]
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Job", "ClusterRole", "NetworkPolicy"} <= kinds
    assert {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"} <= kinds
    for obj in objects:
        meta = obj["metadata"]
        scope = ["-n", meta.get("namespace", NS)]
        got = own_cluster.kubectl("get", obj["kind"], meta["name"], *scope, "-o", "name")
        assert got.stdout.strip(), (obj["kind"], meta["name"])


def can_i(cluster: Cluster, sa: str, verb: str, resource: str, *scope: str) -> bool:
    proc = cluster.kubectl("auth", "can-i", verb, resource, f"--as={SA}{sa}", *scope, check=False)
    answer = proc.stdout.strip().splitlines()[-1:] or [""]
    assert answer[0] in ("yes", "no"), f"can-i {verb} {resource}: {proc.stdout}{proc.stderr}"
    return answer[0] == "yes"


CAN = [
    ("fairshare-webhook", "watch", "pods", "-A"),
    ("fairshare-webhook", "create", "leases", "-n", NS),
    ("fairshare-extender", "create", "pods", "-A", "--subresource=binding"),
    ("fairshare-extender", "patch", "pods", "-A"),
    ("fairshare-certs", "patch", "validatingwebhookconfigurations/fairshare"),
    ("fairshare-scheduler", "create", "pods", "-A", "--subresource=binding"),
]
CANNOT = [
    ("fairshare-webhook", "delete", "pods", "-A"),
    ("fairshare-webhook", "get", "secrets", "-n", NS),
    ("fairshare-extender", "get", "secrets", "-A"),
    ("fairshare-extender", "update", "configmaps", "-n", NS),
    ("fairshare-certs", "list", "secrets", "-A"),
    ("fairshare-certs", "patch", "validatingwebhookconfigurations/someone-else"),
]


def test_installed_rbac(own_cluster: Cluster, installed: dict[str, Any]) -> None:
    deadline = time.monotonic() + 30
    while not can_i(own_cluster, "fairshare-webhook", "list", "pods", "-A"):
        assert time.monotonic() < deadline, "RBAC bindings did not take effect within 30s"
        time.sleep(0.5)
    for sa, verb, resource, *scope in CAN:
        assert can_i(own_cluster, sa, verb, resource, *scope), (sa, verb, resource, scope)
    for sa, verb, resource, *scope in CANNOT:
        assert not can_i(own_cluster, sa, verb, resource, *scope), (sa, verb, resource, scope)
