"""Which pod group (gang) a pod belongs to, read from the pod alone: the native
``spec.schedulingGroup.podGroupName`` or the coscheduling label, the PodGroup APIs that
size a group, and fairshare's ``fairshare.io/gang-min-members`` annotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
"""The coscheduling convention's pod label: the name of the pod's PodGroup."""
ANN_MIN_MEMBERS: Final = "fairshare.io/gang-min-members"
"""fairshare's fallback when no PodGroup object exists: the group's ``min_count``."""
PODGROUP_GROUP: Final = "scheduling.x-k8s.io"
PODGROUP_VERSION: Final = "v1alpha1"
PODGROUP_PLURAL: Final = "podgroups"
NATIVE_GROUP: Final = "scheduling.k8s.io"
"""The native PodGroup's API group (``v1alpha2`` in v1.36; ``NATIVE_VERSION``)."""
NATIVE_VERSION: Final = "v1alpha2"
ANN_TOPOLOGY_KEY: Final = "fairshare.io/gang-topology-key"
"""A node label whose one domain holds the whole group (groups without a native PodGroup
topology constraint)."""


@dataclass(frozen=True, order=True)
class GroupKey:
    namespace: str
    name: str
    native: bool = False
    """A native ``scheduling.k8s.io`` PodGroup (else the coscheduling convention)."""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def api(self) -> tuple[str, str, str]:
        """(group, version, plural) of the PodGroup object that sizes this group."""
        if self.native:
            return (NATIVE_GROUP, NATIVE_VERSION, PODGROUP_PLURAL)
        return (PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL)


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def group_of(pod: Mapping[str, Any]) -> GroupKey | None:
    """The pod's group in its namespace, or None: the native ``spec.schedulingGroup
    .podGroupName`` first, else the label ``scheduling.x-k8s.io/pod-group``."""
    meta = _meta(pod)
    spec = pod.get("spec")
    sched = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    native = sched.get("podGroupName") if isinstance(sched, Mapping) else None
    if isinstance(native, str) and native:
        return GroupKey(str(meta.get("namespace") or "default"), native, native=True)
    labels = meta.get("labels")
    name = labels.get(POD_GROUP_LABEL) if isinstance(labels, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    return GroupKey(str(meta.get("namespace") or "default"), name)


def _positive(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            return None
    return value if isinstance(value, int) and value > 0 else None


def annotated_min_count(pod: Mapping[str, Any]) -> int | None:
    """``fairshare.io/gang-min-members`` as a positive int (None: absent or not one)."""
    ann = _meta(pod).get("annotations")
    return _positive(ann.get(ANN_MIN_MEMBERS)) if isinstance(ann, Mapping) else None
