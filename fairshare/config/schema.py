"""The FairShareConfig schema (``apiVersion: fairshare.io/v1alpha1``) as pydantic v2 models.

Every model is frozen and forbids unknown keys; documents use camelCase keys, Python code
may use the snake_case names. Quantities stay the strings the user wrote, so a dump gives
back what was loaded; the accessors parse them into exact ``Fraction`` amounts. The
scalar field types live in ``fairshare.config.fields`` (re-exported here). One module
because each cross-field check takes a ``FairShareConfig``: split, the checks and the
models would import each other.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from fractions import Fraction
from typing import Annotated, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from fairshare import quantities
from fairshare.config.fields import (
    CPU_RESOURCE,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    NATIVE_RESOURCES,
    Band,
    ConditionType,
    DnsLabel,
    Duration,
    HalfLife,
    LabelSelector,
    MigProfile,
    PodCount,
    PositiveWeight,
    Quantity,
    ResourceName,
    SchedulerName,
    TaintKey,
    UnitFraction,
    Weight,
    _fail,
    _not_bool,
    _positive,
    is_label_key,
    is_label_value,
    parse_duration,
    validate_resource_name,
)

__all__ = [
    "API_VERSION",
    "CONSISTENCY_ERROR",
    "CPU_RESOURCE",
    "GPU_RESOURCE",
    "KIND",
    "MIG_RESOURCE_PREFIX",
    "NATIVE_RESOURCES",
    "Band",
    "ConditionType",
    "DefaultTenantPolicy",
    "DnsLabel",
    "Duration",
    "FairShareConfig",
    "GpuSharing",
    "HalfLife",
    "HealthPolicy",
    "LabelSelector",
    "MigProfile",
    "NodePrice",
    "PodCount",
    "PositiveWeight",
    "PreemptionPolicy",
    "Pricing",
    "Quantity",
    "Quarantine",
    "ReservationHandoff",
    "ResourceName",
    "ResourceSpec",
    "SchedulerName",
    "ScoringWeights",
    "TaintKey",
    "Tenant",
    "UnitFraction",
    "UsageHistory",
    "Weight",
    "is_label_key",
    "is_label_value",
    "parse_duration",
    "validate_resource_name",
]

API_VERSION: Final = "fairshare.io/v1alpha1"
KIND: Final = "FairShareConfig"
CONSISTENCY_ERROR: Final = "fairshare_consistency"
"""pydantic error type of the cross-field checks; ``ctx["errors"]`` holds (path, message)."""

DEFAULT_MIG_PROFILES: Final = {
    "1g.10gb": "1/7", "2g.20gb": "2/7", "3g.40gb": "3/7", "4g.40gb": "4/7", "7g.80gb": "1",
    "1g.5gb": "1/7", "2g.10gb": "2/7", "3g.20gb": "3/7",
}  # fmt: skip
# GPU health signals, by the tool that writes them (sources: docs/health.md). Condition
# types a reporter sets to "True" only for a fatal fault: fairshare's own earlier names,
# NVSentinel's platform connectors (DCGM, syslog and NVSwitch checks) and the AKS Node
# Problem Detector GPU plugin.
DEFAULT_UNHEALTHY_CONDITIONS: Final = (
    "GpuUnhealthy", "GPUUnhealthy", "XidCriticalError", "GpuXidError", "GpuEccError",
    "DCGMHealthCheckFailed",
    "GpuMemWatch", "GpuThermalWatch", "GpuPcieWatch", "GpuPowerWatch", "GpuInforomWatch",
    "GpuSmWatch", "GpuNvlinkWatch", "GpuMcuWatch", "GpuPmuWatch", "GpuDriverWatch",
    "GpuCpusetWatch", "SysLogsXIDError", "SysLogsSXIDError", "SysLogsGPUFallenOff",
    "NVSwitchFatalError", "NVSwitchDown",
    "GPUMissing", "GPUXIDErrors",
)  # fmt: skip
# Conditions that say something is off without a fatal fault: a score penalty only.
DEFAULT_WARNING_CONDITIONS: Final = (
    "NVSwitchNonFatalError", "DCGMError", "SyslogError", "CSPMaintenance",
)  # fmt: skip
# Conditions whose status "False" means the node's accelerators failed (EKS node
# monitoring agent).
DEFAULT_NOT_READY_CONDITIONS: Final = ("AcceleratedHardwareReady",)
DEFAULT_UNHEALTHY_TAINTS: Final = (
    "nvidia.com/gpu.unhealthy", "fairshare.io/gpu-unhealthy",
    "nvidia.com/gpu-xid-error", "nvidia.com/gpu-nvlink-error", "nvidia.com/syslog-xid-error",
    "nvidia.com/gpu-error",
)  # fmt: skip
# Labels a remediator sets on the nodes it cordons or works on (NVSentinel): fairshare's
# quarantine leaves such nodes to it.
DEFAULT_REMEDIATOR_LABELS: Final = (
    "k8saas.nvidia.com/cordon-by", "dgxc.nvidia.com/nvsentinel-state",
)  # fmt: skip


def _amounts(values: dict[str, str]) -> dict[str, Fraction]:
    return {name: quantities.parse_quantity(text) for name, text in values.items()}


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
    )


# --- models --------------------------------------------------------------------------------


class ResourceSpec(_Model):
    """One DRF dimension."""

    weight: Weight = 1.0
    """Weight of this resource in a tenant's dominant share (>= 0, default 1). With 0 the
    resource still counts against guarantees and limits but not for fairness."""


class Tenant(_Model):
    """A named set of namespaces that share one quota and one fair share."""

    name: DnsLabel
    """Tenant name, a DNS-1123 label; namespaces labelled fairshare.io/tenant=<name> join."""

    parent: DnsLabel | None = None
    """Name of the tenant this one belongs to (default none: a top-level tenant). Tenants
    form a tree (organisation, team, project): the weights of a parent's children divide
    the parent's share, a parent's limit caps its whole subtree, the children's
    guarantees must fit in the parent's. Only tenants without children may have
    namespaces."""

    namespaces: tuple[DnsLabel, ...] = ()
    """Namespaces that belong to this tenant (default none). A namespace may be listed by
    one tenant only."""

    namespace_selector: LabelSelector | None = None
    """matchLabels-style selector: namespaces carrying all these labels join (default none).
    Two tenants' selectors must not be able to match one namespace (they need a label key
    with different values); a namespace listed by a tenant, or labelled
    fairshare.io/tenant, is not taken by a selector."""

    weight: PositiveWeight = 1.0
    """Fair-share weight (> 0, default 1): a tenant with weight 2 is entitled to twice the
    dominant share of a tenant with weight 1."""

    guaranteed: dict[str, Quantity] = Field(default_factory=dict)
    """Per resource, the amount never reclaimed by other tenants (quantities, e.g. cpu "8",
    memory "64Gi", nvidia.com/gpu "2" or "0.5"; default none)."""

    limit: dict[str, Quantity] | None = None
    """Per resource, a hard ceiling including borrowing. Omitted (default) means no limit at
    all; a resource missing from the map is unlimited; "0" means none of it."""

    reclaim_to_fair_share: bool | None = None
    """Whether the reclaimer may evict other tenants' youngest pods to bring this tenant up
    to its fair share, not only to its guarantee (victims stay at or above their own fair
    share and guarantee). Default: as the parent tenant, else the top-level
    ``reclaimToFairShare``."""

    def guaranteed_amounts(self) -> dict[str, Fraction]:
        """``guaranteed`` parsed: resource name -> exact amount (cores, bytes, GPUs)."""
        return _amounts(self.guaranteed)

    def limit_amounts(self) -> dict[str, Fraction] | None:
        """``limit`` parsed, or None when the tenant has no limit at all."""
        return None if self.limit is None else _amounts(self.limit)

    def limit_for(self, resource: str) -> Fraction | None:
        """The limit on one resource, or None when that resource is unlimited."""
        if self.limit is None or resource not in self.limit:
            return None
        return quantities.parse_quantity(self.limit[resource])


class DefaultTenantPolicy(_Model):
    """What happens to pods in namespaces that no tenant claims."""

    mode: Literal["tenant", "deny-gpu", "allow"] = "tenant"
    """"tenant" (default): they belong to the tenant called `name` (created with weight 1 and
    no quota if not listed). "deny-gpu": their GPU requests are denied. "allow": they are
    admitted and not tracked."""

    name: DnsLabel = "default"
    """The catch-all tenant used by mode "tenant" (default "default")."""


class PreemptionPolicy(_Model):
    """Which pods a higher-priority pod may displace (the extender's preempt verb judges
    kube-scheduler's proposed victims; the idea of Kueue's preemption policies)."""

    within_tenant: Literal["LowerPriority", "Never"] = "LowerPriority"
    """Pods of the preemptor's own tenant: "LowerPriority" (default): any of lower
    priority, and they are taken first (fairshare puts them in the place of other
    tenants' pods kube-scheduler proposed on the same node). "Never": none."""

    other_tenants: Literal["AboveFairShare", "Any", "Never"] = "AboveFairShare"
    """Pods of other tenants: "AboveFairShare" (default): only of a tenant above its fair
    share, never taking it below its guarantee, nor below its fair share while the
    preemptor's tenant rises above its own (at every level of a tenant tree). "Any":
    kube-scheduler's choice (guarantees still protected). "Never": none."""


class ReservationHandoff(_Model):
    """Handoff ``reservation``: a pod per shared GPU holds it on the node and reports its UUID."""

    namespace: DnsLabel = "fairshare-reservation"
    """Namespace of the reservation pods (default "fairshare-reservation")."""

    image: str = Field(default="ghcr.io/fairshare/fairshare:0.1.0", min_length=1)
    """Image of the reservation pods. It must report the GPU it was given: fairshare's own
    image runs `fairshare gpu-reporter`; KAI's resource-reservation image works too (then
    set `command: []`). Default: fairshare's image."""

    command: tuple[str, ...] = ("fairshare", "gpu-reporter")
    """The reservation container's command (empty: the image's entrypoint)."""

    service_account: DnsLabel = "fairshare-gpu-reporter"
    """ServiceAccount of the reservation pods: it may patch pods in `namespace`."""

    app_label: DnsLabel = "fairshare-gpu-reservation"
    """Value of the `app` label on reservation pods (how the extender finds them)."""

    runtime_class_name: DnsLabel | None = Field(default=None, examples=["nvidia"])
    """runtimeClassName of the reservation pods, and of fractional pods that set none, e.g.
    "nvidia" where the NVIDIA runtime is not the node's default (default none)."""

    report_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long after bind a shared GPU may stay without a reported UUID before its pods
    get a Warning event (default 60)."""


class GpuSharing(_Model):
    """Rules for fractional GPU requests (fairshare.io/gpu-fraction, fairshare.io/gpu-memory)."""

    handoff: Literal["reservation", "hami", "none"] = "reservation"
    """How a shared GPU reaches the containers. "reservation" (default): a reservation pod
    holds the GPU on the node and each fractional pod gets NVIDIA_VISIBLE_DEVICES from a
    ConfigMap bind writes (stock NVIDIA device plugin). "hami": HAMi's pod annotations,
    for HAMi's device plugin. "none": accounting only (nothing on the node reads it)."""

    reservation: ReservationHandoff = Field(default_factory=ReservationHandoff)
    """Settings of the "reservation" handoff."""

    fraction_step: UnitFraction = "0.05"
    """Fractions are whole multiples of this step (a fraction in (0, 1], default "0.05")."""

    min_fraction: UnitFraction = "0.05"
    """Smallest fraction a pod may request (a fraction in (0, 1], default "0.05")."""

    max_pods_per_gpu: PodCount = 8
    """Most pods that may share one physical GPU (>= 1, default 8)."""

    memory_unit: Quantity = "1Mi"
    """Granularity of GPU-memory requests (a quantity in bytes, > 0, default "1Mi")."""

    @field_validator("memory_unit")
    @classmethod
    def _memory_unit_positive(cls, value: str) -> str:
        if quantities.parse_quantity(value) <= 0:
            _fail("quantity", "must be > 0")
        return value

    def fraction_step_amount(self) -> Fraction:
        """``fraction_step`` as an exact fraction."""
        return quantities.parse_fraction(self.fraction_step)

    def min_fraction_amount(self) -> Fraction:
        """``min_fraction`` as an exact fraction."""
        return quantities.parse_fraction(self.min_fraction)

    def memory_unit_bytes(self) -> int:
        """``memory_unit`` in bytes (rounded up)."""
        return quantities.parse_bytes(self.memory_unit)


class ScoringWeights(_Model):
    """Weights of the node-score terms (each >= 0). All zero gives every node the same score."""

    fragmentation: Weight = 1.0
    """FGD fragmentation gradient: how much the placement grows the GPU capacity the
    observed workload mix can no longer use (Weng et al., ATC'23) (default 1)."""

    packing: Weight = 0.02
    """Best-fit packing: least weighted CPU+GPU left over on the node. A small weight
    breaks FGD's near-ties towards fuller nodes; nodes of a GPU model that pods
    restricted to some models may use get no packing pull, so it never draws
    unconstrained pods onto them (default 0.02; measured on openb, see
    docs/simulator/openb.md)."""

    fit: Weight = 0.0
    """DRFH best fit of the pod's demand shape to the node's free shape (default 0)."""

    stranding: Weight = 0.0
    """Penalty for CPU-only pods eating the CPU and memory a node's free GPUs need
    (default 0)."""

    fairness: Weight = 0.0
    """Tenant spread: prefer nodes where the pod's tenant holds less GPU (default 0)."""

    spread: Weight = 0.0
    """Least-allocated GPU: prefer emptier nodes (default 0: off)."""

    health: Weight = 1.0
    """Prefer nodes without GPU health warnings, also for CPU-only pods (default 1)."""

    def weights(self) -> dict[str, float]:
        """Term name -> weight, in field order (the keys of the scorer registry)."""
        return {name: getattr(self, name) for name in type(self).model_fields}


class Quarantine(_Model):
    """Quarantine of failed GPU nodes, for clusters without a remediator (opt-in)."""

    enabled: bool = False
    """Cordon a node whose GPUs report a fatal signal, drain its pods (gangs whole, within
    PodDisruptionBudgets), and uncordon it when the signal clears; only nodes fairshare
    cordoned are ever uncordoned (default false: fairshare reads health and acts on
    nothing)."""

    max_nodes: PodCount = 1
    """Circuit breaker: at most this many nodes quarantined within ``window`` (default 1).
    Past it fairshare quarantines no more nodes and says so (status, metric, alert)."""

    max_fraction: Band = 0.1
    """Circuit breaker: at most this fraction of the GPU nodes quarantined within
    ``window`` (default 0.1), rounded down but never below one node (0: no quarantine at
    all). The tighter of the two limits holds."""

    window: Duration = Field(default="1h", examples=["1h", "30m"])
    """The circuit breaker's sliding window (default 1h)."""

    drain: bool = True
    """Evict the pods of a quarantined node (default true; false: cordon only)."""


class HealthPolicy(_Model):
    """GPU health signals, and what fairshare does when GPUs fail."""

    unhealthy_conditions: tuple[ConditionType, ...] = DEFAULT_UNHEALTHY_CONDITIONS
    """Node condition types that, when status is "True", mean a fatal GPU fault: the
    node's GPUs leave service (no new GPU pods, out of the capacity that fair shares
    divide). Default: the names NVSentinel, the AKS Node Problem Detector GPU plugin
    and fairshare's earlier defaults use."""

    warning_conditions: tuple[ConditionType, ...] = DEFAULT_WARNING_CONDITIONS
    """Node condition types that, when status is "True", are a non-fatal warning: the
    node stays in service with a score penalty (``scoring.health``)."""

    not_ready_conditions: tuple[ConditionType, ...] = DEFAULT_NOT_READY_CONDITIONS
    """Node condition types that, when status is "False", mean a fatal GPU fault (EKS's
    ``AcceleratedHardwareReady``)."""

    unhealthy_taints: tuple[TaintKey, ...] = DEFAULT_UNHEALTHY_TAINTS
    """Taint keys that mark the node's GPUs failed, whatever their value and effect
    (NVSentinel's documented taints and fairshare's own)."""

    remediator_labels: tuple[TaintKey, ...] = DEFAULT_REMEDIATOR_LABELS
    """Node label keys a remediator (NVSentinel) sets on nodes it cordons: such a node
    cordoned counts as failed, and fairshare's quarantine leaves it to the remediator."""

    recover_gangs: bool = True
    """When a member of a gang is lost to a hardware fault, evict the rest of the gang so
    that it restarts whole (default true). Lone pods are left to their controllers."""

    forgive_faults: bool = True
    """Run time lost to a hardware fault is not charged to the tenant's usage history,
    and the pods restarted after it keep their place in the queue (default true)."""

    quarantine: Quarantine = Field(default_factory=Quarantine)
    """Cordon and drain failed GPU nodes (opt-in, off by default)."""


class DraPolicy(_Model):
    """Dynamic Resource Allocation: which ResourceClaim devices are GPUs."""

    gpu_device_classes: tuple[str, ...] = ("gpu.nvidia.com", "mig.nvidia.com")
    """DeviceClass names whose devices are GPUs in capacity, usage, limits and fairness
    (default: the classes NVIDIA's DRA driver installs, ``gpu.nvidia.com`` for full GPUs
    and ``mig.nvidia.com`` for MIG partitions). A full GPU counts 1, a partition its
    fraction of the GPU (from the counters it consumes), a share of a shareable GPU the
    part of its capacity it consumed."""

    all_devices_count: int = Field(default=8, ge=1)
    """GPUs an unallocated request with ``allocationMode: All`` counts as (default 8, a
    full node); once allocated, the devices actually given count."""


class UsageHistory(_Model):
    """Fairness with memory (opt-in): each tenant's resource-seconds, decayed with a
    half-life, lower the weight of a tenant that used more than its weighted share in
    the recent past (``fairshare.history``)."""

    half_life: HalfLife = Field(examples=["1h"])
    """Half-life of past usage (a duration: 1h, 30m, 1h30m; at least 1m). Usage this long
    ago counts half as much as usage now. Required."""

    strength: Weight = 1.0
    """How strongly past over-use lowers a tenant's weight (k >= 0, default 1; 0: the
    history is kept and shown but changes nothing). A tenant whose decayed usage share
    U exceeds its weighted share W gets its weight times W / (W + k (U - W))."""

    min_weight_factor: Annotated[float, BeforeValidator(_not_bool), AfterValidator(_positive)] = (
        Field(default=0.1, le=1.0)
    )
    """Floor of that factor, in (0, 1] (default 0.1): however much a tenant used, it
    keeps at least this fraction of its weight, so it is never starved."""

    def half_life_seconds(self) -> float:
        """``half_life`` in seconds."""
        return parse_duration(self.half_life)


_PRICING_KEYS: Final = frozenset({"resources", "gpuModels", "gpu_models", "nodes"})


def _migrate_flat_pricing(value: object) -> object:
    """The flat map of earlier configs (``pricing: {nvidia.com/gpu: 2.5, cpu: 0.03}``)
    is the ``resources`` table of the structured form: old configs keep their meaning."""
    if isinstance(value, Mapping) and value and not (set(value) & _PRICING_KEYS):
        return {"resources": dict(value)}
    return value


class NodePrice(_Model):
    """Prices of one node, over its GPU model's and the default resource prices."""

    gpu: Weight | None = None
    """Price of one of this node's GPUs for one hour (unset: by its GPU model)."""

    resources: dict[str, Weight] = Field(default_factory=dict)
    """Price per unit-hour of other resources on this node (cpu per core, memory per
    byte), over ``pricing.resources``."""


class Pricing(_Model):
    """Chargeback prices (``docs/chargeback.md``). Which price a GPU-hour gets, first
    match: OpenCost's ``node_gpu_hourly_cost`` for the node where OpenCost runs (the
    report and the recording rules), else ``nodes.<node>.gpu``, else
    ``gpuModels.<nvidia.com/gpu.product>``, else ``resources.nvidia.com/gpu``."""

    resources: dict[str, Weight] = Field(default_factory=dict)
    """Price per unit-hour of each resource (1 GPU, 1 core, 1 byte), >= 0. The flat map
    earlier versions took as ``pricing`` is read as this table."""

    gpu_models: dict[str, Weight] = Field(
        default_factory=dict, examples=[{"NVIDIA-H100-80GB-HBM3": 4.0, "Tesla-T4": 0.35}]
    )
    """Price of one GPU for one hour by GPU model, the ``nvidia.com/gpu.product`` label
    GPU feature discovery puts on the node."""

    nodes: dict[str, NodePrice] = Field(default_factory=dict)
    """Per-node overrides, by node name."""

    def gpu_hourly(self, node: str, model: str) -> float | None:
        """The configured price of one GPU-hour on ``node`` (GPU model ``model``), None
        when nothing prices it."""
        override = self.nodes.get(node)
        if override is not None and override.gpu is not None:
            return override.gpu
        if model in self.gpu_models:
            return self.gpu_models[model]
        return self.resources.get(GPU_RESOURCE)

    def resource_hourly(self, node: str, resource: str) -> float | None:
        """The configured price of one unit-hour of ``resource`` on ``node``."""
        override = self.nodes.get(node)
        if override is not None and resource in override.resources:
            return override.resources[resource]
        return self.resources.get(resource)


def _default_resources() -> dict[str, ResourceSpec]:
    return {name: ResourceSpec() for name in NATIVE_RESOURCES}


class FairShareConfig(_Model):
    """The whole fairshare configuration (ConfigMap key config.yaml)."""

    api_version: Literal["fairshare.io/v1alpha1"] = API_VERSION
    """Schema version; must be "fairshare.io/v1alpha1"."""

    kind: Literal["FairShareConfig"] = KIND
    """Must be "FairShareConfig"."""

    resources: dict[ResourceName, ResourceSpec] = Field(default_factory=_default_resources)
    """The DRF dimensions in order, each with a weight. Must include nvidia.com/gpu (GPUs,
    fractions allowed) and cpu; the default is nvidia.com/gpu, cpu, memory, ephemeral-storage and
    storage (bound PVC requests), all weight 1. Also allowed: hugepages-<size>,
    nvidia.com/mig-<profile> and extended resources <domain>/<name>."""

    tenants: tuple[Tenant, ...] = ()
    """The tenants. Names are unique; a namespace belongs to at most one tenant."""

    default_tenant: DefaultTenantPolicy = Field(default_factory=DefaultTenantPolicy)
    """Policy for namespaces that no tenant claims."""

    preemption: PreemptionPolicy = Field(default_factory=PreemptionPolicy)
    """Which running pods a pending pod of higher priority may displace."""

    reclaim_to_fair_share: bool = False
    """Reclaim toward fair share for every tenant that does not say otherwise (default
    false: reclaim only gives tenants their ``guaranteed`` amounts back)."""

    reclaim_take_back_after: Duration = Field(default="1h", examples=["1h", "30m", "0s"])
    """No take-back: for how long a pod that got its room by reclaim keeps its tenant
    from being a victim of reclaim toward fair share for the tenants whose pods were
    evicted for it (while the pod runs; the reclaimer records them on the pod,
    ``fairshare.io/reclaimed-from`` and ``fairshare.io/reclaimed-at``). Fair shares
    move with demand and usage history; without this, room given would be taken back,
    two running pods lost for nothing. After it, reclaim may take room back if the
    fair shares still call for it. ``0s``: no such rule. Guarantees are always
    reclaimed."""

    hold_for_blocked_tenants: bool = False
    """Hold a tenant above its fair share also while a lower-share tenant has a waiting
    pod that fits no node now but would fit some node once that node's pods were gone
    (default false: only a pod that fits now holds others; idle room goes to whoever
    fits). A pod that fits no node even when drained, or that is not waiting (scheduling
    gates, another scheduler), never holds anyone. Trades some GPU allocation for
    fairness at saturation."""

    yield_band: Band = 0.0
    """From which fraction of its fair share a tenant yields: a pod whose tenant's
    share after it would exceed ``(1 - yieldBand)`` × its fair share waits while a
    tenant further behind its own fair share (a lower fraction of it; of equal
    fractions, the smaller name first) has a waiting pod that fits now and keeps that
    tenant within its fair share (default 0: only above the fair share; 1: furthest
    behind first, always). Work-conserving like the plain gate: when waiting pods fit
    now, some pod goes. Below the fair share only pods that fit now hold others, never
    blocked ones. Spreads what fragmentation leaves idle over the tenants instead of on
    whoever runs out of fitting pods first; costs gate work for pods near their
    tenant's fair share."""

    usage_history: UsageHistory | None = None
    """Fairness with memory: past usage, decayed with a half-life, lowers the weight of
    tenants that used more than their weighted share (default: unset, off; every
    decision is as without it)."""

    gpu_sharing: GpuSharing = Field(default_factory=GpuSharing)
    """Fractional GPU rules."""

    mig: dict[MigProfile, UnitFraction] = Field(default_factory=lambda: dict(DEFAULT_MIG_PROFILES))
    """MIG profile -> fraction of a GPU it stands for (in (0, 1], e.g. "1/7"). Replaces the
    default table (A100/H100 profiles) when given."""

    scoring: ScoringWeights = Field(default_factory=ScoringWeights)
    """Node-score term weights."""

    health: HealthPolicy = Field(default_factory=HealthPolicy)
    """GPU health signals."""

    dra: DraPolicy = Field(default_factory=DraPolicy)
    """GPUs requested through DRA ResourceClaims."""

    pricing: Annotated[Pricing | None, BeforeValidator(_migrate_flat_pricing)] = Field(
        default=None,
        examples=[
            {
                "resources": {"nvidia.com/gpu": 2.5, "cpu": 0.03},
                "gpuModels": {"NVIDIA-H100-80GB-HBM3": 4.0},
            }
        ],
    )
    """Optional chargeback prices: per resource-hour, per GPU model, per node
    (``Pricing``). A flat map ``{resource: price}`` (the earlier form) is read as
    ``resources``. Default: no pricing."""

    scheduler_name: SchedulerName | None = Field(default=None, examples=["fairshare-scheduler"])
    """If set, the webhook sets spec.schedulerName on GPU pods to this, and the fair-share
    gate counts only pods of this scheduler as waiting (unset: default-scheduler's).
    Default: unset."""

    capacity: dict[str, Quantity] | None = Field(
        default=None, examples=[{"nvidia.com/gpu": "64", "cpu": "1024"}]
    )
    """Optional declared cluster capacity: checks that the guarantees fit, and is the
    capacity in shares of a resource no node reports (storage, or GPUs offered only
    through DRA). Default: not checked; such a resource then counts in no share."""

    @model_validator(mode="after")
    def _consistent(self) -> FairShareConfig:
        problems = [
            *_check_resources(self),
            *_check_tenants(self),
            *_check_pricing(self),
            *_check_known_keys("capacity", self.capacity, self),
            *_check_capacity(self),
        ]
        if problems:
            raise PydanticCustomError(
                CONSISTENCY_ERROR,
                "{message}",
                {
                    "message": "\n".join(f"{path}: {text}" for path, text in problems),
                    "errors": [[path, text] for path, text in problems],
                },
            )
        return self

    # --- accessors used by the core --------------------------------------------------------

    def resource_names(self) -> tuple[str, ...]:
        """DRF dimensions in declared order (the columns of the resource vectors)."""
        return tuple(self.resources)

    def resource_weights(self) -> tuple[float, ...]:
        """Weights aligned with ``resource_names()``."""
        return tuple(spec.weight for spec in self.resources.values())

    def mig_fractions(self) -> dict[str, Fraction]:
        """MIG profile (``"1g.10gb"``) -> fraction of a GPU (parsed once per table: every
        pod read asks for it)."""
        return dict(_mig_fractions(tuple(self.mig.items())))

    def mig_resource_fraction(self, resource: str) -> Fraction | None:
        """GPU fraction of a MIG resource (``nvidia.com/mig-1g.10gb``), None if unknown."""
        if not resource.startswith(MIG_RESOURCE_PREFIX):
            return None
        text = self.mig.get(resource.removeprefix(MIG_RESOURCE_PREFIX))
        return None if text is None else quantities.parse_fraction(text)

    def all_tenants(self) -> tuple[Tenant, ...]:
        """Declared tenants, then the implicit default tenant if mode "tenant" needs one."""
        policy = self.default_tenant
        if policy.mode != "tenant" or any(t.name == policy.name for t in self.tenants):
            return self.tenants
        return (*self.tenants, Tenant(name=policy.name))

    def tenant(self, name: str) -> Tenant | None:
        """The tenant called ``name`` (including the implicit default tenant), or None."""
        return next((t for t in self.all_tenants() if t.name == name), None)

    def is_hierarchical(self) -> bool:
        """True when some tenant names a parent (the tenants form a tree)."""
        return any(t.parent is not None for t in self.tenants)

    def children(self, name: str) -> tuple[Tenant, ...]:
        """The tenants whose parent is ``name``, in config order."""
        return tuple(t for t in self.tenants if t.parent == name)

    def ancestors(self, name: str) -> tuple[Tenant, ...]:
        """The parent of tenant ``name``, its parent, ... up to the top (empty for a root)."""
        out: list[Tenant] = []
        current = self.tenant(name)
        seen = {name}
        while current is not None and current.parent is not None:
            parent = self.tenant(current.parent)
            if parent is None or parent.name in seen:
                break
            seen.add(parent.name)
            out.append(parent)
            current = parent
        return tuple(out)

    def subtree(self, name: str) -> tuple[str, ...]:
        """``name`` and every tenant below it, ``name`` first (just ``name`` for a leaf)."""
        out = [name]
        for current in out:
            out.extend(t.name for t in self.tenants if t.parent == current and t.name not in out)
        return tuple(out)

    def level_name(self, name: str) -> str:
        """What a tenant is called in messages: "organisation" at the top of a tree,
        "team" in between, "tenant" for one without children (and in flat configs)."""
        spec = self.tenant(name)
        if spec is None or not self.children(name):
            return "tenant"
        return "organisation" if spec.parent is None else "team"

    def take_back_after_seconds(self) -> float:
        """``reclaimTakeBackAfter`` in seconds."""
        return parse_duration(self.reclaim_take_back_after)

    def reclaims_to_fair_share(self, name: str) -> bool:
        """Does reclaim bring tenant ``name`` up to its fair share (its own setting, else
        its nearest ancestor's, else the top-level one)?"""
        for spec in (self.tenant(name), *self.ancestors(name)):
            if spec is not None and spec.reclaim_to_fair_share is not None:
                return spec.reclaim_to_fair_share
        return self.reclaim_to_fair_share

    def capacity_amounts(self) -> dict[str, Fraction] | None:
        """``capacity`` parsed, or None when no capacity is declared."""
        return None if self.capacity is None else _amounts(self.capacity)


# --- cross-field checks: each yields (path, message) -----------------------------------------

Problem = tuple[str, str]


def _check_resources(config: FairShareConfig) -> list[Problem]:
    problems: list[Problem] = []
    if GPU_RESOURCE not in config.resources:
        problems.append(("resources", f'must include "{GPU_RESOURCE}"'))
    if CPU_RESOURCE not in config.resources:
        # The extender's fragmentation score and workload mix read the CPU column.
        problems.append(("resources", f'must include "{CPU_RESOURCE}"'))
    if config.resources and not any(w > 0 for w in config.resource_weights()):
        problems.append(("resources", "at least one resource weight must be > 0"))
    for name in config.resources:
        profile = name.removeprefix(MIG_RESOURCE_PREFIX)
        if name.startswith(MIG_RESOURCE_PREFIX) and profile not in config.mig:
            problems.append(
                (f"resources.{name}", f'unknown MIG profile "{profile}"; add it to mig')
            )
    return problems


def _unknown_resource(name: str, config: FairShareConfig) -> str:
    known = ", ".join(config.resources)
    problem = validate_resource_name(name)
    if problem is not None:
        return problem
    return f'unknown resource "{name}" (not in resources: {known})'


def _check_known_keys(
    field: str, values: Mapping[str, object] | None, config: FairShareConfig
) -> list[Problem]:
    if values is None:
        return []
    return [
        (f"{field}.{name}", _unknown_resource(name, config))
        for name in values
        if name not in config.resources
    ]


def _check_pricing(config: FairShareConfig) -> list[Problem]:
    pricing = config.pricing
    if pricing is None:
        return []
    problems = _check_known_keys("pricing.resources", pricing.resources, config)
    for node, price in pricing.nodes.items():
        problems += _check_known_keys(f"pricing.nodes.{node}.resources", price.resources, config)
    return problems


def _check_tenants(config: FairShareConfig) -> list[Problem]:
    problems: list[Problem] = []
    first_index: dict[str, int] = {}
    owner: dict[str, int] = {}  # namespace -> index of the first tenant listing it
    for i, tenant in enumerate(config.tenants):
        if tenant.name in first_index:
            also = f"tenants[{first_index[tenant.name]}]"
            problems.append((f"tenants[{i}].name", f'duplicate tenant "{tenant.name}" ({also})'))
        first_index.setdefault(tenant.name, i)
        for j, namespace in enumerate(tenant.namespaces):
            path = f"tenants[{i}].namespaces[{j}]"
            if owner.get(namespace, i) != i:
                other = config.tenants[owner[namespace]].name
                problems.append((path, f'namespace "{namespace}" is already in tenant "{other}"'))
            elif namespace in owner:
                problems.append((path, f'namespace "{namespace}" is listed twice'))
            owner.setdefault(namespace, i)
        problems.extend(_check_tenant_amounts(i, tenant, config))
    problems.extend(_check_selector_overlap(config, owner))
    problems.extend(_check_tree(config))
    return problems


NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
"""The label kube-apiserver puts on every namespace, valued with its name."""


def _check_selector_overlap(config: FairShareConfig, owner: Mapping[str, int]) -> list[Problem]:
    """Refuse tenants whose selection can pick one namespace twice.

    Two ``namespaceSelector``s (matchLabels: all must match) can both match a namespace
    unless some label key is in both with different values; such a pair is refused on the
    later tenant, with a namespace's labels that would match both. So is a selector that
    names, by ``kubernetes.io/metadata.name``, a namespace another tenant lists. (A listed
    namespace that merely carries matching labels cannot be known from the config alone:
    the list wins, and the webhook warns when it admits a pod there.)
    """
    problems: list[Problem] = []
    selected = [(i, t) for i, t in enumerate(config.tenants) if t.namespace_selector]
    for n, (j, later) in enumerate(selected):
        mine = later.namespace_selector or {}
        path = f"tenants[{j}].namespaceSelector"
        for i, earlier in selected[:n]:
            theirs = earlier.namespace_selector or {}
            if any(theirs[key] != mine[key] for key in theirs.keys() & mine.keys()):
                continue
            labels = ", ".join(f"{k}={v}" for k, v in sorted((theirs | mine).items()))
            text = (
                f'can select the same namespaces as tenant "{earlier.name}" (tenants[{i}]): '
                f"a namespace labelled {labels} matches both; give both selectors one label "
                "key with different values"
            )
            problems.append((path, text))
        listed = mine.get(NAMESPACE_NAME_LABEL)
        if listed is not None and owner.get(listed, j) != j:
            other = config.tenants[owner[listed]].name
            text = f'selects namespace "{listed}", which tenant "{other}" lists'
            problems.append((f"{path}.{NAMESPACE_NAME_LABEL}", text))
    return problems


def _check_tree(config: FairShareConfig) -> list[Problem]:
    """Parents: known, no cycles, no namespaces on inner nodes, guarantees nested."""
    problems: list[Problem] = []
    parents = {t.name: t.parent for t in config.tenants}
    for i, tenant in enumerate(config.tenants):
        if tenant.parent is None:
            continue
        path = f"tenants[{i}].parent"
        if tenant.parent == tenant.name:
            problems.append((path, f'tenant "{tenant.name}" cannot be its own parent'))
        elif tenant.parent not in parents:
            problems.append((path, f'unknown tenant "{tenant.parent}"'))
        else:
            chain = [tenant.name]
            current: str | None = tenant.parent
            while current is not None and current not in chain and current in parents:
                chain.append(current)
                current = parents[current]
            if current == tenant.name:
                cycle = " -> ".join([*chain, tenant.name])
                problems.append((path, f"parents form a cycle: {cycle}"))
    for i, tenant in enumerate(config.tenants):
        kids = [t for t in config.tenants if t.parent == tenant.name and t is not tenant]
        if not kids:
            continue
        names = ", ".join(k.name for k in kids)
        if tenant.namespaces:
            text = f"tenant has children ({names}); only tenants without children own namespaces"
            problems.append((f"tenants[{i}].namespaces", text))
        if tenant.namespace_selector:
            text = f"tenant has children ({names}); only tenants without children own namespaces"
            problems.append((f"tenants[{i}].namespaceSelector", text))
        policy = config.default_tenant
        if policy.mode == "tenant" and policy.name == tenant.name:
            text = f'tenant "{tenant.name}" has children ({names}); namespaces belong to leaves'
            problems.append(("defaultTenant.name", text))
        own = tenant.guaranteed_amounts()
        totals: dict[str, Fraction] = {}
        for kid in kids:
            for name, amount in kid.guaranteed_amounts().items():
                totals[name] = totals.get(name, Fraction(0)) + amount
        for name, total in totals.items():
            mine = own.get(name, Fraction(0))
            if total > mine:
                text = (
                    f"children's guaranteed {name} adds up to {_show(name, total)}, "
                    f"above this tenant's guaranteed {_show(name, mine)}"
                )
                problems.append((f"tenants[{i}].guaranteed.{name}", text))
    return problems


def _check_tenant_amounts(i: int, tenant: Tenant, config: FairShareConfig) -> list[Problem]:
    problems = _check_known_keys(f"tenants[{i}].guaranteed", tenant.guaranteed, config)
    problems += _check_known_keys(f"tenants[{i}].limit", tenant.limit, config)
    limits = tenant.limit_amounts() or {}
    for name, amount in tenant.guaranteed_amounts().items():
        if name in limits and amount > limits[name]:
            text = f"guaranteed {_show(name, amount)} is above limit {_show(name, limits[name])}"
            problems.append((f"tenants[{i}].guaranteed.{name}", text))
    return problems


def _check_capacity(config: FairShareConfig) -> list[Problem]:
    capacity = config.capacity_amounts()
    if capacity is None:
        return []
    problems: list[Problem] = []
    # Children's guarantees lie inside their parent's: only top-level tenants add up.
    guaranteed = [t.guaranteed_amounts() for t in config.tenants if t.parent is None]
    for name, available in capacity.items():
        total = sum((amounts.get(name, Fraction(0)) for amounts in guaranteed), Fraction(0))
        if total > available:
            text = f"above capacity {_show(name, available)}"
            problems.append(
                ("tenants", f"guaranteed {name} adds up to {_show(name, total)}, {text}")
            )
    return problems


def _show(resource: str, amount: Fraction) -> str:
    return quantities.format_quantity(amount, quantities.quantity_kind(resource))


@functools.lru_cache(maxsize=16)
def _mig_fractions(table: tuple[tuple[str, str], ...]) -> dict[str, Fraction]:
    return {name: quantities.parse_fraction(text) for name, text in table}
