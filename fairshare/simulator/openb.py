"""Replay of Alibaba's openb GPU trace (cluster-trace-gpu-v2023) with the FGD protocol.

Reads only the CSV files it is pointed at; the trace is never copied into the repository
(``TRACE_HELP`` says where it comes from). One module because the trace reader, the
protocol and the report are one replay.

FGD protocol (Weng et al., ATC'23, as their artifact runs it): the nodes of
``openb_node_list_gpu_node.csv``; the pods of ``openb_pod_list_<NAME>.csv`` sorted by
name, shuffled with the seed and inflated to 130 % of the GPU capacity with copies drawn
from the list; each pod tried once, in order, never deleted (the controls break equal
integer scores by one seeded node order); the figure at x % arrived is the mean
allocation over the events whose arrived GPU share rounds to x.

Synthetic tenants: a pod's tenant is ``tenant-<h mod K>``, ``h`` the first 8 bytes of
BLAKE2b(pod name, key "fairshare-openb"), so every policy and seed sees the same split and
a copy belongs to its original's tenant. Gated pods are retried after each placement.

Saturation protocol (``run_saturation``, ours): the same arrival order, cut so the GPU
requests add up to ``load`` × capacity; tenants with ``weights`` (``demand="weighted"``:
the hash picks a tenant with probability weight ÷ Σ weights); every pod admitted before
any is placed; passes over the pending pods in arrival order until one places nothing
(within a pass a request shape that fitted nowhere is skipped). The tables report
*unweighted* dominant shares: ``share`` (bound), ``fair`` (``fairness.fair_allocation``
over admitted demand), their deviation, and Jain's index over ``share ÷ fair``.
"""

from __future__ import annotations

import csv
import hashlib
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from fairshare import fairness
from fairshare.config import loading
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest, build_workload_mix, class_key
from fairshare.resources import CPU, GPU, MEMORY, GpuDemand, PodDemand
from fairshare.simulator.engine import Policy, Simulation

TRACE_HELP = (
    "The openb trace is Alibaba's cluster-trace-gpu-v2023 (github.com/alibaba/clusterdata, "
    "folder cluster-trace-gpu-v2023/csv). It is not shipped with fairshare: its terms allow "
    "research or study use only, and users are asked to cite Weng et al., 'Beware of "
    "Fragmentation', USENIX ATC '23. Download the CSV files and pass their folder with --trace."
)
NODE_FILE = "openb_node_list_gpu_node.csv"
MIB = 1024 * 1024
DEFAULT_WEIGHTS: tuple[float, ...] = (1.0, 1.0, 2.0, 4.0)
_POD_LIST_NAME = re.compile(r"[A-Za-z0-9_]+")


class TraceError(FileNotFoundError):
    """The trace folder or a file in it is missing."""


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str]

    @property
    def gpu_total_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


def _open(trace: Path, name: str) -> list[dict[str, str]]:
    path = trace / name
    if not path.is_file():
        raise TraceError(f"{path} not found. {TRACE_HELP}")
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def load_nodes(trace: Path) -> list[tuple[str, dict[str, Fraction], dict[str, str]]]:
    """GPU nodes as (name, allocatable, labels)."""
    out = []
    for row in _open(trace, NODE_FILE):
        alloc = {
            CPU: Fraction(int(row["cpu_milli"]), 1000),
            MEMORY: Fraction(int(row["memory_mib"]) * MIB),
            GPU: Fraction(int(row["gpu"])),
            "pods": Fraction(1_000_000),
        }
        labels = {"nvidia.com/gpu.product": row["model"], "nvidia.com/gpu.count": row["gpu"]}
        out.append((row["sn"], alloc, labels))
    return out


def pod_lists(trace: Path) -> list[str]:
    """Names of the pod lists in a trace folder (``openb_pod_list_<NAME>.csv``)."""
    return sorted(
        f.name.removeprefix("openb_pod_list_").removesuffix(".csv")
        for f in trace.glob("openb_pod_list_*.csv")
    )


