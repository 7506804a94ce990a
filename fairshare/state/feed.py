"""What a source feeds and how it retries: the sink contract (``Sink``, ``EVENT_TYPES``),
the kinds a source may deliver, and the list/watch ``BackoffPolicy``. Below both
``state.sources`` (which re-exports every name) and ``state.informers``, so neither
imports the other for these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol

__all__ = [
    "ALL_KINDS",
    "CONFIGMAP",
    "DEFAULT_BACKOFF",
    "DEFAULT_KINDS",
    "DEVICE_CLASS",
    "DEVICE_TAINT_RULE",
    "EVENT_TYPES",
    "OPTIONAL_KINDS",
    "RESOURCE_CLAIM",
    "RESOURCE_SLICE",
    "BackoffPolicy",
    "Sink",
]

CONFIGMAP: Final = "ConfigMap"
ALL_KINDS: Final = ("Node", "Pod", "Namespace", "PersistentVolumeClaim", CONFIGMAP)
"""Every kind a source may deliver (all core/v1)."""
DEFAULT_KINDS: Final = ("Node", "Pod", "Namespace", "PersistentVolumeClaim")
"""The cluster-state kinds; the config ConfigMap is asked for separately."""
RESOURCE_CLAIM: Final = "ResourceClaim"
RESOURCE_SLICE: Final = "ResourceSlice"
DEVICE_CLASS: Final = "DeviceClass"
DEVICE_TAINT_RULE: Final = "DeviceTaintRule"
OPTIONAL_KINDS: Final = (RESOURCE_CLAIM, RESOURCE_SLICE, DEVICE_CLASS, DEVICE_TAINT_RULE)
"""Kinds a consumer may ask an ``ApiSource`` for besides ``ALL_KINDS``: DRA
(``resource.k8s.io/v1``) ResourceClaims, for GPUs requested through claims, and
ResourceSlices and DeviceClasses, for the GPUs nodes publish through DRA drivers, and
``resource.k8s.io/v1beta2`` DeviceTaintRules (listed as none where not served)."""
EVENT_TYPES: Final = ("ADDED", "MODIFIED", "DELETED")


class Sink(Protocol):
    """Receives objects from a source. Both methods are called from the event loop."""

    def on_resync(self, kind: str, objects: list[dict[str, Any]]) -> None:
        """The complete current list of ``kind``: replace everything held for that kind."""

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """One change: ``event_type`` is ``ADDED``, ``MODIFIED`` or ``DELETED``."""


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Delays after a failed list or watch: ``min(maximum, initial * factor**n)`` for the
    n-th consecutive failure, stretched by up to ``jitter`` (a fraction, random) and then
    capped at ``maximum`` seconds. A success resets n to 0. Defaults follow client-go's
    reflector (0.8 s doubling to 30 s)."""

    initial: float = 0.8
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5


DEFAULT_BACKOFF: Final = BackoffPolicy()
