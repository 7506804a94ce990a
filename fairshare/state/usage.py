"""Per-tenant usage kept up to date from cluster events: what the webhook counts.

``UsageTracker`` is a state-source sink and answers the webhook's ``TenantUsageView``.
Usage is kept per namespace (a pod's contribution remembered by uid, so an event
subtracts exactly what was added) and a tenant's is the sum over its namespaces, so a
reload that moves a namespace needs no recount. Counted: non-terminal pods, bound or not
(``resources.pod_usage``; GPU-memory pods again when device memory changes), PVC
``storage`` requests, and the GPUs of DRA claims, once per claim from creation to
deletion. A pod that cannot be read counts as nothing and is listed in ``unreadable``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from fairshare import dra, quantities, resources, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.resources import GPU, STORAGE, DemandError, add_amounts
from fairshare.state import objects
from fairshare.state.cluster import LABEL_GPU_MEMORY

Amounts = dict[str, Fraction]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


CLAIM_SEEN: Final = "claim seen"
"""The listener event of a ResourceClaim now counted (its name is "ns/name")."""


def _key(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def claim_storage(pvc: Mapping[str, Any]) -> Fraction:
    """A PVC's ``spec.resources.requests.storage`` (0 when absent or unreadable): what
    admission and the extender count against the tenant's ``storage``."""
    spec = pvc.get("spec")
    res = spec.get("resources") if isinstance(spec, Mapping) else None
    req = res.get("requests") if isinstance(res, Mapping) else None
    raw = req.get("storage") if isinstance(req, Mapping) else None
    if raw is None:
        return Fraction(0)
    try:
        size = quantities.parse_quantity(raw)
    except (quantities.QuantityError, TypeError):
        return Fraction(0)
    return size if size > 0 else Fraction(0)


