"""Run a scenario through the simulation and turn the outcome into a report.

Workload entries are created in listed order at their ``arrival`` time; after every
arrival or departure the pending pods are retried in creation order until a pass places
nothing; a placed pod with a ``duration`` departs that many seconds later.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Any

from fairshare import history
from fairshare.placement import build_workload_mix, class_key, cluster_fragmentation
from fairshare.resources import CPU
from fairshare.simulator import drapool
from fairshare.simulator.drapool import DraSimulation
from fairshare.simulator.engine import (
    Policy,
    Simulation,
    jain_over,
    requests_pod,
    summarize_tenants,
)
from fairshare.simulator.scenario import LoadedScenario


def run_scenario(loaded: LoadedScenario, *, policy: Policy = "ours", seed: int = 0) -> Simulation:
    """Replay ``loaded`` and return the finished simulation."""
    pools = loaded.dra_pools()
    dra_sim = DraSimulation(loaded.config, policy=policy, seed=seed) if loaded.uses_dra() else None
    sim = dra_sim or Simulation(loaded.config, policy=policy, seed=seed)
    sim.namespace_labels.update(loaded.scenario.namespaces)
    for name, alloc, labels, unhealthy in loaded.node_specs():
        pool = pools.get(name)
        if dra_sim is not None and pool is not None:
            slices = drapool.node_slices(
                name, gpus=pool.gpus, partitionable=pool.partitionable, shareable=pool.shareable
            )
            dra_sim.add_dra_node(name, alloc, labels, slices)
        else:
            sim.add_node(name, alloc, labels)
        if unhealthy:
            sim.state.set_health(name, False, unhealthy)
    specs = loaded.pod_specs()
    reqs = []
    for name, w in specs:
        pod = requests_pod(
            name=name, namespace=w.namespace, requests=w.requests, annotations=w.annotations
        )
        if w.node_selector:
            pod["spec"]["nodeSelector"] = dict(w.node_selector)
        if dra_sim is None:
            reqs.append((w, sim.request_for(pod, uid=name)))
            continue
        claim = None
        if w.claim is not None:
            c = w.claim
            claim = drapool.claim_object(
                f"{name}-gpu", w.namespace, count=c.gpus, mig=c.mig, memory=c.memory
            )
            pod = drapool.claim_pod(pod, f"{name}-gpu")
        reqs.append((w, dra_sim.dra_request(pod, claim, uid=name)))
    cpu_col = sim.index.column(CPU)
    sim.mix = build_workload_mix(
        (class_key(r, cpu_col=cpu_col) for _, r in reqs), model_ids=sim.state.model_ids
    )
    # Events: (time, order, kind, uid); arrivals before departures at the same time
    # keep creation order; kind 0 = departure, 1 = arrival (departures free room first).
    events: list[tuple[float, int, int, str]] = []
    durations: dict[str, float | None] = {}
    for seq, (w, req) in enumerate(reqs):
        heapq.heappush(events, (w.arrival, seq, 1, req.uid))
        durations[req.uid] = w.duration
    seq_next = len(reqs)
    by_uid = {r.uid: r for _, r in reqs}
    # ``usageHistory``: the weights the gate uses follow the tenants' decayed usage.
    keeper = (
        history.Keeper(loaded.config, sim.index.names)
        if loaded.config.usage_history is not None
        else None
    )
    while events:
        now = events[0][0]
        if keeper is not None:
            used = {t: list(u) for t, u in sim.state.tenant_usage.items()}
            sim.config = keeper.step(now, used, sim.state.total_capacity(), sim.admitted)
            sim._fair = None
        while events and events[0][0] == now:
            _, _, kind, uid = heapq.heappop(events)
            if kind == 1:
                sim.submit(by_uid[uid])
            else:
                sim.complete(uid)
        for uid in _settle(sim):
            d = durations.get(uid)
            if d is not None:
                heapq.heappush(events, (now + d, seq_next, 0, uid))
                seq_next += 1
    if keeper is not None:
        sim.config, sim._fair = loaded.config, None  # the report reads the weights as written
    return sim


def _settle(sim: Simulation) -> list[str]:
    placed: list[str] = []
    while True:
        now = sim.schedule_pass()
        if not now:
            return placed
        placed.extend(now)


def fragmentation_percent(sim: Simulation) -> float:
    """FGD fragmentation amount as % of cluster GPU capacity (0 without a workload mix)."""
    cap = sim.capacity()[sim.state.gpu_col]
    if cap <= 0:
        return 0.0
    return 100.0 * cluster_fragmentation(sim.state, sim.mix) / cap


def build_report(sim: Simulation) -> dict[str, Any]:
    """The report: per-tenant figures and cluster figures (docs/simulator/index.md
    describes the fields)."""
    tenants = summarize_tenants(sim)
    active = [n for n, t in tenants.items() if t["running"] or t["pending"]]
    return {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "SimulationReport",
        "policy": sim.policy,
        "tenants": tenants,
        "cluster": {
            "gpuAllocationRatio": round(sim.gpu_allocation_ratio(), 4),
            "fragmentation": round(fragmentation_percent(sim), 2),
            "jainIndex": round(jain_over(sim, active), 4),
            "nodes": sim.state.n_nodes,
            "gpus": sim.gpus(),
        },
        "pending": {uid: sim.last_reason.get(uid, "") for uid in sim.pending},
    }


def render_text(report: dict[str, Any]) -> str:
    """A readable per-tenant table and the cluster line."""
    rows = [("tenant", "running", "pending", "done", "rejected", "share", "fair", "allocated")]
    for name, t in report["tenants"].items():
        alloc = ", ".join(f"{k}={v}" for k, v in sorted(t["allocated"].items()))
        rows.append(
            (
                name,
                str(t["running"]),
                str(t["pending"]),
                str(t.get("completed", 0)),
                str(t["rejected"]),
                f"{t['dominantShare']:.3f}",
                f"{t['fairShare']:.3f}",
                alloc or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    c = report["cluster"]
    lines.append("")
    lines.append(
        f"cluster: {c['nodes']} nodes, {c['gpus']:g} GPUs, GPU allocation "
        f"{100 * c['gpuAllocationRatio']:.1f} %, fragmentation {c['fragmentation']:.1f} % "
        f"of GPU capacity, Jain index {c['jainIndex']:.3f} (policy {report['policy']})"
    )
    waiting = [f"  {uid}: {why}" for uid, why in list(report["pending"].items())[:5] if why]
    if waiting:
        lines.append("why pods wait (first 5):")
        lines.extend(waiting)
    return "\n".join(lines)


def plot(path: Path, *, curves: dict[str, dict[int, float]], shares: dict[str, float]) -> None:
    """Allocation against arrived workload (one line per policy) and tenants' shares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, curve in sorted(curves.items()):
        xs = sorted(curve)
        ax1.plot(xs, [curve[x] for x in xs], label=name)
    ax1.plot([0, 100], [0, 100], linestyle=":", color="grey", label="ideal")
    ax1.set_xlabel("arrived workload (% of GPU capacity)")
    ax1.set_ylabel("GPU allocation (%)")
    ax1.legend()
    names = sorted(shares)
    ax2.bar(names, [shares[n] for n in names])
    ax2.set_ylabel("weighted dominant share")
    ax2.set_title("tenants")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
