"""GPU-sharing annotations: validate them against ``config.gpu_sharing`` and normalise them.

A pod asks for part of a GPU with exactly one of ``fairshare.io/gpu-fraction`` (in (0, 1),
a multiple of ``fractionStep``, at least ``minFraction``) and ``fairshare.io/gpu-memory``
(a positive quantity, at most the largest device's memory when known), never with a whole
``nvidia.com/gpu`` or a MIG resource; MIG resources must name a profile of ``config.mig``.
``fairshare.io/gpu-models`` (``|``-separated product labels) needs a GPU request. Any
other ``fairshare.io/`` annotation is refused, so a typo cannot give a pod a whole GPU.
The mutating webhook writes canonical forms (``"0.25"``, memory rounded up to
``memoryUnit`` as ``"8Gi"``, models sorted, each once); normalising twice gives no ops.
The first problem found is returned as a ``Rejection``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from fairshare import gangs, quantities
from fairshare.config.schema import FairShareConfig, is_label_key, is_label_value
from fairshare.resources import (
    ANN_GPU_CONFIGMAP,
    ANN_GPU_CONTAINER,
    ANN_GPU_DEVICES,
    ANN_GPU_FRACTION,
    ANN_GPU_GROUP,
    ANN_GPU_MEMORY,
    ANN_GPU_MODELS,
    ANN_GPU_UUID,
    ANN_REQUEUED,
    GPU,
    MIG_PREFIX,
    DemandError,
    pod_resource_requests,
)
from webhook import patches
from webhook.policies import gpu_handoff

__all__ = [
    "ANNOTATION_PREFIX",
    "BIND_ANNOTATIONS",
    "KNOWN_ANNOTATIONS",
    "OTHER_ANNOTATIONS",
    "Normalised",
    "Rejection",
    "allowed_fractions",
    "check_gpu_sharing",
    "render_rejection",
]

ANNOTATION_PREFIX: Final = "fairshare.io/"
KNOWN_ANNOTATIONS: Final = (ANN_GPU_FRACTION, ANN_GPU_MEMORY)
"""The ``fairshare.io/`` annotations that ask for part of a GPU."""
OTHER_ANNOTATIONS: Final = (
    ANN_GPU_CONTAINER,
    ANN_GPU_CONFIGMAP,
    ANN_GPU_MODELS,
    gangs.ANN_MIN_MEMBERS,
    gangs.ANN_TOPOLOGY_KEY,
)
"""Other ``fairshare.io/`` annotations a pod may carry at create: the container that gets
the shared GPU, the handoff's ConfigMap (the mutating webhook sets it), the GPU products a
GPU pod may run on, the size of the pod's group (gangs without a PodGroup) and the node
label one domain of which holds its group."""
IGNORED_ANNOTATIONS: Final = (ANN_REQUEUED,)
"""Accepted and ignored at create: the extender's requeue stamp means nothing on a new pod,
but a copy of a pod the gate once held carries it."""
_MODELS_ALLOWED: Final = (
    "GPU products (nvidia.com/gpu.product label values) separated by |,"
    ' e.g. "NVIDIA-A100-SXM4-80GB|Tesla-T4"'
)
BIND_ANNOTATIONS: Final = (ANN_GPU_DEVICES, ANN_GPU_GROUP, ANN_GPU_UUID)
"""Written by the extender when it binds the pod (refused at create)."""


@dataclass(frozen=True)
class Rejection:
    """Why a pod's GPU request is refused: ``subject`` (e.g. ``annotation
    fairshare.io/gpu-fraction``) had ``value``; ``problem``; ``allowed`` says what would do."""

    subject: str
    value: str
    problem: str
    allowed: str = ""


@dataclass(frozen=True)
class Normalised:
    """The request is valid; ``ops`` rewrite its annotations into canonical form (maybe none)."""

    ops: tuple[patches.PatchOp, ...] = ()
    canonical: Mapping[str, str] | None = None
    requests: Mapping[str, Fraction] | None = None
    """The pod's ``pod_resource_requests``, parsed for the check: admission reuses them
    for the pod's demand instead of parsing every quantity a second time per call."""


def render_rejection(rejection: Rejection) -> str:
    """``annotation fairshare.io/gpu-fraction="0.33": not a multiple of 0.05; allowed: ...``."""
    text = f'{rejection.subject}="{rejection.value}": {rejection.problem}'
    return f"{text}; allowed: {rejection.allowed}" if rejection.allowed else text


def _show_gpu(amount: Fraction) -> str:
    return quantities.format_quantity(amount, "gpu")


