"""Handoff ``hami``, the pure part: HAMi's annotation protocol, spoken by the extender
(``hami_hooks`` makes the API calls).

HAMi's device plugin gives a pod bound to its node the devices its annotations list
(HAMi-core then limits memory and compute), so the extender writes on the Binding:

* ``hami.io/vgpu-devices-to-allocate`` and ``hami.io/vgpu-devices-allocated`` (the same
  value): per device ``<UUID>,NVIDIA,<memory MiB>,<cores %>:``, each container's list
  closed by ``;`` (containers without devices included), init containers first;
* ``hami.io/vgpu-node``, ``hami.io/bind-phase: allocating`` and ``hami.io/bind-time``;

and holds the node lock ``hami.io/mutex.lock: <RFC 3339>,<namespace>,<name>`` until the
plugin releases it (a lock older than 5 minutes, or whose pod is gone, is taken over).
The devices come from the node annotation ``hami.io/node-nvidia-register`` (a JSON list
since HAMi v2.8, or the older ``:``-separated list); the ledger's slot ``i`` is the device
whose ``index`` is ``i``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fairshare.resources import GPU, MILLI_GPU

ANN_TO_ALLOCATE: Final = "hami.io/vgpu-devices-to-allocate"
ANN_ALLOCATED: Final = "hami.io/vgpu-devices-allocated"
ANN_NODE: Final = "hami.io/vgpu-node"
ANN_PHASE: Final = "hami.io/bind-phase"
ANN_BIND_TIME: Final = "hami.io/bind-time"
ANN_REGISTER: Final = "hami.io/node-nvidia-register"
ANN_LOCK: Final = "hami.io/mutex.lock"
LOCK_EXPIRE: Final = 300.0
DEVICE_TYPE: Final = "NVIDIA"

__all__ = [
    "ANN_LOCK",
    "ANN_REGISTER",
    "HamiDevice",
    "binding_annotations",
    "container_devices",
    "encode_pod_devices",
    "lock_holder",
    "lock_value",
    "parse_register",
]


class HamiFormatError(ValueError):
    """An annotation HAMi wrote that cannot be read (the message says where)."""


@dataclass(frozen=True)
class HamiDevice:
    """One GPU a HAMi device plugin registered on its node."""

    id: str
    index: int
    count: int
    devmem: int
    """MiB."""
    devcore: int
    type: str
    health: bool


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise HamiFormatError(f"{what}: {value!r} is not an integer")
    try:
        return int(value)
    except ValueError:
        raise HamiFormatError(f"{what}: {value!r} is not an integer") from None


def _json_int(value: object, what: str, *, unsigned: bool = False) -> int:
    """A JSON number field of HAMi's ``DeviceInfo``: Go's decoder refuses a string (or a
    bool) for an int field, and a negative number for a uint one (``index``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise HamiFormatError(f"{what}: {value!r} is not a JSON integer")
    if unsigned and value < 0:
        raise HamiFormatError(f"{what}: {value!r} is negative")
    return value


_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})
"""What Go's ``strconv.ParseBool`` reads as true / false (the legacy health field)."""


def parse_register(text: str) -> list[HamiDevice]:
    """``hami.io/node-nvidia-register`` in either format, sorted by index."""
    text = text.strip()
    out: list[HamiDevice] = []
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise HamiFormatError(f"{ANN_REGISTER}: not JSON: {exc}") from None
        for k, item in enumerate(items):
            if not isinstance(item, Mapping) or not item.get("id"):
                raise HamiFormatError(f"{ANN_REGISTER}[{k}]: a device needs an id")
            out.append(
                HamiDevice(
                    id=str(item["id"]),
                    index=_json_int(
                        item.get("index", 0), f"{ANN_REGISTER}[{k}].index", unsigned=True
                    ),
                    count=_json_int(item.get("count", 0), f"{ANN_REGISTER}[{k}].count"),
                    devmem=_json_int(item.get("devmem", 0), f"{ANN_REGISTER}[{k}].devmem"),
                    devcore=_json_int(item.get("devcore", 0), f"{ANN_REGISTER}[{k}].devcore"),
                    type=str(item.get("type", "")),
                    health=item.get("health") is True,
                )
            )
    else:
        if ":" not in text:
            raise HamiFormatError(f"{ANN_REGISTER}: neither JSON nor a ':'-separated list")
        for k, part in enumerate(p for p in text.split(":") if p):
            f = part.split(",")
            if len(f) not in (7, 9):
                raise HamiFormatError(f"{ANN_REGISTER} entry {k}: {len(f)} fields, want 7 or 9")
            where = f"{ANN_REGISTER} entry {k}"
            if f[6] not in _TRUE | _FALSE:
                raise HamiFormatError(f"{where}: health {f[6]!r} is not a boolean")
            out.append(
                HamiDevice(
                    id=f[0],
                    index=_int(f[7], f"{where}.index") if len(f) == 9 else k,
                    count=_int(f[1], f"{where}.count"),
                    devmem=_int(f[2], f"{where}.devmem"),
                    devcore=_int(f[3], f"{where}.devcore"),
                    type=f[4],
                    health=f[6] in _TRUE,
                )
            )
    return sorted(out, key=lambda d: d.index)


