"""Structural checks of the deployable manifests under manifests/ (issue 6).

Every YAML file under manifests/ is parsed (all documents) and the invariants that keep the
install safe are asserted: the restricted security context, resources and probes of every
workload, the shape of the webhook registrations, least-privilege RBAC, the scheduler
extender stanza, and that every kustomization only names files that exist. When the real
kubectl from `make cluster-bins` is at .e2e/bin/kubectl, the overlays are also rendered
with `kubectl kustomize`. Applying them to a control plane is the e2e suite's job.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gotools import e2e_kubectl

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"

NAMESPACE = "fairshare-system"
RESERVATION_NAMESPACE = "fairshare-reservation"
"""gpu-reservation/: the reservation pods' namespace (gpuSharing.reservation.namespace)."""
IMAGE = "ghcr.io/fairshare/fairshare:0.1.0"
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler:v1.36.3"
EXTENDER_URL = "https://fairshare-extender.fairshare-system.svc:8888"
NS_LABEL = "kubernetes.io/metadata.name"

REPORTER = "fairshare-gpu-reporter"
RESERVATION_OBJECTS = {
    RESERVATION_NAMESPACE,
    REPORTER,
    "fairshare-extender-reservations",
}
SECOND_SCHEDULER_CONFIG = MANIFESTS / "overlays" / "second-scheduler" / "scheduler-config.yaml"
DEFAULT_SCHEDULER_PATCH = MANIFESTS / "scheduler" / "default-scheduler-patch.yaml"
OVERLAYS = ("second-scheduler", "cert-manager")

# Field names of the v1 Extender and ExtenderTLSConfig types (kubescheduler.config.k8s.io/v1).
EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
TLS_FIELDS = {
    "insecure",
    "serverName",
    "certFile",
    "keyFile",
    "caFile",
    "certData",
    "keyData",
    "caData",
}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}

Doc = dict[str, Any]


# --------------------------------------------------------------------------------------------
# Loading


def yaml_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.rglob("*") if p.suffix in (".yaml", ".yml"))


@cache
def load(path: Path) -> tuple[Doc, ...]:
    with path.open() as fh:
        return tuple(d for d in yaml.safe_load_all(fh) if d is not None)


def kustomizations() -> list[Path]:
    return sorted(MANIFESTS.rglob("kustomization.yaml"))


@cache
def patch_files() -> frozenset[Path]:
    """Files that kustomizations use as patches: partial objects, not objects."""
    out = set()
    for path in kustomizations():
        (kust,) = load(path)
        out.update(
            (path.parent / p["path"]).resolve() for p in kust.get("patches", []) if "path" in p
        )
    return frozenset(out)


def all_docs() -> Iterator[tuple[Path, Doc]]:
    for path in yaml_files():
        for doc in load(path):
            yield path, doc


def objects(kind: str) -> list[Doc]:
    """Kubernetes objects of `kind` across all files (kustomizations are not objects)."""
    return [
        d
        for path, d in all_docs()
        if d.get("kind") == kind and "metadata" in d and path.resolve() not in patch_files()
    ]


