"""The whole admission decision: ``review(request, view=, config=, phase=)`` → response.

* Pods, CREATE: the tenant comes from the namespace (``fairshare.tenancy``); a
  ``fairshare.io/tenant`` label naming another tenant and invalid GPU-sharing annotations
  are refused. *mutate* sets the tenant label, canonical GPU-sharing annotations and, for
  GPU pods left to the default scheduler, ``config.schedulerName``; *validate* checks the
  limits of the tenant and its ancestors (``fairshare.limits``) and warns near one.
* PersistentVolumeClaims, CREATE: ``storage`` counts against ``limit.storage``.
* The fairshare ConfigMap, CREATE/UPDATE: ``policies.config_guard``.
* Anything else is allowed untouched.

Both phases repeat the validity checks (the mutating webhook may fail open, a mutation may
be skipped). Denials carry structured reasons, rendered in ``render_reasons``: code 400
for invalid input, 403 for policy refusals. Validating answers never carry a patch. One
module because both phases run the same checks in the same order over one request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final, Literal

from fairshare import dra, gangs, limits, quantities
from fairshare.config.schema import FairShareConfig
from fairshare.resources import (
    GPU,
    LABEL_TENANT,
    STORAGE,
    DemandError,
    PodDemand,
    pod_usage,
    sum_amounts,
)
from fairshare.tenancy import TenantResolution, resolve_tenant
from webhook import gangquota, patches, reservations, wire
from webhook.policies import config_guard, gpu_handoff, gpu_sharing, quota
from webhook.view import TenantUsageView

__all__ = [
    "DEFAULT_SCHEDULER",
    "Claim",
    "GangContext",
    "GangShort",
    "Malformed",
    "NoTenant",
    "Phase",
    "Reason",
    "TenantMismatch",
    "Verdict",
    "admit",
    "claim_key",
    "judge",
    "render_reason",
    "render_reasons",
    "review",
]

Phase = Literal["mutate", "validate"]
DEFAULT_SCHEDULER: Final = "default-scheduler"
BAD_REQUEST: Final = 400
FORBIDDEN: Final = 403


@dataclass(frozen=True)
class TenantMismatch:
    """The pod's ``fairshare.io/tenant`` label names another tenant than its namespace's."""

    namespace: str
    claimed: str
    tenant: str | None


@dataclass(frozen=True)
class NoTenant:
    """A GPU pod in a namespace no tenant claims, under ``defaultTenant.mode: deny-gpu``."""

    namespace: str


@dataclass(frozen=True)
class Malformed:
    """The object itself cannot be judged (bad quantities, missing object)."""

    problem: str


@dataclass(frozen=True)
class GangShort:
    """A gang member refused for its whole group: admitting it would commit the tenant
    (or an ancestor, ``item.level``) to the group's demand, over the limit ``item``.

    ``item.used`` counts the group as it stands now (its known members and their hold);
    ``judgement.after`` is the group's whole demand with this member."""

    item: limits.Insufficient
    judgement: gangquota.MemberJudgement


Reason = (
    limits.Insufficient
    | GangShort
    | gpu_sharing.Rejection
    | config_guard.InvalidConfig
    | TenantMismatch
    | NoTenant
    | Malformed
)


@dataclass(frozen=True)
class Claim:
    """What an allowed create should reserve: ``amounts`` for ``tenant`` under ``key``."""

    key: reservations.PodKey
    tenant: str
    amounts: Mapping[str, Fraction]


@dataclass(frozen=True)
class GangMember:
    """An allowed gang member, to record in the ``GangBook`` once admitted."""

    key: gangs.GroupKey
    name: str
    min_count: int
    demand: Mapping[str, Fraction]


@dataclass(frozen=True)
class Verdict:
    """A response plus the structured reasons behind a denial and the claim of an allow."""

    response: wire.AdmissionResponse
    reasons: tuple[Reason, ...] = ()
    claim: Claim | None = None
    member: GangMember | None = None


