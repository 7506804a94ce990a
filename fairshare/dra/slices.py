"""GPUs published in ResourceSlices (``resource.k8s.io/v1``): which devices a GPU
DeviceClass selects, what part of a physical GPU each is (a whole GPU, a MIG partition by
its counters, a share of a shareable device by its capacity), device taints, and pools
combined into a cluster's capacity.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from fairshare import quantities

GPU_DEVICE_CLASS: Final = "gpu.nvidia.com"
"""Default DRA device class whose devices are GPUs (NVIDIA's DRA driver)."""
GPU_DEVICE_CLASSES: Final = frozenset({GPU_DEVICE_CLASS})
ALL_DEVICES_DEFAULT: Final = 8
"""GPUs an unallocated ``allocationMode: All`` request counts as (one full GPU node)."""
API_VERSION: Final = "resource.k8s.io/v1"
KIND_CLAIM: Final = "ResourceClaim"
KIND_TEMPLATE: Final = "ResourceClaimTemplate"


KIND_SLICE: Final = "ResourceSlice"
KIND_DEVICE_CLASS: Final = "DeviceClass"
KIND_TAINT_RULE: Final = "DeviceTaintRule"


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else []


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
    warned: bool = False
    """An informational taint (effect ``None``, or one kube-scheduler does not know)."""


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
    warned: Mapping[str, int] = field(default_factory=dict)
    """Node name -> GPUs in service with an informational device taint (effect ``None``):
    a health warning, a lower score, never kept off."""


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
                warned=any(
                    _map(t).get("effect") not in TAINT_EFFECTS for t in _list(device.get("taints"))
                ),
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


def taint_rule_warning(rule: Mapping[str, Any]) -> TaintSelector | None:
    """The devices a ``DeviceTaintRule`` marks with an informational taint (effect
    ``None`` or unknown: no device is kept off, fairshare lowers their node's health
    score), or None when the rule's effect keeps claims off or it selects nothing."""
    spec = _map(rule.get("spec"))
    selector = spec.get("deviceSelector")
    if not isinstance(selector, Mapping) or "taint" not in spec:
        return None
    if _map(spec.get("taint")).get("effect") in TAINT_EFFECTS:
        return None
    got = [selector.get(k) for k in ("driver", "pool", "device")]
    return (
        got[0] if isinstance(got[0], str) and got[0] else None,
        got[1] if isinstance(got[1], str) and got[1] else None,
        got[2] if isinstance(got[2], str) and got[2] else None,
    )


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
    warned: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Node -> its physical GPUs in service with an informational taint."""


def combine_pool(
    counts: Iterable[SliceCount],
    mig_fractions: Mapping[str, Fraction] | None = None,
    rules: Sequence[TaintSelector] = (),
    warn_rules: Sequence[TaintSelector] = (),
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
    warned: dict[str, set[str]] = {}
    unattributed = 0
    shapes: dict[str, set[ClassShape]] = {}
    for c in counts:
        driver, pool = c.pool
        for raw in c.devices:
            if rules and not raw.tainted and _tainted_by((driver, pool, raw.name), rules):
                raw = dataclasses.replace(raw, tainted=True)
            if warn_rules and not raw.warned and _tainted_by((driver, pool, raw.name), warn_rules):
                raw = dataclasses.replace(raw, warned=True)
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
            if raw.warned and not raw.tainted:
                warned.setdefault(raw.node, set()).add(gpu)
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
        {n: frozenset(k & live.get(n, set())) for n, k in warned.items()},
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
    warned: dict[str, set[str]] = {}
    shapes: dict[str, set[ClassShape]] = {}
    unattributed = 0
    for pc in pools.values():
        for node, keys in pc.warned.items():
            warned.setdefault(node, set()).update(keys)
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
        {node: len(keys) for node, keys in warned.items() if keys},
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
