"""Node objects → rows of the ``ClusterState``: capacity, GPU health, taints, MIG slices.

``apply_node`` adds or updates a node (allocatable, GPU feature discovery labels, HAMi's
registered devices, MIG slices, GPUs published through DRA); ``node_gpu_health`` reads GPU
health from the Node's conditions and taints. ``state.objects`` re-exports the public
names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Final

from fairshare import mig, resources
from fairshare.config.schema import FairShareConfig, HealthPolicy
from fairshare.hardware import read_node_health
from fairshare.state.cluster import BoundPod, ClusterState, StateError, allocatable_from_node
from fairshare.state.readers import metadata, str_map


def node_gpu_health(node: Mapping[str, Any], health: HealthPolicy) -> tuple[bool, str]:
    """``(healthy, reason)`` of a Node's GPUs under ``health``: healthy when no fatal
    signal is on the node (``fairshare.hardware.read_node_health``); the reason names
    every fatal signal, conditions first, e.g. ``condition GpuMemWatch=True (…)``.
    Healthy nodes have the reason ``""``."""
    reading = read_node_health(node, health)
    return (reading.healthy, reading.reason)


def apply_node(
    state: ClusterState,
    node: Mapping[str, Any],
    config: FairShareConfig,
    *,
    dra_gpus: int = 0,
    dra_tainted: int = 0,
    dra_warned: int = 0,
) -> int:
    """Add or update a Node object; returns its row. Pods already bound stay counted.

    Capacity is ``status.allocatable`` (``capacity`` if absent): the device plugin's
    ``nvidia.com/gpu`` count is the number of devices; ``nvidia.com/gpu.memory`` and
    ``nvidia.com/gpu.product`` (GPU feature discovery labels) give device memory and model.
    MIG slices (``nvidia.com/mig-<profile>``, or ``nvidia.com/gpu`` under a
    ``-MIG-<profile>`` product: ``fairshare.mig``) count as their configured GPU
    fraction in the GPU column and are kept per profile, not as devices.

    ``dra_gpus``: whole GPUs the node publishes through DRA (``dra.slice_capacity``).
    They are its GPUs when it has no ``nvidia.com/gpu`` allocatable (nor MIG slices):
    the rule by which kube-scheduler's NodeResourcesFit hands a pod's ``nvidia.com/gpu``
    to DRA (``shouldDelegateResourceToDRA``: allocatable > 0 keeps the device plugin), so
    a pod asking ``nvidia.com/gpu`` is judged against the devices kube-scheduler will
    allocate it from. A node with device-plugin GPUs keeps those alone.

    Health (``fairshare.hardware``): a fatal signal takes the node's GPUs out of service;
    a warning, or ``dra_warned`` GPUs with an informational device taint, lowers its
    health score; the device plugin's unhealthy devices and ``dra_tainted`` GPUs (every
    device of them tainted ``NoSchedule``/``NoExecute``) are out of its allocatable and
    kept as ``unhealthy_gpus`` to be shown.
    """
    name = metadata(node).get("name")
    if not isinstance(name, str) or not name:
        raise StateError("node without metadata.name")
    reading = read_node_health(node, config.health)
    warnings = list(reading.warnings)
    if dra_warned:
        warnings.append(f"{dra_warned} GPU(s) with an informational DRA device taint")
    labels = str_map(metadata(node).get("labels"))
    allocatable = allocatable_from_node(node)
    registered = hami_device_count(str_map(metadata(node).get("annotations")))
    if registered is not None and registered < allocatable.get(resources.GPU, 0):
        # HAMi's device plugin advertises replicas (devices x splits): count devices.
        allocatable[resources.GPU] = Fraction(registered)
    fractions = config.mig_fractions()
    slices = mig.node_slices(allocatable, labels, fractions)
    if slices.has_slices:
        allocatable = dict(allocatable)
        allocatable[resources.GPU] = Fraction(slices.devices)
    elif dra_gpus > 0 and allocatable.get(resources.GPU, 0) <= 0:
        allocatable = dict(allocatable)
        allocatable[resources.GPU] = Fraction(dra_gpus)
    return state.add_node(
        name,
        allocatable,
        labels=labels,
        gpu_healthy=reading.healthy,
        health_reason=reading.reason,
        taints=node_taints(node),
        mig={
            p: (n, resources.to_kernel_units(resources.GPU, fractions[p]))
            for p, n in slices.slices.items()
        },
        mig_single=slices.single,
        mig_unknown=slices.unknown,
        health_warning="; ".join(warnings),
        unhealthy_gpus=reading.unhealthy_devices + dra_tainted,
    )


def node_taints(node: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``spec.taints`` as (key, value, effect); entries of another shape are skipped."""
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    out = []
    for taint in taints if isinstance(taints, list) else ():
        if isinstance(taint, Mapping):
            parts = [taint.get(k) or "" for k in ("key", "value", "effect")]
            if all(isinstance(p, str) for p in parts):
                out.append((parts[0], parts[1], parts[2]))
    return out


ANN_HAMI_REGISTER: Final = "hami.io/node-nvidia-register"


def hami_device_count(annotations: Mapping[str, str]) -> int | None:
    """GPUs HAMi's device plugin registered on the node (``hami.io/node-nvidia-register``,
    a JSON list or the older ``…:``-separated list); None without (or with an unreadable)
    annotation."""
    text = annotations.get(ANN_HAMI_REGISTER, "").strip()
    if not text:
        return None
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            return None
        return len(items) if isinstance(items, list) else None
    return len([p for p in text.split(":") if p.count(",") in (6, 8)]) or None


def delete_node(state: ClusterState, name: str) -> list[BoundPod]:
    """Remove a node (unknown names are ignored); returns the pods that were on it."""
    if name not in state.node_index:
        return []
    return state.remove_node(name)