@dataclass(frozen=True)
class GangContext:
    """What a pod's admission knows of pod groups (``webhook.gangquota``): the groups'
    accounts, and the ``spec.minMember`` of the judged pod's PodGroup when one was read
    (None: no PodGroup, or it could not be read, ``podgroup_problem`` says why)."""

    book: gangquota.GangBook
    podgroup_min: int | None = None
    podgroup_problem: str = ""


def review(
    request: wire.AdmissionRequest,
    *,
    view: TenantUsageView,
    config: FairShareConfig,
    phase: Phase,
    config_map: config_guard.ConfigMapRef | None = None,
    gang: GangContext | None = None,
) -> wire.AdmissionResponse:
    """The webhook's answer to ``request`` for the ``phase`` endpoint (no reservations)."""
    return judge(
        request, view=view, config=config, phase=phase, config_map=config_map, gang=gang
    ).response


def admit(
    request: wire.AdmissionRequest,
    *,
    view: TenantUsageView,
    config: FairShareConfig,
    ledger: reservations.ReservationLedger,
    now: float,
    config_map: config_guard.ConfigMapRef | None = None,
    gang: GangContext | None = None,
) -> wire.AdmissionResponse:
    """Validate with reservations: judge against watched usage + reservations, and reserve
    the demand of an allowed, non-dry-run create (and, for a gang member, record it in its
    group's account). Call without awaiting in between."""
    ledger.expire(now)
    if gang is not None:
        gang.book.expire(now)
        group = gangs.group_of(request.object) if request.object is not None else None
        if group is not None and gang.podgroup_min is not None:
            gang.book.learn(group, gang.podgroup_min)
    # A retry of the same create must not be counted twice: leave out its own reservation.
    shown = reservations.ReservingView(view, ledger, exclude=claim_key(request))
    verdict = judge(
        request, view=shown, config=config, phase="validate", config_map=config_map, gang=gang
    )
    claim = verdict.claim
    if verdict.response.allowed and not request.dry_run:
        if claim is not None:
            ledger.reserve(key=claim.key, tenant=claim.tenant, amounts=claim.amounts, now=now)
        member = verdict.member
        if gang is not None and member is not None:
            gang.book.admitted(
                member.key,
                member.name,
                min_count=member.min_count,
                demand=member.demand,
                expires=now + ledger.ttl,
            )
    return verdict.response


def claim_key(request: wire.AdmissionRequest) -> reservations.PodKey | None:
    """The ledger key a create of ``request`` reserves under, None if it reserves nothing.

    Pods are ``namespace/name`` (as the informer knows them), PVCs ``pvc:namespace/name``;
    an object without a name (not yet generated) falls back to ``uid:<request uid>``, which
    only the TTL releases.
    """
    obj = request.object
    if obj is None or request.operation != "CREATE" or request.sub_resource:
        return None
    namespace = _namespace(request, obj)
    name = (obj.get("metadata") or {}).get("name") or request.name or f"uid:{request.uid}"
    if (request.kind.group, request.kind.kind) == ("", "Pod"):
        return reservations.pod_key(namespace, name)
    if (request.kind.group, request.kind.kind) == ("", "PersistentVolumeClaim"):
        return reservations.PodKey(f"pvc:{namespace}/{name}")
    return None


def judge(
    request: wire.AdmissionRequest,
    *,
    view: TenantUsageView,
    config: FairShareConfig,
    phase: Phase,
    config_map: config_guard.ConfigMapRef | None = None,
    gang: GangContext | None = None,
) -> Verdict:
    """``review`` with its reasons and reservation claim.

    ``gang``: judge against the pod groups' accounts (the room held for their missing
    members counts in their tenants' usage, and a gang member is judged for its group);
    None judges every pod alone."""
    kind = (request.kind.group, request.kind.kind)
    if request.sub_resource:
        return Verdict(wire.allow())
    if gang is not None and phase == "validate":
        obj = request.object if kind == ("", "Pod") else None
        key = gangs.group_of(obj) if obj is not None else None
        name = str((obj or {}).get("metadata", {}).get("name") or request.name)
        view = gangquota.GangHoldView(
            view, gang.book, exclude=(key, name) if key is not None else None
        )
    if kind == ("", "Pod") and request.operation == "CREATE":
        return _judge_pod(request, view=view, config=config, phase=phase, gang=gang)
    if phase != "validate":
        return Verdict(wire.allow())
    if kind == ("", "PersistentVolumeClaim") and request.operation == "CREATE":
        return _judge_claim(request, view=view, config=config)
    if kind == ("", "ConfigMap") and request.operation in ("CREATE", "UPDATE") and config_map:
        return _judge_config_map(request, config_map, view=view)
    dra_kinds = (dra.KIND_CLAIM, dra.KIND_TEMPLATE)
    if kind[0] == "resource.k8s.io" and kind[1] in dra_kinds and request.operation == "CREATE":
        return _judge_resource_claim(request, view=view, config=config, kind=kind[1])
    return Verdict(wire.allow())


