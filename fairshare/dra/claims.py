"""GPUs requested through ResourceClaims and ResourceClaimTemplates: a claim's GPUs while
pending and once allocated, the quota check at admission, and the claims kube-scheduler
generates for DRA-backed extended resources (KEP-5004). The counting rules are in
``fairshare.dra``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from fairshare.dra.slices import (
    ALL_DEVICES_DEFAULT,
    GPU_DEVICE_CLASSES,
    KIND_TEMPLATE,
    DeviceKey,
    GpuDevice,
    SliceCapacity,
    _list,
    _map,
    _quantities,
    device_match,
)
from fairshare.resources import GPU


def _count(req: Mapping[str, Any], all_devices: int) -> int:
    mode = req.get("allocationMode") or "ExactCount"
    if mode == "All":
        return all_devices
    count = req.get("count", 1)
    return count if isinstance(count, int) and count > 0 else 0


def _per_device(
    req: Mapping[str, Any], devices: SliceCapacity | None, all_devices: int
) -> Fraction:
    """GPUs an unallocated request takes: ``count`` devices, each the smallest part of a
    GPU that a device its class selects can give it (a MIG partition its fraction, a
    shareable GPU the capacity the request asks of it); 1 each while the class's devices
    are unknown. A request whose selectors name a MIG ``profile`` (``device.attributes
    ['<domain>'].profile == '3g.40gb'``) takes a partition of that profile."""
    n = _count(req, all_devices)
    shapes = devices.class_shapes.get(str(req.get("deviceClassName", ""))) if devices else None
    if not n or not shapes:
        return Fraction(n)
    profile = _asked_profile(req)
    if profile:
        shapes = tuple(s for s in shapes if s.profile == profile) or shapes
    asked = _quantities(_map(req.get("capacity")).get("requests"))
    best = min(
        GpuDevice(None, "", s.fraction, s.shareable, dict(s.capacity)).share(asked)
        if asked or not s.shareable
        else s.fraction
        for s in shapes
    )
    return best * n


def _asked_profile(req: Mapping[str, Any]) -> str:
    """The MIG profile a request's selectors require ("" when none, or unreadable)."""
    got = device_match({"spec": {"selectors": _list(req.get("selectors"))}})
    if isinstance(got, str):
        return ""
    return next((value for _, name, value in got.attributes if name == "profile"), "")


def _request_gpus(
    req: Mapping[str, Any],
    classes: Collection[str],
    all_devices: int,
    devices: SliceCapacity | None = None,
) -> tuple[Fraction, bool]:
    """(GPUs the request may take, whether it is a GPU request at all)."""
    exactly = _map(req.get("exactly")) or (req if "deviceClassName" in req else {})
    if exactly:
        if exactly.get("deviceClassName") in classes:
            return _per_device(exactly, devices, all_devices), True
        return Fraction(0), False
    subs = [_map(s) for s in _list(req.get("firstAvailable"))]
    counts = [
        _per_device(s, devices, all_devices) for s in subs if s.get("deviceClassName") in classes
    ]
    return (max(counts), True) if counts else (Fraction(0), False)


def claim_spec_gpus(
    spec: Mapping[str, Any],
    *,
    device_classes: Collection[str] = GPU_DEVICE_CLASSES,
    all_devices: int = ALL_DEVICES_DEFAULT,
    devices: SliceCapacity | None = None,
) -> tuple[Fraction, frozenset[str]]:
    """GPUs a ``ResourceClaimSpec`` asks for, and the names of its GPU requests."""
    total, names = Fraction(0), set()
    for raw in _list(_map(spec.get("devices")).get("requests")):
        req = _map(raw)
        n, is_gpu = _request_gpus(req, device_classes, all_devices, devices)
        if is_gpu:
            total += n
            names.add(str(req.get("name", "")))
    return total, frozenset(names)