@dataclass
class UsageTracker:
    """Live namespace labels and per-namespace usage, fed by a state source."""

    config: Callable[[], FairShareConfig]
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    by_namespace: dict[str, Amounts] = field(default_factory=dict)
    pods: dict[str, tuple[str, Amounts]] = field(default_factory=dict)
    pod_names: dict[str, str] = field(default_factory=dict)  # "ns/name" -> uid key
    claims: dict[str, tuple[str, Amounts]] = field(default_factory=dict)
    device_memory: dict[str, int] = field(default_factory=dict)
    resource_claims: dict[str, tuple[str, Amounts]] = field(default_factory=dict)
    """DRA ResourceClaims by uid: (namespace, {nvidia.com/gpu: devices})."""
    claim_objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each counted ResourceClaim by uid, counted again when the slices' devices change."""
    resource_slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    device_classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    slice_devices: dra.SliceCapacity = field(default_factory=lambda: dra.SliceCapacity({}))
    """The GPU devices the ResourceSlices publish (a MIG partition counts its fraction, a
    share of a shareable GPU its part: ``dra.claim_gpus``)."""
    _book: dra.SliceBook | None = field(default=None, init=False, repr=False)
    unreadable: dict[str, str] = field(default_factory=dict)
    memory_pods: dict[str, tuple[str, resources.PodDemand, str | None]] = field(
        default_factory=dict
    )
    """Pods that ask by GPU memory, by uid: (namespace, demand, node). What they count
    depends on device memory, so they are recounted when a node's device memory changes."""
    listeners: list[Callable[[str, str], None]] = field(default_factory=list)
    """Called with ("ns/name", event) when a pod (event "seen") or a ResourceClaim (event
    ``CLAIM_SEEN``) is counted, for reservation release."""
    _max_memory: tuple[int | None] | None = field(default=None, init=False, repr=False)

    # -- sink ------------------------------------------------------------------

    def on_resync(self, kind: str, objects: list[dict[str, Any]]) -> None:
        """Replace everything known for ``kind`` with ``objects``."""
        if kind == "Pod":
            self.pods.clear()
            self.pod_names.clear()
            self.unreadable.clear()
            self.memory_pods.clear()
            self._rebuild_namespaces()
        elif kind == "PersistentVolumeClaim":
            self.claims.clear()
            self._rebuild_namespaces()
        elif kind == dra.KIND_CLAIM:
            self.resource_claims.clear()
            self.claim_objects.clear()
            self._rebuild_namespaces()
        elif kind in (dra.KIND_SLICE, dra.KIND_DEVICE_CLASS):
            held = self.resource_slices if kind == dra.KIND_SLICE else self.device_classes
            held.clear()
            held.update((str(_meta(o).get("name", "")), o) for o in objects)
            self._recount_devices()
            return
        elif kind == "Namespace":
            self.labels.clear()
        elif kind == "Node":
            before = dict(self.device_memory)
            self.device_memory.clear()
            self._max_memory = None
            for obj in objects:
                self._node(obj, deleted=False, recount=False)
            if before != self.device_memory:
                self._recount_memory_pods()
            return
        for obj in objects:
            self.on_event(kind, "ADDED", obj)

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """Apply one watch event (ADDED / MODIFIED / DELETED)."""
        deleted = event_type == "DELETED"
        if kind == "Pod":
            self._pod(obj, deleted=deleted)
        elif kind == "PersistentVolumeClaim":
            self._claim(obj, deleted=deleted)
        elif kind == dra.KIND_CLAIM:
            self._resource_claim(obj, deleted=deleted)
        elif kind == "Namespace":
            name = str(_meta(obj).get("name", ""))
            if deleted:
                self.labels.pop(name, None)
            else:
                self.labels[name] = {
                    str(k): str(v) for k, v in (_meta(obj).get("labels") or {}).items()
                }
        elif kind == "Node":
            self._node(obj, deleted=deleted, recount=True)
        elif kind in (dra.KIND_SLICE, dra.KIND_DEVICE_CLASS):
            held = self.resource_slices if kind == dra.KIND_SLICE else self.device_classes
            name = str(_meta(obj).get("name", ""))
            if deleted:
                held.pop(name, None)
            else:
                held[name] = obj
            self._recount_devices(name if kind == dra.KIND_SLICE else None)

    def dra_devices(self) -> dra.SliceCapacity:
        """The GPU devices the ResourceSlices publish (for a claim judged at admission)."""
        return self.slice_devices

    def _recount_devices(self, changed_slice: str | None = None) -> None:
        """Derive the device index again (``changed_slice``: only that slice changed);
        count the claims again if the devices changed."""
        if self._book is None:
            self._book = dra.SliceBook(self.resource_slices, self.device_classes)
            changed_slice = None
        config = self.config()
        changed = self._book.recount(
            config.dra.gpu_device_classes, config.mig_fractions(), changed_slice
        )
        self.slice_devices = self._book.capacity
        if changed is None or changed:
            for claim in list(self.claim_objects.values()):
                self._resource_claim(claim, deleted=False, seen=False)

    def _node(self, node: dict[str, Any], *, deleted: bool, recount: bool) -> None:
        name = str(_meta(node).get("name", ""))
        raw = str((_meta(node).get("labels") or {}).get(LABEL_GPU_MEMORY, ""))
        mem = int(raw) * 1024 * 1024 if raw.isdigit() and not deleted else 0
        if mem == self.device_memory.get(name, 0):
            return  # heartbeats and other label changes: nothing to recount
        if mem:
            self.device_memory[name] = mem
        else:
            self.device_memory.pop(name, None)
        self._max_memory = None
        if recount:
            self._recount_memory_pods()

    def _memory_usage(self, demand: resources.PodDemand, node: str | None) -> Amounts:
        where = resources.device_memory_for(node, self.device_memory, self.max_device_memory())
        return dict(resources.counted_demand(demand, where).amounts)

    def _recount_memory_pods(self) -> None:
        """Device memory changed: GPU-memory pods count against the new sizes."""
        for key, (ns, demand, node) in self.memory_pods.items():
            old = self.pods.get(key)
            if old is None:
                continue
            amounts = self._memory_usage(demand, node)
            if amounts != old[1]:
                add_amounts(self.by_namespace.setdefault(ns, {}), old[1], -1)
                add_amounts(self.by_namespace.setdefault(ns, {}), amounts, +1)
                self.pods[key] = (ns, amounts)

    def _rebuild_namespaces(self) -> None:
        self.by_namespace = {}
        tables = (self.pods, self.claims, self.resource_claims)
        for ns, amounts in [entry for table in tables for entry in table.values()]:
            add_amounts(self.by_namespace.setdefault(ns, {}), amounts, +1)

    def _forget(self, table: dict[str, tuple[str, Amounts]], key: str) -> None:
        old = table.pop(key, None)
        if old is not None:
            add_amounts(self.by_namespace.setdefault(old[0], {}), old[1], -1)

    def _pod(self, pod: dict[str, Any], *, deleted: bool) -> None:
        key = _key(pod)
        meta = _meta(pod)
        ns = str(meta.get("namespace", ""))
        name = f"{ns}/{meta.get('name', '')}"
        self._forget(self.pods, key)
        self.unreadable.pop(key, None)
        self.memory_pods.pop(key, None)
        if deleted or objects.is_terminal(pod):
            self.pod_names.pop(name, None)
            return
        try:
            demand = resources.pod_demand(pod, mig=self.config().mig_fractions())
            amounts = dict(demand.amounts)
            if ns == self.config().gpu_sharing.reservation.namespace:
                amounts = {}  # GPU reservation pods: their shared GPU's pods count it
            elif demand.gpu.memory is not None:
                # Read by the one rule admission and reservations use (resources.pod_usage).
                node = (pod.get("spec") or {}).get("nodeName") or None
                self.memory_pods[key] = (ns, demand, str(node) if node else None)
                amounts = self._memory_usage(demand, self.memory_pods[key][2])
        except DemandError as exc:
            self.unreadable[key] = str(exc)
            amounts = {}
        self.pods[key] = (ns, amounts)
        self.pod_names[name] = key
        add_amounts(self.by_namespace.setdefault(ns, {}), amounts, +1)
        for listener in self.listeners:
            listener(name, "seen")

    def _claim(self, pvc: dict[str, Any], *, deleted: bool) -> None:
        key = _key(pvc)
        self._forget(self.claims, key)
        if deleted:
            return
        ns = str(_meta(pvc).get("namespace", ""))
        size = claim_storage(pvc)
        amounts = {STORAGE: size} if size else {}
        self.claims[key] = (ns, amounts)
        add_amounts(self.by_namespace.setdefault(ns, {}), amounts, +1)

    def _resource_claim(self, claim: dict[str, Any], *, deleted: bool, seen: bool = True) -> None:
        key = _key(claim)
        self._forget(self.resource_claims, key)
        self.claim_objects.pop(key, None)
        if deleted:
            return
        ns = str(_meta(claim).get("namespace", ""))
        policy = self.config().dra
        n = dra.claim_gpus(
            claim,
            device_classes=frozenset(policy.gpu_device_classes),
            all_devices=policy.all_devices_count,
            devices=self.slice_devices,
        )
        self.claim_objects[key] = claim
        amounts = {GPU: n} if n else {}
        self.resource_claims[key] = (ns, amounts)
        add_amounts(self.by_namespace.setdefault(ns, {}), amounts, +1)
        if not seen:
            return
        # Now counted here: the admission's reservation of the claim must go, or the
        # claim counts twice until the reservation's TTL.
        name = f"{ns}/{_meta(claim).get('name', '')}"
        for listener in self.listeners:
            listener(name, CLAIM_SEEN)

    # -- TenantUsageView -------------------------------------------------------

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        return self.labels.get(namespace, {})

    def _tenant_of(self, namespace: str) -> str | None:
        return tenancy.resolve_tenant(
            namespace, self.labels.get(namespace, {}), self.config()
        ).tenant

    def tenant_namespaces(self, tenant: str) -> Sequence[str]:
        """Namespaces (known from labels or usage) that resolve to ``tenant``, sorted."""
        names = set(self.labels) | set(self.by_namespace)
        return tuple(sorted(ns for ns in names if self._tenant_of(ns) == tenant))

    def tenant_usage(self, tenant: str) -> Mapping[str, Fraction]:
        total: Amounts = {}
        for ns in self.tenant_namespaces(tenant):
            add_amounts(total, self.by_namespace.get(ns, {}), +1)
        return total

    def max_device_memory(self) -> int | None:
        # Cached: asked twice per admission, changed only by node events.
        if self._max_memory is None:
            self._max_memory = (max(self.device_memory.values(), default=None),)
        return self._max_memory[0]

    def has_pod(self, namespace: str, name: str) -> bool:
        return f"{namespace}/{name}" in self.pod_names
