"""DRA: GPUs of resource.k8s.io/v1 ResourceClaims, the claim check, and the trackers."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from fairshare import dra
from fairshare.config.loading import config_from_mapping
from fairshare.resources import GPU
from fairshare.state.usage import UsageTracker
from tests.extender_side import Side
from tests.unit.test_state_objects import node, pod

CLASS = dra.GPU_DEVICE_CLASS


def exactly(name: str = "gpu", count: int | None = None, **kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": CLASS, **kw}
    if count is not None:
        spec["count"] = count
    return {"name": name, "exactly": spec}


def claim(
    name: str = "c",
    *requests: dict[str, Any],
    ns: str = "prod",
    results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": dra.API_VERSION,
        "kind": dra.KIND_CLAIM,
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-claim-{name}"},
        "spec": {"devices": {"requests": list(requests)}},
    }
    if results is not None:
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def result(request: str, device: str) -> dict[str, Any]:
    return {"request": request, "driver": CLASS, "pool": "n1", "device": device}


@pytest.mark.parametrize(
    ("obj", "gpus"),
    [
        (claim("c", exactly(count=2)), 2),
        (claim("c", exactly()), 1),  # count defaults to 1
        (claim("c", exactly(count=2, allocationMode="ExactCount")), 2),
        (claim("c", exactly(allocationMode="All")), dra.ALL_DEVICES_DEFAULT),
        (claim("c", exactly("a", 2), exactly("b", 3)), 5),
        (claim("c", {"name": "x", "exactly": {"deviceClassName": "nic.example.com"}}), 0),
        # v1beta1's flat shape
        (claim("c", {"name": "g", "deviceClassName": CLASS, "count": 4}), 4),
        # firstAvailable: the largest GPU alternative until allocated
        (
            claim(
                "c",
                {
                    "name": "g",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": CLASS, "count": 4},
                        {"name": "small", "deviceClassName": CLASS, "count": 2},
                    ],
                },
            ),
            4,
        ),
        # allocated: the devices given to GPU requests are the truth
        (
            claim(
                "c",
                exactly(allocationMode="All"),
                results=[result("gpu", "gpu-0"), result("gpu", "gpu-1")],
            ),
            2,
        ),
        (
            claim(
                "c",
                {"name": "g", "firstAvailable": [{"name": "s", "deviceClassName": CLASS}]},
                {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
                results=[result("g/s", "gpu-0"), result("nic", "eth1")],
            ),
            1,
        ),
        (claim("c"), 0),
        ({"kind": dra.KIND_CLAIM}, 0),
        (claim("c", exactly(count=-3)), 0),
    ],
    ids=[
        "exact-2",
        "default-count",
        "explicit-exactcount",
        "all-unallocated",
        "two-requests",
        "other-class",
        "v1beta1-flat",
        "first-available-max",
        "all-allocated",
        "subrequest-result",
        "no-requests",
        "no-spec",
        "negative-count",
    ],
)
def test_claim_gpus(obj, gpus):
    assert dra.claim_gpus(obj) == gpus


def test_configured_device_classes():
    obj = claim("c", {"name": "g", "exactly": {"deviceClassName": "gpu.amd.com", "count": 2}})
    assert dra.claim_gpus(obj) == 0
    assert dra.claim_gpus(obj, device_classes={"gpu.amd.com"}) == 2


def template(count: int) -> dict[str, Any]:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": dra.KIND_TEMPLATE,
        "metadata": {"name": "t", "namespace": "prod"},
        "spec": {"spec": {"devices": {"requests": [exactly(count=count)]}}},
    }


def test_template_gpus():
    assert dra.template_gpus(template(3)) == 3
    assert dra.claim_gpus(template(3)) == 3


def test_pod_claim_names():
    obj = pod("p", ns="prod")
    obj["spec"]["resourceClaims"] = [
        {"name": "a", "resourceClaimName": "shared"},
        {"name": "b", "resourceClaimTemplateName": "tmpl"},
    ]
    obj["status"]["resourceClaimStatuses"] = [{"name": "b", "resourceClaimName": "p-b-x7k2"}]
    assert dra.pod_claim_names(obj) == ("p-b-x7k2", "shared")
    assert dra.pod_claim_names(pod("q")) == ()


@pytest.mark.parametrize(
    ("obj", "used", "limit", "short"),
    [
        (claim("c", exactly(count=2)), 6, 8, None),  # 6 + 2 = 8: at the limit is fine
        (claim("c", exactly(count=2)), 7, 8, (7, 2, 8)),
        (claim("c", exactly(count=2)), 100, None, None),  # unlimited
        (claim("c", {"name": "n", "exactly": {"deviceClassName": "x"}}), 8, 8, None),
        (template(4), 8, 8, None),  # a template holds nothing: only its own size counts
        (template(9), 0, 8, (0, 9, 8)),
    ],
    ids=["at-limit", "over-limit", "unlimited", "no-gpus", "template-fits", "template-too-big"],
)
def test_check_claim(obj, used, limit, short):
    got = dra.check_claim(
        obj,
        usage={GPU: Fraction(used)},
        limit=None if limit is None else Fraction(limit),
        tenant="research",
        namespaces=["b", "a", "a"],
    )
    if short is None:
        assert got is None
    else:
        assert got == dra.Insufficient("research", GPU, *map(Fraction, short), ("a", "b"))


# -- trackers --------------------------------------------------------------------------

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "prod", "namespaces": ["prod"]}],
    }
)


def test_usage_tracker_counts_each_claim_once_from_creation():
    usage = UsageTracker(lambda: CONFIG)
    usage.on_resync(dra.KIND_CLAIM, [claim("c1", exactly(count=2))])
    assert usage.tenant_usage("prod") == {GPU: 2}
    # A pod that uses the claim adds nothing more.
    p = pod("p", ns="prod")
    p["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "c1"}]
    usage.on_event("Pod", "ADDED", p)
    assert usage.tenant_usage("prod")[GPU] == 2
    usage.on_event(dra.KIND_CLAIM, "ADDED", claim("c2", exactly(count=3)))
    assert usage.tenant_usage("prod")[GPU] == 5
    usage.on_event(dra.KIND_CLAIM, "MODIFIED", claim("c2", exactly(count=1)))
    assert usage.tenant_usage("prod")[GPU] == 3
    usage.on_event(dra.KIND_CLAIM, "DELETED", claim("c2"))
    assert usage.tenant_usage("prod")[GPU] == 2
    usage.on_resync("Pod", [])  # a pod relist keeps the claims
    assert usage.tenant_usage("prod")[GPU] == 2
    usage.on_resync(dra.KIND_CLAIM, [])
    assert GPU not in usage.tenant_usage("prod")


def _dra_pod(name: str, claims: list[str], node_name: str | None = "n1") -> dict[str, Any]:
    p = pod(name, ns="prod", node_name=node_name)
    p["spec"]["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    return p


def test_extender_tracker_counts_claims_of_bound_pods_once():
    tr = Side(lambda: CONFIG)
    tr.on_resync("Node", [node("n1", gpus=8)])
    gcol = tr.state.gpu_col
    tr.on_resync(dra.KIND_CLAIM, [claim("c1", exactly(count=2)), claim("c2", exactly(count=1))])
    # Pending pods do not count; bound ones do, once per claim even when shared.
    tr.on_event("Pod", "ADDED", _dra_pod("p0", ["c1"], node_name=None))
    assert tr.state.usage_of("prod")[gcol] == 0
    tr.on_event("Pod", "MODIFIED", _dra_pod("p0", ["c1"]))
    tr.on_event("Pod", "ADDED", _dra_pod("p1", ["c1", "c2"]))
    assert tr.state.usage_of("prod")[gcol] == 3000
    # The node's free GPUs (device plugin) are untouched: DRA devices live elsewhere.
    assert tr.state.node_free(0)[gcol] == 8000
    tr.on_event(dra.KIND_CLAIM, "MODIFIED", claim("c2", exactly(count=4)))
    assert tr.state.usage_of("prod")[gcol] == 6000
    tr.on_event("Pod", "DELETED", _dra_pod("p1", ["c1", "c2"]))
    assert tr.state.usage_of("prod")[gcol] == 2000  # c1 still held by p0
    tr.on_event("Node", "DELETED", node("n1"))
    assert tr.state.usage_of("prod")[gcol] == 0


def test_dra_only_gpus_give_finite_shares_and_fair_allocations():
    """GPUs only through DRA: the nodes' nvidia.com/gpu capacity is 0. The claims' GPUs
    count in usage but the shares stay finite (they used to be +inf)."""
    import math

    from fairshare import cluster_shares

    tr = Side(lambda: CONFIG)
    tr.on_resync("Node", [node("n1", gpus=0)])
    tr.on_resync(dra.KIND_CLAIM, [claim("c1", exactly(count=2))])
    tr.on_event("Pod", "ADDED", _dra_pod("p0", ["c1"]))
    assert tr.state.usage_of("prod")[tr.state.gpu_col] == 2000
    shares = cluster_shares.current_shares(tr.state, CONFIG)
    assert shares["prod"] == 1 / 32  # its CPU: 1 of the node's 32 cores
    fair = tr.fair_shares(CONFIG)
    assert all(math.isfinite(f.share) for f in fair.values())
