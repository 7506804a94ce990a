"""The cache's DRA ledger: ResourceClaims, the slices and classes that give them GPUs,
and which pod holds each claim's devices.

A claim's GPUs count in its tenant's usage once per claim. On a DRA GPU node the bound pod
with the smallest uid among a claim's users carries the claim: its devices join that
pod's row, whole devices as whole GPUs, parts of one physical GPU as one fractional device
``dra:<gpu>``. A pending pod counts the claims no bound pod holds yet. The ledger only
computes; the cache decides which pods to read again when a carrier or a claim changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from fairshare import dra, resources
from fairshare.config.schema import DraPolicy, FairShareConfig
from fairshare.placement import PodRequest
from fairshare.resources import MILLI_GPU
from fairshare.state import objects
from fairshare.state.cluster import ClusterState, allocatable_from_node

ClaimRefs = tuple[str, tuple[str, ...]]
"""A pod's claims: (namespace, claim names)."""


def claim_key(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def slim_claim(claim: Mapping[str, Any]) -> dict[str, Any]:
    """What ``dra.claim_gpus`` reads of a claim (its requests, allocation, annotations)."""
    meta = claim.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    out: dict[str, Any] = {
        "kind": claim.get("kind", dra.KIND_CLAIM),
        "metadata": {
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "annotations": meta.get("annotations") or {},
        },
        "spec": claim.get("spec") or {},
    }
    if isinstance(allocation, Mapping):
        out["status"] = {"allocation": {"devices": allocation.get("devices") or {}}}
    return out


def settle_usage(
    write: Callable[[], ClusterState],
    col: int,
    want: Mapping[str, float],
    had: Mapping[str, float],
) -> dict[str, float]:
    """Move each tenant's usage in column ``col`` from what was added for it (``had``) to
    what should be (``want``), for what no bound pod's row carries (claims, volumes);
    ``write()`` is asked only when a figure changes. Returns the new ``had``."""
    for tenant in sorted(set(want) | set(had)):
        delta = want.get(tenant, 0.0) - had.get(tenant, 0.0)
        if delta:
            state = write()
            row = state.tenant_usage.setdefault(tenant, [0.0] * state.n_res)
            row[col] += delta
            state._pod_changes += 1  # cached shares depend on usage
    return {t: v for t, v in want.items() if v}


@dataclass
class ClaimLedger:
    """Claims, slices, classes and carriers (module docstring)."""

    resource_claims: dict[str, Fraction] = field(default_factory=dict)
    """GPUs of each known ResourceClaim, by ``namespace/name``."""
    claim_objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each known claim, slimmed: counted again when the slices' devices change."""
    claim_held: dict[str, list[tuple[dra.DeviceKey, Fraction]]] = field(default_factory=dict)
    """The GPU devices each allocated claim holds and what each gives it."""
    claim_pods: dict[str, ClaimRefs] = field(default_factory=dict)
    """Pods that reference claims: uid -> (namespace, claim names)."""
    claim_users: dict[str, set[str]] = field(default_factory=dict)
    """Per claim, the pods that reference it (``claim_pods`` inverted)."""
    carried: dict[str, str] = field(default_factory=dict)
    """Claims whose devices a bound pod on a DRA GPU node carries in its row: its uid."""
    dra_usage: dict[str, float] = field(default_factory=dict)
    """Milli-GPU added to each tenant's usage for its bound pods' (uncarried) claims."""
    resource_slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    device_classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    taint_rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    slice_gpus: dra.SliceCapacity = field(default_factory=lambda: dra.SliceCapacity({}))
    """The DRA GPUs per node the slices and classes give (``dra.slice_capacity``)."""
    _book: dra.SliceBook | None = field(default=None, init=False, repr=False)

    def objects_of(self, kind: str) -> dict[str, dict[str, Any]]:
        if kind == dra.KIND_SLICE:
            return self.resource_slices
        return self.device_classes if kind == dra.KIND_DEVICE_CLASS else self.taint_rules

    # -- claims -----------------------------------------------------------------------

    def take(self, claim: Mapping[str, Any], policy: DraPolicy) -> None:
        key = claim_key(claim)
        slim = slim_claim(claim)
        self.claim_objects[key] = slim
        classes = frozenset(policy.gpu_device_classes)
        self.resource_claims[key] = dra.claim_gpus(
            slim,
            device_classes=classes,
            all_devices=policy.all_devices_count,
            devices=self.slice_gpus,
        )
        held = dra.allocated_devices(slim, device_classes=classes, devices=self.slice_gpus)
        if held:
            self.claim_held[key] = held
        else:
            self.claim_held.pop(key, None)

    def forget(self, key: str) -> None:
        self.resource_claims.pop(key, None)
        self.claim_objects.pop(key, None)
        self.claim_held.pop(key, None)

    def counted(self, key: str) -> tuple[Any, ...]:
        """What a change of claim ``key`` is judged by (its GPUs and its devices)."""
        return self.resource_claims.get(key), self.claim_held.get(key)

    def recount_claims(self, policy: DraPolicy) -> list[str]:
        """Count every known claim again (the devices behind them changed); returns the
        claims that now give other GPUs."""
        before = {k: self.counted(k) for k in self.claim_objects}
        for claim in list(self.claim_objects.values()):
            self.take(claim, policy)
        return [k for k in self.claim_objects if self.counted(k) != before.get(k)]

    # -- pods and carriers ------------------------------------------------------------

    def set_pod(self, uid: str, refs: ClaimRefs | None) -> set[str]:
        """Set (None: drop) the claims pod ``uid`` references; returns the claim keys
        whose users changed."""
        keys: set[str] = set()
        old = self.claim_pods.pop(uid, None)
        if old is not None:
            keys |= {f"{old[0]}/{n}" for n in old[1]}
        now: set[str] = set()
        if refs is not None:
            self.claim_pods[uid] = refs
            now = {f"{refs[0]}/{n}" for n in refs[1]}
            keys |= now
        for key in keys:
            users = self.claim_users.setdefault(key, set())
            if key in now:
                users.add(uid)
            else:
                users.discard(uid)
            if not users:
                del self.claim_users[key]
        return keys

    def is_dra_gpu_node(self, name: str, nodes: Mapping[str, Mapping[str, Any]]) -> bool:
        """Are ``name``'s GPUs its DRA devices (``objects.apply_node``'s rule)?"""
        node = nodes.get(name)
        if node is None or self.slice_gpus.node_gpus.get(name, 0) <= 0:
            return False
        return allocatable_from_node(node).get(resources.GPU, 0) <= 0

    def carrier(
        self,
        key: str,
        pods: Mapping[str, Mapping[str, Any]],
        nodes: Mapping[str, Mapping[str, Any]],
    ) -> str | None:
        """The pod that carries claim ``key``: the smallest uid among the bound pods on a
        DRA GPU node that reference it (None: counted by ``recount_usage``)."""
        best = None
        for uid in self.claim_users.get(key, ()):
            spec = (pods.get(uid) or {}).get("spec") or {}
            node = spec.get("nodeName")
            if node and (best is None or uid < best) and self.is_dra_gpu_node(str(node), nodes):
                best = uid
        return best

    def move_carrier(
        self,
        key: str,
        pods: Mapping[str, Mapping[str, Any]],
        nodes: Mapping[str, Mapping[str, Any]],
    ) -> tuple[str | None, str | None] | None:
        """Re-derive the carrier of ``key``; (old, new) when it changed, else None."""
        new, old = self.carrier(key, pods, nodes), self.carried.get(key)
        if new == old:
            return None
        if new is None:
            del self.carried[key]
        else:
            self.carried[key] = new
        return old, new

    def readers(self, keys: Iterable[str], pending: Mapping[str, object]) -> list[str]:
        """The pods whose request includes claims ``keys``: their carriers and the
        pending pods that reference them."""
        keys = list(keys)
        uids = {self.carried[k] for k in keys if k in self.carried}
        uids |= {uid for k in keys for uid in self.claim_users.get(k, ()) if uid in pending}
        return sorted(uids)

    def devices(
        self,
        uid: str,
        req: PodRequest,
        *,
        bound: bool,
        state: ClusterState,
        refs: ClaimRefs | None = None,
    ) -> tuple[PodRequest, str | None]:
        """``req`` plus the GPUs of the pod's claims as devices of its own row, and the
        shared-GPU group they take (None: none).

        Bound: the claims it carries. Parts of several GPUs, or parts besides whole
        devices, take each GPU whole. Pending: the claims no bound pod holds yet, while
        the slices publish GPUs and none of them is network-attached. ``refs``: the
        pod's claims, when the watch has not shown the pod yet."""
        refs = self.claim_pods.get(uid) or refs
        if refs is None:
            return req, None
        ns = refs[0]
        keys = [f"{ns}/{name}" for name in refs[1]]
        whole = 0
        parts: dict[str, Fraction] = {}
        if bound:
            for key in keys:
                if self.carried.get(key) != uid:
                    continue
                held = self.claim_held.get(key)
                if held is None:
                    whole += math.ceil(self.resource_claims.get(key, 0))
                    continue
                count, split = dra.whole_and_parts(held, self.slice_gpus)
                whole += count
                for gpu, part in split.items():
                    parts[gpu] = parts.get(gpu, Fraction(0)) + part
        else:
            slices = self.slice_gpus
            if not slices.node_gpus or slices.unattributed:
                return req, None
            n = sum(
                (
                    self.resource_claims.get(key, Fraction(0))
                    for key in keys
                    if not any(u in state.pods for u in self.claim_users.get(key, ()))
                ),
                Fraction(0),
            )
            if 0 < n < 1:
                parts["pending"] = n
            else:
                whole = math.ceil(n)
        return objects.with_claim_gpus(req, state.gpu_col, whole=whole, parts=parts, bound=bound)

    def recount_usage(self, state: ClusterState, write: Callable[[], ClusterState]) -> None:
        """Re-derive the DRA GPUs of every tenant from the bound pods' uncarried claims
        (``write()``: the state to change, asked only when a figure changes)."""
        want: dict[str, float] = {}
        seen: set[str] = set()
        for uid, (ns, names) in sorted(self.claim_pods.items()):
            bound = state.pods.get(uid)
            if bound is None or bound.tenant is None:
                continue
            for name in names:
                key = f"{ns}/{name}"
                if key in seen:
                    continue
                seen.add(key)
                if self.carried.get(key, "") in state.pods:
                    continue  # held as devices by the pod carrying it (its row)
                milli = float(self.resource_claims.get(key, 0) * MILLI_GPU)
                want[bound.tenant] = want.get(bound.tenant, 0.0) + milli
        self.dra_usage = settle_usage(write, state.gpu_col, want, self.dra_usage)

    # -- slices -----------------------------------------------------------------------

    def recount_slices(
        self, config: FairShareConfig, changed_slice: str | None = None
    ) -> tuple[set[str], list[str]]:
        """Derive the DRA GPUs per node again (counting only ``changed_slice`` when only
        that slice changed). Returns the nodes whose count changed and the claims that
        now give other GPUs."""
        book = self._book
        if book is None or book.slices is not self.resource_slices:
            book = self._book = dra.SliceBook(
                self.resource_slices, self.device_classes, self.taint_rules
            )
            changed_slice = None
        before = self.slice_gpus
        changed = book.recount(config.dra.gpu_device_classes, config.mig_fractions(), changed_slice)
        self.slice_gpus = book.capacity
        claims: list[str] = []
        if (changed is None or changed) and self.claim_objects:
            claims = self.recount_claims(config.dra)
        after = self.slice_gpus

        def seen(c: dra.SliceCapacity, n: str) -> tuple[int, int, int]:
            return (c.node_gpus.get(n, 0), c.tainted.get(n, 0), c.warned.get(n, 0))

        names = {*before.node_gpus, *before.tainted, *before.warned}
        names |= {*after.node_gpus, *after.tainted, *after.warned}
        nodes = {n for n in names if seen(before, n) != seen(after, n)}
        return nodes, claims

    def problems(self) -> dict[str, str]:
        """GPU classes that count nothing, once a driver publishes slices."""
        if not self.resource_slices:
            return {}
        return {f"DeviceClass/{name}": why for name, why in self.slice_gpus.problems.items()}
