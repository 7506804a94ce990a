"""DRA node pools in the simulator: GPUs published in ResourceSlices, claims, and the
allocation kube-scheduler's DynamicResources makes.

A DRA pool's nodes have no ``nvidia.com/gpu`` allocatable; their GPUs are ResourceSlice
devices shaped as NVIDIA's DRA driver publishes them (whole, MIG-partitionable and
shareable GPUs; classes ``gpu.nvidia.com`` and ``mig.nvidia.com``). Counting is
``fairshare.dra``'s, the ledger the extender's (``extender.claims``). ``Allocator``
stands in for DynamicResources (first fit in slice order): fairshare allocates no DRA
devices, but the simulator must, to know which nodes kube-scheduler would offer. One
module because the slices, the allocator that reads them back and the pool that binds
claims through both are one model.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from fairshare import cluster_shares, dra, eligibility, fairness, pipeline, quantities, resources
from fairshare.placement import PodRequest
from fairshare.resources import GPU
from fairshare.simulator.engine import Outcome, Simulation
from fairshare.state import objects

DRIVER: Final = "gpu.nvidia.com"
GPU_CLASS: Final = "gpu.nvidia.com"
MIG_CLASS: Final = "mig.nvidia.com"
API: Final = "resource.k8s.io/v1"
GROUP_PREFIX: Final = objects.DRA_GROUP_PREFIX
"""Shared-GPU group of a physical GPU's parts (``objects.DRA_GROUP_PREFIX``)."""
GPU_MEMORY: Final = "80Gi"
GPU_SMS: Final = 98
MEMORY_SLICES: Final = 8


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile of an 80 GB A100/H100: memory slices, multiprocessors, memory, and
    the memory slices its placements start at."""

    gi: int
    size: int
    sms: int
    memory: str
    starts: tuple[int, ...]


MIG_PROFILES: Final = {
    "1g.10gb": MigProfile(19, 1, 14, "9856Mi", (0, 1, 2, 3, 4, 5, 6)),
    "2g.20gb": MigProfile(14, 2, 28, "19968Mi", (0, 2, 4)),
    "3g.40gb": MigProfile(9, 4, 42, "39424Mi", (0, 4)),
}


def device_classes() -> dict[str, dict[str, Any]]:
    """The DeviceClasses of NVIDIA's chart (full GPUs map ``nvidia.com/gpu``)."""

    def one(name: str, type_: str, extended: str | None) -> dict[str, Any]:
        expr = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{type_}'"
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expr}}]}
        if extended:
            spec["extendedResourceName"] = extended
        return {"apiVersion": API, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}

    return {GPU_CLASS: one(GPU_CLASS, "gpu", GPU), MIG_CLASS: one(MIG_CLASS, "mig", None)}


def _s(value: str) -> dict[str, str]:
    return {"string": value}


def _slots(start: int, size: int) -> dict[str, dict[str, str]]:
    return {f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)}


def _gpu(node: str, minor: int, type_: str = "gpu") -> dict[str, Any]:
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": _s(type_),
            "uuid": _s(f"GPU-{node}-{minor}"),
            "productName": _s("NVIDIA A100-SXM4-80GB"),
        },
        "capacity": {"memory": {"value": GPU_MEMORY}},
    }


