"""Fair-share targets for the saturation protocol, and how far tenants end from them.

Both are *unweighted* dominant shares. **divisible**: weighted DRF over each tenant's
admitted demand on the cluster pooled as one divisible machine (what the gate aims at).
**constrained**: each tenant's level also capped by the GPU its tasks can use with the
cluster to itself (a maximum flow from its task shapes to the pools of nodes they fit,
``usable_gpu``); an upper bound, since tenants contending for one scarce model are not
modelled.

``deviations``: per tenant ``share ÷ fair − 1``, the max and mean of its absolute value
over the tenants with a fair share > 0, the largest gap in percentage points, and Jain's
index over ``share ÷ fair``. ``deviation_bound``: the max relative deviation no split of
what the tenants hold together can go below (1 − Σ held ÷ Σ fair).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fairshare import fairness
from fairshare.resources import CPU, MEMORY, MILLI_GPU

if TYPE_CHECKING:
    from fairshare.simulator.engine import Simulation

EPS = 1e-9


@dataclass(frozen=True)
class Pool:
    """Identical nodes: one GPU model, GPUs per node, CPU and memory per node."""

    model: str
    gpus_per_node: int
    cpu: float  # per node, any unit as long as tasks use the same
    memory: float
    gpu: float  # the pool's GPU in all (count × GPUs per node, in the tasks' unit)


@dataclass(frozen=True)
class Task:
    """GPU demand of like tasks: what they ask in all, and the shape of one of them."""

    gpu: float  # total GPU asked (same unit as ``Pool.gpu``)
    gpu_count: int  # devices one task needs on one node
    cpu: float  # one task's CPU and memory
    memory: float
    models: frozenset[str] = frozenset()  # allowed GPU models; empty = any


def eligible(task: Task, pool: Pool) -> bool:
    """A task of this shape fits a node of this pool when the node is empty."""
    if task.models and pool.model not in task.models:
        return False
    return (
        pool.gpus_per_node >= max(1, task.gpu_count)
        and pool.cpu >= task.cpu
        and pool.memory >= task.memory
    )


def _max_flow(n: int, edges: Sequence[tuple[int, int, float]], s: int, t: int) -> float:
    """Edmonds-Karp on a small graph of ``n`` vertices; capacities may be ``inf``."""
    cap: list[dict[int, float]] = [{} for _ in range(n)]
    for u, v, c in edges:
        cap[u][v] = cap[u].get(v, 0.0) + c
        cap[v].setdefault(u, 0.0)
    flow = 0.0
    while True:
        prev = [-1] * n
        prev[s] = s
        queue = deque([s])
        while queue and prev[t] < 0:
            u = queue.popleft()
            for v, c in cap[u].items():
                if c > EPS and prev[v] < 0:
                    prev[v] = u
                    queue.append(v)
        if prev[t] < 0:
            return flow
        push = math.inf
        v = t
        while v != s:
            push = min(push, cap[prev[v]][v])
            v = prev[v]
        v = t
        while v != s:
            u = prev[v]
            cap[u][v] -= push
            cap[v][u] += push
            v = u
        flow += push


def usable_gpu(tasks: Iterable[Task], pools: Sequence[Pool]) -> float:
    """The most of ``tasks``' GPU that ``pools`` can host (a maximum flow; tasks divisible).

    Tasks with the same set of eligible pools are merged first, so the flow network has
    one vertex per distinct set and one per pool.
    """
    demand: dict[frozenset[int], float] = {}
    for task in tasks:
        if task.gpu <= 0:
            continue
        ok = frozenset(k for k, p in enumerate(pools) if p.gpu > 0 and eligible(task, p))
        if ok:
            demand[ok] = demand.get(ok, 0.0) + task.gpu
    if not demand:
        return 0.0
    groups = list(demand.items())
    src, sink = 0, 1
    first_group, first_pool = 2, 2 + len(groups)
    edges: list[tuple[int, int, float]] = []
    for j, (ok, amount) in enumerate(groups):
        edges.append((src, first_group + j, amount))
        edges.extend((first_group + j, first_pool + k, math.inf) for k in sorted(ok))
    edges.extend((first_pool + k, sink, p.gpu) for k, p in enumerate(pools) if p.gpu > 0)
    return min(_max_flow(first_pool + len(pools), edges, src, sink), sum(demand.values()))


def fair_shares(
    demand: Mapping[str, Sequence[float]],
    *,
    weights: Mapping[str, float],
    capacity: Sequence[float],
    res_weights: Sequence[float],
    caps: Mapping[str, Mapping[int, float]] | None = None,
) -> dict[str, float]:
    """Unweighted dominant share of each tenant's weighted-DRF fair allocation.

    ``demand`` rows are per tenant, in the columns of ``capacity``; ``caps`` optionally
    bound a tenant's allocation per column (its level stops where the first cap binds).
    Without caps this is the divisible target, with them the constrained one.
    """
    caps = caps or {}
    tenants = [
        fairness.TenantDemand(
            name, float(weights.get(name, 1.0)), tuple(row), {}, dict(caps.get(name, {}))
        )
        for name, row in sorted(demand.items())
    ]
    alloc = fairness.fair_allocation(tenants, capacity=capacity, res_weights=res_weights)
    return {name: fs.share * float(weights.get(name, 1.0)) for name, fs in alloc.items()}


@dataclass(frozen=True)
class Deviation:
    """How far held shares are from a target (see module docstring)."""

    max_rel: float  # max |share ÷ fair − 1|
    mean_rel: float  # mean |share ÷ fair − 1|
    max_abs: float  # max |share − fair|, percentage points
    jain: float  # Jain's index over share ÷ fair
    tenants: int  # tenants counted (fair share > 0)


def deviations(shares: Mapping[str, float], fair: Mapping[str, float]) -> Deviation:
    """Deviation figures of held ``shares`` against ``fair`` (tenants with fair > 0)."""
    names = sorted(n for n, f in fair.items() if f > 0)
    if not names:
        return Deviation(0.0, 0.0, 0.0, 1.0, 0)
    ratios = [shares.get(n, 0.0) / fair[n] for n in names]
    rel = [abs(r - 1.0) for r in ratios]
    gaps = [100.0 * abs(shares.get(n, 0.0) - fair[n]) for n in names]
    return Deviation(
        max_rel=max(rel),
        mean_rel=sum(rel) / len(rel),
        max_abs=max(gaps),
        jain=fairness.jain_index(ratios),
        tenants=len(names),
    )


def deviation_bound(shares: Mapping[str, float], fair: Mapping[str, float]) -> float:
    """The least max relative deviation any placement holding ``shares`` in all allows.

    When the tenants hold together less than their targets add up to (idle capacity,
    fragments), some tenant holds at most that fraction of its own target, so
    max |share ÷ fair − 1| ≥ 1 − Σ share ÷ Σ fair, however the held capacity is split.
    Over the tenants with fair > 0; 0 when they hold at least their targets in all.
    """
    names = [n for n, f in fair.items() if f > 0]
    total = sum(fair[n] for n in names)
    if total <= 0:
        return 0.0
    return max(0.0, 1.0 - sum(shares.get(n, 0.0) for n in names) / total)


# -- from a simulation -------------------------------------------------------------------


def pools_of(sim: Simulation) -> list[Pool]:
    """The simulation's nodes grouped into pools of like nodes (kernel units)."""
    state = sim.state
    r, g = state.n_res, state.gpu_col
    cpu, mem = state.index.column(CPU), state.index.column(MEMORY)
    acc: dict[tuple[str, int, float, float], float] = {}
    for i, node in enumerate(state.nodes):
        gpu = state.capacity[i * r + g]
        if gpu <= 0:
            continue
        key = (
            node.gpu_model or "",
            round(gpu / MILLI_GPU),
            state.capacity[i * r + cpu],
            state.capacity[i * r + mem],
        )
        acc[key] = acc.get(key, 0.0) + gpu
    return [Pool(m, n, c, mm, total) for (m, n, c, mm), total in sorted(acc.items())]


