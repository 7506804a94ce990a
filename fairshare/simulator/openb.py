"""Replay of Alibaba's openb GPU trace (cluster-trace-gpu-v2023) with the FGD protocol.

Pure apart from reading the CSV files it is pointed at. Must not import aiohttp,
kubernetes_asyncio or prometheus_client. The trace itself is never copied into the
repository; see ``TRACE_HELP`` for where it comes from and on what terms.

Protocol (Weng et al., ATC'23, as their artifact runs it):

1. nodes from ``openb_node_list_gpu_node.csv`` (1,213 nodes, 6,212 GPUs);
2. pods from ``openb_pod_list_<NAME>.csv``, sorted by name, shuffled with the seed;
3. inflated to 130 % of the cluster's GPU capacity by appending copies drawn with
   replacement from the original list (``<name>-tuned-<i>``);
4. each pod is tried once, in order, and never deleted;
5. after each pod: arrived = cumulative requested GPU ÷ capacity, allocation =
   allocated milli-GPU ÷ capacity; the figure at x % arrived is the mean of the
   allocations of the events whose arrived rounds to x.

Synthetic tenants (``tenants=K``): the trace has no tenant column, so a pod's tenant
is ``tenant-<h mod K>`` with ``h`` the first 8 bytes of BLAKE2b(pod name, key
"fairshare-openb"). It depends on the name only, so every policy and every seed sees
the same assignment, and an inflated copy belongs to its original's tenant.
Pods that a policy gates are queued and retried after each later placement.
"""

from __future__ import annotations

import csv
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

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


def load_pods(trace: Path, pods: str) -> list[TracePod]:
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


def tenant_of(name: str, k: int) -> str:
    """The synthetic tenant of a trace pod (see module docstring)."""
    base = name.split("-tuned-")[0]
    h = hashlib.blake2b(base.encode(), digest_size=8, key=b"fairshare-openb").digest()
    return f"tenant-{int.from_bytes(h, 'big') % k}"


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


def trace_config(k: int) -> FairShareConfig:
    tenants = [{"name": f"tenant-{i}", "namespaces": [f"tenant-{i}"]} for i in range(k)]
    return loading.config_from_mapping(
        {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig", "tenants": tenants}
    )


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
    nodes = load_nodes(trace)
    originals = load_pods(trace, pods)
    config = trace_config(tenants) if tenants else trace_config(1)
    sim = Simulation(config, policy=policy, seed=seed)
    for name, alloc, labels in nodes:
        sim.add_node(name, alloc, labels)
    gpus = int(sim.gpus())
    cpu_col = sim.index.column(CPU)
    originals_req = [_request(sim, p, None) for p in originals]
    sim.mix = build_workload_mix(
        (class_key(r, cpu_col=cpu_col) for r in originals_req), model_ids=sim.state.model_ids
    )
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
