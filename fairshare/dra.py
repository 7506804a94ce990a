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
reference (``pod_claim_names``), once per claim. The claim kube-scheduler generates for a
pod's DRA-backed ``nvidia.com/gpu`` (KEP-5004, annotated
``resource.kubernetes.io/extended-resource-claim``) counts 0: the pod's own request is
its usage, on both sides.

Capacity (``slice_capacity``): a node's DRA GPUs are the devices that a configured GPU
DeviceClass selects in the node-local pools of ``resource.k8s.io/v1`` ResourceSlices.
fairshare evaluates no CEL; ``device_match`` reads the driver/attribute equalities GPU
classes are written with and refuses anything else by name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from fairshare import quantities
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
KIND_SLICE: Final = "ResourceSlice"
KIND_DEVICE_CLASS: Final = "DeviceClass"
KIND_TAINT_RULE: Final = "DeviceTaintRule"


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


# -- capacity: GPUs published in ResourceSlices --------------------------------------------

_DRIVER_TERM = re.compile(r"""^device\.driver\s*==\s*(['"])([^'"]+)\1$""")
_ATTR_TERM = re.compile(
    r"""^device\.attributes\[(['"])([^'"]+)\1\]\.([A-Za-z_][A-Za-z0-9_]*)\s*==\s*(['"])([^'"]*)\4$"""
)


@dataclass(frozen=True)
class DeviceMatch:
    """What a DeviceClass's selectors require of a device, when fairshare can read them:
    the driver (None: any) and string attributes ``(domain, name, value)``."""

    driver: str | None = None
    attributes: tuple[tuple[str, str, str], ...] = ()

    def matches(self, driver: str, device: Mapping[str, Any]) -> bool:
        if self.driver is not None and driver != self.driver:
            return False
        attrs = _map(device.get("attributes"))
        for domain, name, value in self.attributes:
            raw = attrs.get(f"{domain}/{name}")
            if raw is None and domain == driver:
                raw = attrs.get(name)  # unqualified names are in the driver's domain
            attr = _map(raw)
            if attr.get("string", attr.get("version")) != value:
                return False
        return True


def device_match(device_class: Mapping[str, Any]) -> DeviceMatch | str:
    """The ``DeviceMatch`` of a DeviceClass, or the reason fairshare cannot read it.

    fairshare evaluates no CEL. It reads the one form device classes for GPUs use (NVIDIA's
    chart: ``device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type
    == 'gpu'``): each selector a conjunction (``&&``) of ``device.driver == '<name>'`` and
    ``device.attributes['<domain>'].<name> == '<string>'``; all selectors must hold (as in
    the API). Any other expression is refused with its text: that class then counts no
    capacity (the reason shows in status), rather than a guess kube-scheduler could
    contradict. A class without selectors selects every device.
    """
    driver: str | None = None
    attributes: list[tuple[str, str, str]] = []
    for sel in map(_map, _list(_map(device_class.get("spec")).get("selectors"))):
        expr = _map(sel.get("cel")).get("expression")
        if not isinstance(expr, str):
            return "a selector that is not CEL"
        text = expr.strip()
        while text.startswith("(") and text.endswith(")"):
            text = text[1:-1].strip()
        for term in text.split("&&"):
            term = term.strip()
            while term.startswith("(") and term.endswith(")"):
                term = term[1:-1].strip()
            if m := _DRIVER_TERM.match(term):
                if driver is not None and driver != m.group(2):
                    return f"two drivers in {expr!r}"
                driver = m.group(2)
            elif m := _ATTR_TERM.match(term):
                attributes.append((m.group(2), m.group(3), m.group(5)))
            else:
                return f"CEL fairshare does not evaluate: {expr!r}"
    return DeviceMatch(driver, tuple(attributes))


TAINT_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
MEMORY_SLICE_PREFIX: Final = "memory-slice-"
"""NVIDIA's driver publishes one counter of 1 per memory slice of a GPU in its counter set."""

DeviceKey = tuple[str, str, str]
"""(driver, pool, device): how an allocation result names a device."""


def _quantity(value: object) -> Fraction | None:
    """A ``resource.Quantity`` as the API writes it (``"80Gi"``, ``14``), or None."""
    if isinstance(value, Mapping):
        value = value.get("value")
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return None
    try:
        return quantities.parse_quantity(value)
    except ValueError:
        return None


def _quantities(values: object) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for name, raw in _map(values).items():
        q = _quantity(raw)
        if q is not None:
            out[str(name).rsplit("/", 1)[-1]] = q
    return out


