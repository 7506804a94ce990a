"""A pod ready to place: ``PodRequest`` (identity, tenant, exact demand, kernel row) and
its ``RequestShape`` (what decides whether it fits now). It sits below both the state
layer, which builds requests (``state.objects.pod_request``), and ``placement``, which
filters and scores them and re-exports both names.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from functools import cached_property

from fairshare import eligibility
from fairshare.resources import GPU, MILLI_GPU, PodDemand, to_kernel_units

__all__ = ["PodRequest", "RequestShape"]


class RequestShape:
    """What decides whether a pending pod fits now: kernel row, GPU demand (count, share
    or memory), allowed GPU models and node constraints. Two pods with one shape fit
    alike. Hashable, with the hash computed once (a GPU demand hashes Fractions)."""

    __slots__ = ("__weakref__", "_hash", "key")

    def __init__(self, key: tuple[object, ...]) -> None:
        self.key = key
        self._hash = hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, RequestShape) and self._hash == other._hash and self.key == other.key
        )

    def __repr__(self) -> str:
        return f"RequestShape{self.key!r}"


_SHAPES: weakref.WeakValueDictionary[tuple[object, ...], RequestShape] = (
    weakref.WeakValueDictionary()
)


@dataclass(frozen=True)
class PodRequest:
    """A pod ready to place: identity, tenant, exact demand and kernel row."""

    uid: str
    name: str
    namespace: str
    tenant: str | None
    demand: PodDemand
    row: tuple[float, ...]
    gpu_models: frozenset[str] = frozenset()
    constraints: eligibility.NodeConstraints = eligibility.UNCONSTRAINED
    """Node selector, required node affinity and tolerations (which nodes it may use)."""
    waiting: bool = True
    """In the queue of a scheduler that calls the extender, with no scheduling gate, and
    not found unschedulable by kube-scheduler for a reason fairshare does not check."""
    unschedulable: str = ""
    """kube-scheduler's verdict when it found the pod unschedulable for a reason fairshare
    does not check (``verdicts.rejected_by_kube_scheduler``); ``waiting`` is then False."""

    @cached_property
    def shape(self) -> RequestShape:
        """The request's shape (``RequestShape``), computed once and shared by every
        live request of that shape (so that comparing two is an identity check)."""
        key = (self.row, self.demand.gpu, self.gpu_models, self.constraints)
        got = _SHAPES.get(key)
        if got is None:
            got = _SHAPES[key] = RequestShape(key)
        return got

    @cached_property
    def fixed_gpu_milli(self) -> float | None:
        """Per-device milli-GPU when it does not depend on the node (not a memory request).
        A part of a DRA GPU (a MIG partition's 1/7, a consumable-capacity share) is its
        exact float, as ``ClusterState`` keeps it, not rounded up to a whole milli-GPU as
        fairshare's own fractions are: a seventh 1/7 partition then fits the 1000/7 six
        leave, as it does for kube-scheduler."""
        g = self.demand.gpu
        if g.memory is not None:
            return None
        if g.source == "dra":
            return float(g.per_device * MILLI_GPU)
        return to_kernel_units(GPU, g.per_device)

    def gpu_milli_for(self, device_memory: int) -> float:
        """Per-device milli-GPU this pod needs on a node with ``device_memory`` bytes."""
        if self.fixed_gpu_milli is not None:
            return self.fixed_gpu_milli
        g = self.demand.gpu
        if g.memory is not None:
            if device_memory <= 0:
                return math.inf
            g = g.with_device_memory(device_memory)
        return to_kernel_units(GPU, g.per_device)

    @property
    def gpu_count(self) -> int:
        return self.demand.gpu.count

    def row_on(self, gpu_col: int, milli: float) -> tuple[float, ...]:
        """The kernel row as bound on a node where each device share is ``milli``.

        Equal to ``row`` except for GPU-memory requests, whose GPU amount is only
        known once the node (and so the device memory) is.
        """
        if self.demand.gpu.memory is None or not math.isfinite(milli):
            return self.row
        row = list(self.row)
        row[gpu_col] = milli * self.gpu_count
        return tuple(row)
