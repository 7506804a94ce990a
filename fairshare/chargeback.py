"""Chargeback arithmetic: each pod's share of each physical GPU, the idle remainder, and
a period's GPU-hours and cost per tenant from sampled shares (``docs/chargeback.md``).

Pure: no clock, no network. ``allocations`` reads the extender's ledger (a
``ClusterState``) into ``Holding`` rows, one per pod and GPU; ``split_idle`` attributes
what a GPU's holders leave idle; ``build_report`` integrates sampled holdings, prices,
usage and token counters over a period into a ``Report`` that reconciles to the cluster
total.

The idle rule: a GPU some pods share (held in part) leaves its remainder idle *because*
of them: the remainder is attributed to its holders pro rata to their shares. A GPU
nobody holds is cluster idle, attributed to no tenant (``IDLE``). Every GPU-hour of the
cluster is therefore either allocated, attributed idle, or cluster idle, and the three
add up to the GPUs' capacity times the period.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from fairshare.config.schema import GPU_RESOURCE, Pricing
from fairshare.resources import MILLI_GPU
from fairshare.state.cluster import ClusterState

IDLE: str = "__idle__"
"""The tenant column of cluster idle: GPUs no pod holds any part of."""

MIG_DEVICE: str = "mig"
"""The device key of a node's MIG slices taken through the device plugin: the plugin
does not say which GPU a slice is on, so the node's MIG GPUs are one pool."""

POOL_DEVICE: str = "pool"
"""The device key of GPUs the ledger counts without a device (a DRA claim counted before
its devices are known): the node's GPUs as one pool."""

DEFAULT_TOKEN_COUNTERS: tuple[str, ...] = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)
"""vLLM's token counters (prompt and generated), what ``fairshare chargeback`` reads by
default; other inference servers' by ``--token-counter``."""


@dataclass(frozen=True)
class Holding:
    """One pod's share of one GPU (or of a node's GPU pool, ``device`` ``mig``/``pool``)."""

    namespace: str
    pod: str
    container: str
    node: str
    device: str
    tenant: str
    gpu_model: str
    share: float
    """GPUs of this device the pod holds: 1 for a whole GPU, its fraction otherwise."""


@dataclass(frozen=True)
class GpuSlot:
    """A physical GPU, or a node's pool of GPUs (``capacity`` GPUs)."""

    node: str
    device: str
    gpu_model: str
    capacity: float


@dataclass(frozen=True)
class PodMeta:
    """What the ledger does not keep of a pod: its namespace and GPU container."""

    namespace: str
    container: str


