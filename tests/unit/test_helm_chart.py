"""The Helm chart charts/fairshare: generated from the kustomize manifests, no drift.

* the chart on disk is what tools/helm/chart.py makes from manifests/ (so editing a
  manifest without regenerating fails here);
* `helm lint` and `helm template` with the values files of tests/helm/ (defaults, minimal,
  full) pass; values the schema refuses (tests/helm/bad-*.yaml) fail with a message;
* the objects `helm template` renders with the defaults (plus monitoring) are the objects
  `kubectl kustomize` renders from overlays/second-scheduler and monitoring/: the same
  kinds, names and contents (the config compared parsed; kustomize's hashed scheduler
  ConfigMap name and helm's checksum annotation aside);
* the config of each values file is one the servers load (FairShareConfig).

helm is built from the helm.sh/helm/v4 Go module by tools/helm/build.sh (cached). Without
Go the helm tests skip saying why, except under CI, where they fail.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairshare.config.loading import config_from_mapping
from tests.gotools import built_tool, skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fairshare"
VALUES = ROOT / "tests" / "helm"
KUBECTL = ROOT / ".e2e" / "bin" / "kubectl"
NS = "fairshare-system"


@pytest.fixture(scope="module")
def helm() -> str:
    return built_tool("helm")


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_chart_is_generated_from_the_manifests() -> None:
    out = run(sys.executable, str(ROOT / "tools" / "helm" / "chart.py"), "--check")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("values", ["minimal.yaml", "full.yaml"])
def test_values_files_hold_configs_the_servers_load(values: str) -> None:
    doc = yaml.safe_load((VALUES / values).read_text(encoding="utf-8"))
    config_from_mapping(doc["config"])


def template(helm: str, *args: str, namespace: str = NS) -> subprocess.CompletedProcess[str]:
    return run(helm, "template", "fairshare", str(CHART), "--namespace", namespace, *args)


@pytest.mark.parametrize("values", [None, "minimal.yaml", "full.yaml"])
def test_lint_and_template(helm: str, values: str | None) -> None:
    extra = ["--values", str(VALUES / values)] if values else []
    lint = run(helm, "lint", str(CHART), "--namespace", NS, *extra)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = template(helm, *extra)
    assert out.returncode == 0, out.stderr
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("Deployment", "fairshare-webhook") in kinds
    assert ("ValidatingWebhookConfiguration", "fairshare") in kinds or any(
        k == "ValidatingWebhookConfiguration" for k, _ in kinds
    )
    (cm,) = [
        o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "fairshare-config"
    ]
    config_from_mapping(yaml.safe_load(cm["data"]["config.yaml"]))
    if values == "minimal.yaml":
        # The release's namespace is made by hand; the reservation pods' one comes along.
        assert ("Namespace", NS) not in kinds
        assert ("Namespace", "fairshare-reservation") in kinds
        assert ("Deployment", "fairshare-scheduler") not in kinds
        assert ("Deployment", "fairshare-reclaimer") not in kinds
        tenants = yaml.safe_load(cm["data"]["config.yaml"])["tenants"]
        assert [t["name"] for t in tenants] == ["team-a", "team-b"]
    if values == "full.yaml":
        (dep,) = [
            o
            for o in objs
            if o["kind"] == "Deployment" and o["metadata"]["name"] == "fairshare-extender"
        ]
        assert dep["spec"]["replicas"] == 3
        image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == "registry.example.com/fairshare:0.1.0-rc1"
        assert ("PrometheusRule", "fairshare") in kinds
        assert ("Certificate", "fairshare-webhook") in kinds
        assert ("Job", "fairshare-certs") not in kinds


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("bad-replicas.yaml", "replicas"),
        ("bad-key.yaml", "replica"),
        ("bad-config.yaml", "weigth"),
    ],
)
def test_schema_refuses_bad_values(helm: str, values: str, message: str) -> None:
    out = template(helm, "--values", str(VALUES / values))
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr
    assert message in out.stderr


def test_other_namespace_is_refused(helm: str) -> None:
    out = template(helm, namespace="default")
    assert out.returncode != 0
    assert "install fairshare into namespace fairshare-system" in out.stderr


# -- drift: helm template == kubectl kustomize -----------------------------------------

HASHED = re.compile(r"\b(fairshare-scheduler-config)-[a-z0-9]{10}\b")


def _objects(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in yaml.safe_load_all(HASHED.sub(r"\1", text)):
        if not doc:
            continue
        meta = doc["metadata"]
        if meta.get("namespace") == NS:
            del meta["namespace"]  # kustomize writes it, helm leaves it to the release
        annotations = (
            doc.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
        )
        annotations.pop("checksum/config", None)
        if annotations == {} and "annotations" in doc.get("spec", {}).get("template", {}).get(
            "metadata", {}
        ):
            del doc["spec"]["template"]["metadata"]["annotations"]
        if doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {}):
            doc["data"]["config.yaml"] = yaml.safe_load(doc["data"]["config.yaml"])
        out[(doc["kind"], meta["name"])] = doc
    return out


@pytest.mark.parametrize(
    ("sets", "targets"),
    [
        (["monitoring.enabled=true"], ["overlays/second-scheduler", "monitoring"]),
        (["scheduler.mode=none"], ["base", "gpu-reservation"]),
        (["scheduler.mode=none", "gpuHandoff.mode=none"], ["base"]),
        (["scheduler.mode=none", "gpuHandoff.mode=hami"], ["base", "hami"]),
        (["certificates.mode=cert-manager"], ["overlays/cert-manager"]),
    ],
    ids=["second-scheduler+monitoring", "base", "base-no-handoff", "base+hami", "cert-manager"],
)
def test_helm_renders_what_kustomize_renders(
    helm: str, sets: list[str], targets: list[str]
) -> None:
    if not KUBECTL.exists():
        skip_or_fail("kubectl not built (make cluster-bins); needed for `kubectl kustomize`")
    rendered = template(helm, *(a for s in sets for a in ("--set", s)))
    assert rendered.returncode == 0, rendered.stderr
    kustomized = ""
    for target in targets:
        out = run(str(KUBECTL), "kustomize", str(ROOT / "manifests" / target))
        assert out.returncode == 0, out.stderr
        kustomized += "\n---\n" + out.stdout
    from_helm, from_kustomize = _objects(rendered.stdout), _objects(kustomized)
    assert sorted(from_helm) == sorted(from_kustomize)
    for key, obj in from_kustomize.items():
        assert from_helm[key] == obj, key
