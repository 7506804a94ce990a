"""The whole admission decision: every deny path as structured reasons, mutations, allows."""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction as F
from typing import Any

import pytest

from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.errors import FieldError
from fairshare.limits import Insufficient
from fairshare.resources import CPU, GPU, MEMORY, STORAGE
from tests.builders import make_pod
from webhook import review, wire
from webhook.patches import PatchOp
from webhook.policies.config_guard import ConfigMapRef, InvalidConfig
from webhook.policies.gpu_sharing import Rejection
from webhook.review import Claim, Malformed, NoTenant, TenantMismatch
from webhook.view import StaticView

GI = 1024**3
HEAD = {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig"}
TENANTS = [
    {
        "name": "nlp",
        "namespaces": ["nlp-train", "nlp-serve"],
        "limit": {GPU: "12", CPU: "64", STORAGE: "1Ti"},
    },
    {"name": "vision", "namespaceSelector": {"example.com/team": "vision"}, "limit": {GPU: "4"}},
]
CONFIG = config_from_mapping({**HEAD, "schedulerName": "fairshare-scheduler", "tenants": TENANTS})
PLAIN = config_from_mapping({**HEAD, "tenants": TENANTS})
DENY_GPU = config_from_mapping({**HEAD, "tenants": TENANTS, "defaultTenant": {"mode": "deny-gpu"}})
ALLOW = config_from_mapping({**HEAD, "tenants": TENANTS, "defaultTenant": {"mode": "allow"}})
VIEW = StaticView(
    labels={
        "vision-lab": {"example.com/team": "vision"},
        "stray": {"fairshare.io/tenant": "ghost"},
    },
    usage={"nlp": {GPU: F(11), CPU: F(60), MEMORY: F(400 * GI), STORAGE: F(900 * GI)}},
    namespaces={"nlp": ("nlp-serve", "nlp-train")},
    device_memory=80 * GI,
)
CM = ConfigMapRef("fairshare-system", "fairshare-config")
NLP = ("nlp-serve", "nlp-train")
LABEL = "/metadata/labels/fairshare.io~1tenant"
SCHED = PatchOp("add", "/spec/schedulerName", "fairshare-scheduler")
FRAC = "fairshare.io/gpu-fraction"
MEM = "fairshare.io/gpu-memory"
RESOURCES = {"Pod": "pods", "PersistentVolumeClaim": "persistentvolumeclaims"}


def make_request(
    obj: dict[str, Any] | None,
    *,
    op: str = "CREATE",
    kind: str = "Pod",
    namespace: str | None = None,
    sub: str = "",
    dry_run: bool = False,
) -> wire.AdmissionRequest:
    """A request as kube-apiserver sends it, through the real decoder."""
    meta = (obj or {}).get("metadata") or {}
    resource = RESOURCES.get(kind, kind.lower() + "s")
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "subResource": sub,
            "name": meta.get("name", ""),
            "namespace": namespace if namespace is not None else meta.get("namespace", ""),
            "operation": op,
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
        },
    }
    return wire.decode_review(json.dumps(body).encode())


# Handoff "reservation" (the default) for a fractional pod named "pod" with one container
# "c0" and no env or volumes; the hex comes from the request UID of make_request.
HANDOFF_CM = (
    "pod-" + hashlib.sha256(b"705ab4f5-6393-11e8-b7cc-42010a800002").hexdigest()[:5] + "-gpu"
)
HANDOFF = (
    PatchOp("add", "/metadata/annotations/fairshare.io~1gpu-configmap", HANDOFF_CM),
    PatchOp(
        "add",
        "/spec/containers/0/env",
        [
            {
                "name": name,
                "valueFrom": {"configMapKeyRef": {"name": HANDOFF_CM, "key": name}},
            }
            for name in ("NVIDIA_VISIBLE_DEVICES", "GPU_PORTION")
        ],
    ),
    PatchOp(
        "add",
        "/spec/volumes",
        [{"name": "fairshare-gpu-handoff", "configMap": {"name": HANDOFF_CM}}],
    ),
)