def allocations(
    state: ClusterState,
    meta: Callable[[str], PodMeta | None],
    mig: Mapping[str, Fraction] | None = None,
) -> tuple[list[Holding], list[GpuSlot]]:
    """Every bound pod's share of each GPU it holds, and the GPUs, from the ledger.

    A pod's devices (``BoundPod.devices``: slot, milli-GPU) are its shares of those
    slots: whole GPUs, fractions, GPU-memory shares, HAMi shares and DRA devices (whole,
    or a part of one GPU, ``dra:<gpu>``) all land there. MIG slices through the device
    plugin (``BoundPod.mig``) are shares of the node's MIG pool; a GPU amount the ledger
    holds without devices is a share of the node's pool. ``meta(uid)`` gives the pod's
    namespace and container (None: a pod the cache no longer has, skipped). ``mig``: the
    config's MIG profile fractions (exact; the ledger's milli-GPU per slice is rounded)."""
    fractions = mig or {}

    def mig_gpus(profile: str, slices: int, milli: float) -> float:
        exact = fractions.get(profile)
        return float(slices * exact) if exact is not None else slices * milli / MILLI_GPU

    holdings: list[Holding] = []
    used_keys: dict[tuple[str, str], float] = {}
    col = state.gpu_col
    for uid in sorted(state.pods):
        bp = state.pods[uid]
        m = meta(uid)
        if m is None:
            continue
        i = state.node_index.get(bp.node)
        model = state.nodes[i].gpu_model if i is not None else ""
        gpus = bp.row[col] / MILLI_GPU if 0 <= col < len(bp.row) else 0.0
        parts: list[tuple[str, float]] = []
        if bp.devices:
            parts = [(str(slot), milli / MILLI_GPU) for slot, milli in bp.devices if milli > 0]
        elif bp.mig is not None and gpus > 0:
            profile, slices = bp.mig
            parts = [(MIG_DEVICE, mig_gpus(profile, slices, gpus * MILLI_GPU / max(slices, 1)))]
        elif gpus > 0:
            parts = [(POOL_DEVICE, gpus)]
        for device, share in parts:
            holdings.append(
                Holding(
                    m.namespace,
                    bp.name,
                    m.container,
                    bp.node,
                    device,
                    bp.tenant or "",
                    model,
                    share,
                )
            )
            used_keys[(bp.node, device)] = used_keys.get((bp.node, device), 0.0) + share
    slots: list[GpuSlot] = []
    for i, info in enumerate(state.nodes):
        cap = state.capacity[i * state.n_res + col] / MILLI_GPU if col >= 0 else 0.0
        in_mig = math.fsum(mig_gpus(p, n, milli) for p, (n, milli) in info.mig.items())
        in_mig_milli = sum(n * milli for n, milli in info.mig.values()) / MILLI_GPU
        n_dev = round(cap - in_mig_milli) if cap > in_mig_milli else 0
        for d in range(n_dev):
            slots.append(GpuSlot(info.name, str(d), info.gpu_model, 1.0))
        if in_mig > 0:
            slots.append(GpuSlot(info.name, MIG_DEVICE, info.gpu_model, in_mig))
        if (info.name, POOL_DEVICE) in used_keys:
            held = used_keys[(info.name, POOL_DEVICE)]
            slots.append(GpuSlot(info.name, POOL_DEVICE, info.gpu_model, held))
    known = {(s.node, s.device) for s in slots}
    # A device slot the ledger uses beyond the node's count (a fractional DRA GPU's slot
    # past the device-plugin GPUs): one GPU more, so its holders' sum is still <= 1.
    for node, device in sorted(used_keys):
        if (node, device) not in known:
            i = state.node_index.get(node)
            model = state.nodes[i].gpu_model if i is not None else ""
            slots.append(GpuSlot(node, device, model, max(1.0, used_keys[(node, device)])))
    return holdings, slots


def split_idle(
    holdings: Sequence[Holding], slots: Sequence[GpuSlot]
) -> tuple[list[float], dict[tuple[str, str], float]]:
    """The idle rule at one instant: (each holding's attributed idle, in GPUs; each GPU's
    cluster idle). A GPU held in part gives its remainder to its holders pro rata to
    their shares; a GPU nobody holds is cluster idle. A GPU held beyond its capacity (a
    ledger out of step for a moment) has no idle."""
    held: dict[tuple[str, str], float] = {}
    for h in holdings:
        key = (h.node, h.device)
        held[key] = held.get(key, 0.0) + h.share
    capacity = {(s.node, s.device): s.capacity for s in slots}
    attributed = []
    for h in holdings:
        key = (h.node, h.device)
        total = held[key]
        rest = max(0.0, capacity.get(key, total) - total)
        attributed.append(rest * h.share / total if total > 0 else 0.0)
    cluster_idle = {k: c for k, c in capacity.items() if held.get(k, 0.0) <= 0.0}
    return attributed, cluster_idle


