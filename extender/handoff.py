"""Handoff ``reservation``, the pure part: reservation pods, ConfigMaps and the sweep's plan
(``reserving`` makes the API calls).

A shared GPU is held on its node by one *reservation pod*, bound directly and requesting
``nvidia.com/gpu: 1``, so the kubelet gives it a GPU no other pod can get. Its container
reports that GPU's UUID on its own pod (``run.ai/reserve_for_gpu_index``, the key KAI's
reservation image writes); the label ``runai-gpu-group`` names the shared GPU.
Reservation pods are not workload: the ledger leaves them out. Each fractional pod's
ConfigMap (``fairshare.io/gpu-configmap``) gets ``NVIDIA_VISIBLE_DEVICES`` and
``GPU_PORTION``, owned by the pod; the pod then gets ``fairshare.io/gpu-uuid``, which also
marks it done across restarts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from fairshare.config.schema import ReservationHandoff
from fairshare.resources import ANN_GPU_CONFIGMAP, ANN_GPU_UUID, GPU

LABEL_APP: Final = "app"
LABEL_GROUP: Final = "runai-gpu-group"
ANN_RESERVED_UUID: Final = "run.ai/reserve_for_gpu_index"
ANN_DO_NOT_DISRUPT: Final = "karpenter.sh/do-not-disrupt"
NAME_PREFIX: Final = "gpu-reservation-"
ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_GPU_PORTION: Final = "GPU_PORTION"
CREATE_GRACE: Final = 30.0
"""Seconds a reservation pod this process created may be unseen by the watch (or a group
without one may wait for it) before the sweep treats the group as without a reservation."""

__all__ = [
    "ANN_RESERVED_UUID",
    "LABEL_GROUP",
    "Reservation",
    "SweepPlan",
    "configmap_body",
    "is_reservation_pod",
    "plan_sweep",
    "reservation_of",
    "reservation_pod",
]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


@dataclass(frozen=True)
class Reservation:
    """A reservation pod as the watch last showed it."""

    uid: str
    name: str
    namespace: str
    node: str
    group: str
    uuid: str = ""
    terminal: bool = False
    created: str = ""


def is_reservation_pod(pod: Mapping[str, Any], policy: ReservationHandoff) -> bool:
    """In the reservation namespace with ``app=<appLabel>`` (other pods there are not)."""
    meta = _meta(pod)
    labels = meta.get("labels")
    return (
        meta.get("namespace") == policy.namespace
        and isinstance(labels, Mapping)
        and labels.get(LABEL_APP) == policy.app_label
    )


def reservation_of(pod: Mapping[str, Any]) -> Reservation:
    meta = _meta(pod)
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    return Reservation(
        uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"),
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        node=str(spec.get("nodeName") or ""),
        group=str(labels.get(LABEL_GROUP) or ""),
        uuid=str(annotations.get(ANN_RESERVED_UUID) or "").strip(),
        terminal=phase in ("Succeeded", "Failed") or bool(meta.get("deletionTimestamp")),
        created=str(meta.get("creationTimestamp") or ""),
    )


def reservation_name(node: str, group: str) -> str:
    """``gpu-reservation-<node>-<5 hex of the group>`` (a pod name: at most 253 chars)."""
    tail = "-" + hashlib.sha256(group.encode()).hexdigest()[:5]
    return (NAME_PREFIX + node)[: 253 - len(tail)].rstrip("-.") + tail


def reservation_pod(group: str, node: str, policy: ReservationHandoff) -> dict[str, Any]:
    """The reservation pod of shared GPU ``group`` on ``node``."""
    # Small but not BestEffort: a reservation evicted under node pressure frees a GPU its
    # sharers still use.
    requests = {GPU: "1", "cpu": "10m", "memory": "64Mi"}
    limits = {GPU: "1", "memory": "128Mi"}
    container: dict[str, Any] = {
        "name": "gpu-reporter",
        "image": policy.image,
        "resources": {"requests": requests, "limits": limits},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
        ],
    }
    if policy.command:
        container["command"] = list(policy.command)
    spec: dict[str, Any] = {
        "nodeName": node,
        "serviceAccountName": policy.service_account,
        "containers": [container],
        "terminationGracePeriodSeconds": 1,
        # Bound by name, so no scheduler judges taints: tolerate them all, or a taint with
        # NoExecute would take the GPU from pods still running on it.
        "tolerations": [{"operator": "Exists"}],
    }
    if policy.runtime_class_name:
        spec["runtimeClassName"] = policy.runtime_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": reservation_name(node, group),
            "namespace": policy.namespace,
            "labels": {LABEL_APP: policy.app_label, LABEL_GROUP: group},
            "annotations": {ANN_DO_NOT_DISRUPT: "true"},
        },
        "spec": spec,
    }


def configmap_body(
    *, name: str, namespace: str, pod_name: str, pod_uid: str, uuid: str, portion: str
) -> dict[str, Any]:
    """The pod's handoff ConfigMap: the GPU's UUID and the pod's portion, owned by the pod."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}
            ],
            "labels": {"app.kubernetes.io/managed-by": "fairshare"},
        },
        "data": {ENV_VISIBLE_DEVICES: uuid, ENV_GPU_PORTION: portion},
    }