def gpu_pod(ns: str = "nlp-train", gpu: Any = 1, name: str = "p") -> dict[str, Any]:
    return make_pod(name).ns(ns).req(gpu=gpu, cpu="1").obj()


def labelled(pod: dict[str, Any], tenant: str) -> dict[str, Any]:
    pod["metadata"]["labels"] = {"fairshare.io/tenant": tenant}
    return pod


def pvc(ns: str, size: str, name: str = "data") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {STORAGE: size}}},
    }


def config_map(text: str, name: str = "fairshare-config") -> dict[str, Any]:
    meta = {"name": name, "namespace": "fairshare-system"}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"config.yaml": text},
    }


BAD_CONFIG = (
    "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\ntenants:\n- name: a\n  weight: 0\n"
)


def judge(
    request: wire.AdmissionRequest,
    phase: review.Phase = "validate",
    config: FairShareConfig = CONFIG,
) -> review.Verdict:
    return review.judge(request, view=VIEW, config=config, phase=phase, config_map=CM)


# --- every deny path, asserted on the structured reasons -----------------------------------


@pytest.mark.parametrize(
    ("phase", "config", "request_", "reasons", "code"),
    [
        (
            "validate", CONFIG, make_request(labelled(gpu_pod(), "vision")),
            (TenantMismatch("nlp-train", "vision", "nlp"),), 403,
        ),
        (
            "mutate", CONFIG, make_request(labelled(gpu_pod(), "vision")),
            (TenantMismatch("nlp-train", "vision", "nlp"),), 403,
        ),
        (
            "validate", ALLOW, make_request(labelled(gpu_pod("misc"), "nlp")),
            (TenantMismatch("misc", "nlp", None),), 403,
        ),
        (
            "validate", CONFIG, make_request(gpu_pod(gpu=2)),
            (Insufficient("nlp", GPU, F(11), F(2), F(12), NLP),), 403,
        ),
        (
            "validate", CONFIG,
            make_request(make_pod().ns("nlp-serve").req(gpu=2, cpu="8").obj()),
            (
                Insufficient("nlp", CPU, F(60), F(8), F(64), NLP),
                Insufficient("nlp", GPU, F(11), F(2), F(12), NLP),
            ),
            403,
        ),
        (
            "validate", CONFIG, make_request(gpu_pod("vision-lab", gpu=5)),
            (Insufficient("vision", GPU, F(0), F(5), F(4), ("vision-lab",)),), 403,
        ),
        (
            "validate", CONFIG,
            make_request(pvc("nlp-train", "200Gi"), kind="PersistentVolumeClaim"),
            (Insufficient("nlp", STORAGE, F(900 * GI), F(200 * GI), F(1024 * GI), NLP),), 403,
        ),
        ("mutate", DENY_GPU, make_request(gpu_pod("misc")), (NoTenant("misc"),), 403),
        ("validate", DENY_GPU, make_request(gpu_pod("misc")), (NoTenant("misc"),), 403),
        (
            "mutate", CONFIG,
            make_request(make_pod().ns("nlp-train").annotations({FRAC: "0.33"}).obj()),
            (
                Rejection(
                    "annotation fairshare.io/gpu-fraction", "0.33", "not a multiple of 0.05",
                    'a multiple of 0.05 from 0.05 to 0.95 (e.g. "0.5"), or a whole nvidia.com/gpu',
                ),
            ),
            400,
        ),
        (
            "validate", CONFIG, make_request(gpu_pod(gpu="500m")),
            (Malformed("nvidia.com/gpu must be a whole number of devices, got 1/2"),), 400,
        ),
        (
            "validate", CONFIG,
            make_request(pvc("nlp-train", "lots"), kind="PersistentVolumeClaim"),
            (
                Malformed(
                    'spec.resources.requests.storage: invalid quantity "lots": '
                    "expected <number><suffix>, e.g. 500m, 1.5Gi, 2e3"
                ),
            ),
            400,
        ),
        (
            "validate", CONFIG, make_request(None, namespace="nlp-train"),
            (Malformed("request.object is missing for a pod CREATE"),), 400,
        ),
        (
            "validate", CONFIG, make_request(config_map(BAD_CONFIG), op="UPDATE", kind="ConfigMap"),
            (InvalidConfig(CM, (FieldError("tenants[0].weight", "must be > 0"),)),), 400,
        ),
        (
            "validate", CONFIG,
            make_request({"metadata": config_map("")["metadata"]}, kind="ConfigMap"),
            (InvalidConfig(CM, (FieldError("data.config.yaml", "is missing"),)),), 400,
        ),
    ],
    ids=[
        "tenant-mismatch", "tenant-mismatch-at-mutate", "tenant-label-in-untracked-namespace",
        "over-gpu-limit", "over-two-limits", "over-limit-selector-tenant", "pvc-over-storage",
        "deny-gpu-at-mutate", "deny-gpu", "bad-fraction", "fractional-whole-gpu",
        "pvc-bad-size", "missing-object", "invalid-config", "config-key-missing",
    ],
)  # fmt: skip
def test_deny_paths(
    phase: review.Phase,
    config: FairShareConfig,
    request_: wire.AdmissionRequest,
    reasons: tuple[review.Reason, ...],
    code: int,
) -> None:
    verdict = judge(request_, phase, config)
    assert verdict.reasons == reasons
    response = verdict.response
    assert not response.allowed
    assert response.status is not None
    assert response.status.code == code
    assert response.status.message == review.render_reasons(reasons)
    assert response.patch == ()
    assert verdict.claim is None