def load_pods(trace: Path, pods: str) -> list[TracePod]:
    if not _POD_LIST_NAME.fullmatch(pods):
        raise ValueError(f"pod list name {pods!r}: letters, digits and underscores only")
    if not (trace / f"openb_pod_list_{pods}.csv").is_file():
        known = ", ".join(pod_lists(trace)) or "none"
        raise TraceError(
            f"no pod list {pods!r} in {trace} (openb_pod_list_{pods}.csv); "
            f"found: {known}. {TRACE_HELP}"
        )
    out = []
    for row in _open(trace, f"openb_pod_list_{pods}.csv"):
        spec = frozenset(m for m in (row.get("gpu_spec") or "").split("|") if m)
        out.append(
            TracePod(
                row["name"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["num_gpu"]),
                int(row["gpu_milli"]),
                spec,
            )
        )
    return out


def _name_hash(name: str) -> int:
    """The pod name's keyed 64-bit hash; an inflated copy hashes as its original."""
    base = name.split("-tuned-")[0]
    h = hashlib.blake2b(base.encode(), digest_size=8, key=b"fairshare-openb").digest()
    return int.from_bytes(h, "big")


def tenant_of(name: str, k: int) -> str:
    """The synthetic tenant of a trace pod (see module docstring)."""
    return f"tenant-{_name_hash(name) % k}"


def tenant_by_weight(name: str, weights: Sequence[float]) -> str:
    """The synthetic tenant of a trace pod when demand follows the weights: the pod
    name's hash (as in ``tenant_of``) read as u in [0, 1) falls in tenant i's slice of
    width weight_i ÷ Σ weights. Depends on the name only; copies follow their original."""
    ws = check_weights(weights)
    u = _name_hash(name) / 2.0**64
    total = sum(ws)
    edge = 0.0
    for i, w in enumerate(ws):
        edge += w / total
        if u < edge:
            return f"tenant-{i}"
    return f"tenant-{len(ws) - 1}"


DEMANDS = ("equal", "weighted")


def check_demand(demand: str) -> str:
    """``demand`` if it is one of ``DEMANDS``; ValueError naming the choices otherwise."""
    if demand not in DEMANDS:
        raise ValueError(f"demand must be one of {', '.join(DEMANDS)}, got {demand!r}")
    return demand


QUEUES = ("fifo", "largest")
"""Orders of the pending pods in a saturation pass: ``fifo``, creation order (what
kube-scheduler's default queue sort does within a priority); ``largest``, each tenant's
pods largest GPU demand first, in the places its pods hold in creation order (tenants
still take turns as they arrived). ``largest`` is a queue order, which a queue-sort plugin
of kube-scheduler could give and an extender cannot: an experiment, not a policy."""


def check_queue(queue: str) -> str:
    """``queue`` if it is one of ``QUEUES``; ValueError naming the choices otherwise."""
    if queue not in QUEUES:
        raise ValueError(f"queue must be one of {', '.join(QUEUES)}, got {queue!r}")
    return queue


def queue_order(sim: Simulation, queue: str = "fifo") -> list[str]:
    """The pending pods' uids in the order a saturation pass tries them (``QUEUES``)."""
    uids = list(sim.pending)
    if check_queue(queue) == "fifo":
        return uids
    by_tenant: dict[str | None, list[str]] = {}
    for uid in uids:
        by_tenant.setdefault(sim.pods[uid].tenant, []).append(uid)
    firsts = {
        t: iter(sorted(mine, key=lambda u: -_gpu_demand(sim.pods[u])))  # stable: ties by age
        for t, mine in by_tenant.items()
    }
    return [next(firsts[sim.pods[uid].tenant]) for uid in uids]


def _gpu_demand(req: PodRequest) -> float:
    """GPUs a pod asks for (devices × share each; 0 for MIG slices and CPU-only pods)."""
    g = req.demand.gpu
    return float(g.count * g.per_device) if g.count and g.source != "mig" else 0.0


def arrival_order(pods: Sequence[TracePod], *, seed: int, gpus: int, tune: float) -> list[TracePod]:
    """Sort by name, shuffle with ``seed``, append sampled copies up to ``tune`` × GPUs."""
    order = sorted(pods, key=lambda p: p.name)
    rng = random.Random(seed)
    rng.shuffle(order)
    target = tune * gpus * 1000
    total = sum(p.gpu_total_milli for p in order)
    i = 0
    originals = list(order)
    while True:
        p = originals[rng.randrange(len(originals))]
        if total + p.gpu_total_milli > target:
            break
        order.append(
            TracePod(
                f"{p.name}-tuned-{i}", p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec
            )
        )
        total += p.gpu_total_milli
        i += 1
    return order


