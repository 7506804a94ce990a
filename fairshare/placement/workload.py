"""The workload mix: the task classes FGD measures fragmentation against.

``class_key`` files a pod under its class (CPU, per-device milli-GPU, device count,
allowed GPU models); ``build_workload_mix`` keeps the most common classes and their
popularity as the arrays the ``_native.scoring`` kernels read.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from fairshare.podrequest import PodRequest
from fairshare.resources import GPU, to_kernel_units

__all__ = ["ClassKey", "WorkloadMix", "build_workload_mix", "class_key"]


@dataclass(frozen=True)
class WorkloadMix:
    """Task classes and their popularity: the workload FGD measures fragmentation for.

    After Weng et al. ATC'23: pods are grouped by (cpu milli, per-device milli-GPU,
    device count, allowed models); the most common classes covering ``coverage`` of
    the pods are kept and their popularities renormalised to sum to 1.
    """

    cpu: array[float]
    gpu_milli: array[float]
    gpu_count: array[int]
    models: array[int]
    popularity: array[float]

    @property
    def size(self) -> int:
        return len(self.popularity)

    @cached_property
    def restricted_models(self) -> int:
        """Bitmask of the GPU model ids that some model-restricted class may use."""
        bits = 0
        for m in self.models:
            bits |= m
        return bits


ClassKey = tuple[float, float, int, frozenset[str]]


def class_key(req: PodRequest, *, cpu_col: int) -> ClassKey:
    g = req.demand.gpu
    if g.source == "mig":  # slices are no share of a device: a GPU-less task class
        return (req.row[cpu_col], 0.0, 0, req.gpu_models)
    milli = to_kernel_units(GPU, g.per_device) if g.count else 0.0
    return (req.row[cpu_col], milli, g.count, req.gpu_models)


def build_workload_mix(
    keys: Iterable[ClassKey], *, model_ids: Mapping[str, int], coverage: float = 0.95
) -> WorkloadMix:
    """Most popular classes covering ``coverage`` of the pods.

    Classes are taken by count, most first; among equal counts the larger key first
    (CPU, then GPU milli per device, device count, models), the order of the FGD
    reference simulator (its class list sorted in reverse). The order only decides which
    of the equally rare classes at the coverage cut are kept; on the openb gpuspec lists
    it moves the FGD control by up to 0.23 points.
    """
    counts = Counter(keys)
    total = sum(counts.values())
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], _sortable(kv[0])), reverse=True)
    kept: list[tuple[ClassKey, int]] = []
    covered = 0
    for key, c in ordered:
        if total and covered / total >= coverage:
            break
        kept.append((key, c))
        covered += c
    mass = sum(c for _, c in kept) or 1
    mask = array("q")
    for (_cpu, _milli, _count, models), _c in kept:
        bits = 0
        for m in models:
            if m in model_ids:
                bits |= 1 << model_ids[m]
        mask.append(bits)
    return WorkloadMix(
        cpu=array("d", [k[0] for k, _ in kept]),
        gpu_milli=array("d", [k[1] for k, _ in kept]),
        gpu_count=array("q", [k[2] for k, _ in kept]),
        models=mask,
        popularity=array("d", [c / mass for _, c in kept]),
    )


def _sortable(key: ClassKey) -> tuple[float, float, int, tuple[str, ...]]:
    return (key[0], key[1], key[2], tuple(sorted(key[3])))