def allowed_fractions(config: FairShareConfig) -> tuple[Fraction, Fraction, Fraction] | None:
    """``(smallest, largest, step)`` of the fractions a pod may ask for; None if none may.

    The smallest is ``minFraction`` rounded up to a multiple of the step; the largest is the
    last multiple of the step below 1.
    """
    step = config.gpu_sharing.fraction_step_amount()
    lowest = math.ceil(config.gpu_sharing.min_fraction_amount() / step) * step
    highest = (math.ceil(1 / step) - 1) * step
    if lowest > highest:
        return None
    return lowest, highest, step


def _allowed_fraction_text(config: FairShareConfig) -> str:
    bounds = allowed_fractions(config)
    if bounds is None:
        return "none (fractional GPUs are disabled by gpuSharing); request nvidia.com/gpu"
    lowest, highest, step = bounds
    return (
        f"a multiple of {_show_gpu(step)} from {_show_gpu(lowest)} to {_show_gpu(highest)}"
        ' (e.g. "0.5"), or a whole nvidia.com/gpu'
    )


def _check_fraction(raw: str, config: FairShareConfig) -> Rejection | str:
    subject, allowed = f"annotation {ANN_GPU_FRACTION}", _allowed_fraction_text(config)
    try:
        value = quantities.parse_fraction(raw)
    except quantities.QuantityError:
        return Rejection(subject, raw, "not a fraction", allowed)
    bounds = allowed_fractions(config)
    if value >= 1:
        problem = "a whole GPU or more; request nvidia.com/gpu instead"
        return Rejection(subject, raw, problem, allowed)
    if bounds is None or value <= 0:
        return Rejection(subject, raw, "outside (0, 1)" if value <= 0 else "not allowed", allowed)
    lowest, _, step = bounds
    if (value / step).denominator != 1:
        return Rejection(subject, raw, f"not a multiple of {_show_gpu(step)}", allowed)
    if value < lowest:
        return Rejection(subject, raw, f"below the minimum {_show_gpu(lowest)}", allowed)
    return _show_gpu(value)


def _check_memory(raw: str, config: FairShareConfig, device_memory: int | None) -> Rejection | str:
    subject = f"annotation {ANN_GPU_MEMORY}"
    unit = config.gpu_sharing.memory_unit_bytes()
    allowed = f'a positive quantity such as "8Gi", rounded up to {config.gpu_sharing.memory_unit}'
    if device_memory:
        allowed += f", at most {quantities.format_quantity(device_memory, 'bytes')}"
    try:
        amount = quantities.parse_quantity(raw)
    except quantities.QuantityError:
        return Rejection(subject, raw, "not a quantity", allowed)
    if amount <= 0:
        return Rejection(subject, raw, "must be > 0", allowed)
    rounded = math.ceil(amount / unit) * unit
    if device_memory and rounded > device_memory:
        shown = quantities.format_quantity(device_memory, "bytes")
        return Rejection(subject, raw, f"above the largest GPU's memory ({shown})", allowed)
    return quantities.format_quantity(rounded, "bytes")


def _check_keys(annotations: Mapping[str, str]) -> Rejection | None:
    known = ", ".join(KNOWN_ANNOTATIONS + OTHER_ANNOTATIONS)
    for key in sorted(annotations):
        if not key.startswith(ANNOTATION_PREFIX) or key in KNOWN_ANNOTATIONS + OTHER_ANNOTATIONS:
            continue
        if key in IGNORED_ANNOTATIONS:
            continue
        if key in BIND_ANNOTATIONS:
            problem = "is set by the fairshare scheduler when it binds the pod"
        else:
            problem = "unknown fairshare.io annotation"
        return Rejection(f"annotation {key}", str(annotations[key]), problem, known)
    return None


def _check_resources(
    requests: Mapping[str, Fraction], annotations: Mapping[str, str], config: FairShareConfig
) -> Rejection | None:
    shared = [key for key in KNOWN_ANNOTATIONS if key in annotations]
    if len(shared) > 1:
        problem = f"cannot be combined with annotation {ANN_GPU_MEMORY}"
        allowed = "one of " + ", ".join(KNOWN_ANNOTATIONS)
        return Rejection(f"annotation {ANN_GPU_FRACTION}", annotations[shared[0]], problem, allowed)
    whole = requests.get(GPU, Fraction(0))
    hami_replica = config.gpu_sharing.handoff == "hami" and whole == 1
    if shared and whole > 0 and not hami_replica:
        problem = f"cannot be combined with a whole-GPU request ({GPU}: {_show_gpu(whole)})"
        allowed = f"either the annotation or {GPU}, not both"
        return Rejection(f"annotation {shared[0]}", annotations[shared[0]], problem, allowed)
    profiles = ", ".join(MIG_PREFIX + name for name in sorted(config.mig))
    for name in sorted(requests):
        if not name.startswith(MIG_PREFIX) or requests[name] <= 0:
            continue
        value = _show_gpu(requests[name])
        if name.removeprefix(MIG_PREFIX) not in config.mig:
            return Rejection(f"resource {name}", value, "unknown MIG profile", profiles)
        if shared:
            problem = f"cannot be combined with annotation {shared[0]}"
            return Rejection(f"resource {name}", value, problem, "a MIG slice or a GPU share")
    return None