# --- rendering: the one place that turns reasons into text ------------------------------


def render_reason(reason: Reason) -> str:
    """One reason as text."""
    if isinstance(reason, limits.Insufficient):
        return quota.render_denial([reason])
    if isinstance(reason, GangShort):
        return render_gang_short(reason)
    if isinstance(reason, gpu_sharing.Rejection):
        return gpu_sharing.render_rejection(reason)
    if isinstance(reason, config_guard.InvalidConfig):
        return config_guard.render_invalid(reason)
    if isinstance(reason, TenantMismatch):
        owner = f"tenant {reason.tenant}" if reason.tenant else "no tenant"
        return (
            f"label {LABEL_TENANT}={reason.claimed} does not match namespace "
            f"{reason.namespace}, which belongs to {owner}; remove the label"
        )
    if isinstance(reason, NoTenant):
        return (
            f"namespace {reason.namespace} belongs to no tenant and defaultTenant.mode is "
            "deny-gpu: GPU pods are not admitted there"
        )
    return reason.problem


def render_gang_short(short: GangShort) -> str:
    """A gang member's denial for its group, e.g.::

    gang ml/job (5 members × nvidia.com/gpu 2) would take tenant ml over its
    nvidia.com/gpu limit: 0 used + 10 for the group > 8 (namespaces: ml); no member of
    the group is admitted until all 5 fit
    """
    item, j = short.item, short.judgement
    r = item.resource
    acc = j.account
    n = acc.min_count or 0

    def show(amount: Fraction) -> str:
        return quantities.format_quantity(amount, quantities.quantity_kind(r))

    own = show(j.demand.get(r, Fraction(0)))
    shape = f"{n} members × {r} {own}"
    if acc.known:
        shape += f", {acc.known} admitted"
    group_now = acc.members.get(r, Fraction(0)) + acc.hold.get(r, Fraction(0))
    others = item.used - group_now
    counted = ", ".join(item.namespaces) or "none"
    return (
        f"gang {acc.key} ({shape}) would take {item.level} {item.tenant} over its {r} "
        f"limit: {show(others)} used + {show(j.after.get(r, Fraction(0)))} for the group > "
        f"{show(item.limit)} (namespaces: {counted}); no member of the group is admitted "
        f"until all {n} fit"
    )


def render_reasons(reasons: tuple[Reason, ...]) -> str:
    """The ``status.message`` of a denial: the reasons' texts joined by ``"; "``."""
    return "; ".join(render_reason(reason) for reason in reasons)


def _deny(reasons: tuple[Reason, ...], *, warnings: tuple[str, ...] = ()) -> Verdict:
    invalid = (gpu_sharing.Rejection, config_guard.InvalidConfig, Malformed)
    code = BAD_REQUEST if all(isinstance(r, invalid) for r in reasons) else FORBIDDEN
    return Verdict(wire.deny(code, render_reasons(reasons), warnings=warnings), reasons)


# --- pods -------------------------------------------------------------------------------


def _namespace(request: wire.AdmissionRequest, obj: Mapping[str, Any]) -> str:
    return request.namespace or (obj.get("metadata") or {}).get("namespace") or ""