@pytest.mark.parametrize(
    ("reason", "text"),
    [
        (
            TenantMismatch("nlp-train", "vision", "nlp"),
            "label fairshare.io/tenant=vision does not match namespace nlp-train, which belongs "
            "to tenant nlp; remove the label",
        ),
        (
            TenantMismatch("misc", "nlp", None),
            "label fairshare.io/tenant=nlp does not match namespace misc, which belongs to no "
            "tenant; remove the label",
        ),
        (
            NoTenant("misc"),
            "namespace misc belongs to no tenant and defaultTenant.mode is deny-gpu: GPU pods "
            "are not admitted there",
        ),
        (
            Insufficient("nlp", GPU, F(11), F(2), F(12), NLP),
            "tenant nlp would exceed its nvidia.com/gpu limit: 11 used + 2 requested > 12 "
            "(namespaces: nlp-serve, nlp-train)",
        ),
        (
            InvalidConfig(CM, (FieldError("tenants[0].weight", "must be > 0"),)),
            "ConfigMap fairshare-system/fairshare-config key config.yaml is not a valid "
            "FairShareConfig: tenants[0].weight: must be > 0",
        ),
        (Malformed("request.object is missing"), "request.object is missing"),
    ],
    ids=["mismatch", "mismatch-no-tenant", "no-tenant", "insufficient", "config", "malformed"],
)
def test_render_reason(reason: review.Reason, text: str) -> None:
    assert review.render_reason(reason) == text