@dataclass(frozen=True)
class GpuDevice:
    """One device of a GPU class, as fairshare counts it.

    ``gpu`` names the physical GPU it is part of: the counter set it consumes
    (partitionable devices, KEP-4815: the full GPU and each MIG placement consume the
    same set), else its ``parentUUID`` (a MIG device published without counters), else
    itself. A node's GPU capacity is its number of distinct ``gpu`` keys.

    ``fraction`` is the part of that GPU one allocation of the whole device gives: 1 for
    a full GPU; for a partition its share of the set's ``multiprocessors`` counter (the
    GPU's compute: a 1g.10gb on an A100 takes 14 of 98, 1/7; a 3g.40gb 42 of 98, 3/7,
    as the device plugin's MIG table counts them), or, in a set without that counter,
    the largest share it takes of any counter; without counters the config's MIG table
    by the ``profile`` attribute; else 1. One counter makes fractions add up: the
    partitions kube-scheduler fits on one GPU never count more than 1 (largest shares
    would: four 1g.10gb and a 3g.40gb fill an A100's 8 memory slices and 98
    multiprocessors, but count 4/7 + 1/2).
    ``shareable`` (``allowMultipleAllocations``): each allocation takes the part of
    ``capacity`` it consumed (``consumedCapacity``), DRA's own fractional GPU."""

    node: str | None
    gpu: str
    fraction: Fraction = Fraction(1)
    shareable: bool = False
    capacity: Mapping[str, Fraction] = field(default_factory=dict)
    tainted: bool = False
    classes: frozenset[str] = frozenset()

    def share(self, consumed: Mapping[str, Fraction]) -> Fraction:
        """GPUs one allocation takes that consumed ``consumed`` of a shareable device's
        capacity: the largest ratio over the capacities it names (all of it when it
        names none), times ``fraction``."""
        if not self.shareable:
            return self.fraction
        ratios = [
            min(Fraction(1), q / self.capacity[k])
            for k, q in consumed.items()
            if self.capacity.get(k, Fraction(0)) > 0
        ]
        return (max(ratios) if ratios else Fraction(1)) * self.fraction


@dataclass(frozen=True)
class _RawDevice:
    name: str
    node: str | None
    consumes: tuple[tuple[str, Mapping[str, Fraction]], ...]
    profile: str
    parent: str
    shareable: bool
    capacity: Mapping[str, Fraction]
    tainted: bool
    classes: frozenset[str]


@dataclass(frozen=True)
class SliceCount:
    """What one ResourceSlice publishes that fairshare counts (``count_slice``)."""

    pool: tuple[str, str]
    """(driver, pool name)."""
    generation: int
    devices: tuple[_RawDevice, ...] = ()
    """Devices one of the GPU classes selects."""
    counter_sets: Mapping[str, Mapping[str, Fraction]] = field(default_factory=dict)
    """``sharedCounters`` by set name (v1.36 publishes them in a slice of their own)."""


@dataclass(frozen=True)
class ClassShape:
    """A kind of device a GPU class selects (for the GPUs an unallocated request takes)."""

    fraction: Fraction
    shareable: bool
    capacity: tuple[tuple[str, Fraction], ...]
    profile: str = ""
    """The MIG profile of a partition ("" for others)."""


@dataclass(frozen=True)
class SliceCapacity:
    """GPUs the ResourceSlices publish, per node, and the devices behind them."""

    node_gpus: Mapping[str, int]
    """Node name -> physical GPUs (distinct ``GpuDevice.gpu``) of the GPU classes in its
    node-local pools that are not all tainted."""
    tainted: Mapping[str, int] = field(default_factory=dict)
    """Node name -> GPUs left out because every device of them carries a taint that
    keeps new claims off (``NoSchedule``/``NoExecute``)."""
    unattributed: int = 0
    """GPU devices not bound to one node (a pool or device with a ``nodeSelector`` or
    ``allNodes``: network-attached): counted nowhere, since which nodes may use them is
    a node-selector kube-scheduler evaluates per pod."""
    problems: Mapping[str, str] = field(default_factory=dict)
    """Configured GPU class -> why it counts nothing (missing, unreadable selector)."""
    devices: Mapping[DeviceKey, GpuDevice] = field(default_factory=dict)
    """Every device of a GPU class in the newest generation of its pool."""
    class_shapes: Mapping[str, tuple[ClassShape, ...]] = field(default_factory=dict)
    """GPU class -> the kinds of untainted devices it selects."""