def export_rows(
    state: ClusterState,
    meta: Callable[[str], PodMeta | None],
    pricing: Pricing | None,
    mig: Mapping[str, Fraction] | None = None,
) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The chargeback gauges' rows (``fairshare.metrics.CHARGEBACK_SERIES``) of the
    ledger now: shares, attributed idle, capacity, non-GPU requests and the config's
    prices. A pure function of the bound pods, the nodes and the config."""
    holdings, slots = allocations(state, meta, mig)
    idle, _ = split_idle(holdings, slots)
    rows: dict[str, list[tuple[tuple[str, ...], float]]] = {
        "fairshare_pod_gpu_allocation": [],
        "fairshare_pod_gpu_idle_allocation": [],
        "fairshare_gpu_capacity": [],
        "fairshare_pod_resource_allocation": [],
        "fairshare_node_gpu_hourly_price": [],
        "fairshare_node_resource_hourly_price": [],
    }
    for h, extra in zip(holdings, idle, strict=True):
        labels = (h.namespace, h.pod, h.container, h.node, h.device, h.tenant, h.gpu_model)
        rows["fairshare_pod_gpu_allocation"].append((labels, h.share))
        rows["fairshare_pod_gpu_idle_allocation"].append((labels, extra))
    for s in slots:
        rows["fairshare_gpu_capacity"].append(((s.node, s.device, s.gpu_model), s.capacity))
    names = state.index.names
    col = state.gpu_col
    for uid in sorted(state.pods):
        bp = state.pods[uid]
        m = meta(uid)
        if m is None:
            continue
        amounts = state.index.amounts(bp.row)  # user units: cores, bytes
        for k, name in enumerate(names):
            if k == col or name.startswith("nvidia.com/mig-"):
                continue
            if amounts[name] > 0:
                key = (m.namespace, bp.name, bp.node, bp.tenant or "", name)
                rows["fairshare_pod_resource_allocation"].append((key, float(amounts[name])))
    if pricing is not None:
        for info in state.nodes:
            p = pricing.gpu_hourly(info.name, info.gpu_model)
            if p is not None:
                rows["fairshare_node_gpu_hourly_price"].append(((info.name, info.gpu_model), p))
            for name in names:
                if name == GPU_RESOURCE:
                    continue
                q = pricing.resource_hourly(info.name, name)
                if q is not None:
                    rows["fairshare_node_resource_hourly_price"].append(((info.name, name), q))
    return rows


# ----------------------------------------------------------------------------- the report


Labels = Mapping[str, str]
Series = tuple[Labels, Sequence[tuple[float, float]]]
"""One range-query result: labels and (timestamp, value) samples."""


@dataclass
class TenantModel:
    """One tenant's figures on one GPU model over the period."""

    tenant: str
    gpu_model: str
    gpu_hours: float = 0.0
    cost: float = 0.0
    idle_gpu_hours: float = 0.0
    idle_cost: float = 0.0
    busy_gpu_hours: float = 0.0
    """GPU-hours times the measured graphics-engine activity, where DCGM reports it."""
    measured_gpu_hours: float = 0.0
    """The GPU-hours DCGM measured at all (the denominator of ``usage_ratio``)."""

    @property
    def usage_ratio(self) -> float | None:
        return self.busy_gpu_hours / self.measured_gpu_hours if self.measured_gpu_hours else None


@dataclass
class TenantTotal:
    tenant: str
    gpu_hours: float = 0.0
    gpu_cost: float = 0.0
    idle_gpu_hours: float = 0.0
    idle_cost: float = 0.0
    other_cost: float = 0.0
    """CPU, memory and storage as requested, at their prices."""
    tokens: float = 0.0
    busy_gpu_hours: float = 0.0
    measured_gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0
    """Of ``gpu_hours``, those of pods a hardware fault took (``Inputs.lost``): marked, not
    removed; the usage history forgives them (``health.forgiveFaults``)."""
    lost_cost: float = 0.0
    memory_mib_hours: float = 0.0
    """DCGM's framebuffer used (MiB) times hours, over the hours it was measured."""
    memory_hours: float = 0.0

    @property
    def memory_used_mib(self) -> float | None:
        """Average GPU memory the tenant's pods used while DCGM measured them (MiB)."""
        return self.memory_mib_hours / self.memory_hours if self.memory_hours else None

    @property
    def cost(self) -> float:
        return self.gpu_cost + self.idle_cost + self.other_cost

    @property
    def idle_share(self) -> float:
        """Attributed idle over the tenant's GPU-hours (allocated plus idle)."""
        whole = self.gpu_hours + self.idle_gpu_hours
        return self.idle_gpu_hours / whole if whole else 0.0

    @property
    def usage_ratio(self) -> float | None:
        return self.busy_gpu_hours / self.measured_gpu_hours if self.measured_gpu_hours else None

    @property
    def cost_per_million_tokens(self) -> float | None:
        return self.cost / self.tokens * 1e6 if self.tokens > 0 else None