# --- allowed without a word --------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "request_"),
    [
        ("validate", make_request(gpu_pod(gpu=8), op="UPDATE")),
        ("validate", make_request(None, op="DELETE", namespace="nlp-train")),
        ("validate", make_request(gpu_pod(gpu=8), op="CONNECT")),
        ("validate", make_request(gpu_pod(gpu=8), sub="ephemeralcontainers")),
        ("mutate", make_request(labelled(gpu_pod(), "vision"), op="UPDATE")),
        ("validate", make_request({"metadata": {"name": "svc"}}, kind="Service")),
        ("validate", make_request(config_map(BAD_CONFIG, name="other"), kind="ConfigMap")),
        ("validate", make_request(config_map(BAD_CONFIG), op="DELETE", kind="ConfigMap")),
        ("mutate", make_request(config_map(BAD_CONFIG), kind="ConfigMap")),
        ("mutate", make_request(pvc("nlp-train", "200Gi"), kind="PersistentVolumeClaim")),
        ("validate", make_request(pvc("nlp-train", "100Gi"), kind="PersistentVolumeClaim")),
        ("validate", make_request(pvc("misc", "100Ti"), kind="PersistentVolumeClaim")),
        ("validate", make_request(gpu_pod("misc", gpu=64))),
    ],
    ids=[
        "pod-update",
        "pod-delete",
        "pod-connect",
        "subresource",
        "mutate-update",
        "other-kind",
        "other-configmap",
        "configmap-delete",
        "configmap-at-mutate",
        "pvc-at-mutate",
        "pvc-within-limit",
        "pvc-default-tenant-no-limit",
        "default-tenant-no-limit",
    ],
)
def test_allowed_untouched(phase: review.Phase, request_: wire.AdmissionRequest) -> None:
    response = review.review(request_, view=VIEW, config=CONFIG, phase=phase, config_map=CM)
    assert response.allowed
    assert response.status is None
    assert response.patch == ()


def test_valid_config_map_update_is_allowed() -> None:
    text = "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n"
    verdict = judge(make_request(config_map(text), op="UPDATE", kind="ConfigMap"))
    assert verdict.response.allowed


@pytest.mark.parametrize(
    ("limits", "warnings"),
    [
        # nlp uses 11 GPUs and 60 cores (VIEW): a limit under either is named, with both
        # amounts; equal to usage or above it says nothing.
        ({GPU: "8"}, ["tenant nlp: nvidia.com/gpu limit 8 is below current usage 11; "
                      "new pods are refused until usage is under it"]),
        ({GPU: "11", CPU: "64"}, []),
        ({GPU: "12", CPU: "32"}, ["tenant nlp: cpu limit 32 is below current usage 60; "
                                  "new pods are refused until usage is under it"]),
        ({GPU: "4", CPU: "1"}, [
            "tenant nlp: cpu limit 1 is below current usage 60; "
            "new pods are refused until usage is under it",
            "tenant nlp: nvidia.com/gpu limit 4 is below current usage 11; "
            "new pods are refused until usage is under it",
        ]),
        (None, []),
    ],
    ids=["gpu-below", "equal-or-above", "cpu-below", "both-below", "no-limit"],
)  # fmt: skip
def test_config_map_limit_below_usage_is_admitted_with_a_warning(
    limits: dict[str, str] | None, warnings: list[str]
) -> None:
    import yaml

    tenant: dict[str, Any] = {"name": "nlp", "namespaces": ["nlp-train", "nlp-serve"]}
    if limits is not None:
        tenant["limit"] = limits
    text = yaml.safe_dump({**HEAD, "tenants": [tenant]})
    verdict = judge(make_request(config_map(text), op="UPDATE", kind="ConfigMap"))
    assert verdict.response.allowed
    assert list(verdict.response.warnings) == warnings
    body = wire.encode_response("u", verdict.response)["response"]
    assert body.get("warnings", []) == warnings


def test_a_parent_limit_is_compared_with_its_subtree() -> None:
    import yaml

    tenants = [
        {"name": "org", "limit": {GPU: "10"}},
        {"name": "nlp", "parent": "org", "namespaces": ["nlp-train", "nlp-serve"]},
        {"name": "vision", "parent": "org", "namespaceSelector": {"example.com/team": "v"}},
    ]
    text = yaml.safe_dump({**HEAD, "tenants": tenants})
    view = StaticView(usage={"nlp": {GPU: F(7)}, "vision": {GPU: F(5)}})
    request = make_request(config_map(text), op="UPDATE", kind="ConfigMap")
    verdict = review.judge(request, view=view, config=CONFIG, phase="validate", config_map=CM)
    assert verdict.response.allowed
    # 7 + 5 = 12 GPUs in org's subtree, above its new limit of 10.
    assert verdict.response.warnings == (
        "tenant org: nvidia.com/gpu limit 10 is below current usage 12; "
        "new pods are refused until usage is under it",
    )