def gpu_matches(
    classes: Mapping[str, Mapping[str, Any]], gpu_classes: Collection[str] = GPU_DEVICE_CLASSES
) -> tuple[tuple[tuple[str, DeviceMatch], ...], dict[str, str]]:
    """(class name, ``DeviceMatch``) of each of ``gpu_classes`` (DeviceClass objects by
    name in ``classes``), and why each of the others counts nothing (missing,
    unreadable)."""
    matches: list[tuple[str, DeviceMatch]] = []
    problems: dict[str, str] = {}
    for name in sorted(gpu_classes):
        dc = classes.get(name)
        if dc is None:
            problems[name] = f"DeviceClass {name} not found"
            continue
        got = device_match(dc)
        if isinstance(got, str):
            problems[name] = f"DeviceClass {name}: {got}"
        else:
            matches.append((name, got))
    return tuple(matches), problems


def _consumes(device: Mapping[str, Any]) -> tuple[tuple[str, Mapping[str, Fraction]], ...]:
    out = []
    for c in map(_map, _list(device.get("consumesCounters"))):
        name = c.get("counterSet")
        if isinstance(name, str) and name:
            out.append((name, _quantities(c.get("counters"))))
    return tuple(out)


def _attr(device: Mapping[str, Any], driver: str, name: str) -> str:
    attrs = _map(device.get("attributes"))
    raw = _map(attrs.get(name) or attrs.get(f"{driver}/{name}"))
    value = raw.get("string")
    return value if isinstance(value, str) else ""


def count_slice(rs: Mapping[str, Any], matches: Sequence[tuple[str, DeviceMatch]]) -> SliceCount:
    """The GPU devices one of ``matches`` selects in one slice (a node-local pool names its
    node in ``spec.nodeName``; under ``perDeviceNodeSelection`` a device may in its own
    ``nodeName``), and the counter sets the slice publishes."""
    spec = _map(rs.get("spec"))
    driver = str(spec.get("driver", ""))
    pool = _map(spec.get("pool"))
    gen = pool.get("generation", 0)
    devices: list[_RawDevice] = []
    for device in map(_map, _list(spec.get("devices"))):
        classes = frozenset(name for name, m in matches if m.matches(driver, device))
        if not classes:
            continue
        node = spec.get("nodeName") or device.get("nodeName")
        devices.append(
            _RawDevice(
                name=str(device.get("name", "")),
                node=node if isinstance(node, str) and node else None,
                consumes=_consumes(device),
                profile=_attr(device, driver, "profile"),
                parent=_attr(device, driver, "parentUUID"),
                shareable=device.get("allowMultipleAllocations") is True,
                capacity=_quantities(device.get("capacity")),
                tainted=any(
                    _map(t).get("effect") in TAINT_EFFECTS for t in _list(device.get("taints"))
                ),
                classes=classes,
            )
        )
    counter_sets = {
        str(cs.get("name")): _quantities(cs.get("counters"))
        for cs in map(_map, _list(spec.get("sharedCounters")))
        if cs.get("name")
    }
    return SliceCount(
        (driver, str(pool.get("name", ""))),
        gen if isinstance(gen, int) else 0,
        tuple(devices),
        counter_sets,
    )


_NUMBERED = re.compile(r"^(.*?)-?\d+$")
COMPUTE_COUNTER: Final = "multiprocessors"
"""The counter whose share is a partition's GPU fraction when its set has it (NVIDIA's
driver publishes a GPU's streaming multiprocessors under this name)."""


def _dimensions(counters: Mapping[str, Fraction]) -> dict[str, Fraction]:
    """Counters summed per dimension: numbered counters (``memory-slice-0`` ..
    ``memory-slice-7``, one per placement slot) are one dimension, their sum."""
    out: dict[str, Fraction] = {}
    for name, q in counters.items():
        m = _NUMBERED.match(name)
        dim = m.group(1) if m and m.group(1) else name
        out[dim] = out.get(dim, Fraction(0)) + q
    return out


def _fraction(
    raw: _RawDevice,
    sets: Mapping[str, Mapping[str, Fraction]],
    mig_fractions: Mapping[str, Fraction],
) -> Fraction:
    for set_name, used in raw.consumes:
        if set_name not in sets:
            continue
        total, took = _dimensions(sets[set_name]), _dimensions(used)
        if total.get(COMPUTE_COUNTER) and COMPUTE_COUNTER in took:
            return min(Fraction(1), took[COMPUTE_COUNTER] / total[COMPUTE_COUNTER])
        ratios = [min(Fraction(1), q / total[k]) for k, q in took.items() if total.get(k)]
        if ratios:
            return max(ratios)
    if raw.profile and raw.profile in mig_fractions:
        return mig_fractions[raw.profile]
    return Fraction(1)


