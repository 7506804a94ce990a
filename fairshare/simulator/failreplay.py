"""The openb and Philly replays with GPUs that fail (``fairshare.simulator.failures``).

Each replay runs once without faults and once per variant, every variant meeting the
same faults (one fault seed): with and without whole-gang recovery (``gang``: a job that
lost a member restarts whole; ``member``: only the lost member is queued again, the
others hold their GPUs) and with and without the no-penalty rule (a lost pod keeps its
place in the queue, or goes to the back)::

    python -m fairshare.simulator.failreplay philly [--jobs N] [--nodes 64] ...
    python -m fairshare.simulator.failreplay openb [--pods default] [--hours 720] ...

openb has no time of its own under the FGD protocol (pods never end): here the saturation
protocol's pods (``openb.run_saturation``: 4 tenants weighted 1:1:2:4, demand in
proportion to the weights, ``--load`` × the GPUs) are admitted at time 0, placed, and
run for ``--hours`` while the GPUs fail; a lost pod has lost the time it ran. Its pods
are single pods (no gangs), so the recovery option changes nothing there and only the
no-penalty rule varies.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairshare import fairness
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import API_VERSION, KIND, FairShareConfig
from fairshare.errors import ConfigError
from fairshare.simulator import openb, philly
from fairshare.simulator.engine import Simulation
from fairshare.simulator.failures import (
    DEFAULT_FATAL,
    DEFAULT_RATE,
    DEFAULT_REPAIR_HOURS,
    HOUR,
    SCOPES,
    FailureModel,
    FailureModelError,
    Fault,
    FaultProcess,
    Recovery,
    Scope,
    fleet_gpus,
)
from fairshare.simulator.gangsim import Replay
from fairshare.state.cluster import BoundPod


@dataclass(frozen=True)
class Variant:
    """One way of living with faults; ``faults=False`` is the run without any."""

    name: str
    faults: bool = True
    recovery: Recovery = "gang"
    no_penalty: bool = True


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("no-faults", faults=False),
        Variant("gang+no-penalty", recovery="gang", no_penalty=True),
        Variant("gang", recovery="gang", no_penalty=False),
        Variant("member+no-penalty", recovery="member", no_penalty=True),
        Variant("member", recovery="member", no_penalty=False),
        Variant("no-penalty", no_penalty=True),
        Variant("penalty", no_penalty=False),
    )
}
PHILLY_VARIANTS = ("no-faults", "gang+no-penalty", "gang", "member+no-penalty", "member")
OPENB_VARIANTS = ("no-faults", "no-penalty", "penalty")
"""openb has no gangs: the recovery option would change nothing."""
OPENB_TRACE = "../shared/data/openb"


def check_variants(names: Sequence[str], allowed: Sequence[str]) -> list[str]:
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise FailureModelError(
            f"unknown variant {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(allowed)}"
        )
    return list(names)


# -- Philly ----------------------------------------------------------------------------


def philly_one(
    folder: Path,
    variant: Variant,
    model: FailureModel,
    *,
    nodes: int,
    gpus_per_node: int,
    limit: int | None,
    policy: str = "ours",
    quiet: bool = False,
    half_life: str | None = None,
) -> dict[str, Any]:
    """One variant of the Philly replay, summarised (a worker process runs one);
    ``half_life`` turns ``usageHistory`` on with that half-life."""
    jobs, _, _ = philly.load_jobs(folder, limit=limit)
    config = history_config(sorted({j.namespace for j in jobs}), half_life)
    prog = None if quiet else philly.Progress(f"{variant.name}")
    t0 = time.monotonic()
    replay = Replay(
        config,
        philly.make_nodes(nodes, gpus_per_node),
        jobs,
        "gang-fifo" if policy == "gang-fifo" else "ours",
        progress=prog,
        failures=model if variant.faults else None,
        recovery=variant.recovery,
        no_penalty=variant.no_penalty,
    )
    # Without faults every job ends by the trace's end; with them, jobs run again, and
    # the run stops at twice that (what has not ended by then counts as unfinished).
    horizon = max((j.arrival + j.duration for j in jobs), default=0.0)
    result = replay.run(until=2 * horizon if variant.faults else None)
    out = philly.summary(result)
    jcts = [x for f in result.tenants.values() for x in f.jcts]
    out.update(
        variant=variant.name,
        lostGpuHours=round(result.lost_gpu_seconds / HOUR, 1),
        brokenGangGpuHours=round(result.broken_gpu_seconds / HOUR, 1),
        outOfServiceGpuHours=round(result.out_gpu_seconds / HOUR, 1),
        faults=result.faults,
        fatalFaults=result.fatal_faults,
        restarts=result.restarts,
        unfinished=result.unfinished,
        refundedGpuHours=round(replay.refunded / HOUR, 1),
        jctHours={
            "mean": round(statistics.fmean(jcts) / HOUR, 2) if jcts else None,
            "p95": round(philly.percentile(jcts, 95) / HOUR, 2) if jcts else None,
        },
        seconds=round(time.monotonic() - t0, 1),
    )
    for t, f in result.tenants.items():
        out["tenants"][t]["lostGpuHours"] = round(f.lost_gpu_seconds / HOUR, 1)
        out["tenants"][t]["restarts"] = f.restarts
    if not quiet:
        print(f"failreplay: philly {variant.name}: done in {out['seconds']:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return out


def history_config(tenants: Sequence[str], half_life: str | None) -> FairShareConfig:
    """The Philly replay's config (``philly.make_config``), with ``usageHistory`` at
    ``half_life`` (a duration such as ``24h``) when given; ConfigError when it is bad."""
    if half_life is None:
        return philly.make_config(tenants)
    doc = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "resources": {"nvidia.com/gpu": {}, "cpu": {}, "memory": {}},
        "tenants": [{"name": t, "namespaces": [t], "weight": 1} for t in sorted(tenants)],
        "usageHistory": {"halfLife": half_life},
    }
    return config_from_mapping(doc)


# -- openb -----------------------------------------------------------------------------


def strike(
    sim: Simulation, fault: Fault, scope: Scope, *, keep_position: bool
) -> tuple[list[BoundPod], str | None]:
    """Apply ``fault`` to a simulation of single pods: the pods on its GPU (on its
    node, when a fatal fault takes the node) are lost and queued again, at their place
    or at the back; a fatal fault then takes the GPU or node out of service. Returns the
    pods lost, as they were bound, and the uid ``repair`` takes back (None: non-fatal,
    or the GPU was already out of service and cannot fail)."""
    state = sim.state
    if state.out_of_service(fault.node, fault.slot):
        return [], None
    whole = fault.fatal and scope == "node"
    lost = state.pods_hit(fault.node, None if whole else fault.slot)
    for pod in lost:
        sim.requeue(pod.uid, keep_position=keep_position, reason="lost to a GPU fault")
    uid = None
    if fault.fatal:
        uid = state.take_out(fault.node, None if whole else fault.slot)
    sim._fair = None
    sim._ctx = None
    return lost, uid


def repair(sim: Simulation, uid: str) -> None:
    """The GPU or node ``strike`` took out of service is back."""
    sim.state.bring_back(uid)
    sim._fair = None
    sim._ctx = None


@dataclass
class OpenbFigures:
    lost: float = 0.0  # GPU-seconds of work lost
    out: float = 0.0  # GPU-seconds out of service
    busy: float = 0.0  # GPU-seconds held by pods
    faults: int = 0
    fatal: int = 0
    restarts: int = 0


def openb_one(
    trace: Path,
    variant: Variant,
    model: FailureModel,
    *,
    pods: str = "default",
    seed: int = 42,
    hours: float = 720.0,
    load: float = 1.3,
    weights: Sequence[float] = openb.DEFAULT_WEIGHTS,
    quiet: bool = False,
) -> dict[str, Any]:
    """One variant of the openb failure replay (module docstring), summarised."""
    t0 = time.monotonic()
    ws = openb.check_weights(weights)
    config = openb.trace_config(len(ws), ws)
    sim, originals = openb._cluster(trace, pods, config, policy="ours", seed=seed)
    order = openb.saturation_order(originals, seed=seed, gpus=int(sim.gpus()), load=load)
    for p in order:
        sim.submit(openb._request(sim, p, openb.tenant_by_weight(p.name, ws)))
    started: dict[str, float] = {}
    g = sim.state.gpu_col

    def settle(now: float) -> None:
        while True:
            placed, _, _ = openb.saturation_pass(sim)
            for uid in placed:
                started[uid] = now
            if not placed:
                return

    settle(0.0)
    horizon = hours * HOUR
    figs = OpenbFigures()
    used: dict[str, float] = {}
    fair_t: dict[str, float] = {}
    now = 0.0

    def account(dt: float) -> None:
        if dt <= 0:
            return
        fair = sim.fair_shares()
        for t in sim.admitted:
            used[t] = used.get(t, 0.0) + sim.state.usage_of(t)[g] / 1000.0 * dt
            if t in fair:
                fair_t[t] = fair_t.get(t, 0.0) + fair[t].allocation[g] / 1000.0 * dt
        out = sim.state.out_gpus()
        figs.out += out * dt
        figs.busy += (sim.capacity()[g] - sim.state.total_free()[g]) / 1000.0 * dt

    faults = FaultProcess(model, fleet_gpus(sim.state)).until(horizon) if variant.faults else []
    # (time, kind, seq): kind 0 a repair (placeholder uid), 1 a fault
    events: list[tuple[float, int, int, Any]] = [(f.time, 1, k, f) for k, f in enumerate(faults)]
    heapq.heapify(events)
    seq = len(events)
    last_report = time.monotonic()
    state = sim.state
    while events and events[0][0] < horizon:
        t, kind, _, what = heapq.heappop(events)
        account(t - now)
        now = t
        if kind == 0:
            repair(sim, what)
        else:
            f = what
            if state.out_of_service(f.node, f.slot):
                continue
            figs.faults += 1
            figs.fatal += f.fatal
            lost, uid = strike(sim, f, model.scope, keep_position=variant.no_penalty)
            for pod in lost:
                figs.lost += pod.row[g] / 1000.0 * (now - started.pop(pod.uid))
                figs.restarts += 1
            if uid is not None:
                heapq.heappush(events, (now + model.repair_seconds, 0, seq, uid))
                seq += 1
        sim._fair = None
        sim._ctx = None
        settle(now)
        if not quiet and time.monotonic() - last_report > 3:
            last_report = time.monotonic()
            print(f"failreplay: openb {variant.name}: {now / HOUR:,.0f} of {hours:g} h, "
                  f"{figs.faults} faults, {time.monotonic() - t0:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    account(horizon - now)
    total_fair = sum(fair_t.values())
    ratios = [used.get(t, 0.0) / f for t, f in fair_t.items() if f > 0]
    tenants = {
        t: {
            "gpuHours": round(used.get(t, 0.0) / HOUR, 1),
            "fairGpuHours": round(fair_t.get(t, 0.0) / HOUR, 1),
            "usedOverFair": round(used.get(t, 0.0) / fair_t[t], 3) if fair_t.get(t) else None,
        }
        for t in sorted(sim.admitted)
    }
    out = {
        "variant": variant.name,
        "pods": len(order),
        "gpus": len(fleet_gpus(state)),
        "hours": hours,
        "faults": figs.faults,
        "fatalFaults": figs.fatal,
        "restarts": figs.restarts,
        "lostGpuHours": round(figs.lost / HOUR, 1),
        "brokenGangGpuHours": 0.0,
        "outOfServiceGpuHours": round(figs.out / HOUR, 1),
        "busyGpuHours": round(figs.busy / HOUR, 1),
        "pendingAtEnd": len(sim.pending),
        "offFair": round(sum(abs(used.get(t, 0.0) - f) for t, f in fair_t.items()) / total_fair, 4)
        if total_fair
        else None,
        "jain": round(fairness.jain_index(ratios), 4) if ratios else None,
        "tenants": tenants,
        "seconds": round(time.monotonic() - t0, 1),
    }
    if not quiet:
        print(f"failreplay: openb {variant.name}: done in {out['seconds']:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return out


# -- tables ----------------------------------------------------------------------------


def _f(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def render(kind: str, figures: Sequence[dict[str, Any]], header: str) -> str:
    """The Markdown table of one replay's variants."""
    out = [header, ""]
    if kind == "philly":
        out.append(
            "| variant | faults (fatal) | job restarts | GPU-h lost | GPU-h held by broken "
            "gangs | GPU-h out of service | jobs not ended | JCT mean / p95 (h) | wait mean / "
            "p95 (h) | run ends (h) | GPU-time off fair | Jain |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|")
        for f in figures:
            j, w = f["jctHours"], f["waitHours"]
            out.append(
                f"| {f['variant']} | {f['faults']} ({f['fatalFaults']}) | {f['restarts']} "
                f"| {_f(f['lostGpuHours'])} | {_f(f['brokenGangGpuHours'])} "
                f"| {_f(f['outOfServiceGpuHours'])} | {f['unfinished']} "
                f"| {_f(j['mean'], 2)} / {_f(j['p95'], 2)} "
                f"| {_f(w['mean'], 2)} / {_f(w['p95'], 2)} | {_f(f['endHours'], 0)} "
                f"| {100 * (f['offFair'] or 0):.1f} % | {_f(f['jain'], 3)} |"
            )
    else:
        out.append(
            "| variant | faults (fatal) | pods lost | GPU-h lost | GPU-h held by broken gangs "
            "| GPU-h out of service | GPU-h held by pods | pending at end | GPU-time off fair "
            "| Jain | " + " | ".join(f"{t} used ÷ fair" for t in figures[0]["tenants"]) + " |"
        )
        out.append(
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            + "---:|" * len(figures[0]["tenants"])
        )
        for f in figures:
            cells = " | ".join(_f(t["usedOverFair"], 3) for t in f["tenants"].values())
            out.append(
                f"| {f['variant']} | {f['faults']} ({f['fatalFaults']}) | {f['restarts']} "
                f"| {_f(f['lostGpuHours'])} | n/a (no gangs) | {_f(f['outOfServiceGpuHours'])} "
                f"| {_f(f['busyGpuHours'])} | {f['pendingAtEnd']} "
                f"| {100 * (f['offFair'] or 0):.2f} % | {_f(f['jain'], 4)} | {cells} |"
            )
    return "\n".join(out)