def one(kind: str, name: str) -> Doc:
    found = [d for d in objects(kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def workloads() -> list[Doc]:
    return objects("Deployment") + objects("Job")


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: Doc) -> list[Doc]:
    spec = pod_spec(workload)
    return list(spec.get("initContainers") or []) + list(spec["containers"])


def label_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; an empty selector matches everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def namespace_selected(webhook: Doc, namespace: str) -> bool:
    selector = webhook.get("namespaceSelector") or {}
    return label_selector_matches(selector, {NS_LABEL: namespace})


def all_webhooks() -> list[tuple[str, Doc]]:
    out = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for cfg in objects(kind):
            out.extend((kind, wh) for wh in cfg["webhooks"])
    return out


def webhook_params() -> list[Any]:
    return [pytest.param(k, w, id=f"{k}/{w['name']}") for k, w in all_webhooks()]


def webhook_resources(webhook: Doc) -> set[str]:
    return {r for rule in webhook["rules"] for r in rule["resources"]}


def extenders(path: Path) -> list[Doc]:
    (doc,) = load(path)
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert doc["kind"] == "KubeSchedulerConfiguration"
    found: list[Doc] = doc["extenders"]
    assert len(found) == 1
    return found


def sa_bindings() -> list[tuple[Doc, Doc]]:
    """(binding, the Role/ClusterRole it grants) for roles defined in the manifests."""
    out = []
    for binding in objects("RoleBinding") + objects("ClusterRoleBinding"):
        ref = binding["roleRef"]
        out.extend(
            (binding, role)
            for role in objects(ref["kind"])
            if role["metadata"]["name"] == ref["name"]
        )
    return out


def subjects(binding: Doc) -> set[str]:
    return {
        f"{s.get('namespace', binding['metadata'].get('namespace', NAMESPACE))}/{s['name']}"
        for s in binding["subjects"]
        if s["kind"] == "ServiceAccount"
    }


def grants(role: Doc, verb: str, resource: str, group: str = "") -> bool:
    for rule in role.get("rules") or []:
        if group not in rule.get("apiGroups", []) and "*" not in rule.get("apiGroups", []):
            continue
        if resource not in rule["resources"] and "*" not in rule["resources"]:
            continue
        if verb in rule["verbs"] or "*" in rule["verbs"]:
            return True
    return False


def rules_of(sa: str) -> list[tuple[Doc, Doc]]:
    """(role, binding) pairs that give ServiceAccount fairshare-system/`sa` permissions."""
    return [(role, b) for b, role in sa_bindings() if f"{NAMESPACE}/{sa}" in subjects(b)]


# --------------------------------------------------------------------------------------------
# Every file


def test_manifests_exist() -> None:
    names = {rel(p) for p in yaml_files()}
    for required in (
        "manifests/base/kustomization.yaml",
        "manifests/overlays/second-scheduler/kustomization.yaml",
        "manifests/overlays/cert-manager/kustomization.yaml",
        "manifests/scheduler/default-scheduler-patch.yaml",
        "manifests/kind/cluster.yaml",
    ):
        assert required in names
    assert (MANIFESTS / "README.md").is_file()


@pytest.mark.parametrize("path", yaml_files(), ids=rel)
def test_every_document_is_a_typed_mapping(path: Path) -> None:
    docs = load(path)
    assert docs, f"{rel(path)} has no YAML documents"
    for doc in docs:
        assert isinstance(doc, dict)
        assert isinstance(doc.get("apiVersion"), str) and doc["apiVersion"]
        assert isinstance(doc.get("kind"), str) and doc["kind"]


def test_object_names_are_unique_per_kind_and_namespace() -> None:
    seen: dict[tuple[str, str, str], str] = {}
    for path, doc in all_docs():
        meta = doc.get("metadata")
        if doc["kind"] == "Kustomization" or not meta or "$patch" in doc:
            continue
        if path.resolve() in patch_files():
            continue
        key = (doc["kind"], meta.get("namespace", NAMESPACE), meta["name"])
        assert key not in seen, f"{key} defined in {seen[key]} and {rel(path)}"
        seen[key] = rel(path)


# --------------------------------------------------------------------------------------------
# Kustomizations


@pytest.mark.parametrize("path", kustomizations(), ids=rel)
def test_kustomization_references_exist(path: Path) -> None:
    (kust,) = load(path)
    here = path.parent
    for entry in kust.get("resources", []) + kust.get("components", []):
        target = here / entry
        assert target.exists(), f"{rel(path)}: resource {entry} does not exist"
        if target.is_dir():
            assert (target / "kustomization.yaml").is_file(), f"{entry} is no kustomization"
    for patch in kust.get("patches", []):
        assert "path" in patch or "patch" in patch
        if "path" in patch:
            assert (here / patch["path"]).is_file(), f"{rel(path)}: patch {patch['path']}"
    for gen in kust.get("configMapGenerator", []) + kust.get("secretGenerator", []):
        for entry in gen.get("files", []):
            source = entry.split("=", 1)[-1]
            assert (here / source).is_file(), f"{rel(path)}: generator file {source}"


def test_every_manifest_file_is_used_by_a_kustomization() -> None:
    used: set[Path] = set()
    for path in kustomizations():
        (kust,) = load(path)
        used.add(path)
        for entry in kust.get("resources", []):
            used.add((path.parent / entry).resolve())
        for patch in kust.get("patches", []):
            if "path" in patch:
                used.add((path.parent / patch["path"]).resolve())
        for gen in kust.get("configMapGenerator", []):
            used.update((path.parent / e.split("=", 1)[-1]).resolve() for e in gen["files"])
    standalone = {DEFAULT_SCHEDULER_PATCH, MANIFESTS / "kind" / "cluster.yaml"}
    for path in yaml_files():
        if path in standalone or path.name == "kustomization.yaml":
            continue
        assert path.resolve() in used, f"{rel(path)} is not referenced by any kustomization"


def test_base_puts_everything_in_fairshare_system() -> None:
    (kust,) = load(MANIFESTS / "base" / "kustomization.yaml")
    assert kust["namespace"] == NAMESPACE
    assert {"name": "fairshare-config", "files": ["config.yaml"]} in kust["configMapGenerator"]
    (ns,) = load(MANIFESTS / "base" / "namespace.yaml")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_overlays_do_not_override_the_namespace() -> None:
    # The kube-system RoleBinding of the fairshare-scheduler must keep its namespace.
    for overlay in OVERLAYS:
        (kust,) = load(MANIFESTS / "overlays" / overlay / "kustomization.yaml")
        assert "namespace" not in kust, overlay


# --------------------------------------------------------------------------------------------
# Workloads


def test_there_are_the_expected_workloads() -> None:
    names = {d["metadata"]["name"] for d in objects("Deployment")}
    assert names == {
        "fairshare-webhook",
        "fairshare-extender",
        "fairshare-reclaimer",
        "fairshare-scheduler",
    }
    assert {d["metadata"]["name"] for d in objects("Job")} == {"fairshare-certs"}


@pytest.mark.parametrize(
    "workload", workloads(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}"
)
def test_containers_run_restricted(workload: Doc) -> None:
    pod = pod_spec(workload)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod.get("hostNetwork") is not True and pod.get("hostPID") is not True
    for c in containers(workload):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert "add" not in sc["capabilities"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]
        assert sc.get("privileged") is not True
        assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] > 0
        if c["image"] == IMAGE:
            assert sc["runAsUser"] == 10001
        else:
            assert c["image"] == SCHEDULER_IMAGE


