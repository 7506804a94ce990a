"""The webhook's verdict on a pod as if it were created now (``fairshare explain``): the
admission request the API server would send, judged with ``review.judge`` as the
validating phase would. The caller lists the cluster and feeds the webhook's trackers.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fairshare import gangs, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.report import AdmissionVerdict
from fairshare.state.usage import UsageTracker
from fairshare.usageview import ExcludingView
from webhook import review, wire
from webhook.gangquota import GangBook, GangHoldView
from webhook.policies.gpu_sharing import BIND_ANNOTATIONS
from webhook.view import TenantUsageView

__all__ = ["judge_as_created"]


def judge_as_created(
    pod: dict[str, Any],
    *,
    usage: UsageTracker,
    config: FairShareConfig,
    book: GangBook,
    podgroup_min: int | None = None,
) -> tuple[AdmissionVerdict, TenantUsageView]:
    """``review.judge`` (validating phase, dry run) on a CREATE of ``pod``, on the
    webhook's ``usage`` without the pod's own share and with the pod groups' holds of
    ``book`` (``podgroup_min``: the ``minMember`` of the pod's PodGroup, when read).

    Returns the verdict and the quota view it was judged against (the pod's own member
    left out of its group's hold), for the report's headroom figures.
    """
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace")), str(meta.get("name"))
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and any(k in annotations for k in BIND_ANNOTATIONS):
        # A pod created now would not carry what the scheduler writes when it binds
        # (the webhook refuses those on a create): judge it without them.
        kept = {k: v for k, v in annotations.items() if k not in BIND_ANNOTATIONS}
        pod = {**pod, "metadata": {**meta, "annotations": kept}}
    tenant = tenancy.resolve_tenant(ns, usage.namespace_labels(ns), config).tenant
    own = usage.pods.get(usage.pod_names.get(f"{ns}/{name}", ""), (ns, {}))[1]
    view = ExcludingView(usage, ns, own, tenant)
    group = gangs.group_of(pod)
    context = review.GangContext(book, podgroup_min=podgroup_min) if group else None
    if context is None and book.groups:
        context = review.GangContext(book)
    shown = GangHoldView(view, book, exclude=(group, name) if group else None)
    body = {
        "apiVersion": wire.API_VERSION,
        "kind": wire.KIND,
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": ns,
            "operation": "CREATE",
            "object": pod,
            "dryRun": True,
        },
    }
    response = review.judge(
        wire.decode_review(json.dumps(body).encode()),
        view=view,
        config=config,
        phase="validate",
        gang=context,
    ).response
    verdict = AdmissionVerdict(
        allowed=response.allowed,
        message=response.status.message if response.status else "",
        warnings=tuple(response.warnings),
    )
    return verdict, shown
