"""DeviceClasses and ResourceSlices as NVIDIA's DRA driver for GPUs publishes them.

Test fixtures only: the shapes follow the driver's Helm chart (device classes
``gpu.nvidia.com`` and ``mig.nvidia.com``: a CEL selector on the driver and the ``type``
attribute; the full-GPU class maps ``extendedResourceName: nvidia.com/gpu`` when the chart
targets ``resource.k8s.io/v1``) and its kubelet plugin (one pool per node named after the
node, devices ``gpu-<minor>`` with ``type``, ``uuid``, ``productName``, ``brand``,
``architecture``, ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``
attributes and a ``memory`` capacity; MIG devices ``gpu-<minor>-mig-<gi>-<start>-<size>``
with ``type: mig``, ``parentUUID`` and ``profile``). Written from those descriptions, not
copied from the driver.
"""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
API_VERSION = "resource.k8s.io/v1"


def device_class(
    name: str = GPU_CLASS, type_: str = "gpu", extended_resource: str | None = "nvidia.com/gpu"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selectors": [
            {
                "cel": {
                    "expression": f"device.driver == '{DRIVER}' && "
                    f"device.attributes['{DRIVER}'].type == '{type_}'"
                }
            }
        ]
    }
    if extended_resource:
        spec["extendedResourceName"] = extended_resource
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def _string(value: str) -> dict[str, str]:
    return {"string": value}


def _version(value: str) -> dict[str, str]:
    return {"version": value}