@pytest.mark.parametrize(
    "workload", workloads(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}"
)
def test_containers_have_requests_and_limits(workload: Doc) -> None:
    for c in containers(workload):
        for section in ("requests", "limits"):
            assert set(c["resources"][section]) >= {"cpu", "memory"}, (c["name"], section)


@pytest.mark.parametrize(
    "workload", workloads(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}"
)
def test_writable_tmp_is_an_empty_dir(workload: Doc) -> None:
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    for c in containers(workload):
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        assert "/tmp" in mounts, c["name"]
        assert "emptyDir" in volumes[mounts["/tmp"]]
        for m in c.get("volumeMounts", []):
            if m["mountPath"] != "/tmp":
                assert m.get("readOnly") is True, (c["name"], m["mountPath"])


@pytest.mark.parametrize("deployment", objects("Deployment"), ids=lambda d: d["metadata"]["name"])
def test_deployments_probe_healthz_and_readyz_over_https(deployment: Doc) -> None:
    # The reclaimer serves only health and metrics (no TLS option): plain HTTP there.
    scheme = "HTTP" if deployment["metadata"]["name"] == "fairshare-reclaimer" else "HTTPS"
    for c in pod_spec(deployment)["containers"]:
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = c[probe]["httpGet"]
            assert get["path"] == path and get["scheme"] == scheme, (c["name"], probe)
            assert get["port"] in ports or get["port"] in ports.values()


@pytest.mark.parametrize("deployment", objects("Deployment"), ids=lambda d: d["metadata"]["name"])
def test_deployments_are_highly_available(deployment: Doc) -> None:
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    labels = spec["template"]["metadata"]["labels"]
    assert label_selector_matches(spec["selector"], labels)
    pdbs = [
        p
        for p in objects("PodDisruptionBudget")
        if label_selector_matches(p["spec"]["selector"], labels)
    ]
    assert len(pdbs) == 1, deployment["metadata"]["name"]
    assert pdbs[0]["spec"]["minAvailable"] < spec["replicas"]
    spread = pod_spec(deployment)["topologySpreadConstraints"]
    assert "kubernetes.io/hostname" in {t["topologyKey"] for t in spread}
    for t in spread:
        assert label_selector_matches(t["labelSelector"], labels)