TaintSelector = tuple[str | None, str | None, str | None]
"""(driver, pool, device) a DeviceTaintRule taints; None: any."""


def taint_rule_selector(rule: Mapping[str, Any]) -> TaintSelector | None:
    """The devices a ``DeviceTaintRule`` (``resource.k8s.io/v1beta2``) keeps new claims
    off, or None when it keeps none off: no ``deviceSelector`` (it selects no device), or
    a taint effect other than ``NoSchedule``/``NoExecute`` (``None`` only informs)."""
    spec = _map(rule.get("spec"))
    selector = spec.get("deviceSelector")
    if not isinstance(selector, Mapping):
        return None
    if _map(spec.get("taint")).get("effect") not in TAINT_EFFECTS:
        return None

    def field_(name: str) -> str | None:
        value = selector.get(name)
        return value if isinstance(value, str) and value else None

    return (field_("driver"), field_("pool"), field_("device"))


def _tainted_by(key: DeviceKey, rules: Sequence[TaintSelector]) -> bool:
    return any(
        all(want is None or want == got for want, got in zip(r, key, strict=True)) for r in rules
    )


@dataclass(frozen=True)
class PoolCount:
    """One pool's devices from its newest generation (``combine_pool``)."""

    devices: Mapping[DeviceKey, GpuDevice]
    live: Mapping[str, frozenset[str]]
    """Node -> its physical GPUs (``GpuDevice.gpu``) with an untainted device."""
    dead: Mapping[str, frozenset[str]]
    """Node -> its physical GPUs with a tainted device."""
    unattributed: int
    shapes: Mapping[str, frozenset[ClassShape]]


def combine_pool(
    counts: Iterable[SliceCount],
    mig_fractions: Mapping[str, Fraction] | None = None,
    rules: Sequence[TaintSelector] = (),
) -> PoolCount:
    """The devices of one pool's slices (``counts``, all of one pool), from its newest
    generation only (kube-scheduler ignores older ones). A device a rule of ``rules``
    (``taint_rule_selector``) selects is tainted like one tainted in its slice."""
    counts = list(counts)
    newest = max((c.generation for c in counts), default=0)
    counts = [c for c in counts if c.generation == newest]
    sets: dict[str, Mapping[str, Fraction]] = {}
    for c in counts:
        sets.update(c.counter_sets)
    fractions = mig_fractions or {}
    devices: dict[DeviceKey, GpuDevice] = {}
    live: dict[str, set[str]] = {}
    dead: dict[str, set[str]] = {}
    unattributed = 0
    shapes: dict[str, set[ClassShape]] = {}
    for c in counts:
        driver, pool = c.pool
        for raw in c.devices:
            if rules and not raw.tainted and _tainted_by((driver, pool, raw.name), rules):
                raw = dataclasses.replace(raw, tainted=True)
            if raw.consumes:
                gpu = f"{driver}/{pool}/{raw.consumes[0][0]}"
            elif raw.parent:
                gpu = f"{driver}/{pool}/parent={raw.parent}"
            else:
                gpu = f"{driver}/{pool}/{raw.name}"
            dev = GpuDevice(
                node=raw.node,
                gpu=gpu,
                fraction=_fraction(raw, sets, fractions),
                shareable=raw.shareable,
                capacity=raw.capacity,
                tainted=raw.tainted,
                classes=raw.classes,
            )
            devices[(driver, pool, raw.name)] = dev
            if raw.node is None:
                unattributed += 1
                continue
            (dead if raw.tainted else live).setdefault(raw.node, set()).add(gpu)
            if not raw.tainted:
                shape = ClassShape(
                    dev.fraction, dev.shareable, tuple(sorted(dev.capacity.items())), raw.profile
                )
                for name in raw.classes:
                    shapes.setdefault(name, set()).add(shape)
    return PoolCount(
        devices,
        {n: frozenset(k) for n, k in live.items()},
        {n: frozenset(k) for n, k in dead.items()},
        unattributed,
        {n: frozenset(v) for n, v in shapes.items()},
    )