def node_slices(
    node: str, *, gpus: int = 0, partitionable: int = 0, shareable: int = 0
) -> list[dict[str, Any]]:
    """The ResourceSlices of one node's pool: ``gpus`` whole GPUs, then ``partitionable``
    GPUs with their MIG placements (their counter sets in a slice of their own, as v1.35+
    publishes them), then ``shareable`` GPUs. Device names number the GPUs in that order."""
    total = gpus + partitionable + shareable
    pool = {"name": node, "generation": 1, "resourceSliceCount": 1 + (1 if partitionable else 0)}

    def slice_(suffix: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": API,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}-{suffix}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": dict(pool), **spec},
        }

    devices: list[dict[str, Any]] = [_gpu(node, i) for i in range(gpus)]
    counter_sets = []
    for i in range(gpus, gpus + partitionable):
        cset = f"gpu-{i}-counter-set"
        full = {"memory": {"value": GPU_MEMORY}, "multiprocessors": {"value": str(GPU_SMS)}}
        counter_sets.append({"name": cset, "counters": {**full, **_slots(0, MEMORY_SLICES)}})
        whole = _gpu(node, i)
        whole["capacity"] = dict(full)
        whole["consumesCounters"] = [
            {"counterSet": cset, "counters": {**full, **_slots(0, MEMORY_SLICES)}}
        ]
        devices.append(whole)
        for profile, p in MIG_PROFILES.items():
            for start in p.starts:
                used = {"memory": {"value": p.memory}, "multiprocessors": {"value": str(p.sms)}}
                devices.append(
                    {
                        "name": f"gpu-{i}-mig-{p.gi}-{start}-{p.size}",
                        "attributes": {
                            "type": _s("mig"),
                            "uuid": _s(f"MIG-{node}-{i}-{p.gi}-{start}"),
                            "parentUUID": _s(f"GPU-{node}-{i}"),
                            "profile": _s(profile),
                        },
                        "capacity": dict(used),
                        "consumesCounters": [
                            {"counterSet": cset, "counters": {**used, **_slots(start, p.size)}}
                        ],
                    }
                )
    for i in range(gpus + partitionable, total):
        dev = _gpu(node, i)
        dev["allowMultipleAllocations"] = True
        dev["capacity"] = {
            "memory": {
                "value": GPU_MEMORY,
                "requestPolicy": {
                    "default": GPU_MEMORY,
                    "validRange": {"min": "1Gi", "max": GPU_MEMORY, "step": "1Gi"},
                },
            }
        }
        devices.append(dev)
    out = [slice_("devices", {"devices": devices})]
    if counter_sets:
        out.insert(0, slice_("counters", {"sharedCounters": counter_sets}))
    return out


def claim_object(
    name: str, namespace: str, *, count: int = 1, mig: str | None = None, memory: str | None = None
) -> dict[str, Any]:
    """A ResourceClaim for ``count`` full GPUs, MIG partitions of profile ``mig``, or
    shares of ``memory`` of a shareable GPU."""
    exactly: dict[str, Any] = {"deviceClassName": MIG_CLASS if mig else GPU_CLASS}
    if count != 1:
        exactly["count"] = count
    if mig:
        expr = f"device.attributes['{DRIVER}'].profile == '{mig}'"
        exactly["selectors"] = [{"cel": {"expression": expr}}]
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def claim_pod(pod: dict[str, Any], claim: str) -> dict[str, Any]:
    """``pod`` using the ResourceClaim ``claim`` (by name) in its one container."""
    out = copy.deepcopy(pod)
    spec = out.setdefault("spec", {})
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    for c in spec.get("containers", ()):
        c.setdefault("resources", {})["claims"] = [{"name": "gpu"}]
    return out


def claim_asks(claim: Mapping[str, Any]) -> tuple[str, int, str | None, Fraction | None]:
    """(class, count, MIG profile, memory asked) of a claim ``claim_object`` made."""
    exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
    profile = None
    for sel in exactly.get("selectors", ()):
        profile = sel["cel"]["expression"].rsplit("==", 1)[1].strip().strip("'")
    asked = exactly.get("capacity", {}).get("requests", {}).get("memory")
    memory = quantities.parse_quantity(asked) if asked else None
    return exactly["deviceClassName"], int(exactly.get("count", 1)), profile, memory


# -- kube-scheduler's DynamicResources, as the simulator models it --------------------------


@dataclass
class _Device:
    pool: str
    name: str
    type: str
    profile: str
    consumes: tuple[tuple[str, dict[str, Fraction]], ...]
    shareable: bool
    capacity: Fraction


Result = dict[str, Any]
"""One ``status.allocation.devices.results`` entry."""