def encode_pod_devices(per_container: Sequence[Sequence[tuple[str, int, int]]]) -> str:
    """``(uuid, memory MiB, cores %)`` per device, per container (init containers first)."""
    return "".join(
        "".join(f"{uuid},{DEVICE_TYPE},{mem},{cores}:" for uuid, mem, cores in devices) + ";"
        for devices in per_container
    )


def _gpu_limit(container: Mapping[str, Any]) -> int:
    res = container.get("resources") or {}
    raw = (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU) or 0
    try:
        return int(str(raw))
    except ValueError:
        return 0


def container_devices(
    spec: Mapping[str, Any],
    devices: Sequence[tuple[str, int, int]],
    *,
    share_container: int | None = None,
) -> list[list[tuple[str, int, int]]]:
    """Which container gets which of the pod's ``devices``: in order, each container as
    many as its ``nvidia.com/gpu`` (init containers, which run before the others, reuse
    the first devices); a share goes to container ``share_container``."""
    inits = list(spec.get("initContainers") or [])
    mains = list(spec.get("containers") or [])
    out: list[list[tuple[str, int, int]]] = []
    for c in inits:
        out.append(list(devices[: _gpu_limit(c)]) if share_container is None else [])
    at = 0
    for k, c in enumerate(mains):
        if share_container is not None:
            out.append(list(devices) if k == share_container else [])
            continue
        n = _gpu_limit(c)
        out.append(list(devices[at : at + n]))
        at += n
    return out


def device_shares(
    register: Sequence[HamiDevice],
    slots: Sequence[tuple[int, float]],
    *,
    memory: int | None,
) -> list[tuple[str, int, int]] | str:
    """``(uuid, MiB, cores)`` for the ledger's ``(slot, milli-GPU)``, or the problem.

    A whole device: all its memory and 100 % of its cores. A share: the requested memory
    (``memory`` bytes) or the fraction of the device's memory, and no core limit (0: the
    sharers split the SMs by time, as with the reservation handoff)."""
    by_index = {d.index: d for d in register}
    out = []
    for slot, milli in slots:
        dev = by_index.get(slot)
        if dev is None:
            return f"device index {slot} is not in {ANN_REGISTER}"
        if milli >= MILLI_GPU:
            out.append((dev.id, dev.devmem, 100))
        elif memory is not None:
            out.append((dev.id, min(dev.devmem, math.ceil(memory / 2**20)), 0))
        else:
            out.append((dev.id, max(1, math.floor(dev.devmem * milli / MILLI_GPU)), 0))
    return out


def binding_annotations(node: str, encoded: str, *, now: float) -> dict[str, str]:
    return {
        ANN_TO_ALLOCATE: encoded,
        ANN_ALLOCATED: encoded,
        ANN_NODE: node,
        ANN_PHASE: "allocating",
        ANN_BIND_TIME: str(int(now)),
    }


def lock_value(now: float, namespace: str, name: str) -> str:
    """``<RFC 3339, seconds, UTC as Z>,<namespace>,<name>`` (Go's time.RFC3339)."""
    stamp = dt.datetime.fromtimestamp(int(now), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp},{namespace},{name}"


def parse_lock(value: str) -> tuple[float, str, str]:
    """(unix time, namespace, name) of a node lock; namespace and name are "" in the
    old time-only form. ``HamiFormatError`` for anything else."""
    parts = value.split(",")
    if len(parts) not in (1, 3):
        raise HamiFormatError(f"{ANN_LOCK}={value!r}: expected 3 comma-separated parts")
    try:
        when = dt.datetime.fromisoformat(parts[0].replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise HamiFormatError(f"{ANN_LOCK}={value!r}: {parts[0]!r} is not RFC 3339") from None
    return (when, "", "") if len(parts) == 1 else (when, parts[1], parts[2])


def lock_holder(value: str | None, *, now: float, namespace: str, name: str) -> str | None:
    """Who holds the node lock against pod ``namespace/name``: None when it is free, ours,
    expired or unreadable (taken over); else ``"<namespace>/<name>"`` of the holder (the
    caller still checks that pod exists: a lock of a gone pod is free)."""
    if not value:
        return None
    try:
        when, ns, holder = parse_lock(value)
    except HamiFormatError:
        return None
    if now - when > LOCK_EXPIRE or (ns, holder) == (namespace, name):
        return None
    return f"{ns}/{holder}" if ns else "?"
