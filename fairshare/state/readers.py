"""Reading Pod objects as the API serves them, and the slim copy the extender keeps.

Identity (``pod_uid``), phase (``is_terminal``, ``is_bound``), kube-scheduler's last
verdict on a pending pod (``unschedulable_message``) and ``slim_pod``, the smaller dict
every later reader gives the same answers on; ``metadata`` and ``str_map`` are the
tolerant accessors the other readers share. ``state.objects`` re-exports the public names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``metadata`` of an API object, ``{}`` when absent or not a mapping."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def str_map(value: object) -> dict[str, str]:
    """A mapping of labels or annotations as ``str`` to ``str``; ``{}`` for anything else."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def pod_uid(pod: Mapping[str, Any]) -> str:
    """``metadata.uid``, or ``namespace/name`` for objects without one (test fixtures)."""
    meta = metadata(pod)
    uid = meta.get("uid")
    if isinstance(uid, str) and uid:
        return uid
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """Phase Succeeded or Failed: the pod holds nothing any more."""
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return isinstance(phase, str) and phase in TERMINAL_PHASES


def is_bound(pod: Mapping[str, Any]) -> bool:
    """``spec.nodeName`` is set."""
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return isinstance(node, str) and bool(node)


_KEPT_META: Final = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp")
_KEPT_SPEC: Final = (
    "nodeName",
    "nodeSelector",
    "overhead",
    "priority",
    "resourceClaims",
    "schedulerName",
    "schedulingGates",
    "schedulingGroup",
)
_KEPT_CONTAINER: Final = ("name", "resources", "restartPolicy")
_KEPT_STATUS: Final = ("phase", "resourceClaimStatuses")
_ANN_PREFIX: Final = "fairshare.io/"
_REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"
_KEPT_ANNOTATIONS: Final = frozenset({"run.ai/reserve_for_gpu_index"})
"""Other annotations kept: the GPU UUID a reservation pod reports."""
_POD_GROUP: Final = "scheduling.x-k8s.io/pod-group"
"""``fairshare.gangs.POD_GROUP_LABEL``: kept, as the extender groups pods by it."""
LABEL_GPU_GROUP: Final = "runai-gpu-group"
"""The shared GPU a reservation pod holds; its pods keep it and their ``app`` label."""


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The parts of a Pod the extender reads again later, as a smaller dict.

    Kept: identity and timestamps, ``fairshare.io/*`` annotations (and a reservation pod's
    reported GPU and its ``app`` and ``runai-gpu-group`` labels, and a gang member's
    ``scheduling.x-k8s.io/pod-group`` label), ``spec.nodeName``,
    ``nodeSelector``, ``overhead``, ``priority``, ``resourceClaims``, ``schedulerName``,
    ``schedulingGates``, ``tolerations``, the required part of ``affinity.nodeAffinity``
    (what ``eligibility`` reads), each container's and init
    container's ``name``, ``resources`` and ``restartPolicy``, ``status.phase`` and
    ``resourceClaimStatuses``, and kube-scheduler's last ``Unschedulable`` verdict on a
    pending pod (its ``PodScheduled`` condition, as ``unschedulable_message`` reads it).
    Every reader of a stored pod (``pod_uid``, ``is_bound``,
    ``is_terminal``, ``pod_tenant``, ``pod_request``, ``apply_pod``, the DRA claim names,
    the reclaimer) gives the same answer on the slim dict as on the whole one; the
    images, env, volumes, probes, other status conditions and other annotations (often most of
    a pod's size) are dropped. A pod of an unexpected shape is returned unchanged, so
    its errors stay what they were.
    """
    meta, spec, status = pod.get("metadata"), pod.get("spec"), pod.get("status")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return pod
    if status is not None and not isinstance(status, dict):
        return pod
    annotations = meta.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        return pod
    out_spec: dict[str, Any] = {k: spec[k] for k in _KEPT_SPEC if k in spec}
    if "tolerations" in spec:
        out_spec["tolerations"] = _shared(spec["tolerations"])
    affinity = spec.get("affinity")
    if isinstance(affinity, dict):
        node_affinity = affinity.get("nodeAffinity")
        required = None
        if isinstance(node_affinity, dict):
            required = node_affinity.get(_REQUIRED)
        if required is not None:
            out_spec["affinity"] = _shared({"nodeAffinity": {_REQUIRED: required}})
    elif affinity is not None:
        out_spec["affinity"] = affinity
    for key in ("containers", "initContainers"):
        if key not in spec:
            continue
        items = spec[key]
        if not isinstance(items, list) or not all(isinstance(c, dict) for c in items):
            return pod
        out_spec[key] = _shared([{k: c[k] for k in _KEPT_CONTAINER if k in c} for c in items])
    out_meta: dict[str, Any] = {k: meta[k] for k in _KEPT_META if k in meta}
    if annotations is not None:
        out_meta["annotations"] = {
            k: v
            for k, v in annotations.items()
            if isinstance(k, str) and (k.startswith(_ANN_PREFIX) or k in _KEPT_ANNOTATIONS)
        }
    labels = meta.get("labels")
    if isinstance(labels, dict) and LABEL_GPU_GROUP in labels:
        out_meta["labels"] = {k: labels[k] for k in (LABEL_GPU_GROUP, "app") if k in labels}
    if isinstance(labels, dict) and _POD_GROUP in labels:  # a gang member (``fairshare.gangs``)
        out_meta.setdefault("labels", {})[_POD_GROUP] = labels[_POD_GROUP]
    out: dict[str, Any] = {k: pod[k] for k in ("apiVersion", "kind") if k in pod}
    out["metadata"] = out_meta
    out["spec"] = out_spec
    if status is not None:
        kept = {k: status[k] for k in _KEPT_STATUS if k in status}
        verdict = unschedulable_message(pod)
        if verdict is not None and not is_bound(pod):
            kept["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": UNSCHEDULABLE,
                 "message": verdict}
            ]  # fmt: skip
        out["status"] = _shared(kept)
    return out


UNSCHEDULABLE: Final = "Unschedulable"
"""The ``PodScheduled`` reason kube-scheduler writes when no node can take a pod."""


def unschedulable_message(pod: Mapping[str, Any]) -> str | None:
    """kube-scheduler's last verdict against a pending pod: the message of its
    ``PodScheduled`` condition when that is ``False`` with reason ``Unschedulable``
    (None otherwise, and for a condition of an unexpected shape)."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return None
    for cond in conditions:
        if not isinstance(cond, Mapping) or cond.get("type") != "PodScheduled":
            continue
        if cond.get("status") != "False" or cond.get("reason") != UNSCHEDULABLE:
            return None
        message = cond.get("message")
        return message if isinstance(message, str) else ""
    return None


_SHARED: dict[str, Any] = {}
_SHARED_MAX: Final = 4096


def _shared(value: Any) -> Any:
    """One object for equal slim parts (pods of one template have the same containers;
    most statuses are ``{"phase": "Running"}``): 100,000 pods then hold a few hundred
    container lists instead of 100,000. Slim pods are read, never mutated in place. The
    table is bounded; past the bound a value is kept as it is."""
    try:
        key = json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return value
    hit = _SHARED.get(key)
    if hit is not None:
        return hit
    if len(_SHARED) < _SHARED_MAX:
        _SHARED[key] = value
    return value