@dataclass
class Allocator:
    """Devices per node, what is allocated, first-fit allocation and release."""

    devices: dict[str, list[_Device]] = field(default_factory=dict)
    counters: dict[tuple[str, str], dict[str, Fraction]] = field(default_factory=dict)
    taken: set[tuple[str, str]] = field(default_factory=set)
    consumed: dict[tuple[str, str], Fraction] = field(default_factory=dict)
    shares: int = 0

    def add_slices(self, slices: Sequence[Mapping[str, Any]]) -> None:
        for rs in slices:
            spec = rs["spec"]
            pool = spec["pool"]["name"]
            for cs in spec.get("sharedCounters", ()):
                self.counters[(pool, cs["name"])] = {
                    k: quantities.parse_quantity(v["value"]) for k, v in cs["counters"].items()
                }
            for d in spec.get("devices", ()):
                attrs = d.get("attributes", {})
                consumes = tuple(
                    (
                        c["counterSet"],
                        {
                            k: quantities.parse_quantity(v["value"])
                            for k, v in c["counters"].items()
                        },
                    )
                    for c in d.get("consumesCounters", ())
                )
                self.devices.setdefault(spec["nodeName"], []).append(
                    _Device(
                        pool,
                        d["name"],
                        attrs.get("type", {}).get("string", ""),
                        attrs.get("profile", {}).get("string", ""),
                        consumes,
                        d.get("allowMultipleAllocations") is True,
                        quantities.parse_quantity(d["capacity"]["memory"]["value"]),
                    )
                )

    def _fits(self, dev: _Device, memory: Fraction | None) -> bool:
        key = (dev.pool, dev.name)
        if dev.shareable:
            room = dev.capacity - self.consumed.get(key, Fraction(0))
            return room >= (memory if memory is not None else dev.capacity)
        if key in self.taken:
            return False
        for cset, used in dev.consumes:
            left = self.counters[(dev.pool, cset)]
            if any(left.get(k, Fraction(0)) < q for k, q in used.items()):
                return False
        return True

    def _take(self, dev: _Device, memory: Fraction | None, sign: int = 1) -> None:
        key = (dev.pool, dev.name)
        if dev.shareable:
            q = memory if memory is not None else dev.capacity
            self.consumed[key] = self.consumed.get(key, Fraction(0)) + sign * q
            return
        if sign > 0:
            self.taken.add(key)
        else:
            self.taken.discard(key)
        for cset, used in dev.consumes:
            left = self.counters[(dev.pool, cset)]
            for k, q in used.items():
                left[k] -= sign * q

    def allocate(
        self, node: str, device_class: str, count: int, profile: str | None, memory: Fraction | None
    ) -> list[Result] | None:
        """Allocate ``count`` devices of ``device_class`` (of MIG ``profile``; ``memory``
        of a shareable one) on ``node``, first fit in slice order; None (nothing taken)
        when they are not there."""
        want = "mig" if device_class == MIG_CLASS else "gpu"
        got: list[tuple[_Device, Fraction | None]] = []
        for dev in self.devices.get(node, ()):
            if len(got) == count:
                break
            if dev.type != want or (profile and dev.profile != profile):
                continue
            ask = memory if dev.shareable else None
            if not dev.shareable and memory is not None and memory > dev.capacity:
                continue
            if self._fits(dev, ask):
                self._take(dev, ask)
                got.append((dev, ask))
        if len(got) < count:
            for dev, ask in got:
                self._take(dev, ask, -1)
            return None
        out: list[Result] = []
        for dev, _ in got:
            r: Result = {"request": "gpu", "driver": DRIVER, "pool": dev.pool, "device": dev.name}
            if dev.shareable:
                self.shares += 1
                q = memory if memory is not None else dev.capacity
                r["shareID"] = f"00000000-0000-0000-0000-{self.shares:012d}"
                r["consumedCapacity"] = {"memory": quantities.format_quantity(q, "bytes")}
            out.append(r)
        return out

    def can_allocate(
        self, node: str, device_class: str, count: int, profile: str | None, memory: Fraction | None
    ) -> bool:
        got = self.allocate(node, device_class, count, profile, memory)
        if got is None:
            return False
        self.release(node, got)
        return True

    def release(self, node: str, results: Sequence[Result]) -> None:
        by_key = {(d.pool, d.name): d for d in self.devices.get(node, ())}
        for r in results:
            dev = by_key[(r["pool"], r["device"])]
            q = r.get("consumedCapacity", {}).get("memory")
            self._take(dev, quantities.parse_quantity(q) if q else None, -1)