class DeviceIndex(Mapping[DeviceKey, GpuDevice]):
    """The devices of every pool, looked up in their pool's count (no merged copy: a
    slice event rebuilds its pool alone)."""

    def __init__(self, pools: Mapping[tuple[str, str], PoolCount]) -> None:
        self._pools = pools

    def __getitem__(self, key: DeviceKey) -> GpuDevice:
        pool = self._pools.get((key[0], key[1]))
        if pool is None:
            raise KeyError(key)
        return pool.devices[key]

    def __iter__(self) -> Iterator[DeviceKey]:
        for pool in self._pools.values():
            yield from pool.devices

    def __len__(self) -> int:
        return sum(len(p.devices) for p in self._pools.values())


def capacity_of_pools(
    pools: Mapping[tuple[str, str], PoolCount], problems: Mapping[str, str] | None = None
) -> SliceCapacity:
    """The ``SliceCapacity`` of the pools' counts (``combine_pool``)."""
    live: dict[str, set[str]] = {}
    dead: dict[str, set[str]] = {}
    shapes: dict[str, set[ClassShape]] = {}
    unattributed = 0
    for pc in pools.values():
        for node, keys in pc.live.items():
            live.setdefault(node, set()).update(keys)
        for node, keys in pc.dead.items():
            dead.setdefault(node, set()).update(keys)
        for name, got in pc.shapes.items():
            shapes.setdefault(name, set()).update(got)
        unattributed += pc.unattributed
    gpus = {node: len(keys) for node, keys in live.items()}
    tainted = {node: n for node, keys in dead.items() if (n := len(keys - live.get(node, set())))}
    return SliceCapacity(
        gpus,
        tainted,
        unattributed,
        dict(problems or {}),
        DeviceIndex(dict(pools)),
        {name: tuple(sorted(v, key=repr)) for name, v in shapes.items()},
    )


def combine_slices(
    counts: Iterable[SliceCount],
    problems: Mapping[str, str] | None = None,
    mig_fractions: Mapping[str, Fraction] | None = None,
    taint_rules: Iterable[TaintSelector] = (),
) -> SliceCapacity:
    """Per-node GPUs and the device index of all slices' counts (``combine_pool`` per
    pool)."""
    rules = list(taint_rules)
    by_pool: dict[tuple[str, str], list[SliceCount]] = {}
    for c in counts:
        by_pool.setdefault(c.pool, []).append(c)
    pools = {k: combine_pool(v, mig_fractions, rules) for k, v in by_pool.items()}
    return capacity_of_pools(pools, problems)


