"""GPUs requested through Dynamic Resource Allocation (``resource.k8s.io/v1``).

Pure: no network, no clock. Must not import aiohttp, kubernetes_asyncio or
prometheus_client. Reads ResourceClaim / ResourceClaimTemplate objects as API JSON dicts.

A claim's GPUs are the devices its requests ask for from a **GPU device class**
(``GPU_DEVICE_CLASSES``, default ``gpu.nvidia.com``, the class the NVIDIA DRA driver
installs; callers pass their configured set):

* ``spec.devices.requests[].exactly`` with ``deviceClassName`` in the set:
  ``allocationMode: ExactCount`` (the default) counts ``count`` (default 1);
  ``allocationMode: All`` counts ``all_devices`` (a whole node, default 8) until the
  claim is allocated;
* ``spec.devices.requests[].firstAvailable[]``: the largest count among the GPU
  sub-requests (the worst case the scheduler may pick) until allocated;
* the pre-v1 flat shape (``requests[].deviceClassName`` / ``count`` / ``allocationMode``)
  is read the same way, so claims written for v1beta1 count too;
* once allocated, ``status.allocation.devices.results`` is the truth: the number of
  devices given to the GPU requests (a result's ``request`` is ``<request>`` or
  ``<request>/<sub-request>``).

Accounting choices: admission counts a ResourceClaim from creation to deletion, whether
or not a pod uses it yet (as Kubernetes ResourceQuota counts ``devices`` per claim);
claims generated from a template are ResourceClaims and count the same way, so a pod is
never counted twice for one claim. The scheduler side counts the claims that bound pods
reference (``pod_claim_names``), once per claim.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from fairshare.resources import GPU

GPU_DEVICE_CLASS: Final = "gpu.nvidia.com"
"""Default DRA device class whose devices are GPUs (NVIDIA's DRA driver)."""
GPU_DEVICE_CLASSES: Final = frozenset({GPU_DEVICE_CLASS})
ALL_DEVICES_DEFAULT: Final = 8
"""GPUs an unallocated ``allocationMode: All`` request counts as (one full GPU node)."""
API_VERSION: Final = "resource.k8s.io/v1"
KIND_CLAIM: Final = "ResourceClaim"
KIND_TEMPLATE: Final = "ResourceClaimTemplate"


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def _count(req: Mapping[str, Any], all_devices: int) -> int:
    mode = req.get("allocationMode") or "ExactCount"
    if mode == "All":
        return all_devices
    count = req.get("count", 1)
    return count if isinstance(count, int) and count > 0 else 0


def _request_gpus(
    req: Mapping[str, Any], classes: Collection[str], all_devices: int
) -> tuple[int, bool]:
    """(GPUs the request may take, whether it is a GPU request at all)."""
    exactly = _map(req.get("exactly")) or (req if "deviceClassName" in req else {})
    if exactly:
        if exactly.get("deviceClassName") in classes:
            return _count(exactly, all_devices), True
        return 0, False
    subs = [_map(s) for s in _list(req.get("firstAvailable"))]
    counts = [_count(s, all_devices) for s in subs if s.get("deviceClassName") in classes]
    return (max(counts), True) if counts else (0, False)


def claim_spec_gpus(
    spec: Mapping[str, Any],
    *,
    device_classes: Collection[str] = GPU_DEVICE_CLASSES,
    all_devices: int = ALL_DEVICES_DEFAULT,
) -> tuple[int, frozenset[str]]:
    """GPUs a ``ResourceClaimSpec`` asks for, and the names of its GPU requests."""
    total, names = 0, set()
    for raw in _list(_map(spec.get("devices")).get("requests")):
        req = _map(raw)
        n, is_gpu = _request_gpus(req, device_classes, all_devices)
        if is_gpu:
            total += n
            names.add(str(req.get("name", "")))
    return total, frozenset(names)


def claim_gpus(
    claim: Mapping[str, Any],
    *,
    device_classes: Collection[str] = GPU_DEVICE_CLASSES,
    all_devices: int = ALL_DEVICES_DEFAULT,
) -> int:
    """GPUs of a ResourceClaim (allocated: devices given; else: requested). >= 0.

    Also accepts a ResourceClaimTemplate (its ``spec.spec``), counted as requested.
    """
    if claim.get("kind") == KIND_TEMPLATE:
        return template_gpus(claim, device_classes=device_classes, all_devices=all_devices)
    wanted, names = claim_spec_gpus(
        _map(claim.get("spec")), device_classes=device_classes, all_devices=all_devices
    )
    results = _list(
        _map(_map(_map(claim.get("status")).get("allocation")).get("devices")).get("results")
    )
    if not results:
        return wanted
    return sum(1 for r in results if str(_map(r).get("request", "")).split("/")[0] in names)


def template_gpus(
    template: Mapping[str, Any],
    *,
    device_classes: Collection[str] = GPU_DEVICE_CLASSES,
    all_devices: int = ALL_DEVICES_DEFAULT,
) -> int:
    """GPUs each claim made from a ResourceClaimTemplate asks for."""
    spec = _map(_map(template.get("spec")).get("spec"))
    return claim_spec_gpus(spec, device_classes=device_classes, all_devices=all_devices)[0]


def pod_claim_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the ResourceClaims (in the pod's namespace) a pod uses, sorted.

    ``spec.resourceClaims[].resourceClaimName`` directly, plus the claims generated from
    templates as ``status.resourceClaimStatuses[].resourceClaimName`` records them.
    """
    names = {
        str(rc["resourceClaimName"])
        for rc in map(_map, _list(_map(pod.get("spec")).get("resourceClaims")))
        if rc.get("resourceClaimName")
    }
    names |= {
        str(rs["resourceClaimName"])
        for rs in map(_map, _list(_map(pod.get("status")).get("resourceClaimStatuses")))
        if rs.get("resourceClaimName")
    }
    return tuple(sorted(names))


@dataclass(frozen=True)
class Insufficient:
    """The claim would take ``tenant`` over its limit on ``resource`` (same fields as the
    webhook's ``policies.quota.Insufficient``, so one renderer formats both)."""

    tenant: str
    resource: str
    used: Fraction
    requested: Fraction
    limit: Fraction
    namespaces: tuple[str, ...]


def check_claim(
    claim: Mapping[str, Any],
    *,
    usage: Mapping[str, Fraction],
    limit: Fraction | None,
    tenant: str = "",
    namespaces: Sequence[str] = (),
    device_classes: Collection[str] = GPU_DEVICE_CLASSES,
    all_devices: int = ALL_DEVICES_DEFAULT,
) -> Insufficient | None:
    """Refuse a claim (or template) whose GPUs take the tenant over its GPU ``limit``.

    A ResourceClaim: ``usage[GPU] + claim_gpus > limit`` (``usage`` from the usage
    tracker, which already counts the tenant's existing claims; on UPDATE pass usage
    without this claim). A ResourceClaimTemplate holds nothing itself: refused only when
    one claim made from it could never fit (``template_gpus > limit``). ``limit`` None
    (unlimited) and claims without GPUs always pass.
    """
    if limit is None:
        return None
    requested = Fraction(claim_gpus(claim, device_classes=device_classes, all_devices=all_devices))
    if requested <= 0:
        return None
    used = Fraction(0) if claim.get("kind") == KIND_TEMPLATE else usage.get(GPU, Fraction(0))
    if used + requested <= limit:
        return None
    return Insufficient(tenant, GPU, used, requested, limit, tuple(sorted(set(namespaces))))