def _check_models(
    raw: str, requests: Mapping[str, Fraction], annotations: Mapping[str, str]
) -> Rejection | str:
    """The canonical ``fairshare.io/gpu-models`` value, or why it is refused."""
    subject = f"annotation {ANN_GPU_MODELS}"
    names = [name.strip() for name in raw.split("|")]
    if not any(names):
        return Rejection(subject, raw, "names no GPU model", _MODELS_ALLOWED)
    for name in names:
        if not name:
            return Rejection(
                subject, raw, "has an empty model name between | separators", _MODELS_ALLOWED
            )
        if not is_label_value(name):
            problem = f'"{name}" is not a valid nvidia.com/gpu.product label value'
            return Rejection(subject, raw, problem, _MODELS_ALLOWED)
    asks_gpu = (
        requests.get(GPU, Fraction(0)) > 0
        or any(key in annotations for key in KNOWN_ANNOTATIONS)
        or any(n.startswith(MIG_PREFIX) and v > 0 for n, v in requests.items())
    )
    if not asks_gpu:
        problem = "the pod asks for no GPU, so the annotation would restrict nothing"
        return Rejection(subject, raw, problem, f"a pod that requests {GPU}, a GPU share or MIG")
    return "|".join(sorted(set(names)))


def check_gpu_sharing(
    pod: Mapping[str, Any], *, config: FairShareConfig, device_memory: int | None = None
) -> Normalised | Rejection:
    """Validate the pod's GPU-sharing request and compute the canonical-form patch.

    ``device_memory`` is the largest GPU's memory in bytes (None: not checked).
    """
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    rejection = _check_keys(annotations)
    if rejection is not None:
        return rejection
    try:
        requests = pod_resource_requests(pod.get("spec") or {})
    except DemandError as exc:
        return Rejection("spec.containers", "", str(exc))
    rejection = _check_resources(requests, annotations, config)
    if rejection is not None:
        return rejection
    if ANN_GPU_CONTAINER in annotations:
        where = gpu_handoff.gpu_container_index(pod)
        if isinstance(where, str):
            names = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or ()]
            allowed = "one of the pod's containers: " + ", ".join(names)
            return Rejection(
                f"annotation {ANN_GPU_CONTAINER}", annotations[ANN_GPU_CONTAINER], where, allowed
            )
    if gangs.ANN_MIN_MEMBERS in annotations:
        raw = str(annotations[gangs.ANN_MIN_MEMBERS])
        if gangs.annotated_min_count(pod) is None:
            subject = f"annotation {gangs.ANN_MIN_MEMBERS}"
            return Rejection(subject, raw, "not a positive integer", 'e.g. "4"')
    if gangs.ANN_TOPOLOGY_KEY in annotations:
        raw = str(annotations[gangs.ANN_TOPOLOGY_KEY])
        if not is_label_key(raw):
            subject = f"annotation {gangs.ANN_TOPOLOGY_KEY}"
            return Rejection(
                subject,
                raw,
                "not a valid node label key",
                'a label key such as "topology.kubernetes.io/rack" or "nvidia.com/gpu.clique"'
                " ([prefix/]name, the name up to 63 of A-Z a-z 0-9 - _ .)",
            )
    canonical: dict[str, str] = {}
    if ANN_GPU_FRACTION in annotations:
        checked = _check_fraction(str(annotations[ANN_GPU_FRACTION]), config)
        if isinstance(checked, Rejection):
            return checked
        canonical[ANN_GPU_FRACTION] = checked
    if ANN_GPU_MEMORY in annotations:
        checked = _check_memory(str(annotations[ANN_GPU_MEMORY]), config, device_memory)
        if isinstance(checked, Rejection):
            return checked
        canonical[ANN_GPU_MEMORY] = checked
    if ANN_GPU_MODELS in annotations:
        checked = _check_models(str(annotations[ANN_GPU_MODELS]), requests, annotations)
        if isinstance(checked, Rejection):
            return checked
        canonical[ANN_GPU_MODELS] = checked
    builder = patches.PatchBuilder(pod)
    for key, value in canonical.items():
        builder.set_entry(("metadata", "annotations"), key, value)
    return Normalised(builder.ops, canonical, requests)
