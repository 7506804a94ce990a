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
