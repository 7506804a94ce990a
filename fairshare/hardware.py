"""GPU health of a Node, read from the signals clusters already have.

One pure reading (``read_node_health``) of a Node object under ``HealthPolicy``:

* **fatal** signals take the node's GPUs out of service: a condition of
  ``unhealthy_conditions`` with status ``"True"`` (NVSentinel, the AKS Node Problem
  Detector plugin), one of ``not_ready_conditions`` with status ``"False"`` (EKS), a
  taint of ``unhealthy_taints`` (any value, any effect), or the node cordoned by a
  remediator (``spec.unschedulable`` and one of ``remediator_labels``);
* **warnings** (``warning_conditions`` with status ``"True"``) keep the node in service
  with a score penalty;
* **unhealthy devices**: the device plugin counts a GPU it found unhealthy in
  ``status.capacity`` but not in ``status.allocatable``; the node's other GPUs stay in
  service.

DRA device taints are per device and read with the ResourceSlices (``fairshare.dra``).
The reading never raises: a malformed entry is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairshare import resources
from fairshare.config.schema import HealthPolicy

__all__ = ["NodeHealth", "read_node_health", "unhealthy_devices"]


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """What the signals on one Node say about its GPUs."""

    fatal: tuple[str, ...] = ()
    """Why the node's GPUs are out of service, one entry per signal
    (``condition GpuMemWatch=True (…)``, ``taint nvidia.com/gpu-error=fatal:NoExecute``)."""

    warnings: tuple[str, ...] = ()
    """Non-fatal signals: the node stays in service with a score penalty."""

    unhealthy_devices: int = 0
    """GPUs the device plugin marked unhealthy (capacity minus allocatable)."""

    no_execute: bool = False
    """A fatal signal is a ``NoExecute`` taint: the pods on the node are lost."""

    remediator: str = ""
    """The remediator that works on this node (``label=value`` of a
    ``remediator_labels`` key), ``""`` when none does."""

    @property
    def healthy(self) -> bool:
        """No fatal signal (warnings and unhealthy devices leave the node in service)."""
        return not self.fatal

    @property
    def reason(self) -> str:
        """The fatal signals joined, ``""`` for a healthy node."""
        return "; ".join(self.fatal)


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _gpu_count(amounts: Mapping[str, Any]) -> int | None:
    raw = amounts.get(resources.GPU)
    if raw is None:
        return None
    try:
        return int(str(raw))
    except ValueError:
        return None


def unhealthy_devices(node: Mapping[str, Any]) -> int:
    """GPUs in the node's ``status.capacity`` but not in its ``status.allocatable``: the
    device plugin reports a device it found unhealthy in capacity only."""
    status = _map(node.get("status"))
    cap = _gpu_count(_map(status.get("capacity")))
    alloc = _gpu_count(_map(status.get("allocatable")))
    if cap is None or alloc is None:
        return 0
    return max(0, cap - alloc)


def read_node_health(node: Mapping[str, Any], policy: HealthPolicy) -> NodeHealth:
    """The GPU health of ``node`` under ``policy`` (module docstring)."""
    status = _map(node.get("status"))
    spec = _map(node.get("spec"))
    labels = _map(_map(node.get("metadata")).get("labels"))
    fatal: list[str] = []
    warnings: list[str] = []
    no_execute = False
    for cond in map(_map, _list(status.get("conditions"))):
        ctype, state = cond.get("type"), cond.get("status")
        why = cond.get("reason") or cond.get("message")
        text = f" ({why})" if isinstance(why, str) and why else ""
        if ctype in policy.unhealthy_conditions and state == "True":
            fatal.append(f"condition {ctype}=True{text}")
        elif ctype in policy.not_ready_conditions and state == "False":
            fatal.append(f"condition {ctype}=False{text}")
        elif ctype in policy.warning_conditions and state == "True":
            warnings.append(f"condition {ctype}=True{text}")
    for taint in map(_map, _list(spec.get("taints"))):
        key = taint.get("key")
        if key in policy.unhealthy_taints:
            value, effect = taint.get("value"), taint.get("effect")
            shown = f"={value}" if isinstance(value, str) and value else ""
            shown += f":{effect}" if isinstance(effect, str) and effect else ""
            fatal.append(f"taint {key}{shown}")
            no_execute = no_execute or effect == "NoExecute"
    remediator = ""
    for key in policy.remediator_labels:
        value = labels.get(key)
        if isinstance(value, str):
            remediator = f"{key}={value}"
            break
    if remediator and spec.get("unschedulable") is True:
        fatal.append(f"cordoned by a remediator ({remediator})")
    return NodeHealth(
        fatal=tuple(fatal),
        warnings=tuple(warnings),
        unhealthy_devices=unhealthy_devices(node),
        no_execute=no_execute,
        remediator=remediator,
    )