@dataclass
class Deployment:
    """A model deployment's tokens and the GPU cost of the pods serving it."""

    namespace: str
    model: str
    tenant: str
    tokens: float = 0.0
    cost: float = 0.0

    @property
    def cost_per_million_tokens(self) -> float | None:
        return self.cost / self.tokens * 1e6 if self.tokens > 0 else None


@dataclass
class Report:
    start: float
    end: float
    step: float
    by_model: list[TenantModel] = field(default_factory=list)
    tenants: list[TenantTotal] = field(default_factory=list)
    deployments: list[Deployment] = field(default_factory=list)
    cluster_gpu_hours: float = 0.0
    """Capacity × time: every GPU-hour of the period."""
    cluster_gpu_cost: float = 0.0
    cluster_idle_gpu_hours: float = 0.0
    cluster_idle_cost: float = 0.0
    max_gpu_load: float = 0.0
    """The largest sum of shares on one GPU (over its capacity) at any sample: <= 1."""
    opencost_priced_gpu_hours: float = 0.0
    """GPU-hours priced by OpenCost's ``node_gpu_hourly_cost`` instead of the config."""
    unpriced_gpu_hours: float = 0.0

    @property
    def billed_gpu_cost(self) -> float:
        """What the tenants' GPU lines add up to, plus cluster idle: the cluster total."""
        return math.fsum(t.gpu_cost + t.idle_cost for t in self.tenants) + self.cluster_idle_cost


@dataclass(frozen=True)
class Inputs:
    """What ``build_report`` reads: range-query results at ``step`` over [start, end)."""

    holdings: Sequence[Series]
    """Per pod and GPU share (labels namespace, pod, container, node, device, tenant,
    gpu_model)."""
    capacity: Sequence[Series]
    """Per GPU (labels node, device, gpu_model)."""
    gpu_prices: Sequence[Series]
    """The config's per-GPU-hour price per node (labels node)."""
    opencost_prices: Sequence[Series] = ()
    """OpenCost's ``node_gpu_hourly_cost`` per node (labels node); wins where present."""
    resources: Sequence[Series] = ()
    """Per pod non-GPU requests (labels namespace, pod, node, tenant, resource)."""
    resource_prices: Sequence[Series] = ()
    """Per node and resource price per unit-hour (labels node, resource)."""
    usage: Sequence[Series] = ()
    """DCGM graphics-engine activity per pod, 0..1 (labels namespace, pod)."""
    memory_used: Sequence[Series] = ()
    """DCGM framebuffer used per pod, MiB (labels namespace, pod)."""
    tokens: Sequence[Series] = ()
    """Token counters (labels namespace, pod, model_name), cumulative."""
    lost: frozenset[tuple[str, str]] = frozenset()
    """(namespace, pod) of the pods lost to a hardware fault (``lost_pods``)."""


def _at(
    series: Iterable[Series], key: Callable[[Labels], tuple[str, ...]]
) -> dict[float, dict[tuple[str, ...], float]]:
    out: dict[float, dict[tuple[str, ...], float]] = {}
    for labels, samples in series:
        k = key(labels)
        for t, v in samples:
            if math.isfinite(v):
                out.setdefault(t, {})[k] = v
    return out