def _resolution_warnings(namespace: str, resolution: TenantResolution) -> tuple[str, ...]:
    return resolution.warnings(namespace)


def _judge_pod(
    request: wire.AdmissionRequest,
    *,
    view: TenantUsageView,
    config: FairShareConfig,
    phase: Phase,
    gang: GangContext | None = None,
) -> Verdict:
    pod = request.object
    if pod is None:
        return _deny((Malformed("request.object is missing for a pod CREATE"),))
    namespace = _namespace(request, pod)
    resolution = resolve_tenant(namespace, view.namespace_labels(namespace), config)
    warnings = _resolution_warnings(namespace, resolution)
    tenant = resolution.tenant
    labels = (pod.get("metadata") or {}).get("labels") or {}
    claimed = labels.get(LABEL_TENANT)
    if claimed is not None and claimed != tenant:
        return _deny((TenantMismatch(namespace, str(claimed), tenant),), warnings=warnings)
    sharing = gpu_sharing.check_gpu_sharing(
        pod, config=config, device_memory=view.max_device_memory()
    )
    if isinstance(sharing, gpu_sharing.Rejection):
        return _deny((sharing,), warnings=warnings)
    try:
        # The same rule as the watch counts the pod by (a share of the largest device
        # before it is bound: never over-denies; a whole GPU when no size is known).
        demand = pod_usage(
            pod,
            mig=config.mig_fractions(),
            largest_memory=view.max_device_memory(),
            requests=sharing.requests,
        )
    except DemandError as exc:
        return _deny((Malformed(str(exc)),), warnings=warnings)
    if tenant is None and resolution.source == "deny-gpu" and demand.wants_gpu:
        return _deny((NoTenant(namespace),), warnings=warnings)
    if phase == "mutate":
        patch = _mutations(
            pod,
            tenant=tenant,
            sharing=sharing,
            demand=demand,
            config=config,
            request_uid=request.uid,
        )
        return Verdict(wire.allow(patch=patch, warnings=warnings))
    if tenant is None:
        return Verdict(wire.allow(warnings=warnings))
    key = claim_key(request) or reservations.pod_key(namespace, f"uid:{request.uid}")
    group = gangs.group_of(pod) if gang is not None else None
    if gang is not None and group is not None:
        return _judge_gang_member(
            pod,
            group,
            tenant,
            demand,
            gang=gang,
            namespace=namespace,
            key=key,
            view=view,
            config=config,
            warnings=warnings,
        )
    return _judge_quota(
        tenant, demand, namespace=namespace, key=key, view=view, config=config, warnings=warnings
    )


def _judge_gang_member(
    pod: Mapping[str, Any],
    group: gangs.GroupKey,
    tenant: str,
    demand: PodDemand,
    *,
    gang: GangContext,
    namespace: str,
    key: reservations.PodKey,
    view: TenantUsageView,
    config: FairShareConfig,
    warnings: tuple[str, ...],
) -> Verdict:
    """A member of a pod group: judged for its whole group (``webhook.gangquota``)."""
    if gang.podgroup_problem:
        warnings += (gang.podgroup_problem,)
    name = str((pod.get("metadata") or {}).get("name") or key.rpartition("/")[2])
    n = gang.podgroup_min or gangs.annotated_min_count(pod)
    account = gang.book.account(group, exclude=name, min_count=n)
    if account.complete:  # the group has run whole: a further member counts alone
        return _judge_quota(
            tenant,
            demand,
            namespace=namespace,
            key=key,
            view=view,
            config=config,
            warnings=warnings,
        )
    if account.min_count is None:
        warnings += (
            f"gang {group}: no PodGroup {gangs.PODGROUP_GROUP}/{gangs.PODGROUP_VERSION} "
            f"{group.name} and no {gangs.ANN_MIN_MEMBERS} annotation: its quota is checked "
            "pod by pod, not for the whole group",
        )
        return _judge_quota(
            tenant,
            demand,
            namespace=namespace,
            key=key,
            view=view,
            config=config,
            warnings=warnings,
        )
    judgement = gangquota.judge_member(account, demand.amounts)
    added = PodDemand({r: v for r, v in judgement.added.items() if v > 0}, demand.gpu)
    verdict = _judge_quota(
        tenant,
        added,
        namespace=namespace,
        key=key,
        view=view,
        config=config,
        warnings=warnings,
        claimed=demand,
    )
    if not verdict.response.allowed:
        reasons = tuple(
            GangShort(r, judgement) if isinstance(r, limits.Insufficient) else r
            for r in verdict.reasons
        )
        return _deny(reasons, warnings=warnings)
    member = GangMember(group, name, account.min_count, dict(demand.amounts))
    return Verdict(verdict.response, verdict.reasons, verdict.claim, member)


