"""kube-scheduler's own verdict on a pending pod, as its ``PodScheduled`` condition says.

Which reasons are fairshare's (its filter took part), which ones fairshare checks again
itself (so they do not stop a pod from waiting), and which say DynamicResources found no
free devices.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final

# kube-scheduler writes why it could not place a pod in the pod's ``PodScheduled``
# condition (status False, reason Unschedulable). The message is ``FitError.Error()`` of
# pkg/scheduler/framework/types.go (v1.36): ``0/<N> nodes are available:``, then either a
# PreFilter plugin's message, or the reasons of the nodes as a histogram (``<count>
# <reason>`` sorted as strings, joined by ", "), a ".", and PostFilter's (preemption's)
# message. Extenders run after the Filter plugins and only over the nodes those passed
# (``findNodesThatPassExtenders`` stops when none is left), and an extender's failure
# text joins the histogram as it is. So a verdict without any of fairshare's own reasons
# means kube-scheduler's plugins refused every node before fairshare was asked.

_VERDICT_HEAD: Final = re.compile(r"0/(\d+) nodes are available: ?")
_HISTOGRAM_SPLIT: Final = re.compile(r", (?=\d+ )")
_COUNTED: Final = re.compile(r"(\d+) (.+)", re.DOTALL)

FAIRSHARE_REASONS: Final = (
    re.compile(r"tenant \S+ (above|near) its fair share"),
    re.compile(r"Insufficient \S+ \((free|MIG) "),
    re.compile(r"no \d+ GPU device\(s\)"),
    re.compile(r"GPU unhealthy: "),
    re.compile(r"GPU model \S+ not in "),
    re.compile(r"GPU memory request larger than a device"),
    re.compile(r"node not known to fairshare"),
    re.compile(r"fairshare"),
)
"""The failure texts of fairshare's own filter (``placement``, ``filtering``, the gate):
a verdict that holds one was made with fairshare's part in it."""

CHECKED_REASONS: Final = (
    re.compile(r"Insufficient \S+"),  # NodeResourcesFit
    re.compile(r"node\(s\) didn't match Pod's node affinity/selector"),  # NodeAffinity
    re.compile(r"node\(s\) had taints that the pod didn't tolerate"),  # TaintToleration
)
"""kube-scheduler reasons for what fairshare checks itself against the current state
(resources, node selector and required node affinity, taints): fairshare's own check is
newer than the verdict, so these do not stop a pod from waiting."""

DRA_GPU_REASONS: Final = (
    re.compile(r"cannot allocate all claims"),  # DynamicResources' allocator
    re.compile(r"cannot fit resource"),  # its extended-resource (KEP-5004) filter
)
"""DynamicResources reasons that, for a pod whose only DRA use is ``nvidia.com/gpu``
served from DRA devices (KEP-5004: no claims of its own), say "not enough free GPUs": the
DRA twin of ``Insufficient nvidia.com/gpu``, which fairshare checks itself against the
node's DRA GPUs (``dra.slice_capacity``). kube-scheduler writes them for a pod it tried
while its in-flight pods held the devices, before their binds reached the extender."""


def verdict_reasons(message: str) -> tuple[str, ...] | None:
    """The per-node reasons of a ``FitError`` message (the PreFilter message as one
    reason), without the counts and the PostFilter part; None when ``message`` is not
    of that form (another scheduler's, or none)."""
    head = _VERDICT_HEAD.match(message)
    if head is None:
        return None
    body = message[head.end() :]
    # PostFilter's part follows the filter part's closing "." and a space: DRA's ("no new
    # claims to deallocate"), then preemption's ("preemption: ..."), or any other plugin's.
    # No reason of kube-scheduler's or fairshare's holds ". ", so the first one ends it.
    cut = body.find(". ")
    if cut >= 0:
        body = body[:cut]
    body = body.rstrip()
    if body.endswith("."):
        body = body[:-1]
    parts = _HISTOGRAM_SPLIT.split(body) if body else []
    reasons = []
    for part in parts:
        counted = _COUNTED.fullmatch(part)
        reasons.append(counted.group(2) if counted else part)
    return tuple(r for r in reasons if r)


def _dra_gpu_reason(reason: str) -> bool:
    return any(p.fullmatch(reason) for p in DRA_GPU_REASONS)


def refused_for_dra_devices(message: str) -> bool:
    """Does ``message`` (the ``PodScheduled`` condition's) say kube-scheduler's
    DynamicResources found no free devices for the pod on some node (``DRA_GPU_REASONS``)?"""
    return any(_dra_gpu_reason(r) for r in verdict_reasons(message) or ())


def rejected_by_kube_scheduler(
    message: str, own: Collection[str] = (), *, dra_gpus_checked: bool = False
) -> bool:
    """Did kube-scheduler find the pod unschedulable for a reason fairshare does not check
    (pod affinity, topology spread, volumes, ports, DRA claims, ...) before fairshare had
    a say? True when ``message`` (the ``PodScheduled`` condition's) names at least one
    such reason and none of fairshare's own (``FAIRSHARE_REASONS``, or one of ``own``: the
    texts fairshare's filter last answered for this pod). A message of another form is
    not a verdict (False): fairshare's own checks decide. ``dra_gpus_checked``: the pod
    asks ``nvidia.com/gpu`` and has no claims, so ``DRA_GPU_REASONS`` count as checked.
    """
    reasons = verdict_reasons(message)
    if not reasons:
        return False
    own_texts = set(own)
    unchecked = False
    for reason in reasons:
        if reason in own_texts or any(p.match(reason) for p in FAIRSHARE_REASONS):
            return False
        if not any(p.fullmatch(reason) for p in CHECKED_REASONS) and not (
            dra_gpus_checked and _dra_gpu_reason(reason)
        ):
            unchecked = True
    return unchecked