def gpu_device(
    node: str, minor: int, *, taints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    uuid = f"GPU-{node}-{minor:04d}-0000-0000-000000000000"
    device: dict[str, Any] = {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": _string("gpu"),
            "uuid": _string(uuid),
            "productName": _string("NVIDIA A100-SXM4-80GB"),
            "brand": _string("Nvidia"),
            "architecture": _string("Ampere"),
            "cudaComputeCapability": _version("8.0.0"),
            "driverVersion": _version("550.54.15"),
            "cudaDriverVersion": _version("12.4.0"),
            "resource.kubernetes.io/pcieRoot": _string(f"pci0000:{minor:02x}"),
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    if taints:
        device["taints"] = taints
    return device


def mig_device(node: str, minor: int, start: int) -> dict[str, Any]:
    """A 1g.10gb MIG placement of GPU ``minor`` (GI profile 19, one memory slice)."""
    parent = f"GPU-{node}-{minor:04d}-0000-0000-000000000000"
    return {
        "name": f"gpu-{minor}-mig-19-{start}-1",
        "attributes": {
            "type": _string("mig"),
            "uuid": _string(f"MIG-{node}-{minor}-{start}"),
            "parentUUID": _string(parent),
            "profile": _string("1g.10gb"),
            "productName": _string("NVIDIA A100-SXM4-80GB"),
        },
        "capacity": {"memory": {"value": "9856Mi"}, "multiprocessors": {"value": "14"}},
    }


MIG_1G = {"profile": "1g.10gb", "gi": 19, "size": 1, "sms": 14, "memory": "9856Mi"}
MIG_3G = {"profile": "3g.40gb", "gi": 9, "size": 4, "sms": 42, "memory": "39424Mi"}
GPU_SMS = 98
MEMORY_SLICES = 8


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def _memory_slices(start: int, size: int) -> dict[str, dict[str, str]]:
    return {f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)}


def gpu_counters(minor: int) -> dict[str, Any]:
    """The counter set of one physical GPU (KEP-4815): its capacities as counters, and one
    counter of 1 per memory slice."""
    return {
        "name": counter_set_name(minor),
        "counters": {
            "memory": {"value": "80Gi"},
            "multiprocessors": {"value": str(GPU_SMS)},
            **_memory_slices(0, MEMORY_SLICES),
        },
    }


def partitionable_gpu(node: str, minor: int) -> dict[str, Any]:
    """A full GPU that consumes all of its counter set (a MIG placement then blocks it)."""
    device = gpu_device(node, minor)
    device["capacity"] = {"memory": {"value": "80Gi"}, "multiprocessors": {"value": str(GPU_SMS)}}
    device["consumesCounters"] = [
        {
            "counterSet": counter_set_name(minor),
            "counters": {
                "memory": {"value": "80Gi"},
                "multiprocessors": {"value": str(GPU_SMS)},
                **_memory_slices(0, MEMORY_SLICES),
            },
        }
    ]
    return device


def partition(
    node: str, minor: int, start: int, profile: dict[str, Any] = MIG_1G
) -> dict[str, Any]:
    """A MIG placement of GPU ``minor`` published as a partitionable device: it consumes
    its memory slices and its share of the GPU's capacities from the GPU's counter set."""
    parent = f"GPU-{node}-{minor:04d}-0000-0000-000000000000"
    size = int(profile["size"])
    return {
        "name": f"gpu-{minor}-mig-{profile['gi']}-{start}-{size}",
        "attributes": {
            "type": _string("mig"),
            "uuid": _string(f"MIG-{node}-{minor}-{profile['gi']}-{start}"),
            "parentUUID": _string(parent),
            "profile": _string(str(profile["profile"])),
            "productName": _string("NVIDIA A100-SXM4-80GB"),
        },
        "capacity": {
            "memory": {"value": profile["memory"]},
            "multiprocessors": {"value": str(profile["sms"])},
        },
        "consumesCounters": [
            {
                "counterSet": counter_set_name(minor),
                "counters": {
                    "memory": {"value": profile["memory"]},
                    "multiprocessors": {"value": str(profile["sms"])},
                    **_memory_slices(start, size),
                },
            }
        ],
    }


def partitioned_slices(
    node: str, gpus: int = 2, *, generation: int = 1, placements: int = 7
) -> list[dict[str, Any]]:
    """The pool of a node whose GPUs can be partitioned, as v1.35+ needs it: one slice
    with every GPU's counter set, then one slice per GPU with the full GPU and its
    ``placements`` 1g.10gb placements (and one 3g.40gb)."""
    pool = {"name": node, "generation": generation, "resourceSliceCount": gpus + 1}
    out: list[dict[str, Any]] = [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}-counters"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": dict(pool),
                "sharedCounters": [gpu_counters(i) for i in range(gpus)],
            },
        }
    ]
    for i in range(gpus):
        devices = [partitionable_gpu(node, i)]
        devices += [partition(node, i, s) for s in range(placements)]
        devices.append(partition(node, i, 4, MIG_3G))
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{DRIVER}-gpu-{i}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node,
                    "pool": dict(pool),
                    "devices": devices,
                },
            }
        )
    return out


def shareable_slice(node: str, gpus: int = 1, *, generation: int = 1) -> dict[str, Any]:
    """``gpus`` GPUs that several claims may share (consumable capacity, KEP-5075): each
    claim consumes part of the 80Gi ``memory`` capacity, at least 1Gi, in 1Gi steps."""
    devices = []
    for i in range(gpus):
        device = gpu_device(node, i)
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            "memory": {
                "value": "80Gi",
                "requestPolicy": {
                    "default": "80Gi",
                    "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"},
                },
            }
        }
        devices.append(device)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-shared"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def resource_slice(
    node: str,
    gpus: int = 8,
    *,
    generation: int = 1,
    name: str | None = None,
    mig_per_gpu: int = 0,
    tainted: int = 0,
) -> dict[str, Any]:
    """The slice of node ``node``'s pool: ``gpus`` full GPUs (the last ``tainted`` of
    them with a NoSchedule device taint), plus ``mig_per_gpu`` MIG placements of each."""
    taint = [{"key": "nvidia.com/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}]
    devices = [
        gpu_device(node, i, taints=taint if i >= gpus - tainted else None) for i in range(gpus)
    ]
    devices += [mig_device(node, i, s) for i in range(gpus) for s in range(mig_per_gpu)]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{DRIVER}-x7k2p"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
