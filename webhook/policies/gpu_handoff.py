"""GPU handoffs at admission: prepare a fractional pod's GPU container for its shared GPU.

Handoff ``hami``: the container gets ``nvidia.com/gpu: 1`` (``hami_ops``). Handoff
``reservation``: a fractional pod requests no ``nvidia.com/gpu``, and pod env cannot
change after creation, so at create the pod gets ``fairshare.io/gpu-configmap`` naming a
ConfigMap (``<pod name or generateName>-<5 hex>-gpu``, the hex from the request UID, kept
on reinvocation); its GPU container gets ``NVIDIA_VISIBLE_DEVICES`` and ``GPU_PORTION``
from required ``configMapKeyRef``s to it; the pod gets an unmounted volume of it, so the
kubelet starts no container before the extender wrote it; and, with
``gpuSharing.reservation.runtimeClassName`` set, that runtime class when it has none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

from fairshare.resources import ANN_GPU_CONFIGMAP, ANN_GPU_CONTAINER, GPU
from webhook import patches

__all__ = [
    "ENV_GPU_PORTION",
    "ENV_VISIBLE_DEVICES",
    "VOLUME_NAME",
    "configmap_name",
    "gpu_container_index",
    "hami_ops",
    "handoff_ops",
]

ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_GPU_PORTION: Final = "GPU_PORTION"
VOLUME_NAME: Final = "fairshare-gpu-handoff"
MAX_NAME: Final = 63
_TAIL: Final = "-gpu"


def configmap_name(pod: Mapping[str, Any], request_uid: str) -> str:
    """``<base>-<5 hex>-gpu`` within 63 characters; ``base`` is the pod's name, else its
    ``generateName`` (without the trailing ``-``), else ``pod``."""
    meta = pod.get("metadata") or {}
    base = str(meta.get("name") or "") or str(meta.get("generateName") or "").rstrip("-.")
    suffix = hashlib.sha256(request_uid.encode()).hexdigest()[:5]
    tail = f"-{suffix}{_TAIL}"
    base = (base or "pod")[: MAX_NAME - len(tail)].rstrip("-.") or "pod"
    return base + tail


def gpu_container_index(pod: Mapping[str, Any]) -> int | str:
    """Index of the container that gets the shared GPU, or the problem as text."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        return "the pod has no containers"
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    wanted = annotations.get(ANN_GPU_CONTAINER)
    if wanted is None:
        return 0
    for i, c in enumerate(containers):
        if isinstance(c, Mapping) and c.get("name") == wanted:
            return i
    return f"no container named {wanted!r}"


def _env_entry(name: str, configmap: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": configmap, "key": name}}}


def _covers(have: Any, want: Any) -> bool:
    """``have`` holds everything ``want`` does (the API server may add defaults, such as a
    ConfigMap volume's ``defaultMode``, before a reinvocation)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(_covers(have.get(k), v) for k, v in want.items())
    return bool(have == want)


def _list_ops(
    path: Sequence[str], items: Any, wanted: Sequence[Mapping[str, Any]]
) -> list[patches.PatchOp]:
    """Ops making each entry of ``wanted`` (matched by ``name``) present in the list at
    ``path``: appended, or replacing an entry of the same name that differs."""
    if not isinstance(items, list):
        return [patches.add(patches.pointer(*path), [dict(w) for w in wanted])]
    ops: list[patches.PatchOp] = []
    for entry in wanted:
        at = next(
            (
                k
                for k, e in enumerate(items)
                if isinstance(e, Mapping) and e.get("name") == entry["name"]
            ),
            None,
        )
        if at is None:
            ops.append(patches.add(patches.pointer(*path, "-"), dict(entry)))
        elif not _covers(items[at], entry):
            ops.append(patches.replace(patches.pointer(*path, str(at)), dict(entry)))
    return ops


def handoff_ops(
    pod: Mapping[str, Any],
    builder: patches.PatchBuilder,
    *,
    request_uid: str,
    runtime_class: str | None = None,
) -> str:
    """Add the handoff's ops for a fractional pod to ``builder``'s; returns the ConfigMap
    name. The pod must have passed ``gpu_sharing.check_gpu_sharing`` (its GPU container
    exists)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    name = str(annotations.get(ANN_GPU_CONFIGMAP) or configmap_name(pod, request_uid))
    builder.set_entry(("metadata", "annotations"), ANN_GPU_CONFIGMAP, name)
    spec = pod.get("spec") or {}
    index = gpu_container_index(pod)
    ops: list[patches.PatchOp] = []
    if isinstance(index, int):
        container = spec["containers"][index]
        wanted = [_env_entry(ENV_VISIBLE_DEVICES, name), _env_entry(ENV_GPU_PORTION, name)]
        ops += _list_ops(("spec", "containers", str(index), "env"), container.get("env"), wanted)
    volume = {"name": VOLUME_NAME, "configMap": {"name": name}}
    ops += _list_ops(("spec", "volumes"), spec.get("volumes"), [volume])
    builder.extend(ops)
    if runtime_class and not spec.get("runtimeClassName"):
        # The NVIDIA runtime is what reads NVIDIA_VISIBLE_DEVICES (a pod's own choice stays).
        builder.set_entry(("spec",), "runtimeClassName", runtime_class)
    return name


def hami_ops(pod: Mapping[str, Any], builder: patches.PatchBuilder) -> None:
    """Handoff ``hami``: the GPU container of a fractional pod asks for the one
    ``nvidia.com/gpu`` replica HAMi's device plugin allocates the shared GPU through (the
    share, not the replica, is what fairshare counts)."""
    index = gpu_container_index(pod)
    if not isinstance(index, int):
        return
    container = (pod.get("spec") or {})["containers"][index]
    base = ("spec", "containers", str(index), "resources")
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    if not isinstance(resources, Mapping):
        op = patches.add(patches.pointer(*base), {"limits": {GPU: "1"}})
    elif not isinstance(limits, Mapping):
        op = patches.add(patches.pointer(*base, "limits"), {GPU: "1"})
    elif str(limits.get(GPU)) != "1":
        op = patches.add(patches.pointer(*base, "limits", GPU), "1")
    else:
        return
    builder.extend([op])
