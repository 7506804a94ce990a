"""Resource names, columns and a pod's request vector, computed as Kubernetes does.

Two forms on purpose: ``PodDemand.amounts`` keeps exact ``Fraction`` values in natural
units (quota arithmetic, messages); ``ResourceIndex.kernel_vector`` converts once to the
kernels' float64 columns in integral canonical units (milli-GPU, millicores, bytes), so
float sums stay exact. A pod's request follows Kubernetes' ``PodRequests`` rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from fairshare import quantities
from fairshare.errors import FairshareError

GPU: Final = "nvidia.com/gpu"
CPU: Final = "cpu"
MEMORY: Final = "memory"
EPHEMERAL: Final = "ephemeral-storage"
STORAGE: Final = "storage"
DEFAULT_RESOURCES: Final = (GPU, CPU, MEMORY, EPHEMERAL, STORAGE)
MIG_PREFIX: Final = "nvidia.com/mig-"

ANN_GPU_FRACTION: Final = "fairshare.io/gpu-fraction"
ANN_GPU_MEMORY: Final = "fairshare.io/gpu-memory"
ANN_GPU_DEVICES: Final = "fairshare.io/gpu-devices"
ANN_GPU_GROUP: Final = "fairshare.io/gpu-group"
"""Set at bind on a fractional pod: the id of the shared GPU it holds a share of."""
ANN_GPU_UUID: Final = "fairshare.io/gpu-uuid"
"""Set once the handoff learned it: the UUID of the physical GPU behind the shared GPU."""
ANN_GPU_CONFIGMAP: Final = "fairshare.io/gpu-configmap"
"""Set by the webhook (handoff ``reservation``): the ConfigMap bind writes the GPU into."""
ANN_GPU_CONTAINER: Final = "fairshare.io/gpu-container"
"""Optional, set by the user: the container that gets the shared GPU (default: the first)."""
ANN_GPU_MODELS: Final = "fairshare.io/gpu-models"
"""Pod annotation: the GPU products (``nvidia.com/gpu.product`` values) a GPU pod may run on,
separated by ``|``."""
ANN_REQUEUED: Final = "fairshare.io/requeued-at"
"""Set by the extender on a pod the fair-share gate held once the gate lifts: the update
makes kube-scheduler retry the pod at once (``extender.requeue``)."""
REQUEUE_DEVICE_CLASS: Final = "requeue.fairshare.io"
"""fairshare's own DeviceClass (it selects no device): the extender annotates it with
``ANN_REQUEUED`` when kube-scheduler deleted an allocated ResourceClaim while pods it
refused for want of DRA devices wait, as DynamicResources retries those pods on a
DeviceClass update but not on a claim's deletion (``extender.requeue``)."""
NO_GPU_MODELS: Final[frozenset[str]] = frozenset()
LABEL_TENANT: Final = "fairshare.io/tenant"

MILLI_GPU: Final = 1000
"""Kernel unit of the GPU column: one device is 1000 milli-GPU."""


class DemandError(FairshareError):
    """A pod's resources or GPU annotations cannot be read."""


@dataclass(frozen=True)
class GpuDemand:
    """How a pod uses GPU devices.

    ``count`` devices, each needing ``per_device`` of a device (1 = whole device).
    ``memory`` is set when the pod asked by GPU memory; the fraction is then known
    only per node (``memory / device memory``) and ``per_device`` is 0 until resolved.
    """

    count: int = 0
    per_device: Fraction = Fraction(0)
    memory: int | None = None
    source: str = "none"  # "device", "fraction", "memory", "mig", "none"
    mig_profile: str = ""
    """The MIG profile of ``nvidia.com/mig-<profile>`` slices (source "mig")."""

    @property
    def total(self) -> Fraction:
        """GPUs in all (a fraction for shared GPUs)."""
        return self.per_device * self.count

    @property
    def is_fractional(self) -> bool:
        return self.count == 1 and 0 < self.per_device < 1

    def with_device_memory(self, device_memory: int) -> GpuDemand:
        """Resolve a GPU-memory request against a device of ``device_memory`` bytes."""
        if self.memory is None or device_memory <= 0:
            return self
        frac = min(Fraction(1), Fraction(self.memory, device_memory))
        return GpuDemand(count=1, per_device=frac, memory=self.memory, source=self.source)