def _mutations(
    pod: Mapping[str, Any],
    *,
    tenant: str | None,
    sharing: gpu_sharing.Normalised,
    demand: PodDemand,
    config: FairShareConfig,
    request_uid: str = "",
) -> tuple[patches.PatchOp, ...]:
    builder = patches.PatchBuilder(pod)
    if tenant is not None:
        builder.set_entry(("metadata", "labels"), LABEL_TENANT, tenant)
    for key, value in (sharing.canonical or {}).items():
        builder.set_entry(("metadata", "annotations"), key, value)
    scheduler = (pod.get("spec") or {}).get("schedulerName")
    if config.scheduler_name and demand.wants_gpu and scheduler in (None, "", DEFAULT_SCHEDULER):
        builder.set_entry(("spec",), "schedulerName", config.scheduler_name)
    if demand.gpu.source in ("fraction", "memory"):
        if config.gpu_sharing.handoff == "reservation":
            gpu_handoff.handoff_ops(
                pod,
                builder,
                request_uid=request_uid,
                runtime_class=config.gpu_sharing.reservation.runtime_class_name,
            )
        elif config.gpu_sharing.handoff == "hami":
            gpu_handoff.hami_ops(pod, builder)
    return builder.ops


def _judge_quota(
    tenant: str,
    demand: PodDemand,
    *,
    namespace: str,
    key: reservations.PodKey,
    view: TenantUsageView,
    config: FairShareConfig,
    warnings: tuple[str, ...],
    claimed: PodDemand | None = None,
) -> Verdict:
    """``demand`` checked against the limits of ``tenant`` and its ancestors (each over
    the usage of its whole subtree, ``limits.check_limits``); an allow claims ``claimed``
    (default: ``demand``) for the reservation."""

    def usage(members: Sequence[str]) -> Mapping[str, Fraction]:
        return sum_amounts(view.tenant_usage(m) for m in members)

    def counted(members: Sequence[str]) -> list[str]:
        return [namespace, *(ns for m in members for ns in view.tenant_namespaces(m))]

    decision = limits.check_limits(config, tenant, demand, usage, namespaces=counted)
    if decision.insufficient:
        return _deny(decision.insufficient, warnings=warnings)
    warnings += tuple(quota.render_warning(item) for item in decision.near_limit)
    own = claimed if claimed is not None else demand
    claim = Claim(key, tenant, dict(own.amounts)) if own.amounts else None
    return Verdict(wire.allow(warnings=warnings), claim=claim)


# --- persistent volume claims -----------------------------------------------------------