def node_tie_ranks(n: int, seed: int) -> list[int]:
    """The controls' tie-break rank of each of ``n`` nodes: a seeded random permutation.

    Weng et al.'s simulator sorts the nodes by name, prefixes each name with the index
    ``rand.Perm`` gives it (``0042-openb-node-0007``) and lets its kube-scheduler take the
    smallest name among equal scores; so ties go to one random node order, fixed for
    the run and drawn from the run's seed. Go's generator is not reproduced: the order
    is a permutation drawn from ``seed`` by Python's, the same for every control.
    """
    ranks = list(range(n))
    random.Random(f"openb-node-order-{seed}").shuffle(ranks)
    return ranks


def check_weights(weights: Sequence[float]) -> tuple[float, ...]:
    """The tenant weights as floats; ValueError unless there is at least one and all > 0."""
    out = tuple(float(w) for w in weights)
    if not out:
        raise ValueError("weights: give at least one tenant weight")
    bad = [w for w in out if not (math.isfinite(w) and w > 0)]
    if bad:
        raise ValueError(f"weights: every weight must be a finite number > 0, got {bad[0]}")
    return out


def trace_config(
    k: int,
    weights: Sequence[float] | None = None,
    *,
    hold_for_blocked: bool = False,
    yield_band: float = 0.0,
) -> FairShareConfig:
    """K synthetic tenants ``tenant-<i>`` (namespace of the same name), weight 1 each
    unless ``weights`` (one per tenant) says otherwise; ``hold_for_blocked`` and
    ``yield_band`` set the config's ``holdForBlockedTenants`` and ``yieldBand``."""
    if k < 1:
        raise ValueError(f"tenants: need at least one, got {k}")
    ws = check_weights(weights) if weights is not None else (1.0,) * k
    if len(ws) != k:
        raise ValueError(f"weights: {len(ws)} given for {k} tenants")
    tenants = [
        {"name": f"tenant-{i}", "namespaces": [f"tenant-{i}"], "weight": ws[i]} for i in range(k)
    ]
    return loading.config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": tenants,
            "holdForBlockedTenants": hold_for_blocked,
            "yieldBand": yield_band,
        }
    )


def _cluster(
    trace: Path, pods: str, config: FairShareConfig, *, policy: Policy, seed: int
) -> tuple[Simulation, list[TracePod]]:
    """A simulation holding the trace's GPU nodes, its workload mix set from the pod list."""
    nodes = load_nodes(trace)
    originals = load_pods(trace, pods)
    sim = Simulation(config, policy=policy, seed=seed, tie_rank=node_tie_ranks(len(nodes), seed))
    for name, alloc, labels in nodes:
        sim.add_node(name, alloc, labels)
    cpu_col = sim.index.column(CPU)
    originals_req = [_request(sim, p, None) for p in originals]
    sim.mix = build_workload_mix(
        (class_key(r, cpu_col=cpu_col) for r in originals_req), model_ids=sim.state.model_ids
    )
    return sim, originals


def _request(sim: Simulation, p: TracePod, tenant: str | None) -> PodRequest:
    gpu = (
        GpuDemand(count=p.num_gpu, per_device=Fraction(p.gpu_milli, 1000), source="device")
        if p.num_gpu
        else GpuDemand()
    )
    amounts = {CPU: Fraction(p.cpu_milli, 1000), MEMORY: Fraction(p.memory_mib * MIB)}
    if p.num_gpu:
        amounts[GPU] = gpu.total
    demand = PodDemand({k: v for k, v in amounts.items() if v}, gpu)
    return PodRequest(
        uid=p.name,
        name=p.name,
        namespace=tenant or "default",
        tenant=tenant,
        demand=demand,
        row=tuple(sim.index.kernel_vector(demand.amounts)),
        gpu_models=p.gpu_spec,
    )


@dataclass
class TraceResult:
    policy: str
    seed: int
    pods: int
    placed: int
    failed: int
    curve: dict[int, float] = field(default_factory=dict)  # arrived % → mean allocation %
    frag_curve: dict[int, float] = field(default_factory=dict)
    tenants: dict[str, Any] = field(default_factory=dict)
    jain: float = 1.0

    def allocation_at(self, x: int) -> float | None:
        for probe in (x, x - 1, x + 1):
            if probe in self.curve:
                return self.curve[probe]
        return None