@dataclass(frozen=True)
class PodDemand:
    """A pod's total request: exact amounts by resource name, plus its GPU shape."""

    amounts: Mapping[str, Fraction]
    gpu: GpuDemand = field(default_factory=GpuDemand)

    def get(self, name: str) -> Fraction:
        return self.amounts.get(name, Fraction(0))

    @property
    def wants_gpu(self) -> bool:
        return self.gpu.count > 0 or self.gpu.memory is not None


MAX_AMOUNT: Final = Fraction(2**63 - 1)
"""Largest amount Kubernetes can represent (Quantity.Value is an int64)."""


def gpu_models(annotations: object) -> frozenset[str]:
    """The GPU products a pod's ``fairshare.io/gpu-models`` annotation lists (blanks around
    the names dropped; the webhook refuses malformed lists, this reading only skips empties).

    Every pod without one shares one empty set (``NO_GPU_MODELS``), not one per pod."""
    listed = annotations.get(ANN_GPU_MODELS) if isinstance(annotations, Mapping) else None
    if not listed:
        return NO_GPU_MODELS
    return frozenset(m.strip() for m in str(listed).split("|") if m.strip()) or NO_GPU_MODELS


def _checked(where: str, name: str, raw: object) -> Fraction:
    try:
        amount = quantities.parse_quantity(raw)  # type: ignore[arg-type]
    except (quantities.QuantityError, TypeError) as exc:
        raise DemandError(f"{where}: resources {name}: {exc}") from exc
    if amount < 0:
        raise DemandError(f"{where}: resources {name}: {raw!r} must not be negative")
    if amount > MAX_AMOUNT:
        raise DemandError(f"{where}: resources {name}: {raw!r} is too large")
    return amount


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DemandError(f"{what} must be an object, got {type(value).__name__}")
    return value


def _container_requests(container: object) -> dict[str, Fraction]:
    if not isinstance(container, Mapping):
        raise DemandError(f"a container entry must be an object, got {type(container).__name__}")
    where = f"container {container.get('name', '?')!r}"
    res = _mapping(container.get("resources"), f"{where}: resources")
    requests = _mapping(res.get("requests"), f"{where}: resources.requests")
    limits = _mapping(res.get("limits"), f"{where}: resources.limits")
    out: dict[str, Fraction] = {}
    for name in set(requests) | set(limits):
        raw = requests[name] if name in requests else limits[name]
        out[str(name)] = _checked(where, str(name), raw)
    return out


def _containers(spec: Mapping[str, Any], key: str) -> list[Any]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DemandError(f"spec.{key} must be a list, got {type(value).__name__}")
    return value


def _add(into: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, Fraction(0)) + v