def _judge_claim(
    request: wire.AdmissionRequest, *, view: TenantUsageView, config: FairShareConfig
) -> Verdict:
    pvc = request.object
    if pvc is None:
        return _deny((Malformed("request.object is missing for a PVC CREATE"),))
    namespace = _namespace(request, pvc)
    raw = (((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}).get(STORAGE)
    if raw is None:
        return Verdict(wire.allow())
    try:
        size = quantities.parse_quantity(raw)
    except quantities.QuantityError as exc:
        return _deny((Malformed(f"spec.resources.requests.storage: {exc}"),))
    resolution = resolve_tenant(namespace, view.namespace_labels(namespace), config)
    warnings = _resolution_warnings(namespace, resolution)
    if resolution.tenant is None:
        return Verdict(wire.allow(warnings=warnings))
    demand = PodDemand(amounts={STORAGE: size} if size > 0 else {})
    key = claim_key(request) or reservations.PodKey(f"pvc:{namespace}/uid:{request.uid}")
    return _judge_quota(
        resolution.tenant,
        demand,
        namespace=namespace,
        key=key,
        view=view,
        config=config,
        warnings=warnings,
    )


# --- DRA resource claims -------------------------------------------------------------


def _judge_resource_claim(
    request: wire.AdmissionRequest, *, view: TenantUsageView, config: FairShareConfig, kind: str
) -> Verdict:
    """GPUs requested through DRA count against the tenant's ``nvidia.com/gpu`` limit.

    A ResourceClaim is usage from its creation (as ResourceQuota counts it) and reserves
    like a pod. A ResourceClaimTemplate is not usage (each pod gets its own claim, judged
    when the claim is created), but a template whose single claim could never fit the
    limit is refused up front.
    """
    obj = request.object
    if obj is None:
        return _deny((Malformed(f"request.object is missing for a {kind} CREATE"),))
    namespace = _namespace(request, obj)
    resolution = resolve_tenant(namespace, view.namespace_labels(namespace), config)
    warnings = _resolution_warnings(namespace, resolution)
    if resolution.tenant is None:
        return Verdict(wire.allow(warnings=warnings))
    classes = frozenset(config.dra.gpu_device_classes)
    count = dra.template_gpus if kind == dra.KIND_TEMPLATE else dra.claim_gpus
    gpus = count(
        obj,
        device_classes=classes,
        all_devices=config.dra.all_devices_count,
        devices=_dra_devices(view),
    )
    if gpus <= 0:
        return Verdict(wire.allow(warnings=warnings))
    demand = PodDemand(amounts={GPU: Fraction(gpus)})
    if kind == dra.KIND_TEMPLATE:
        view = _EmptyUsage(view)
    name = (obj.get("metadata") or {}).get("name") or request.name or f"uid:{request.uid}"
    verdict = _judge_quota(
        resolution.tenant,
        demand,
        namespace=namespace,
        key=reservations.PodKey(f"claim:{namespace}/{name}"),
        view=view,
        config=config,
        warnings=warnings,
    )
    if kind == dra.KIND_TEMPLATE:
        return Verdict(verdict.response, verdict.reasons)  # a template reserves nothing
    return verdict


def _dra_devices(view: object) -> dra.SliceCapacity | None:
    """The slices' GPU devices the usage view behind ``view`` follows (views that add
    reservations wrap it as ``base``), None if it follows none."""
    for _ in range(8):
        got = getattr(view, "dra_devices", None)
        if callable(got):
            devices = got()
            return devices if isinstance(devices, dra.SliceCapacity) else None
        view = getattr(view, "base", None)
        if view is None:
            break
    return None


@dataclass(frozen=True)
class _EmptyUsage:
    """A view with no usage: judges whether one claim could ever fit the limit."""

    base: TenantUsageView

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        return self.base.namespace_labels(namespace)

    def tenant_usage(self, tenant: str) -> Mapping[str, Fraction]:
        return {}

    def tenant_namespaces(self, tenant: str) -> Sequence[str]:
        return self.base.tenant_namespaces(tenant)

    def max_device_memory(self) -> int | None:
        return self.base.max_device_memory()


# --- the config ConfigMap ---------------------------------------------------------------


def _judge_config_map(
    request: wire.AdmissionRequest, ref: config_guard.ConfigMapRef, *, view: TenantUsageView
) -> Verdict:
    obj = request.object or {}
    name = (obj.get("metadata") or {}).get("name") or request.name
    if not ref.matches(_namespace(request, obj), name):
        return Verdict(wire.allow())
    parsed = config_guard.parse_config_map(obj, ref=ref)
    if isinstance(parsed, config_guard.InvalidConfig):
        return _deny((parsed,))
    below = config_guard.check_limits_below_usage(parsed, view.tenant_usage)
    warnings = tuple(config_guard.render_limit_below_usage(item) for item in below)
    return Verdict(wire.allow(warnings=warnings))