class SliceBook:
    """ResourceSlices, DeviceClasses and DeviceTaintRules as they come and go, and the
    ``SliceCapacity`` they give, kept per pool: a slice event counts that slice, combines
    its pool again and updates the totals of that pool's nodes and classes, nothing else
    (a full recount at 5,000 nodes costs 100 times that)."""

    def __init__(
        self,
        slices: dict[str, Any] | None = None,
        classes: dict[str, Any] | None = None,
        rules: dict[str, Any] | None = None,
    ) -> None:
        """``slices``, ``classes``, ``rules``: the caller's dicts of those objects by name
        (shared: the caller edits them, then calls ``recount``)."""
        self.slices: dict[str, Any] = {} if slices is None else slices
        self.classes: dict[str, Any] = {} if classes is None else classes
        self.rules: dict[str, Any] = {} if rules is None else rules
        self.capacity = SliceCapacity({})
        self._setting: tuple[tuple[str, ...], tuple[tuple[str, Fraction], ...]] | None = None
        self._matches: tuple[tuple[str, DeviceMatch], ...] = ()
        self._problems: dict[str, str] = {}
        self._rules: list[TaintSelector] = []
        self._counts: dict[str, SliceCount] = {}
        self._pool_slices: dict[tuple[str, str], set[str]] = {}
        self._pools: dict[tuple[str, str], PoolCount] = {}
        self._node_pools: dict[str, set[tuple[str, str]]] = {}
        self._gpus: dict[str, int] = {}
        self._tainted: dict[str, int] = {}
        self._unattributed = 0
        self._shape_refs: dict[str, dict[ClassShape, int]] = {}
        self._shapes: dict[str, tuple[ClassShape, ...]] = {}

    def recount(
        self,
        gpu_classes: Collection[str],
        mig_fractions: Mapping[str, Fraction],
        changed_slice: str | None = None,
    ) -> set[tuple[str, str]] | None:
        """Derive the capacity again after a change; ``changed_slice``: only that slice
        changed (its pool is combined again). Returns the pools whose devices changed,
        or None after a full recount (classes, rules or settings changed)."""
        setting = (tuple(sorted(gpu_classes)), tuple(sorted(mig_fractions.items())))
        if changed_slice is None or setting != self._setting:
            self._setting = setting
            self._matches, self._problems = gpu_matches(self.classes, gpu_classes)
            self._rules = [r for r in map(taint_rule_selector, self.rules.values()) if r]
            self._counts = {n: count_slice(rs, self._matches) for n, rs in self.slices.items()}
            self._pool_slices = {}
            for name, c in self._counts.items():
                self._pool_slices.setdefault(c.pool, set()).add(name)
            self._pools, self._node_pools = {}, {}
            self._gpus, self._tainted, self._unattributed = {}, {}, 0
            self._shape_refs, self._shapes = {}, {}
            for pool in list(self._pool_slices):
                self._combine(pool, mig_fractions)
            self._publish()
            return None
        touched: set[tuple[str, str]] = set()
        old = self._counts.pop(changed_slice, None)
        if old is not None:
            touched.add(old.pool)
            self._pool_slices.get(old.pool, set()).discard(changed_slice)
        rs = self.slices.get(changed_slice)
        if rs is not None:
            new = count_slice(rs, self._matches)
            self._counts[changed_slice] = new
            self._pool_slices.setdefault(new.pool, set()).add(changed_slice)
            touched.add(new.pool)
        changed = {pool for pool in touched if self._combine(pool, mig_fractions)}
        self._publish()
        return changed

    def _combine(self, pool: tuple[str, str], mig_fractions: Mapping[str, Fraction]) -> bool:
        """Combine ``pool`` again and move the totals; whether its devices changed."""
        before = self._pools.pop(pool, None)
        names = self._pool_slices.get(pool)
        got = None
        if names:
            got = combine_pool((self._counts[n] for n in names), mig_fractions, self._rules)
            self._pools[pool] = got
        else:
            self._pool_slices.pop(pool, None)
        nodes: set[str] = set()
        for pc, sign in ((before, -1), (got, 1)):
            if pc is None:
                continue
            self._unattributed += sign * pc.unattributed
            for node in {*pc.live, *pc.dead}:
                nodes.add(node)
                held = self._node_pools.setdefault(node, set())
                if sign > 0:
                    held.add(pool)
                else:
                    held.discard(pool)
            for cls, shapes in pc.shapes.items():
                refs = self._shape_refs.setdefault(cls, {})
                for shape in shapes:
                    refs[shape] = refs.get(shape, 0) + sign
                    if refs[shape] <= 0:
                        del refs[shape]
                self._shapes[cls] = tuple(sorted(refs, key=repr))
                if not refs:
                    del self._shape_refs[cls], self._shapes[cls]
        for node in nodes:
            live: set[str] = set()
            dead: set[str] = set()
            for key in self._node_pools.get(node, ()):
                pc = self._pools[key]
                live |= pc.live.get(node, frozenset())
                dead |= pc.dead.get(node, frozenset())
            self._gpus.pop(node, None)
            self._tainted.pop(node, None)
            if live:
                self._gpus[node] = len(live)
            if dead - live:
                self._tainted[node] = len(dead - live)
            if not self._node_pools.get(node):
                self._node_pools.pop(node, None)
        return (before.devices if before else {}) != (got.devices if got else {})

    def _publish(self) -> None:
        self.capacity = SliceCapacity(
            dict(self._gpus),
            dict(self._tainted),
            self._unattributed,
            dict(self._problems),
            DeviceIndex(dict(self._pools)),
            dict(self._shapes),
        )


def slice_capacity(
    slices: Iterable[Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    gpu_classes: Collection[str] = GPU_DEVICE_CLASSES,
    mig_fractions: Mapping[str, Fraction] | None = None,
    taint_rules: Iterable[Mapping[str, Any]] = (),
) -> SliceCapacity:
    """Physical GPUs per node: the devices that one of the ``gpu_classes`` (DeviceClass
    objects by name in ``classes``) selects in the node-local pools of ``slices``, from
    each pool's newest generation (``count_slice``, ``combine_slices``)."""
    matches, problems = gpu_matches(classes, gpu_classes)
    rules = [r for r in map(taint_rule_selector, taint_rules) if r is not None]
    return combine_slices(
        (count_slice(rs, matches) for rs in slices), problems, mig_fractions, rules
    )


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