def allocated_devices(
    claim: Mapping[str, Any],
    *,
    device_classes: Collection[str] = GPU_DEVICE_CLASSES,
    devices: SliceCapacity | None = None,
) -> list[tuple[DeviceKey, Fraction]]:
    """The GPU devices an allocated claim holds and the GPUs each gives it (``[]`` while
    unallocated): a device's ``GpuDevice.fraction``, a share of a shareable device by its
    ``consumedCapacity``; a device fairshare does not know counts 1."""
    _, names = claim_spec_gpus(_map(claim.get("spec")), device_classes=device_classes)
    results = _list(
        _map(_map(_map(claim.get("status")).get("allocation")).get("devices")).get("results")
    )
    out = []
    for r in map(_map, results):
        if str(r.get("request", "")).split("/")[0] not in names:
            continue
        key = (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
        dev = devices.devices.get(key) if devices else None
        gpus = Fraction(1) if dev is None else dev.share(_quantities(r.get("consumedCapacity")))
        out.append((key, gpus))
    return out


def whole_and_parts(
    held: Iterable[tuple[DeviceKey, Fraction]], devices: SliceCapacity
) -> tuple[int, dict[str, Fraction]]:
    """How a pod holds the devices ``held`` (``allocated_devices``): whole devices
    (a device fairshare does not know, or one that gives a whole GPU or more, counts
    whole, rounded up) and parts of physical GPUs by GPU (MIG partitions, shares of a
    shareable GPU)."""
    whole = 0
    parts: dict[str, Fraction] = {}
    for key, gives in held:
        dev = devices.devices.get(key)
        if dev is None or gives >= 1:
            whole += math.ceil(gives)
        else:
            parts[dev.gpu] = parts.get(dev.gpu, Fraction(0)) + gives
    return whole, parts


def claim_gpus(
    claim: Mapping[str, Any],
    *,
    device_classes: Collection[str] = GPU_DEVICE_CLASSES,
    all_devices: int = ALL_DEVICES_DEFAULT,
    devices: SliceCapacity | None = None,
) -> Fraction:
    """GPUs of a ResourceClaim (allocated: what its devices give; else: requested). >= 0.

    ``devices``: the slices' device index (``slice_capacity``), which turns a MIG
    partition into its fraction and a share of a shareable GPU into its part; without it
    every device counts 1. Also accepts a ResourceClaimTemplate (its ``spec.spec``),
    counted as requested.
    """
    if claim.get("kind") == KIND_TEMPLATE:
        return template_gpus(
            claim, device_classes=device_classes, all_devices=all_devices, devices=devices
        )
    if is_extended_resource_claim(claim):
        return Fraction(0)  # the pod's own nvidia.com/gpu request counts these devices
    held = allocated_devices(claim, device_classes=device_classes, devices=devices)
    if held or _map(_map(claim.get("status")).get("allocation")):
        return sum((g for _, g in held), Fraction(0))
    return claim_spec_gpus(
        _map(claim.get("spec")),
        device_classes=device_classes,
        all_devices=all_devices,
        devices=devices,
    )[0]


def template_gpus(
    template: Mapping[str, Any],
    *,
    device_classes: Collection[str] = GPU_DEVICE_CLASSES,
    all_devices: int = ALL_DEVICES_DEFAULT,
    devices: SliceCapacity | None = None,
) -> Fraction:
    """GPUs each claim made from a ResourceClaimTemplate asks for."""
    spec = _map(_map(template.get("spec")).get("spec"))
    return claim_spec_gpus(
        spec, device_classes=device_classes, all_devices=all_devices, devices=devices
    )[0]


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
    """The claim would take ``tenant`` over its limit on ``resource`` (same fields as
    ``fairshare.limits.Insufficient``, so one renderer formats both)."""

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
    devices: SliceCapacity | None = None,
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
    requested = claim_gpus(
        claim, device_classes=device_classes, all_devices=all_devices, devices=devices
    )
    if requested <= 0:
        return None
    used = Fraction(0) if claim.get("kind") == KIND_TEMPLATE else usage.get(GPU, Fraction(0))
    if used + requested <= limit:
        return None
    return Insufficient(tenant, GPU, used, requested, limit, tuple(sorted(set(namespaces))))


# -- KEP-5004: extended resources backed by DRA -------------------------------------------

EXTENDED_RESOURCE_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/extended-resource-claim"
"""kube-scheduler marks the claim it generates for a pod's DRA-backed extended resources
(``resource/v1`` ``ExtendedResourceClaimAnnotation``, value ``"true"``)."""


def is_extended_resource_claim(claim: Mapping[str, Any]) -> bool:
    """Is this the claim kube-scheduler generated for a pod's extended resources (KEP-5004)?

    Its devices are the pod's own ``nvidia.com/gpu`` request, which the pod's request
    vector already counts: such a claim counts 0 GPUs (``claim_gpus``), so a pod is never
    counted twice."""
    ann = _map(_map(claim.get("metadata")).get("annotations"))
    return ann.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"


def extended_resource_claim_name(pod: Mapping[str, Any]) -> str | None:
    """The generated claim a pod's ``status.extendedResourceClaimStatus`` names, if any."""
    held = _map(_map(pod.get("status")).get("extendedResourceClaimStatus"))
    name = held.get("resourceClaimName")
    return name if isinstance(name, str) and name else None


def extended_resource_classes(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name -> DeviceClass name, from ``spec.extendedResourceName``
    (KEP-5004). Two classes naming one resource: the one created first, then by name,
    as kube-scheduler's DeviceClassResolver picks."""
    found: dict[str, tuple[str, str]] = {}
    for dc in classes:
        meta = _map(dc.get("metadata"))
        name = str(meta.get("name") or "")
        resource = _map(dc.get("spec")).get("extendedResourceName")
        if not name or not isinstance(resource, str) or not resource:
            continue
        key = (str(meta.get("creationTimestamp") or ""), name)
        if resource not in found or key < found[resource]:
            found[resource] = key
    return {r: k[1] for r, k in found.items()}


def asks_gpus_without_claims(pod: Mapping[str, Any], resource: str = GPU) -> bool:
    """Does the pod ask ``resource`` (``nvidia.com/gpu``) in a container and use no
    ResourceClaim of its own? On a node without that allocatable, its GPUs come from DRA
    only through KEP-5004's generated claim, whose devices fairshare models."""
    spec = _map(pod.get("spec"))
    if _list(spec.get("resourceClaims")):
        return False
    for c in map(_map, [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]):
        res = _map(c.get("resources"))
        if resource in _map(res.get("requests")) or resource in _map(res.get("limits")):
            return True
    return False