@pytest.mark.parametrize(
    ("name", "port"), [("fairshare-webhook", 8443), ("fairshare-extender", 8888)]
)
def test_fairshare_servers_command_lines(name: str, port: int) -> None:
    secret = f"{name}-tls"
    dep = one("Deployment", name)
    (c,) = pod_spec(dep)["containers"]
    assert c["image"] == IMAGE
    assert c["command"] == ["fairshare"]
    assert c["args"][0] == name.removeprefix("fairshare-")
    assert f"--configmap={NAMESPACE}/fairshare-config" in c["args"]
    assert f"--port={port}" in c["args"]
    assert {"--tls-cert=/tls/tls.crt", "--tls-key=/tls/tls.key"} <= set(c["args"])
    assert not any(a.startswith("--kubeconfig") for a in c["args"])
    assert c["ports"][0]["containerPort"] == port
    assert pod_spec(dep)["serviceAccountName"] == name
    volumes = {v["name"]: v for v in pod_spec(dep)["volumes"]}
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tls")
    assert volumes[mount["name"]]["secret"]["secretName"] == secret
    # --client-ca on by default, from the client CA Secret's certificate only.
    assert "--client-ca=/client-ca/ca.crt" in c["args"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/client-ca")
    ca_secret = volumes[mount["name"]]["secret"]
    assert ca_secret["secretName"] == "fairshare-client-ca"
    assert ca_secret["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    svc = one("Service", name)
    selects = dict(dep["spec"]["selector"]["matchLabels"])
    if name == "fairshare-extender":  # the leader's pod only
        selects["fairshare.io/extender-leader"] = "true"
    assert svc["spec"]["selector"] == selects
    assert svc["spec"]["ports"][0]["targetPort"] in ("https", port)


def test_cert_job_writes_the_secrets_the_servers_mount() -> None:
    job = one("Job", "fairshare-certs")
    pod = pod_spec(job)
    assert pod["serviceAccountName"] == "fairshare-certs"
    assert pod["restartPolicy"] in ("OnFailure", "Never")
    runs = {}
    client_runs = []
    for c in containers(job):
        assert c["command"] == ["fairshare"] and c["args"][0] in ("certs", "client-certs")
        if c["args"][0] == "client-certs":
            client_runs.append(c["args"][1:])
            continue
        opts = dict(a.removeprefix("--").split("=", 1) for a in c["args"][1:])
        assert opts["namespace"] == NAMESPACE
        runs[opts["service"]] = opts
    assert set(runs) == {"fairshare-webhook", "fairshare-extender"}
    for service, opts in runs.items():
        assert opts["secret"] == f"{service}-tls"
        assert opts["out"].startswith("/tmp/")
    webhook_configs = {
        d["metadata"]["name"]
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for d in objects(kind)
    }
    patched = runs["fairshare-webhook"]["patch-webhooks"].split(",")
    assert len(patched) == 2 and set(patched) == webhook_configs
    assert "patch-webhooks" not in runs["fairshare-extender"]
    # One run makes the client CA and certificates, and never replaces a CA in use.
    (client_args,) = client_runs
    assert f"--secrets={NAMESPACE}" in client_args and "--keep-existing" in client_args


# --------------------------------------------------------------------------------------------
# Admission registration


def test_webhook_configurations_exist() -> None:
    kinds = [k for k, _ in all_webhooks()]
    assert kinds.count("MutatingWebhookConfiguration") == 1
    assert kinds.count("ValidatingWebhookConfiguration") == 2


@pytest.mark.parametrize(("kind", "webhook"), webhook_params())
def test_webhook_common_fields(kind: str, webhook: Doc) -> None:
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "None"
    assert 1 <= webhook["timeoutSeconds"] <= 10
    assert webhook["name"].endswith(".fairshare.io")
    svc = webhook["clientConfig"]["service"]
    assert (svc["namespace"], svc["name"]) == (NAMESPACE, "fairshare-webhook")
    assert svc["path"] == ("/mutate" if kind.startswith("Mutating") else "/validate")
    service = one("Service", "fairshare-webhook")
    assert svc["port"] in {p["port"] for p in service["spec"]["ports"]}
    assert "caBundle" not in webhook["clientConfig"], "caBundle is filled in at install time"
    for rule in webhook["rules"]:
        assert rule["apiGroups"] in ([""], ["resource.k8s.io"]) and rule["apiVersions"] == ["v1"]
        assert "*" not in rule["resources"] and "DELETE" not in rule["operations"]


@pytest.mark.parametrize(("kind", "webhook"), webhook_params())
def test_webhook_namespace_selection(kind: str, webhook: Doc) -> None:
    if webhook_resources(webhook) == {"configmaps"}:
        # The config guard: only fairshare-system, only the ConfigMap fairshare-config.
        assert namespace_selected(webhook, NAMESPACE)
        assert not namespace_selected(webhook, "kube-system")
        assert not namespace_selected(webhook, "team-a")
        (cond,) = webhook["matchConditions"]
        assert re.search(
            r"object\.metadata\.name\s*==\s*[\"']fairshare-config[\"']", cond["expression"]
        )
        assert set(webhook["rules"][0]["operations"]) == {"CREATE", "UPDATE"}
        assert webhook["failurePolicy"] == "Fail"
        return
    assert not namespace_selected(webhook, NAMESPACE)
    assert not namespace_selected(webhook, "kube-system")
    assert namespace_selected(webhook, "team-a")
    assert namespace_selected(webhook, "default")
    assert "pods" in webhook_resources(webhook)
    # Quota covers CPU and memory too: nothing may narrow the pod webhooks by content.
    assert "matchConditions" not in webhook
    assert "objectSelector" not in webhook


def test_failure_policies() -> None:
    for kind, webhook in all_webhooks():
        if kind == "MutatingWebhookConfiguration":
            assert webhook["failurePolicy"] == "Ignore"
            assert webhook["reinvocationPolicy"] == "IfNeeded"
            assert webhook_resources(webhook) == {"pods"}
        else:
            assert webhook["failurePolicy"] == "Fail"
            assert "reinvocationPolicy" not in webhook
    validating_pods = [
        w
        for k, w in all_webhooks()
        if k.startswith("Validating") and "pods" in webhook_resources(w)
    ]
    (pods,) = validating_pods
    assert webhook_resources(pods) == {
        "pods",
        "persistentvolumeclaims",
        "resourceclaims",
        "resourceclaimtemplates",
    }
    assert pods["rules"][0]["operations"] == ["CREATE"]


# --------------------------------------------------------------------------------------------
# RBAC


def test_no_wildcards_in_fairshare_roles() -> None:
    for kind in ("Role", "ClusterRole"):
        for role in objects(kind):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], (role["metadata"]["name"], field)


def test_webhook_writes_only_its_reservation_leases() -> None:
    # Cluster-wide the webhook only reads; its one write is the namespaced Role for the
    # per-tenant reservation Leases its replicas share (webhook/coordination.py).
    pairs = rules_of("fairshare-webhook")
    assert pairs
    for role, _ in pairs:
        for rule in role["rules"]:
            writes = WRITE_VERBS & set(rule["verbs"])
            if writes:
                assert role["kind"] == "Role", role["metadata"]["name"]
                assert rule["resources"] == ["leases"]
                assert writes <= {"create", "update"}
            assert "secrets" not in rule["resources"]
    cluster = one("ClusterRole", "fairshare-webhook")
    for resource in ("pods", "namespaces", "persistentvolumeclaims", "nodes"):
        assert grants(cluster, "watch", resource)
    assert any(grants(r, "watch", "configmaps") for r, _ in pairs)


def test_only_the_extender_binds_pods() -> None:
    binders = set()
    for binding, role in sa_bindings():
        if grants(role, "create", "pods/binding") or grants(role, "create", "bindings"):
            binders |= subjects(binding)
    assert binders == {f"{NAMESPACE}/fairshare-extender"}
    extender = one("ClusterRole", "fairshare-extender")
    assert grants(extender, "patch", "pods")
    assert grants(extender, "create", "events")
    assert not grants(extender, "delete", "pods")
    # The extender and the reclaimer read what their trackers count (PVCs: storage).
    reclaimer = one("ClusterRole", "fairshare-reclaimer")
    for resource in ("nodes", "pods", "namespaces", "persistentvolumeclaims"):
        assert grants(extender, "watch", resource)
        assert grants(reclaimer, "watch", resource)
    # The reclaimer annotates the pod it makes room for (the hold the extender honours)
    # and evicts through the Eviction API, never by deleting pods.
    assert grants(reclaimer, "patch", "pods")
    assert grants(reclaimer, "create", "pods/eviction")
    assert not grants(reclaimer, "delete", "pods")


def test_extender_replicas_elect_a_leader() -> None:
    # Several replicas behind one Service: only the Lease holder decides and is ready.
    dep = one("Deployment", "fairshare-extender")
    (c,) = pod_spec(dep)["containers"]
    lease = [a for a in c["args"] if a.startswith("--lease=")]
    assert lease == [f"--lease={NAMESPACE}/fairshare-extender"]
    # The leader labels its own pod and the Service selects the label; both replicas
    # stay ready (/readyz), so rolling updates and the PodDisruptionBudget work.
    assert "--leader-label-pod=$(POD_NAMESPACE)/$(POD_NAME)" in c["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert (
        one("Service", "fairshare-extender")["spec"]["selector"]["fairshare.io/extender-leader"]
        == "true"
    )
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    extender = one("ClusterRole", "fairshare-extender")
    assert grants(extender, "patch", "pods")  # its own pod's label
    roles = [role for role, _ in rules_of("fairshare-extender") if role["kind"] == "Role"]
    for verb in ("get", "create", "update"):
        assert any(grants(r, verb, "leases", "coordination.k8s.io") for r in roles), verb
    # Leases are written only in the extender's own namespace, never cluster-wide.
    for role, _ in rules_of("fairshare-extender"):
        if role["kind"] == "ClusterRole":
            assert not grants(role, "update", "leases", "coordination.k8s.io")


def test_no_fairshare_role_reads_secrets_cluster_wide() -> None:
    for role in objects("ClusterRole"):
        for rule in role["rules"]:
            assert "secrets" not in rule["resources"], role["metadata"]["name"]


def test_cert_job_rbac_is_scoped_to_named_objects() -> None:
    role = one("Role", "fairshare-certs")
    for rule in role["rules"]:
        assert rule["resources"] == ["secrets"]
        if rule["verbs"] != ["create"]:
            assert set(rule["resourceNames"]) == {
                "fairshare-webhook-tls",
                "fairshare-extender-tls",
                "fairshare-client-ca",
                "fairshare-apiserver-client",
                "fairshare-scheduler-client",
            }
    cluster = one("ClusterRole", "fairshare-certs")
    (rule,) = cluster["rules"]
    assert rule["apiGroups"] == ["admissionregistration.k8s.io"]
    assert set(rule["verbs"]) == {"get", "patch"}
    names = {
        d["metadata"]["name"]
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for d in objects(kind)
    }
    assert set(rule["resourceNames"]) == names


def test_extender_writes_only_its_own_device_class() -> None:
    # It annotates requeue.fairshare.io to requeue pods DRA refused (extender/
    # requeue.py): by name, patch only; that class selects no device.
    from fairshare.resources import REQUEUE_DEVICE_CLASS

    ours = one("DeviceClass", REQUEUE_DEVICE_CLASS)
    assert ours["spec"]["selectors"] == [{"cel": {"expression": "false"}}]
    assert "extendedResourceName" not in ours["spec"]
    extender = one("ClusterRole", "fairshare-extender")
    writes = [
        r
        for r in extender["rules"]
        if "resource.k8s.io" in r["apiGroups"] and WRITE_VERBS & set(r["verbs"])
    ]
    assert writes == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["deviceclasses"],
            "resourceNames": [REQUEUE_DEVICE_CLASS],
            "verbs": ["patch"],
        }
    ]
    for role in objects("ClusterRole"):  # nobody else writes DRA objects
        if role is not extender:
            for rule in role["rules"]:
                if "resource.k8s.io" in rule["apiGroups"]:
                    assert not WRITE_VERBS & set(rule["verbs"]), role["metadata"]["name"]