# -- the sweep -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """A bound pod of a shared GPU, as the sweep needs it."""

    uid: str
    name: str
    namespace: str
    configmap: str
    uuid: str
    """``fairshare.io/gpu-uuid`` on the pod ("" until its ConfigMap was written)."""


@dataclass
class SweepPlan:
    """What one sweep does."""

    delete: list[Reservation] = field(default_factory=list)
    """Reservations of no live group, duplicates and finished ones."""
    create: list[tuple[str, str]] = field(default_factory=list)
    """(group, node) whose reservation must be (re)created: no pod of theirs has a GPU yet."""
    lost: list[str] = field(default_factory=list)
    """Groups whose pods already run on a GPU nothing holds any more (surfaced, not fixed)."""
    write: list[tuple[Member, str, str]] = field(default_factory=list)
    """(member, uuid, group) whose ConfigMap can be written now."""
    overdue: list[tuple[Member, str]] = field(default_factory=list)
    """(member, group) still without a UUID after the timeout (not reported before)."""


def member_of(uid: str, pod: Mapping[str, Any]) -> Member | None:
    """A group member that uses the reservation handoff (has a ConfigMap), else None."""
    meta = _meta(pod)
    annotations = meta.get("annotations") or {}
    configmap = annotations.get(ANN_GPU_CONFIGMAP)
    if not configmap:
        return None
    return Member(
        uid,
        str(meta.get("name") or ""),
        str(meta.get("namespace") or ""),
        str(configmap),
        str(annotations.get(ANN_GPU_UUID) or ""),
    )


def plan_sweep(
    *,
    groups: Mapping[str, tuple[str, Iterable[Member]]],
    reservations: Iterable[Reservation],
    pending_create: Mapping[str, float],
    waiting_since: Mapping[str, float],
    warned: Iterable[str],
    done: Iterable[str],
    now: float,
    timeout: float,
) -> SweepPlan:
    """Decide one sweep.

    ``groups``: each live shared GPU's node and members; ``pending_create``: groups whose
    reservation this process created at (time) and the watch may not show yet;
    ``waiting_since``: when each member without a ConfigMap was first seen waiting;
    ``warned``: members already reported overdue; ``done``: members whose ConfigMap was
    written (their annotation may lag).
    """
    plan = SweepPlan()
    warned_set, done_set = set(warned), set(done)
    by_group: dict[str, list[Reservation]] = {}
    for r in reservations:
        if r.terminal or r.group not in groups or groups[r.group][0] != r.node:
            plan.delete.append(r)
        else:
            by_group.setdefault(r.group, []).append(r)
    held: dict[str, Reservation] = {}
    for group, rs in by_group.items():
        # One per group: the one that reported (else the oldest) stays.
        rs.sort(key=lambda r: (not r.uuid, r.created, r.name))
        held[group] = rs[0]
        plan.delete.extend(rs[1:])
    for group, (node, members_) in sorted(groups.items()):
        members = list(members_)
        if not members:
            continue
        reservation = held.get(group)
        if reservation is None:
            created = pending_create.get(group)
            if created is not None and now - created < CREATE_GRACE:
                continue
            if any(m.uuid or m.uid in done_set for m in members):
                plan.lost.append(group)
            else:
                plan.create.append((group, node))
            continue
        for m in members:
            if m.uuid or m.uid in done_set:
                continue
            if reservation.uuid:
                plan.write.append((m, reservation.uuid, group))
            elif now - waiting_since.get(m.uid, now) >= timeout and m.uid not in warned_set:
                plan.overdue.append((m, group))
    return plan