def _max_into(into: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    for k, v in other.items():
        if v > into.get(k, Fraction(0)):
            into[k] = v


def pod_resource_requests(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """Per-resource request of a pod spec, by Kubernetes' PodRequests rule."""
    reqs: dict[str, Fraction] = {}
    for c in _containers(spec, "containers"):
        _add(reqs, _container_requests(c))
    sidecars: dict[str, Fraction] = {}
    init_max: dict[str, Fraction] = {}
    for c in _containers(spec, "initContainers"):
        creq = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            _add(reqs, creq)
            _add(sidecars, creq)
            _max_into(init_max, sidecars)
        else:
            step = dict(sidecars)
            _add(step, creq)
            _max_into(init_max, step)
    _max_into(reqs, init_max)
    overhead = _mapping(spec.get("overhead"), "spec.overhead")
    for k, raw in overhead.items():
        reqs[str(k)] = reqs.get(str(k), Fraction(0)) + _checked("overhead", str(k), raw)
    for k, total in reqs.items():
        if total > MAX_AMOUNT:
            raise DemandError(f"resources {k}: the pod's total {total} is too large")
    return reqs


def gpu_demand(
    requests: Mapping[str, Fraction],
    annotations: Mapping[str, str],
    *,
    mig: Mapping[str, Fraction],
) -> GpuDemand:
    """The pod's GPU shape: whole devices, a fraction, GPU memory, or MIG slices.

    Whole devices (``nvidia.com/gpu``) win over annotations, except ``nvidia.com/gpu: 1``
    with a share annotation: that is the one replica HAMi's device plugin hands a shared
    GPU's pod (handoff ``hami``; the webhook refuses the pair otherwise), so the share
    counts. A ``fairshare.io/gpu-fraction`` must lie in (0, 1]; ``fairshare.io/gpu-memory``
    is a quantity; a MIG resource ``nvidia.com/mig-<profile>: n`` is n slices of the
    profile's configured fraction.
    """
    whole = requests.get(GPU, Fraction(0))
    if whole == 1 and (ANN_GPU_FRACTION in annotations or ANN_GPU_MEMORY in annotations):
        whole = Fraction(0)
    if whole:
        if whole.denominator != 1 or whole < 0:
            raise DemandError(f"{GPU} must be a whole number of devices, got {whole}")
        return GpuDemand(count=int(whole), per_device=Fraction(1), source="device")
    for name, n in sorted(requests.items()):
        if name.startswith(MIG_PREFIX) and n > 0:
            profile = name[len(MIG_PREFIX) :]
            if profile not in mig:
                raise DemandError(f"unknown MIG profile {profile!r} (resource {name})")
            if n.denominator != 1:
                raise DemandError(f"{name} must be a whole number, got {n}")
            return GpuDemand(
                count=int(n), per_device=mig[profile], source="mig", mig_profile=profile
            )
    if ANN_GPU_FRACTION in annotations:
        raw = annotations[ANN_GPU_FRACTION]
        try:
            frac = quantities.parse_fraction(raw)
        except (quantities.QuantityError, ValueError) as exc:
            raise DemandError(f"annotation {ANN_GPU_FRACTION}={raw!r}: {exc}") from exc
        if not 0 < frac <= 1:
            raise DemandError(f"annotation {ANN_GPU_FRACTION}={raw!r}: must be in (0, 1]")
        return GpuDemand(count=1, per_device=frac, source="fraction")
    if ANN_GPU_MEMORY in annotations:
        raw = annotations[ANN_GPU_MEMORY]
        try:
            mem = quantities.parse_quantity(raw)
        except quantities.QuantityError as exc:
            raise DemandError(f"annotation {ANN_GPU_MEMORY}={raw!r}: {exc}") from exc
        if mem <= 0:
            raise DemandError(f"annotation {ANN_GPU_MEMORY}={raw!r}: must be > 0")
        return GpuDemand(count=1, memory=quantities.to_int(mem), source="memory")
    return GpuDemand()


def pod_demand(
    pod: Mapping[str, Any],
    *,
    mig: Mapping[str, Fraction],
    pvc_sizes: Mapping[str, Fraction] | None = None,
    requests: Mapping[str, Fraction] | None = None,
) -> PodDemand:
    """A pod's request vector (exact) and GPU shape.

    ``pvc_sizes`` maps claim names in the pod's namespace to their storage request;
    the pod's ``storage`` is the sum over the claims it mounts that are known.
    The ``nvidia.com/gpu`` amount is replaced by the GPU total (a fraction for
    shared GPUs) and MIG resources are folded into it. ``requests``: the pod's
    ``pod_resource_requests``, when the caller has parsed them already (not read again).
    """
    spec = _mapping(pod.get("spec"), "spec")
    meta = _mapping(pod.get("metadata"), "metadata")
    reqs = pod_resource_requests(spec) if requests is None else dict(requests)
    gpu = gpu_demand(reqs, meta.get("annotations") or {}, mig=mig)
    for name in [n for n in reqs if n.startswith(MIG_PREFIX)]:
        del reqs[name]
    if gpu.count:
        reqs[GPU] = gpu.total
    else:
        reqs.pop(GPU, None)
    if pvc_sizes:
        storage = Fraction(0)
        for vol in spec.get("volumes") or ():
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and claim in pvc_sizes:
                storage += pvc_sizes[claim]
        if storage:
            reqs[STORAGE] = reqs.get(STORAGE, Fraction(0)) + storage
    return PodDemand(amounts={k: v for k, v in reqs.items() if v}, gpu=gpu)


def device_memory_for(
    node: str | None, by_node: Mapping[str, int], largest: int | None
) -> int | None:
    """The device memory (bytes) a GPU-memory request resolves against.

    The memory of the node the pod is bound to when that is known, else the largest
    device memory known (a pending pod, or a node without a device-memory label), else
    None (no device size known anywhere).
    """
    if node:
        mem = by_node.get(node, 0)
        if mem > 0:
            return mem
    return largest if largest and largest > 0 else None


def counted_demand(demand: PodDemand, device_memory: int | None) -> PodDemand:
    """A pod's demand as usage counts it, in quotas, reservations and shares alike.

    A ``fairshare.io/gpu-memory`` request counts ``memory / device_memory`` of a GPU
    (at most one), with ``device_memory`` from :func:`device_memory_for`, or a whole GPU
    when no device size is known (never under-counted). Every other demand counts as
    :func:`pod_demand` reads it. Only ``amounts`` change: ``gpu`` keeps the request as
    asked, so placement still resolves it per node.
    """
    g = demand.gpu
    if g.memory is None or g.per_device:
        return demand
    share = Fraction(1)
    if device_memory and device_memory > 0:
        share = min(Fraction(1), Fraction(g.memory, device_memory))
    return PodDemand(amounts={**demand.amounts, GPU: share * g.count}, gpu=g)


def pod_usage(
    pod: Mapping[str, Any],
    *,
    mig: Mapping[str, Fraction],
    device_memory: Mapping[str, int] | None = None,
    largest_memory: int | None = None,
    requests: Mapping[str, Fraction] | None = None,
) -> PodDemand:
    """What one pod counts in its tenant's usage: the one rule for admission,
    reservations, the webhook's watch and the extender's shares.

    ``device_memory`` maps node names to their GPU device memory (bytes) and
    ``largest_memory`` is the largest known; a GPU-memory request is resolved against the
    node in ``spec.nodeName`` (see :func:`device_memory_for` and :func:`counted_demand`).
    ``requests`` as in :func:`pod_demand`. Raises ``DemandError`` like :func:`pod_demand`.
    """
    demand = pod_demand(pod, mig=mig, requests=requests)
    if demand.gpu.memory is None:
        return demand
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    where = device_memory_for(
        node if isinstance(node, str) else None, device_memory or {}, largest_memory
    )
    return counted_demand(demand, where)


def to_kernel_units(name: str, amount: Fraction) -> float:
    """Exact amount (natural units) → kernel float in canonical integral units.

    GPU → milli-GPU, cpu → millicores (both rounded up, as Kubernetes' MilliValue),
    everything else → whole units (bytes), rounded up.
    """
    if name in (GPU, CPU):
        return float(-((-amount * 1000) // 1))
    return float(-((-amount) // 1))


def from_kernel_units(name: str, value: float) -> Fraction:
    """Inverse of :func:`to_kernel_units` (exact for integral kernel values; others, such
    as the 142.857 milli-GPU of a 1/7 MIG partition or a sum's float error, round to the
    nearest unit instead of truncating)."""
    if name in (GPU, CPU):
        return Fraction(round(value), 1000)
    return Fraction(round(value))


@dataclass(frozen=True)
class ResourceIndex:
    """The DRF dimensions in column order: name → column of every N×R array."""

    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"duplicate resource names: {self.names}")

    @property
    def width(self) -> int:
        return len(self.names)

    def column(self, name: str) -> int:
        return self.names.index(name)

    def has(self, name: str) -> bool:
        return name in self.names

    def kernel_vector(self, amounts: Mapping[str, Fraction]) -> list[float]:
        """Exact amounts → a kernel row (unknown names are ignored)."""
        return [to_kernel_units(n, amounts.get(n, Fraction(0))) for n in self.names]

    def amounts(self, row: Sequence[float]) -> dict[str, Fraction]:
        return {n: from_kernel_units(n, v) for n, v in zip(self.names, row, strict=True)}


def add_amounts(into: dict[str, Fraction], amounts: Mapping[str, Fraction], sign: int = 1) -> None:
    """``into += sign * amounts`` per resource; a resource that reaches zero is dropped,
    so running totals never keep empty entries."""
    for name, amount in amounts.items():
        total = into.get(name, Fraction(0)) + sign * amount
        if total:
            into[name] = total
        else:
            into.pop(name, None)


def sum_amounts(items: Iterable[Mapping[str, Fraction]]) -> dict[str, Fraction]:
    """Resource-wise sum of exact amounts."""
    total: dict[str, Fraction] = {}
    for item in items:
        _add(total, item)
    return total