def test_scheduler_rbac_mirrors_kube_scheduler() -> None:
    refs = {
        (b["metadata"].get("namespace"), b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in objects("RoleBinding") + objects("ClusterRoleBinding")
        if f"{NAMESPACE}/fairshare-scheduler" in subjects(b)
    }
    assert (None, "ClusterRole", "system:kube-scheduler") in refs
    assert (None, "ClusterRole", "system:volume-scheduler") in refs
    assert ("kube-system", "Role", "extension-apiserver-authentication-reader") in refs
    lease = one("Role", "fairshare-scheduler-leader-election")
    named = [r for r in lease["rules"] if "resourceNames" in r]
    assert named and all(r["resourceNames"] == ["fairshare-scheduler"] for r in named)


@pytest.mark.parametrize(
    "binding",
    objects("RoleBinding") + objects("ClusterRoleBinding"),
    ids=lambda b: b["metadata"]["name"],
)
def test_bindings_name_existing_service_accounts(binding: Doc) -> None:
    accounts = {sa["metadata"]["name"] for sa in objects("ServiceAccount")}
    for subject in binding["subjects"]:
        assert subject["kind"] == "ServiceAccount"
        want = RESERVATION_NAMESPACE if subject["name"] == REPORTER else NAMESPACE
        assert subject["namespace"] == want
        assert subject["name"] in accounts


def test_reservation_objects_match_the_config_defaults() -> None:
    from fairshare.config.schema import ReservationHandoff

    policy = ReservationHandoff()
    (kust,) = load(MANIFESTS / "gpu-reservation" / "kustomization.yaml")
    assert kust["namespace"] == policy.namespace == RESERVATION_NAMESPACE
    assert policy.service_account == REPORTER
    assert policy.image == IMAGE
    (role,) = [r for r in objects("Role") if r["metadata"]["name"] == REPORTER]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    (ext,) = [
        r for r in objects("Role") if r["metadata"]["name"] == "fairshare-extender-reservations"
    ]
    assert ext["rules"][0]["verbs"] == ["create", "delete"]


# --------------------------------------------------------------------------------------------
# Scheduler configuration


@pytest.mark.parametrize("path", [SECOND_SCHEDULER_CONFIG, DEFAULT_SCHEDULER_PATCH], ids=rel)
def test_extender_stanza_field_names(path: Path) -> None:
    (ext,) = extenders(path)
    assert set(ext) <= EXTENDER_FIELDS, set(ext) - EXTENDER_FIELDS
    assert set(ext) >= EXTENDER_FIELDS - {"managedResources"}
    assert ext["urlPrefix"] == EXTENDER_URL
    assert (ext["filterVerb"], ext["prioritizeVerb"]) == ("filter", "prioritize")
    assert (ext["preemptVerb"], ext["bindVerb"]) == ("preempt", "bind")
    assert ext["weight"] == 5
    assert ext["enableHTTPS"] is True
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert ext["httpTimeout"] == "5s"
    tls = ext["tlsConfig"]
    assert set(tls) <= TLS_FIELDS
    assert "insecure" not in tls
    assert ("caFile" in tls) != ("caData" in tls)
    for res in ext.get("managedResources", []):
        assert set(res) <= {"name", "ignoredByScheduler"}
        assert re.fullmatch(r"[a-z0-9.-]+\.[a-z]+/[A-Za-z0-9._-]+", res["name"]), res["name"]


def test_second_scheduler_configuration() -> None:
    (doc,) = load(SECOND_SCHEDULER_CONFIG)
    assert [p["schedulerName"] for p in doc["profiles"]] == ["fairshare-scheduler"]
    election = doc["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceName"] == "fairshare-scheduler"
    assert election["resourceNamespace"] == NAMESPACE
    assert "kubeconfig" not in (doc.get("clientConnection") or {})
    (ext,) = doc["extenders"]
    # Fractional-GPU pods request no extended resource; a managedResources list would let
    # them skip the extender.
    assert "managedResources" not in ext
    assert ext["tlsConfig"]["caFile"].startswith("/")


def test_default_scheduler_patch() -> None:
    (doc,) = load(DEFAULT_SCHEDULER_PATCH)
    (ext,) = doc["extenders"]
    assert {"name": "nvidia.com/gpu", "ignoredByScheduler": False} in ext["managedResources"]
    assert ext["tlsConfig"]["serverName"] == EXTENDER_URL.removeprefix("https://").split(":")[0]
    assert "REPLACE" in ext["tlsConfig"]["caData"]  # a placeholder, documented in the file
    for field in ("certData", "keyData"):  # the extender's --client-ca needs these
        assert (
            "REPLACE" in ext["tlsConfig"][field]
            and "fairshare-scheduler-client" in (ext["tlsConfig"][field])
        )
    text = DEFAULT_SCHEDULER_PATCH.read_text()
    assert "jsonpath='{.data.ca\\.crt}'" in text
    assert "profiles" not in doc  # the default profile stays as it is


def test_second_scheduler_deployment_matches_its_configuration() -> None:
    dep = one("Deployment", "fairshare-scheduler")
    pod = pod_spec(dep)
    (c,) = pod["containers"]
    assert c["image"] == SCHEDULER_IMAGE
    assert pod["serviceAccountName"] == "fairshare-scheduler"
    (config_arg,) = [a for a in c["command"] if a.startswith("--config=")]
    config_path = Path(config_arg.removeprefix("--config="))
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    config_volume = volumes[mounts[str(config_path.parent)]]
    (kust,) = load(MANIFESTS / "overlays" / "second-scheduler" / "kustomization.yaml")
    (gen,) = [g for g in kust["configMapGenerator"] if g["name"] == "fairshare-scheduler-config"]
    assert config_volume["configMap"]["name"] == gen["name"]
    assert f"{config_path.name}={SECOND_SCHEDULER_CONFIG.name}" in gen["files"]
    assert gen["namespace"] == NAMESPACE
    # The CA file comes from the extender's Secret, and only its ca.crt key.
    (ext,) = extenders(SECOND_SCHEDULER_CONFIG)
    ca = Path(ext["tlsConfig"]["caFile"])
    ca_volume = volumes[mounts[str(ca.parent)]]
    assert ca_volume["secret"]["secretName"] == "fairshare-extender-tls"
    assert ca_volume["secret"]["items"] == [{"key": "ca.crt", "path": ca.name}]
    # The client certificate for the extender's --client-ca, from its own Secret.
    cert, key = Path(ext["tlsConfig"]["certFile"]), Path(ext["tlsConfig"]["keyFile"])
    assert cert.parent == key.parent
    client_volume = volumes[mounts[str(cert.parent)]]["secret"]
    assert client_volume["secretName"] == "fairshare-scheduler-client"
    assert {i["path"] for i in client_volume["items"]} == {cert.name, key.name}
    # The extender Service answers on the port of urlPrefix.
    svc = one("Service", "fairshare-extender")
    assert int(EXTENDER_URL.rsplit(":", 1)[1]) in {p["port"] for p in svc["spec"]["ports"]}


# --------------------------------------------------------------------------------------------
# Network policy, cert-manager, kind


def test_network_policies() -> None:
    default = one("NetworkPolicy", "fairshare-default")
    assert default["spec"]["podSelector"] == {}
    assert set(default["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    egress = {
        (p["protocol"], p["port"]) for rule in default["spec"]["egress"] for p in rule["ports"]
    }
    assert {("UDP", 53), ("TCP", 53), ("TCP", 443), ("TCP", 6443)} <= egress
    for name, port in (("fairshare-webhook", 8443), ("fairshare-extender", 8888)):
        labels = one("Deployment", name)["spec"]["template"]["metadata"]["labels"]
        allowed = {
            p["port"]
            for pol in objects("NetworkPolicy")
            if label_selector_matches(pol["spec"]["podSelector"], labels)
            for rule in pol["spec"].get("ingress", [])
            for p in rule["ports"]
        }
        assert port in allowed, name
    sched = one("NetworkPolicy", "fairshare-scheduler")
    (to_extender,) = sched["spec"]["egress"]
    assert to_extender["ports"] == [{"protocol": "TCP", "port": 8888}]


def test_cert_manager_overlay() -> None:
    overlay = MANIFESTS / "overlays" / "cert-manager"
    (kust,) = load(overlay / "kustomization.yaml")
    deleted = {
        (p["target"]["kind"], p["target"]["name"])
        for p in kust["patches"]
        if "$patch: delete" in p.get("patch", "")
    }
    assert ("Job", "fairshare-certs") in deleted
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        assert (kind, "fairshare-certs") in deleted
    certificates = {
        d["metadata"]["name"]: d
        for d in load(overlay / "certificates.yaml")
        if d["kind"] == "Certificate"
    }
    for doc in load(overlay / "inject-ca.yaml"):
        ref = doc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        ns, name = ref.split("/")
        assert ns == NAMESPACE and name in certificates
        assert "fairshare.svc" not in ref
    # Client certificates from a CA of their own (what the servers' --client-ca trusts).
    assert certificates["fairshare-client-ca"]["spec"]["isCA"] is True
    for name in ("fairshare-apiserver-client", "fairshare-scheduler-client"):
        spec = certificates[name]["spec"]
        assert spec["secretName"] == name
        assert "client auth" in spec["usages"] and "server auth" not in spec["usages"]
        assert spec["issuerRef"]["name"] == "fairshare-client-ca"
    for name in ("fairshare-webhook", "fairshare-extender"):
        cert = certificates[name]["spec"]
        assert cert["secretName"] == f"{name}-tls"
        assert f"{name}.{NAMESPACE}.svc" in cert["dnsNames"]
        assert cert["issuerRef"]["name"] in {
            d["metadata"]["name"] for d in load(overlay / "certificates.yaml")
        }


def test_kind_cluster() -> None:
    path = MANIFESTS / "kind" / "cluster.yaml"
    (doc,) = load(path)
    assert doc["kind"] == "Cluster" and doc["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in doc["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") == 2
    assert "kind load docker-image" in path.read_text()
    # kube-apiserver gets its webhook client certificate from the mounted directory.
    (plane,) = [n for n in doc["nodes"] if n["role"] == "control-plane"]
    patch = yaml.safe_load(plane["kubeadmConfigPatches"][0])
    config_file = patch["apiServer"]["extraArgs"]["admission-control-config-file"]
    (mount,) = plane["extraMounts"]
    assert config_file.startswith(mount["containerPath"] + "/")
    assert any(v["hostPath"] == mount["containerPath"] for v in patch["apiServer"]["extraVolumes"])


def test_images_are_pinned() -> None:
    for workload in workloads():
        for c in containers(workload):
            assert c["image"] in (IMAGE, SCHEDULER_IMAGE)
            assert not c["image"].endswith(":latest")
            assert c["imagePullPolicy"] == "IfNotPresent"


# --------------------------------------------------------------------------------------------
# Rendering with the real kubectl


@cache
def render(target: str) -> tuple[Doc, ...]:
    proc = subprocess.run(
        [str(e2e_kubectl()), "kustomize", str(MANIFESTS / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d is not None)


@pytest.fixture
def kubectl() -> Path:
    return e2e_kubectl()


needs_kubectl = pytest.mark.usefixtures("kubectl")


@needs_kubectl
@pytest.mark.parametrize("target", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_kustomize_renders(target: str) -> None:
    docs = render(target)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ValidatingWebhookConfiguration", "ConfigMap"} <= kinds
    for doc in docs:
        ns = doc["metadata"].get("namespace")
        cluster_scoped = ("Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass")
        if doc["kind"] in cluster_scoped or doc["kind"].endswith("WebhookConfiguration"):
            assert ns is None
        elif doc["metadata"]["name"] == "fairshare-scheduler-authentication-reader":
            assert ns == "kube-system"
        elif target != "base" and doc["metadata"]["name"] in RESERVATION_OBJECTS:
            assert ns == RESERVATION_NAMESPACE, (doc["kind"], doc["metadata"]["name"])
        else:
            assert ns == NAMESPACE, (doc["kind"], doc["metadata"]["name"])
    # The ConfigMap the servers read is the generated example config, under its fixed name.
    (config,) = [d for d in docs if d["metadata"]["name"] == "fairshare-config"]
    assert config["data"]["config.yaml"] == (MANIFESTS / "base" / "config.yaml").read_text()


@needs_kubectl
def test_rendered_second_scheduler_mounts_the_generated_config() -> None:
    docs = render("overlays/second-scheduler")
    (cm,) = [d for d in docs if d["metadata"]["name"].startswith("fairshare-scheduler-config")]
    assert yaml.safe_load(cm["data"]["config.yaml"]) == load(SECOND_SCHEDULER_CONFIG)[0]
    (dep,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "fairshare-scheduler"
    ]
    names = {v["configMap"]["name"] for v in pod_spec(dep)["volumes"] if "configMap" in v}
    assert names == {cm["metadata"]["name"]}  # kustomize rewrote the hashed name
    assert any(d["kind"] == "Job" for d in docs)


@needs_kubectl
def test_rendered_cert_manager_overlay() -> None:
    docs = render("overlays/cert-manager")
    assert not [d for d in docs if d["metadata"]["name"] == "fairshare-certs"]
    for d in docs:
        if d["kind"].endswith("WebhookConfiguration"):
            annotations = d["metadata"]["annotations"]
            assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/fairshare-webhook"
            assert len(d["webhooks"]) >= 1  # the patch merged, it did not replace
    assert sum(d["kind"] == "Certificate" for d in docs) == 6
    assert any(d["metadata"]["name"] == "fairshare-scheduler" for d in docs)


def test_the_podgroup_crd_serves_what_fairshare_reads() -> None:
    """The coscheduling PodGroup CRD fairshare ships (manifests/gangs, the chart's crds/,
    make dev-up) serves scheduling.x-k8s.io/v1alpha1 podgroups with spec.minMember, the
    field ``gangs.podgroup_min_count`` reads."""
    from fairshare import gangs

    (crd,) = load(MANIFESTS / "gangs" / "podgroup-crd.yaml")
    assert crd["spec"]["group"] == gangs.PODGROUP_GROUP
    assert crd["spec"]["names"]["plural"] == gangs.PODGROUP_PLURAL
    (version,) = crd["spec"]["versions"]
    assert version["name"] == gangs.PODGROUP_VERSION and version["served"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["minMember"]["type"] == "integer"
    assert gangs.podgroup_min_count({"spec": {"minMember": 3}}) == 3
    chart = ROOT / "charts" / "fairshare" / "crds" / "podgroups.scheduling.x-k8s.io.yaml"
    assert chart.read_text() == (MANIFESTS / "gangs" / "podgroup-crd.yaml").read_text()