# -- the command -----------------------------------------------------------------------


def _run(
    fn: Callable[..., dict[str, Any]],
    first: Any,
    variants: Sequence[Variant],
    model: FailureModel,
    workers: int,
    **kw: Any,
) -> list[dict[str, Any]]:
    if workers <= 1 or len(variants) <= 1:
        return [fn(first, v, model, **kw) for v in variants]
    with ProcessPoolExecutor(max_workers=min(workers, len(variants))) as pool:
        futures = [pool.submit(fn, first, v, model, **kw) for v in variants]
        return [f.result() for f in futures]


def _number(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    return v


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fairshare.simulator.failreplay", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("replay", choices=("philly", "openb"), help="which trace to replay")
    ap.add_argument("--trace", type=Path, help="trace folder (default: the replay's)")
    ap.add_argument(
        "--rate", type=_number, default=DEFAULT_RATE,
        help=f"faults per GPU-hour (default {DEFAULT_RATE:.3g}, Llama 3 405B)",
    )  # fmt: skip
    ap.add_argument(
        "--rate-scale", type=_number, default=1.0,
        help="multiply the rate (stress runs; default 1)",
    )  # fmt: skip
    ap.add_argument(
        "--fatal", type=_number, default=DEFAULT_FATAL,
        help=f"fraction of faults that are fatal (default {DEFAULT_FATAL:.2f})",
    )  # fmt: skip
    ap.add_argument(
        "--repair-hours", type=_number, default=DEFAULT_REPAIR_HOURS,
        help=f"hours a fatal fault keeps its GPU out (default {DEFAULT_REPAIR_HOURS:g})",
    )  # fmt: skip
    ap.add_argument(
        "--scope", default="node",
        help=f"what a fatal fault takes out: {' or '.join(SCOPES)} (default node)",
    )  # fmt: skip
    ap.add_argument("--fault-seed", type=int, default=1, help="seed of the faults (default 1)")
    ap.add_argument("--variants", help="comma-separated (default: all the replay has)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                    help="variants replayed at once (default: the cores, up to 2)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    g = ap.add_argument_group("philly")
    g.add_argument("--nodes", type=int, default=64)
    g.add_argument("--gpus-per-node", type=int, default=8)
    g.add_argument("--jobs", type=int, help="the first N jobs by arrival (default: all)")
    g.add_argument("--policy", default="ours", help="ours or gang-fifo (default ours)")
    g.add_argument(
        "--half-life", help="turn usageHistory on with this half-life (e.g. 24h; default off)"
    )
    o = ap.add_argument_group("openb")
    o.add_argument("--pods", default="default", help="pod list (default: default)")
    o.add_argument("--seed", type=int, default=42, help="arrival order seed (default 42)")
    o.add_argument("--hours", type=float, default=720.0, help="hours replayed (default 720)")
    o.add_argument("--load", type=float, default=1.3, help="demand × GPUs (default 1.3)")
    args = ap.parse_args(argv)
    allowed = OPENB_VARIANTS if args.replay == "openb" else PHILLY_VARIANTS
    try:
        if args.rate_scale < 0:
            raise FailureModelError(f"--rate-scale must be ≥ 0, got {args.rate_scale}")
        model = FailureModel(
            rate=args.rate * args.rate_scale,
            fatal=args.fatal,
            repair_hours=args.repair_hours,
            scope=args.scope,
            seed=args.fault_seed,
        )
        names = [v.strip() for v in (args.variants or ",".join(allowed)).split(",") if v.strip()]
        variants = [VARIANTS[n] for n in check_variants(names, allowed)]
        if args.replay == "philly":
            if (
                args.nodes < 1
                or args.gpus_per_node < 1
                or (args.jobs is not None and args.jobs < 1)
            ):
                raise FailureModelError("--nodes, --gpus-per-node and --jobs must be at least 1")
            if args.policy not in ("ours", "gang-fifo"):
                raise FailureModelError(
                    f"--policy: unknown {args.policy!r}; choose ours or gang-fifo"
                )
            if args.half_life is not None:
                try:
                    history_config(["t"], args.half_life)
                except ConfigError as exc:
                    why = str(exc).replace("\n", "; ")
                    raise FailureModelError(f"--half-life {args.half_life!r}: {why}") from None
        elif not (args.hours > 0 and args.load > 0):
            raise FailureModelError("--hours and --load must be numbers > 0")
    except FailureModelError as exc:
        print(f"failreplay: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        if args.replay == "philly":
            folder = args.trace or Path(philly.DEFAULT_TRACE)
            figures = _run(
                philly_one, folder, variants, model, args.workers, nodes=args.nodes,
                gpus_per_node=args.gpus_per_node, limit=args.jobs, policy=args.policy,
                quiet=args.quiet, half_life=args.half_life,
            )  # fmt: skip
            jobs = figures[0]["jobs"]
            header = (
                f"Philly (Gavel, seed 0), {jobs:,} jobs, {args.nodes} × {args.gpus_per_node} "
                f"GPUs, policy {args.policy}"
                + (f", usageHistory half-life {args.half_life}" * bool(args.half_life))
                + f"; faults: {model.describe()}"
            )
        else:
            folder = args.trace or Path(OPENB_TRACE)
            figures = _run(
                openb_one, folder, variants, model, args.workers, pods=args.pods,
                seed=args.seed, hours=args.hours, load=args.load, quiet=args.quiet,
            )  # fmt: skip
            header = (
                f"openb {args.pods} (seed {args.seed}), {figures[0]['pods']:,} pods at "
                f"{args.load:g} × {figures[0]['gpus']:,} GPUs, tenants weighted 1:1:2:4 with "
                f"demand in proportion, {args.hours:g} h; faults: {model.describe()}"
            )
    except (philly.TraceError, openb.TraceError) as exc:
        print(f"failreplay: {exc}", file=sys.stderr)
        return 2
    header += f" ({time.monotonic() - t0:.0f} s)"
    if args.json:
        json.dump({"header": header, "variants": figures}, sys.stdout, indent=1)
        print()
    else:
        print(render(args.replay, figures, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
