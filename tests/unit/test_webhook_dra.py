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