def run_trace(
    trace: Path,
    *,
    pods: str = "default",
    seed: int = 42,
    policy: Policy = "ours",
    arrival: float = 1.0,
    tenants: int = 0,
    tune: float = 1.3,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Simulation, TraceResult]:
    """Run the protocol; stops once arrived passes ``arrival`` (1.0 = 100 %) × capacity."""
    config = trace_config(tenants) if tenants else trace_config(1)
    sim, originals = _cluster(trace, pods, config, policy=policy, seed=seed)
    gpus = int(sim.gpus())
    order = arrival_order(originals, seed=seed, gpus=gpus, tune=max(tune, arrival))
    cap = gpus * 1000.0
    arrived = 0.0
    buckets: dict[int, list[float]] = {}
    placed = failed = 0
    last_bucket = round(100 * arrival)
    for n, p in enumerate(order):
        if round(100 * (arrived + p.gpu_total_milli) / cap) > last_bucket:
            break
        tenant = tenant_of(p.name, tenants) if tenants else None
        req = _request(sim, p, tenant)
        sim.submit(req)
        arrived += p.gpu_total_milli
        out = sim.try_place(req.uid)
        if out.status == "running":
            placed += 1
            # A placement may free the gate for tenants that were held back.
            if tenants and len(sim.pending) > 0:
                placed += len(sim.schedule_pass())
        elif sim.last_reason.get(req.uid) == "no node fits":
            sim.fail(req.uid)
            failed += 1
        x = round(100 * arrived / cap)
        buckets.setdefault(x, []).append(100 * sim.gpu_allocation_ratio())
        if progress is not None:
            progress(n + 1, len(order))
    curve = {x: sum(v) / len(v) for x, v in sorted(buckets.items())}
    result = TraceResult(policy, seed, len(order), placed, failed, curve)
    return sim, result


@dataclass(frozen=True)
class TenantFairness:
    """One tenant at the end of a saturation run (shares unweighted, fractions of 1)."""

    tenant: str
    weight: float
    pods: int  # admitted
    running: int
    pending: int
    demand: float  # dominant share of everything it asked for
    share: float  # dominant share it holds
    fair: float  # dominant share of its fair allocation
    gpu_share: float  # fraction of the cluster's GPUs it holds

    @property
    def deviation(self) -> float:
        """share − fair, in percentage points."""
        return 100.0 * (self.share - self.fair)

    @property
    def ratio(self) -> float:
        """share ÷ fair (1 = exactly its fair share)."""
        return self.share / self.fair if self.fair > 0 else math.inf


@dataclass
class SaturationResult:
    policy: str
    seed: int
    pods: int
    placed: int
    pending: int
    passes: int
    attempts: int  # scheduling attempts made (pods skipped by shape are not counted)
    skipped: int  # attempts saved by the shape skip
    allocation: float  # GPU allocation %, end of run
    tenants: list[TenantFairness] = field(default_factory=list)

    @property
    def max_abs_deviation(self) -> float:
        """Largest |share − fair| over the tenants, percentage points."""
        return max((abs(t.deviation) for t in self.tenants), default=0.0)

    @property
    def max_rel_deviation(self) -> float:
        """Largest |share ÷ fair − 1| over the tenants."""
        return max((abs(t.ratio - 1.0) for t in self.tenants), default=0.0)

    @property
    def jain(self) -> float:
        """Jain's index over share ÷ fair."""
        return fairness.jain_index([t.ratio for t in self.tenants])


def saturation_order(
    originals: Sequence[TracePod], *, seed: int, gpus: int, load: float
) -> list[TracePod]:
    """The seeded arrival order, inflated or cut to ``load`` × the GPU capacity."""
    order = arrival_order(originals, seed=seed, gpus=gpus, tune=load)
    target = load * gpus * 1000
    total = 0
    out = []
    for p in order:
        if total + p.gpu_total_milli > target:
            break
        out.append(p)
        total += p.gpu_total_milli
    return out


def _shape(req: PodRequest) -> tuple[object, ...]:
    """What ``filter_nodes`` looks at: the kernel row, the GPU demand, the allowed models."""
    return (req.row, req.demand.gpu, req.gpu_models)