def allocated(claim: Mapping[str, Any], results: Sequence[Result]) -> dict[str, Any]:
    """``claim`` with its allocation written (as kube-scheduler's PreBind writes it)."""
    out = copy.deepcopy(dict(claim))
    out["status"] = {"allocation": {"devices": {"results": [dict(r) for r in results]}}}
    return out


# -- the ledger: claims as GPU demand and devices (the extender's rule) ---------------------
# ``objects.with_claim_gpus`` turns them into the request, as in the extender.


@dataclass
class DraSimulation(Simulation):
    """A ``Simulation`` whose nodes may publish GPUs through DRA and whose pods may use
    ResourceClaims. Placement as ``Simulation.try_place``, with kube-scheduler's
    DynamicResources in front of fairshare's filter (a DRA GPU node is a candidate only
    when the pod's claims, or its ``nvidia.com/gpu`` through KEP-5004, can be allocated
    there) and the allocation made at bind."""

    slices: list[dict[str, Any]] = field(default_factory=list)
    classes: dict[str, dict[str, Any]] = field(default_factory=device_classes)
    allocator: Allocator = field(default_factory=Allocator)
    capacity_dra: dra.SliceCapacity = field(default_factory=lambda: dra.SliceCapacity({}))
    dra_nodes: set[str] = field(default_factory=set)
    """Nodes whose GPUs are their DRA devices (no ``nvidia.com/gpu`` allocatable)."""
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each pod's claim by pod uid (as allocated once it is bound)."""
    raw: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each pod's object by uid (its claims are read from it)."""
    held: dict[str, list[Result]] = field(default_factory=dict)
    """Devices allocated to each bound pod (its claim's, or KEP-5004's generated claim's)."""
    planned: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    """The devices each bound pod's bind chose (the extender's Binding annotation)."""
    on_allocation: Callable[[str, str, list[Result]], None] | None = None
    """Called with (pod uid, node, devices) once DynamicResources has allocated a pod's
    devices, before fairshare's bind: where a driver of the simulator writes the claim's
    allocation for others to see (as kube-scheduler's PreBind does)."""
    _fair_rows: dict[str, list[float]] = field(default_factory=dict, init=False, repr=False)
    refused: dict[str, tuple[str, list[Result]]] = field(default_factory=dict)
    """Pods whose bind fairshare refused after DynamicResources had allocated their
    devices: the node and that allocation (undone), the last time."""

    # -- inputs ----------------------------------------------------------------------

    def add_dra_node(
        self,
        name: str,
        allocatable: Mapping[str, Fraction],
        labels: Mapping[str, str],
        slices: Sequence[dict[str, Any]],
        *,
        taints: Sequence[eligibility.Taint] = (),
    ) -> None:
        """A node and the slices of its pool; its GPUs are what ``dra.slice_capacity``
        counts when it has no ``nvidia.com/gpu`` allocatable (``objects.apply_node``)."""
        self.slices.extend(slices)
        self.allocator.add_slices(slices)
        self.capacity_dra = dra.slice_capacity(
            self.slices,
            self.classes,
            self.config.dra.gpu_device_classes,
            self.config.mig_fractions(),
        )
        node = {
            "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"taints": [{"key": k, "value": v, "effect": e} for k, v, e in taints]},
            "status": {
                "allocatable": {
                    k: quantities.format_quantity(v, quantities.quantity_kind(k))
                    for k, v in allocatable.items()
                }
            },
        }
        n = self.capacity_dra.node_gpus.get(name, 0)
        objects.apply_node(self.state, node, self.config, dra_gpus=n)
        if n > 0 and allocatable.get(GPU, Fraction(0)) <= 0:
            self.dra_nodes.add(name)
        self._ctx = None
        self._fair = None

    def dra_request(
        self, pod: Mapping[str, Any], claim: dict[str, Any] | None, uid: str
    ) -> PodRequest:
        """``request_for`` of a pod that uses ``claim`` (None: none): pending, its claim's
        GPUs are its demand (while the slices publish node-local GPUs)."""
        self.raw[uid] = dict(pod)
        req = self.request_for(pod, uid=uid)
        if claim is None:
            return req
        self.claims[uid] = claim
        return self._pending_request(req, claim)

    def _pending_request(self, req: PodRequest, claim: Mapping[str, Any]) -> PodRequest:
        caps = self.capacity_dra
        if not caps.node_gpus or caps.unattributed:
            return req
        n = self._claim_gpus(claim)
        if 0 < n < 1:
            return objects.with_claim_gpus(
                req, self.state.gpu_col, whole=0, parts={"pending": n}, bound=False
            )[0]
        return objects.with_claim_gpus(
            req, self.state.gpu_col, whole=math.ceil(n), parts={}, bound=False
        )[0]

    def _claim_gpus(self, claim: Mapping[str, Any]) -> Fraction:
        policy = self.config.dra
        return dra.claim_gpus(
            claim,
            device_classes=frozenset(policy.gpu_device_classes),
            all_devices=policy.all_devices_count,
            devices=self.capacity_dra,
        )

    def _bound_request(
        self, req: PodRequest, claim: Mapping[str, Any]
    ) -> tuple[PodRequest, str | None]:
        held = dra.allocated_devices(
            claim,
            device_classes=frozenset(self.config.dra.gpu_device_classes),
            devices=self.capacity_dra,
        )
        whole, parts = dra.whole_and_parts(held, self.capacity_dra)
        if not held:
            whole = math.ceil(self._claim_gpus(claim))
        return objects.with_claim_gpus(
            req, self.state.gpu_col, whole=whole, parts=parts, bound=True
        )

    def fair_shares(self) -> dict[str, fairness.FairShare]:
        """The fair allocation over bound usage plus the pending queue, summed as the
        extender sums them (``cluster_shares.demand_rows``): a claim pod's pending demand changes
        when its claim is allocated, and float for float the two must not drift apart."""
        rows = cluster_shares.demand_rows(self.state, self.pending.values())
        if self._fair is None or rows != self._fair_rows:
            self._fair = cluster_shares.fair_shares_for(self.state, self.config, rows)
            self._fair_rows = rows
        return self._fair

    # -- kube-scheduler's DynamicResources ----------------------------------------------

    def _asks(self, uid: str) -> tuple[str, int, str | None, Fraction | None] | None:
        """What DynamicResources must allocate for the pod on a DRA GPU node: its claim,
        or (KEP-5004) its ``nvidia.com/gpu`` as whole full GPUs; None: nothing."""
        claim = self.claims.get(uid)
        if claim is not None:
            return claim_asks(claim)
        gpu = self.pods[uid].demand.gpu
        if gpu.source == "device" and gpu.count:
            return GPU_CLASS, gpu.count, None, None
        return None

    def dra_admits(self, uid: str, node: str) -> bool:
        """Would DynamicResources let the pod onto ``node``? A claim pod needs a DRA GPU
        node where its claim can be allocated; a pod asking ``nvidia.com/gpu`` on a DRA
        GPU node needs that many full GPUs free there."""
        asks = self._asks(uid)
        if uid in self.claims and node not in self.dra_nodes:
            return False
        if asks is None or node not in self.dra_nodes:
            return True
        return self.allocator.can_allocate(node, *asks)

    # -- placing -------------------------------------------------------------------

    def try_place(self, uid: str) -> Outcome:
        """``Simulation.try_place`` behind DynamicResources: the pipeline's stages with
        the allocation between the node choice and the bind, which then fits, gates and
        plans the pod by the devices it got, as the extender's bind does."""
        req = self.pods[uid]
        eligible = self.state.eligible_rows(req.constraints)
        every = range(self.state.n_nodes) if eligible is None else eligible
        rows = [i for i in every if self.dra_admits(uid, self.state.nodes[i].name)]
        fr = pipeline.fit(self.state, req, rows) if rows else None
        if fr is None or not fr.fits:
            self.last_reason[uid] = pipeline.NO_FIT
            return self.outcomes[uid]
        gate = self._gate(req)
        if gate is not None and not gate.allowed:
            self.last_reason[uid] = gate.reason
            return self.outcomes[uid]
        best = self._choose(req, fr)
        node = self.state.nodes[best].name
        asks = self._asks(uid)
        results: list[Result] = []
        if asks is not None and node in self.dra_nodes:
            got = self.allocator.allocate(node, *asks)
            assert got is not None, f"{uid}: DynamicResources admitted {node} but cannot allocate"
            results = got
        claim = self.claims.get(uid)
        if claim is not None:
            # kube-scheduler writes the allocation before it calls the extender's bind,
            # which reads the pod again: its demand is now the devices it got.
            claim = self.claims[uid] = allocated(claim, results)
            req = self._repend(uid, claim)
        if self.on_allocation is not None and results:
            self.on_allocation(uid, node, results)
        bind_fr = pipeline.fit(self.state, req, [best])
        why = "" if bind_fr.fits else "no room"
        if not why and claim is not None:
            gate = self._gate(req)  # the extender's bind judges the gate again
            why = gate.reason if gate is not None else ""  # "" when it lets the pod by
        plan: pipeline.Plan | str = why
        if not why:
            milli = bind_fr.gpu_milli.get(best, 0.0)
            plan = pipeline.plan_on(self.state, req, best, milli=milli, mix=self._device_mix())
        if isinstance(plan, str):
            # The extender's bind refuses the node; kube-scheduler undoes the allocation.
            self.allocator.release(node, results)
            self.refused[uid] = (node, results)
            if claim is not None:
                self.claims[uid] = _unallocated(claim)
                self._repend(uid, self.claims[uid])
            self.last_reason[uid] = f"bind refused on {node}: {plan}"
            return self.outcomes[uid]
        self.planned[uid] = plan.devices
        if results:
            self.held[uid] = results
        return self._bind(uid, plan, req, claim)

    def _repend(self, uid: str, claim: Mapping[str, Any]) -> PodRequest:
        """Count pending pod ``uid`` again with ``claim`` as it is now (its tenant's
        admitted demand follows)."""
        old = self.pods[uid]
        new = self._pending_request(self.request_for(self.raw[uid], uid=uid), claim)
        if new.row != old.row and new.tenant is not None:
            admitted = self.admitted[new.tenant]
            for k, (now, was) in enumerate(zip(new.row, old.row, strict=True)):
                admitted[k] += now - was
            self._fair = None
        self.pods[uid] = self.pending[uid] = new
        return new

    def _bind(
        self, uid: str, plan: pipeline.Plan, req: PodRequest, claim: Mapping[str, Any] | None
    ) -> Outcome:
        """Account the bound pod as the extender's watch reads it back: its Binding's
        devices as the slot hint, its claim's devices in its row (``objects.apply_pod``)."""
        node, devs = plan.node, plan.devices
        before = self.pods[uid]
        held_req, group = req, None
        if claim is not None and node in self.dra_nodes:
            held_req, group = self._bound_request(self.request_for(self.raw[uid], uid=uid), claim)
        pod = copy.deepcopy(self.raw[uid])
        pod.setdefault("metadata", {})["uid"] = uid
        pod.setdefault("metadata", {}).setdefault("annotations", {})
        if devs:
            pod["metadata"]["annotations"][resources.ANN_GPU_DEVICES] = objects.format_gpu_devices(
                devs
            )
        pod["spec"]["nodeName"] = node
        if plan.group:
            pod["metadata"]["annotations"][resources.ANN_GPU_GROUP] = plan.group
        bound = objects.apply_pod(
            self.state, pod, self.config, req.tenant, request=held_req, group=group
        )
        assert bound is not None
        self._readmit(req.tenant, bound.row, before.row)
        return self._running(uid, node)

    def complete(self, uid: str) -> None:
        """A running pod ends: its devices are free again for DynamicResources too."""
        bound = self.state.pods.get(uid)
        super().complete(uid)
        results = self.held.pop(uid, None)
        if results and bound is not None:
            self.allocator.release(bound.node, results)


def _unallocated(claim: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(claim))
    out.pop("status", None)
    return out
