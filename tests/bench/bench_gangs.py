"""The extender's verbs for the members of a pod group (``extender.ganging``).

    python -m tests.bench.bench_gangs [--quick] [--nodes 1000] [--members 64] [--rounds 30]

In process, no HTTP: the extender's own verb functions (``app._filter``, ``app._bind``:
request decoding, the gang coordinator, the answer) over the tracker of the servers
benchmark's cluster (``bench_servers.state_list``: N nodes × 8 GPUs, 4 bound pods a node,
four tenants). Each round adds a group of ``--members`` pods (the coscheduling
label and ``fairshare.io/gang-min-members``, 4 GPUs each), then plays kube-scheduler: the filter of
every member in turn with every node a candidate (the first member's filter plans the
whole group: the gate for the group and ``gangs.plan_gang``), then every member's bind,
each started before the previous returns (kube-scheduler binds concurrently): the first
``members - 1`` binds are held, the last completes the group and every member is bound
(a binder that does nothing: no API server). The members are then deleted.

Printed: the first member's filter (the plan), the later members' filters, the bind
that completes the group (it binds all), the CPU of the whole bind phase per member, and
the parts of a plan timed alone: the members lookup (``gangs.gang_of``, a scan of every
pod the tracker holds), the group's gate and ``gangs.plan_gang``. Figures only, never
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml

from extender import app
from fairshare import gangs
from fairshare.config import loading
from tests.bench import bench_servers, common
from tests.bench.common import progress
from tests.extender_side import Side

NS = "team-c"
GPUS = 4


def member(r: int, i: int, size: int) -> dict[str, Any]:
    pod = bench_servers.pod(
        f"train-{r}-{i}", NS, GPUS, node_name=None, uid=f"22222222-{r:04d}-4000-8000-{i:012d}"
    )
    pod["metadata"]["labels"][gangs.POD_GROUP_LABEL] = f"train-{r}"
    pod["metadata"]["annotations"] = {gangs.ANN_MIN_MEMBERS: str(size)}
    return pod


async def _noop_binder(_plan: Any) -> None:
    return None


def build(nodes: int) -> app.ExtenderDeps:
    config = loading.config_from_mapping(yaml.safe_load(bench_servers.CONFIG))
    deps = app.build_deps(config=lambda: config, ready=lambda: True, binder=_noop_binder)
    items = bench_servers.state_list(nodes)["items"]
    t = Side.of(deps)
    for kind in ("Namespace", "Node", "Pod"):
        t.on_resync(kind, [o for o in items if o["kind"] == kind])
    return deps


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


async def one_round(deps: app.ExtenderDeps, r: int, size: int, names: list[str]) -> dict[str, Any]:
    pods = [member(r, i, size) for i in range(size)]
    for p in pods:
        deps.sink.on_event("Pod", "ADDED", p)
    key = gangs.GroupKey(NS, f"train-{r}")
    # The parts of a plan, timed alone first (they change nothing).
    config = deps.config()
    with deps.reading(config) as snap:
        state = snap.state
        lookup, gang = timed(
            lambda: gangs.gang_of(
                key, size, pods=deps.cache.pods, pending=snap.pending, bound=state.pods
            )
        )
        gate, _ = timed(
            lambda: gangs.gang_gate(state, config, gang, pending=list(snap.queue), fair=snap.fair)
        )
        rows = [i for i in state.rows_of(names) if i >= 0]
        plan_s, plan = timed(lambda: gangs.plan_gang(state, gang, rows=rows))
    assert isinstance(plan, gangs.GangPlan), plan
    # kube-scheduler's calls.
    bodies = [json.dumps({"Pod": p, "Nodes": None, "NodeNames": names}).encode() for p in pods]
    filters: list[float] = []
    chosen: list[str] = []
    for body in bodies:
        t0 = time.perf_counter()
        out = await app._filter(deps, body)
        filters.append(time.perf_counter() - t0)
        assert out.node_names and len(out.node_names) == 1, out
        chosen.append(out.node_names[0])
    binds: list[asyncio.Task[Any]] = []
    cpu0 = time.process_time()
    last_start = 0.0
    for p, node in zip(pods, chosen, strict=True):
        meta = p["metadata"]
        body = json.dumps(
            {"PodName": meta["name"], "PodNamespace": NS, "PodUID": meta["uid"], "Node": node}
        ).encode()
        last_start = time.perf_counter()
        binds.append(asyncio.ensure_future(app._bind(deps, body)))
        await asyncio.sleep(0)  # the bind runs up to its wait for the group
    results = await asyncio.gather(*binds)
    completing = time.perf_counter() - last_start
    bind_cpu = (time.process_time() - cpu0) / size
    errors = [res["Error"] for res in results if res.get("Error")]
    assert not errors, errors[:3]
    for p in pods:
        node = deps.cache.state.pods[p["metadata"]["uid"]].node
        deps.sink.on_event("Pod", "DELETED", dict(p, spec=dict(p["spec"], nodeName=node)))
    return {
        "plan_filter": filters[0],
        "later_filters": filters[1:],
        "completing_bind": completing,
        "bind_cpu_per_member": bind_cpu,
        "lookup": lookup,
        "gate": gate,
        "plan_gang": plan_s,
    }


def run_bench(nodes: int, size: int, rounds: int) -> dict[str, Any]:
    deps = build(nodes)
    names = [n.name for n in deps.cache.state.nodes]
    out: list[dict[str, Any]] = []

    async def go() -> None:
        await one_round(deps, 0, size, names)  # warm-up, not counted
        for r in range(1, rounds + 1):
            out.append(await one_round(deps, r, size, names))

    asyncio.run(go())
    later = [x for o in out for x in o["later_filters"]]

    def stat(values: list[float]) -> dict[str, float]:
        return {
            "p50": statistics.median(values),
            "p99": common.percentile(values, 99),
            "max": max(values),
        }

    return {
        "nodes": nodes,
        "members": size,
        "rounds": rounds,
        "pods": len(deps.cache.pods),
        "plan_filter": stat([o["plan_filter"] for o in out]),
        "later_filter": stat(later),
        "completing_bind": stat([o["completing_bind"] for o in out]),
        "bind_cpu_per_member": stat([o["bind_cpu_per_member"] for o in out]),
        "lookup": stat([o["lookup"] for o in out]),
        "gate": stat([o["gate"] for o in out]),
        "plan_gang": stat([o["plan_gang"] for o in out]),
    }


def markdown(d: dict[str, Any]) -> str:
    ms = common.fmt_ms
    rows = [
        ("filter of the first member (plans the group)", d["plan_filter"]),
        ("filter of a later member (answers its planned node)", d["later_filter"]),
        ("the bind that completes the group (binds every member)", d["completing_bind"]),
        ("CPU of the bind phase, per member", d["bind_cpu_per_member"]),
        ("in the plan: members lookup (`gang_of`, scans every pod)", d["lookup"]),
        ("in the plan: the group's fair-share gate", d["gate"]),
        ("in the plan: `plan_gang` over every node", d["plan_gang"]),
    ]
    lines = [
        f"## Gangs: the extender's verbs for a {d['members']}-member group\n",
        f"{d['nodes']:,} nodes × 8 GPUs, {d['pods']:,} pods known to the tracker, members of "
        f"{GPUS} GPUs each, every node a candidate; {d['rounds']} rounds (one group each), in "
        "process (no HTTP).\n",
        "| call | p50 | p99 | max |",
        "|---|---:|---:|---:|",
    ]
    for label, s in rows:
        lines.append(f"| {label} | {ms(s['p50'])} | {ms(s['p99'])} | {ms(s['max'])} |")
    return "\n".join(lines)


def run(quick: bool, *, nodes: int = 1000, members: int = 64, rounds: int | None = None) -> None:
    n_rounds = rounds if rounds is not None else (5 if quick else 30)
    progress(f"gangs: {nodes} nodes, {members} members, {n_rounds} rounds")
    data = run_bench(nodes, members, n_rounds)
    md = markdown(data)
    common.write_results("gangs", data, md)
    print(md)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 rounds")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--members", type=int, default=64)
    p.add_argument("--rounds", type=int)
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    n_rounds = args.rounds if args.rounds is not None else (5 if args.quick else 30)
    if args.no_write:
        print(markdown(run_bench(args.nodes, args.members, n_rounds)))
        return 0
    common.set_quick(args.quick)
    run(args.quick, nodes=args.nodes, members=args.members, rounds=n_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