def test_config_map_is_only_judged_when_registered() -> None:
    request = make_request(config_map(BAD_CONFIG), op="UPDATE", kind="ConfigMap")
    response = review.review(request, view=VIEW, config=CONFIG, phase="validate")
    assert response.allowed


# --- mutations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "pod", "ops"),
    [
        (
            CONFIG,
            make_pod().ns("nlp-train").req(gpu=1).obj(),
            (PatchOp("add", "/metadata/labels", {"fairshare.io/tenant": "nlp"}), SCHED),
        ),
        (
            CONFIG,
            labelled(make_pod().ns("nlp-train").req(cpu="1").obj(), "nlp"),
            (),
        ),
        (
            CONFIG,
            make_pod().ns("nlp-serve").req(cpu="1").obj(),
            (PatchOp("add", "/metadata/labels", {"fairshare.io/tenant": "nlp"}),),
        ),
        (
            CONFIG,
            make_pod().ns("vision-lab").annotations({FRAC: "1/2"}).req(cpu="1").obj(),
            (
                PatchOp("add", "/metadata/labels", {"fairshare.io/tenant": "vision"}),
                PatchOp("add", "/metadata/annotations/fairshare.io~1gpu-fraction", "0.5"),
                SCHED,
                *HANDOFF,
            ),
        ),
        (
            PLAIN,
            make_pod().ns("nlp-train").req(gpu=1).obj(),
            (PatchOp("add", "/metadata/labels", {"fairshare.io/tenant": "nlp"}),),
        ),
        (
            CONFIG,
            make_pod().ns("misc").req(gpu=1).obj(),
            (PatchOp("add", "/metadata/labels", {"fairshare.io/tenant": "default"}), SCHED),
        ),
        (ALLOW, make_pod().ns("misc").req(cpu="1").obj(), ()),
    ],
    ids=[
        "gpu-pod", "cpu-pod-already-labelled", "cpu-pod", "fraction-pod",
        "no-scheduler-configured", "default-tenant", "untracked-namespace",
    ],
)  # fmt: skip
def test_mutations(config: FairShareConfig, pod: dict[str, Any], ops: tuple[PatchOp, ...]) -> None:
    verdict = judge(make_request(pod), "mutate", config)
    assert verdict.response.allowed
    assert verdict.response.patch == ops


@pytest.mark.parametrize(
    "scheduler",
    ["volcano", "fairshare-scheduler"],
    ids=["users-choice", "already-set"],
)
def test_mutate_keeps_an_explicit_scheduler(scheduler: str) -> None:
    pod = labelled(gpu_pod(), "nlp")
    pod["spec"]["schedulerName"] = scheduler
    assert judge(make_request(pod), "mutate").response.patch == ()


def test_mutate_replaces_the_defaulted_scheduler() -> None:
    pod = labelled(gpu_pod(), "nlp")
    pod["spec"]["schedulerName"] = "default-scheduler"
    assert judge(make_request(pod), "mutate").response.patch == (SCHED,)


def test_mutate_does_not_check_quota() -> None:
    verdict = judge(make_request(gpu_pod(gpu=100)), "mutate")
    assert verdict.response.allowed and verdict.claim is None


def test_unknown_namespace_tenant_label_is_a_warning() -> None:
    response = judge(make_request(gpu_pod("stray")), "mutate").response
    assert response.allowed
    assert response.warnings == (
        "namespace stray has label fairshare.io/tenant=ghost, which names no configured "
        "tenant; it was ignored",
    )


# --- validation outcomes -----------------------------------------------------------------


