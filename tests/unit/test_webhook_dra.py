"""DRA ResourceClaims and templates against a tenant's GPU limit, through review()."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from fairshare.config import loading
from webhook import review, wire
from webhook.view import StaticView

CONFIG = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "nlp", "namespaces": ["nlp"], "limit": {"nvidia.com/gpu": "8"}}],
    }
)


def claim(kind: str, gpus: int) -> dict[str, Any]:
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": gpus,
                    },
                }
            ]
        }
    }
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": "c", "namespace": "nlp"},
    }
    obj["spec"] = {"spec": spec} if kind == "ResourceClaimTemplate" else spec
    return obj


def request(kind: str, gpus: int) -> wire.AdmissionRequest:
    return wire.AdmissionRequest.model_validate(
        {
            "uid": "u",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "x"},
            "namespace": "nlp",
            "name": "c",
            "operation": "CREATE",
            "object": claim(kind, gpus),
        }
    )


@pytest.mark.parametrize(
    ("kind", "used", "gpus", "allowed"),
    [
        # a claim is usage: 6 used + 2 = 8 fits the limit of 8, + 3 does not
        ("ResourceClaim", 6, 2, True),
        ("ResourceClaim", 6, 3, False),
        # a template is judged alone: 9 GPUs per claim could never fit a limit of 8
        ("ResourceClaimTemplate", 6, 3, True),
        ("ResourceClaimTemplate", 0, 9, False),
    ],
    ids=["claim-fits", "claim-over", "template-fits-alone", "template-never-fits"],
)
def test_dra_gpus_count_against_the_limit(kind, used, gpus, allowed):
    view = StaticView(
        usage={"nlp": {"nvidia.com/gpu": Fraction(used)}}, namespaces={"nlp": ("nlp",)}
    )
    verdict = review.judge(request(kind, gpus), view=view, config=CONFIG, phase="validate")
    assert verdict.response.allowed is allowed
    if not allowed:
        assert verdict.response.status is not None
        assert "nvidia.com/gpu" in verdict.response.status.message
    # only a claim reserves (a template is not usage)
    assert (verdict.claim is not None) == (allowed and kind == "ResourceClaim")


async def test_an_admitted_claim_counts_once_when_the_watch_sees_it() -> None:
    """The webhook reserves an admitted ResourceClaim (key ``claim:ns/name``) until its
    watch counts it; then the reservation must go, or the claim counts twice until the
    reservation's TTL: 2 + 2 GPUs of a limit of 4 refused as 4 used + 2 requested."""
    from aiohttp.test_utils import TestClient, TestServer

    from webhook import app as webhook_app

    limited = loading.config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"name": "nlp", "namespaces": ["nlp"], "limit": {"nvidia.com/gpu": "4"}}],
        }
    )
    deps = webhook_app.build_deps(config=lambda: limited, ready=lambda: True)
    deps.tracker.on_resync("Namespace", [{"metadata": {"name": "nlp"}}])
    deps.tracker.on_resync("ResourceClaim", [])

    def review_of(name: str) -> dict[str, Any]:
        obj = claim("ResourceClaim", 2)
        obj["metadata"]["name"] = name
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                **request("ResourceClaim", 2).model_dump(by_alias=True, mode="json"),
                "uid": f"uid-{name}",
                "name": name,
                "object": obj,
            },
        }

    async with TestClient(TestServer(webhook_app.make_app(deps))) as c:
        first = await (await c.post("/validate", json=review_of("c1"))).json()
        assert first["response"]["allowed"] is True
        seen = claim("ResourceClaim", 2)
        seen["metadata"] = {"name": "c1", "namespace": "nlp", "uid": "claim-uid-1"}
        deps.tracker.on_event("ResourceClaim", "ADDED", seen)  # the watch counts it now
        second = await (await c.post("/validate", json=review_of("c2"))).json()
        assert second["response"]["allowed"] is True, second["response"].get("status")
        third = await (await c.post("/validate", json=review_of("c3"))).json()
        assert third["response"]["allowed"] is False  # 2 counted + 2 reserved + 2 > 4