def saturation_pass(
    sim: Simulation, *, skip_shapes: bool = True, queue: str = "fifo"
) -> tuple[list[str], int, int]:
    """One pass over the pending pods in ``queue`` order (``QUEUES``; creation order by
    default): (placed uids, attempts, skipped).

    With ``skip_shapes`` a pod whose shape already fitted no node in this pass is not
    tried again: nothing is freed during the pass, so the answer cannot change. Its
    ``last_reason`` is set as the attempt would have set it.
    """
    if not skip_shapes and queue == "fifo":
        n = len(sim.pending)
        return sim.schedule_pass(), n, 0
    placed: list[str] = []
    nofit: set[tuple[object, ...]] = set()
    attempts = skipped = 0
    for uid in queue_order(sim, queue):
        req = sim.pods[uid]
        key = _shape(req)
        if skip_shapes and key in nofit:
            sim.last_reason[uid] = "no node fits"
            skipped += 1
            continue
        attempts += 1
        if sim.try_place(uid).status == "running":
            placed.append(uid)
        elif sim.last_reason.get(uid) == "no node fits":
            nofit.add(key)
    return placed, attempts, skipped


def fairness_at_end(sim: Simulation) -> list[TenantFairness]:
    """Per tenant with demand: unweighted held, fair and demanded dominant shares."""
    weights = {t.name: float(t.weight) for t in sim.config.tenants}
    cap = sim.capacity()
    res_w = sim.config.resource_weights()
    unweighted = {n: 1.0 for n in sim.admitted}
    held = fairness.dominant_shares(
        used={n: sim.state.usage_of(n) for n in sim.admitted},
        capacity=cap,
        res_weights=res_w,
        tenant_weights=unweighted,
    )
    demand = fairness.dominant_shares(
        used=sim.admitted, capacity=cap, res_weights=res_w, tenant_weights=unweighted
    )
    fair = sim.fair_shares()
    g = sim.state.gpu_col
    out = []
    for name in sorted(sim.admitted):
        if demand[name] <= 0 or name not in fair:
            continue
        w = weights.get(name, 1.0)
        c = sim.counters[name]
        out.append(
            TenantFairness(
                tenant=name,
                weight=w,
                pods=c.running + c.pending,
                running=c.running,
                pending=c.pending,
                demand=demand[name],
                share=held[name],
                fair=fair[name].share * w,
                gpu_share=sim.state.usage_of(name)[g] / cap[g] if cap[g] > 0 else 0.0,
            )
        )
    return out


def run_saturation(
    trace: Path,
    *,
    pods: str = "default",
    seed: int = 42,
    policy: Policy = "ours",
    weights: Sequence[float] = DEFAULT_WEIGHTS,
    load: float = 2.0,
    skip_shapes: bool = True,
    max_passes: int = 1000,
    progress: Callable[[int, int], None] | None = None,
    hold_for_blocked: bool = False,
    yield_band: float = 0.0,
    demand: str = "equal",
    queue: str = "fifo",
) -> tuple[Simulation, SaturationResult]:
    """The saturation fairness protocol (module docstring); ``progress(pass, placed)``;
    ``hold_for_blocked`` and ``yield_band`` run the gate with ``holdForBlockedTenants``
    and ``yieldBand``; ``demand`` ("equal" or "weighted") splits the pods among the
    tenants evenly or in proportion to their weights; ``queue`` is the order each pass
    tries the pending pods in (``QUEUES``)."""
    ws = check_weights(weights)
    check_demand(demand)
    check_queue(queue)
    if not (math.isfinite(load) and load > 0):
        raise ValueError(f"load must be a finite number > 0 (× GPU capacity), got {load}")
    config = trace_config(len(ws), ws, hold_for_blocked=hold_for_blocked, yield_band=yield_band)
    sim, originals = _cluster(trace, pods, config, policy=policy, seed=seed)
    order = saturation_order(originals, seed=seed, gpus=int(sim.gpus()), load=load)
    for p in order:
        tenant = (
            tenant_by_weight(p.name, ws) if demand == "weighted" else tenant_of(p.name, len(ws))
        )
        sim.submit(_request(sim, p, tenant))
    passes = attempts = skipped = placed = 0
    while passes < max_passes:
        passes += 1
        done, tried, saved = saturation_pass(sim, skip_shapes=skip_shapes, queue=queue)
        attempts += tried
        skipped += saved
        placed += len(done)
        if progress is not None:
            progress(passes, placed)
        if not done:
            break
    result = SaturationResult(
        policy=policy,
        seed=seed,
        pods=len(order),
        placed=placed,
        pending=len(sim.pending),
        passes=passes,
        attempts=attempts,
        skipped=skipped,
        allocation=100.0 * sim.gpu_allocation_ratio(),
        tenants=fairness_at_end(sim),
    )
    return sim, result