def test_validate_warns_near_a_limit_and_claims_the_demand() -> None:
    verdict = judge(make_request(gpu_pod("nlp-serve", name="serve-0")))
    assert verdict.response.allowed
    # cpu 60 + 1 = 61 of 64 (95 %), GPU 11 + 1 = 12 of 12: both warned, in resource order
    assert verdict.response.warnings == (
        "tenant nlp is at 95% of its cpu limit (61 of 64)",
        "tenant nlp is at 100% of its nvidia.com/gpu limit (12 of 12)",
    )
    assert verdict.claim == Claim("nlp-serve/serve-0", "nlp", {GPU: F(1), CPU: F(1)})


def test_validate_claims_pvc_storage() -> None:
    verdict = judge(make_request(pvc("nlp-train", "100Gi"), kind="PersistentVolumeClaim"))
    assert verdict.claim == Claim("pvc:nlp-train/data", "nlp", {STORAGE: F(100 * GI)})


def test_a_pod_without_a_name_is_claimed_by_request_uid() -> None:
    pod = gpu_pod()
    del pod["metadata"]["name"]
    verdict = judge(make_request(pod))
    assert verdict.claim is not None
    assert verdict.claim.key == "nlp-train/uid:705ab4f5-6393-11e8-b7cc-42010a800002"


def test_pod_without_requests_claims_nothing() -> None:
    verdict = judge(make_request(make_pod().ns("nlp-train").container().obj()))
    assert verdict.response.allowed and verdict.claim is None


def test_the_pods_own_namespace_is_counted() -> None:
    verdict = judge(make_request(gpu_pod("vision-lab", gpu=5)))
    (item,) = verdict.reasons
    assert isinstance(item, Insufficient) and item.namespaces == ("vision-lab",)


@pytest.mark.parametrize(
    ("device_memory", "counted"),
    [(80 * GI, F(1, 10)), (None, F(1)), (8 * GI, F(1))],
    ids=["share-of-largest-device", "unknown-device-counts-whole-gpu", "whole-device"],
)
def test_gpu_memory_requests_count_against_the_gpu_limit(
    device_memory: int | None, counted: F
) -> None:
    pod = make_pod("m").ns("vision-lab").annotations({MEM: "8Gi"}).req(cpu="1").obj()
    request = make_request(pod)
    labels = {"vision-lab": {"example.com/team": "vision"}}
    # vision already uses its 4 GPUs: the 8Gi request is denied, showing what it counts
    view = StaticView(labels=labels, usage={"vision": {GPU: F(4)}}, device_memory=device_memory)
    view_free = StaticView(labels=labels, device_memory=device_memory)
    full = review.judge(request, view=view, config=CONFIG, phase="validate")
    assert full.reasons == (Insufficient("vision", GPU, F(4), counted, F(4), ("vision-lab",)),)
    free = review.judge(request, view=view_free, config=CONFIG, phase="validate")
    assert free.claim is not None and free.claim.amounts[GPU] == counted


@pytest.mark.parametrize("phase", ["mutate", "validate"])
def test_a_pod_s_quantities_are_parsed_once_per_call(
    phase: review.Phase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The GPU-sharing check and the pod's demand read the same requests: parsed once.
    from fairshare import resources
    from webhook.policies import gpu_sharing

    calls: list[object] = []
    real = resources.pod_resource_requests

    def counted(spec: Any) -> dict[str, F]:
        calls.append(spec)
        return real(spec)

    monkeypatch.setattr(resources, "pod_resource_requests", counted)
    monkeypatch.setattr(gpu_sharing, "pod_resource_requests", counted)
    pod = make_pod("p").ns("nlp-serve").req(gpu=1, cpu="1").init(requests={"cpu": "2"}).obj()
    verdict = judge(make_request(pod), phase=phase)
    assert verdict.response.allowed
    assert len(calls) == 1
    if phase == "validate":  # the init container's 2 CPUs win over the container's 1
        assert verdict.claim == Claim("nlp-serve/p", "nlp", {GPU: F(1), CPU: F(2)})