def lost_pods(runs: object) -> frozenset[tuple[str, str]]:
    """(namespace, pod) of every pod a hardware fault took, from the lost runs the
    extender's recovery keeps (the ``runs.json`` of ConfigMap ``fairshare-lost-runs``:
    runs with ``key`` ``namespace/name`` and the pod names ``lost`` and ``evicted``).
    Read leniently: any JSON holding such run objects, at any depth."""
    found: set[tuple[str, str]] = set()

    def walk(x: object) -> None:
        if isinstance(x, Mapping):
            key = x.get("key")
            if isinstance(key, str) and "/" in key and ("lost" in x or "evicted" in x):
                ns = key.split("/", 1)[0]
                for field_ in ("lost", "evicted"):
                    names = x.get(field_)
                    if isinstance(names, list):
                        found.update((ns, str(n)) for n in names)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(runs)
    return frozenset(found)


def counter_increase(samples: Sequence[tuple[float, float]]) -> float:
    """A counter's increase over its samples, a reset (a drop) counting from zero."""
    total = 0.0
    for (_, a), (_, b) in itertools.pairwise(samples):
        total += b - a if b >= a else b
    return total


def build_report(inputs: Inputs, start: float, end: float, step: float) -> Report:
    """Integrate the samples over [start, end): each sample at t stands for [t, t+step).

    Per sample and GPU the idle rule (``split_idle``) runs on the holdings present at
    that instant; the GPU price is OpenCost's for the node when present at that instant,
    else the config's. Tokens: each counter's increase over the period, the pods' cost
    per deployment from their own holdings."""
    hours = step / 3600.0
    rep = Report(start=start, end=end, step=step)
    hold_key = ("namespace", "pod", "container", "node", "device", "tenant", "gpu_model")
    holds = _at(inputs.holdings, lambda lb: tuple(lb.get(k, "") for k in hold_key))
    caps = _at(
        inputs.capacity,
        lambda lb: (lb.get("node", ""), lb.get("device", ""), lb.get("gpu_model", "")),
    )
    prices = _at(inputs.gpu_prices, lambda lb: (lb.get("node", ""),))
    oc_prices = _at(inputs.opencost_prices, lambda lb: (lb.get("node", ""),))
    usage = _at(inputs.usage, lambda lb: (lb.get("namespace", ""), lb.get("pod", "")))
    memory = _at(inputs.memory_used, lambda lb: (lb.get("namespace", ""), lb.get("pod", "")))
    by_model: dict[tuple[str, str], TenantModel] = {}
    tenants: dict[str, TenantTotal] = {}
    pod_cost: dict[tuple[str, str], float] = {}
    pod_tenant: dict[tuple[str, str], str] = {}

    def total(t: str) -> TenantTotal:
        return tenants.setdefault(t, TenantTotal(t))

    times = sorted(t for t in set(holds) | set(caps) if start <= t < end)
    for t in times:
        # DCGM's memory per pod, once per pod and sample (not per GPU it holds a part of).
        tenant_of = {(k[0], k[1]): k[5] for k in holds.get(t, {})}
        for pk, mib in memory.get(t, {}).items():
            if pk in tenant_of:
                total(tenant_of[pk]).memory_mib_hours += mib * hours
                total(tenant_of[pk]).memory_hours += hours
        held = [Holding(*k[:7], share=v) for k, v in holds.get(t, {}).items() if v > 0]  # type: ignore[arg-type,misc]
        slots = [GpuSlot(n, d, m, c) for (n, d, m), c in caps.get(t, {}).items() if c > 0]
        idle, cluster_idle = split_idle(held, slots)

        def price(node: str, t: float = t) -> float | None:
            oc = oc_prices.get(t, {}).get((node,))
            return oc if oc is not None else prices.get(t, {}).get((node,))

        load: dict[tuple[str, str], float] = {}
        for h in held:
            load[(h.node, h.device)] = load.get((h.node, h.device), 0.0) + h.share
        cap_of = {(s.node, s.device): s.capacity for s in slots}
        for key, used in load.items():
            rep.max_gpu_load = max(rep.max_gpu_load, used / cap_of.get(key, 1.0))
        for s in slots:
            p = price(s.node)
            rep.cluster_gpu_hours += s.capacity * hours
            rep.cluster_gpu_cost += s.capacity * hours * (p or 0.0)
            if p is None:
                rep.unpriced_gpu_hours += s.capacity * hours
            elif (s.node,) in oc_prices.get(t, {}):
                rep.opencost_priced_gpu_hours += s.capacity * hours
        for (node, _device), c in cluster_idle.items():
            p = price(node) or 0.0
            rep.cluster_idle_gpu_hours += c * hours
            rep.cluster_idle_cost += c * hours * p
        for h, extra in zip(held, idle, strict=True):
            p = price(h.node) or 0.0
            line = by_model.setdefault((h.tenant, h.gpu_model), TenantModel(h.tenant, h.gpu_model))
            tt = total(h.tenant)
            gh, ih = h.share * hours, extra * hours
            line.gpu_hours += gh
            line.cost += gh * p
            line.idle_gpu_hours += ih
            line.idle_cost += ih * p
            tt.gpu_hours += gh
            tt.gpu_cost += gh * p
            tt.idle_gpu_hours += ih
            tt.idle_cost += ih * p
            pk = (h.namespace, h.pod)
            if pk in inputs.lost:
                tt.lost_gpu_hours += gh
                tt.lost_cost += gh * p
            pod_cost[pk] = pod_cost.get(pk, 0.0) + (gh + ih) * p
            pod_tenant[pk] = h.tenant
            active = usage.get(t, {}).get(pk)
            if active is not None:
                line.busy_gpu_hours += gh * active
                line.measured_gpu_hours += gh
                tt.busy_gpu_hours += gh * active
                tt.measured_gpu_hours += gh
    # CPU, memory, storage: the requests, at the node's price of each.
    res = _at(
        inputs.resources,
        lambda lb: tuple(lb.get(k, "") for k in ("namespace", "pod", "node", "tenant", "resource")),
    )
    res_prices = _at(
        inputs.resource_prices, lambda lb: (lb.get("node", ""), lb.get("resource", ""))
    )
    for t in sorted(x for x in res if start <= x < end):
        for (ns, pod, node, tenant, resource), amount in res[t].items():
            p = res_prices.get(t, {}).get((node, resource))
            if p is None or amount <= 0:
                continue
            c = amount * hours * p
            total(tenant).other_cost += c
            pod_cost[(ns, pod)] = pod_cost.get((ns, pod), 0.0) + c
            pod_tenant.setdefault((ns, pod), tenant)
    # Tokens: per deployment (namespace, model), and per tenant through the namespace.
    ns_tenant: dict[str, str] = {}
    for (ns, _pod), tenant in sorted(pod_tenant.items()):
        ns_tenant.setdefault(ns, tenant)
    deployments: dict[tuple[str, str], Deployment] = {}
    serving_pods: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for labels, samples in inputs.tokens:
        inside = [(t, v) for t, v in samples if start - step <= t <= end]
        n = counter_increase(inside)
        ns = labels.get("namespace", "")
        model = labels.get("model_name", "")
        d = deployments.setdefault((ns, model), Deployment(ns, model, ns_tenant.get(ns, "")))
        d.tokens += n
        pod = labels.get("pod", "")
        if pod:
            serving_pods.setdefault((ns, model), set()).add((ns, pod))
        if d.tenant:
            total(d.tenant).tokens += n
    for key, d in deployments.items():
        d.cost = math.fsum(pod_cost.get(p, 0.0) for p in sorted(serving_pods.get(key, ())))
    rep.by_model = sorted(by_model.values(), key=lambda x: (x.tenant, x.gpu_model))
    rep.tenants = sorted(tenants.values(), key=lambda x: x.tenant)
    rep.deployments = sorted(deployments.values(), key=lambda x: (x.namespace, x.model))
    return rep