def tasks_of(sim: Simulation) -> dict[str, list[Task]]:
    """Each tenant's admitted GPU tasks (running or pending), like tasks merged."""
    g = sim.state.gpu_col
    cpu, mem = sim.index.column(CPU), sim.index.column(MEMORY)
    acc: dict[str, dict[tuple[int, float, float, frozenset[str]], float]] = {}
    for uid, req in sim.pods.items():
        if req.tenant is None or sim.outcomes[uid].status not in ("running", "pending"):
            continue
        gpu = req.row[g]
        if gpu <= 0:
            continue
        key = (req.demand.gpu.count, req.row[cpu], req.row[mem], req.gpu_models)
        per = acc.setdefault(req.tenant, {})
        per[key] = per.get(key, 0.0) + gpu
    return {
        t: [Task(v, k[0], k[1], k[2], k[3]) for k, v in sorted(per.items(), key=_task_order)]
        for t, per in acc.items()
    }


def _task_order(
    item: tuple[tuple[int, float, float, frozenset[str]], float],
) -> tuple[int, float, float, tuple[str, ...]]:
    (count, cpu, mem, models), _ = item
    return (count, cpu, mem, tuple(sorted(models)))


@dataclass(frozen=True)
class Targets:
    """Held shares and both targets at the end of a run (unweighted dominant shares)."""

    held: dict[str, float]
    divisible: dict[str, float]
    constrained: dict[str, float]
    usable_gpu: dict[str, float]  # GPU (fraction of the cluster's) each tenant can use


def targets_at_end(sim: Simulation) -> Targets:
    """Both fair targets over the tenants' admitted demand, and what each tenant holds."""
    weights = {t.name: float(t.weight) for t in sim.config.tenants}
    capacity = sim.capacity()
    res_w = sim.config.resource_weights()
    demand = {n: list(row) for n, row in sim.admitted.items() if any(v > 0 for v in row)}
    held = fairness.dominant_shares(
        used={n: sim.state.usage_of(n) for n in demand},
        capacity=capacity,
        res_weights=res_w,
        tenant_weights={n: 1.0 for n in demand},
    )
    pools = pools_of(sim)
    tasks = tasks_of(sim)
    g = sim.state.gpu_col
    usable = {n: usable_gpu(tasks.get(n, ()), pools) for n in demand}
    caps = {n: {g: usable[n]} for n in demand}
    common = {"weights": weights, "capacity": capacity, "res_weights": res_w}
    return Targets(
        held=held,
        divisible=fair_shares(demand, **common),  # type: ignore[arg-type]
        constrained=fair_shares(demand, caps=caps, **common),  # type: ignore[arg-type]
        usable_gpu={n: u / capacity[g] if capacity[g] > 0 else 0.0 for n, u in usable.items()},
    )
