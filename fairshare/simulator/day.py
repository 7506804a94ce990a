"""The day-long scenario of fairness with memory (``usageHistory``).

Tenant ``a`` has the cluster to itself overnight; ``b`` arrives in the morning, and from
then on both saturate it with 1-GPU pods of 30 to 90 minutes (no evictions: room changes
hands only as pods end). ``python -m fairshare.simulator.day --half-life 1h --png
day.png`` prints, per hour, b's time-averaged GPU share without and with history, b's
fair share with history (0.5 without) and the factor on a's weight.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from fairshare import history
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import API_VERSION, KIND, FairShareConfig, parse_duration
from fairshare.errors import ConfigError
from fairshare.simulator.engine import Simulation, requests_pod

HOUR = 3600.0


@dataclass(frozen=True)
class DayScenario:
    """The scenario's knobs (the defaults are the run docs/usage-history.md shows)."""

    nodes: int = 4
    gpus_per_node: int = 8
    b_arrives: float = 8 * HOUR
    end: float = 20 * HOUR
    min_duration: float = 30 * 60
    max_duration: float = 90 * 60
    seed: int = 1


@dataclass
class DayRun:
    """Per-hour figures of one run (index = hour of the day)."""

    half_life: float  # seconds; 0 for the run without history
    b_share: list[float] = field(default_factory=list)  # b's GPUs / cluster GPUs, averaged
    b_fair: list[float] = field(default_factory=list)  # b's fair GPU share, averaged
    a_factor: list[float] = field(default_factory=list)  # factor on a's weight, averaged


def _config(half_life: str | None, strength: float = 1.0) -> FairShareConfig:
    doc: dict[str, object] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "resources": {"nvidia.com/gpu": {}, "cpu": {}, "memory": {}},
        "tenants": [
            {"name": "a", "namespaces": ["a"], "weight": 1},
            {"name": "b", "namespaces": ["b"], "weight": 1},
        ],
    }
    if half_life is not None:
        doc["usageHistory"] = {"halfLife": half_life, "strength": strength}
    return config_from_mapping(doc)  # ConfigError with field paths on a bad value


def run_day(scn: DayScenario, half_life: str | None, *, strength: float = 1.0) -> DayRun:
    """Replay the day; ``half_life`` None is the run without history."""
    base = _config(half_life, strength)
    policy = base.usage_history
    sim = Simulation(base)
    for i in range(scn.nodes):
        g = str(scn.gpus_per_node)
        sim.add_node(
            f"gpu-{i}",
            {"nvidia.com/gpu": Fraction(g), "cpu": Fraction(64), "memory": Fraction(512 << 30)},
            {"nvidia.com/gpu.count": g, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        )
    cap = sim.capacity()
    gcol = sim.state.gpu_col
    total = cap[gcol]
    backlog = scn.nodes * scn.gpus_per_node
    rng = random.Random(scn.seed)
    keeper = history.Keeper(base, sim.index.names) if policy is not None else None
    hours = int(scn.end // HOUR)
    run = DayRun(
        keeper.history.half_life if keeper else 0.0, [0.0] * hours, [0.0] * hours, [0.0] * hours
    )
    serial = {"a": 0, "b": 0}
    waiting = {"a": 0, "b": 0}
    started = {"a": 0.0, "b": scn.b_arrives}
    departures: list[tuple[float, int, str]] = []
    seq = 0

    def top_up(now: float) -> None:
        for t in ("a", "b"):
            while now >= started[t] and waiting[t] < backlog:
                serial[t] += 1
                name = f"{t}-{serial[t]}"
                pod = requests_pod(
                    name=name,
                    namespace=t,
                    requests={"nvidia.com/gpu": "1", "cpu": "4", "memory": "32Gi"},
                )
                sim.submit(sim.request_for(pod, uid=name))
                waiting[t] += 1

    def refit(now: float) -> float:
        """Fold the history in up to ``now`` and adjust the weights; a's factor."""
        if keeper is None:
            return 1.0
        used = {t: sim.state.usage_of(t) for t in ("a", "b")}
        sim.config = keeper.step(now, used, cap, sim.admitted)
        sim._fair = None  # the weights may have changed: the cached allocation is stale
        judged = keeper.assessed
        return judged["a"].factor if "a" in judged else 1.0

    def account(t0: float, t1: float, b_frac: float, b_fair: float, a_f: float) -> None:
        h = int(t0 // HOUR)
        while t0 < t1 and h < hours:
            stop = min(t1, (h + 1) * HOUR)
            part = (stop - t0) / HOUR
            run.b_share[h] += b_frac * part
            run.b_fair[h] += b_fair * part
            run.a_factor[h] += a_f * part
            t0, h = stop, h + 1

    now = 0.0
    arrivals = [scn.b_arrives]
    while now < scn.end:
        a_factor = refit(now)
        top_up(now)
        for uid in _settle(sim):
            waiting[uid.split("-")[0]] -= 1
            seq += 1
            d = rng.uniform(scn.min_duration, scn.max_duration)
            heapq.heappush(departures, (now + d, seq, uid))
        fair = sim.fair_shares()
        b_fair = fair["b"].allocation[gcol] / total if "b" in fair else 0.0
        b_frac = sim.state.usage_of("b")[gcol] / total
        nxt = min([departures[0][0]] if departures else [scn.end], default=scn.end)
        nxt = min([nxt, scn.end, *(t for t in arrivals if t > now)])
        account(now, nxt, b_frac, b_fair, a_factor)
        now = nxt
        while departures and departures[0][0] <= now:
            _, _, uid = heapq.heappop(departures)
            sim.complete(uid)
    return run


def _settle(sim: Simulation) -> list[str]:
    placed: list[str] = []
    while True:
        got = sim.schedule_pass()
        if not got:
            return placed
        placed.extend(got)


def table(scn: DayScenario, plain: DayRun, kept: DayRun) -> str:
    """Per-hour figures from b's arrival, as a Markdown table."""
    lines = [
        "| hour | b's GPU share, no history | with history | b's fair share, with history "
        "| factor on a's weight |",
        "|---:|---:|---:|---:|---:|",
    ]
    for h in range(int(scn.b_arrives // HOUR), len(plain.b_share)):
        lines.append(
            f"| {h:02d}:00 | {plain.b_share[h]:.3f} | {kept.b_share[h]:.3f} "
            f"| {kept.b_fair[h]:.3f} | {kept.a_factor[h]:.3f} |"
        )
    return "\n".join(lines)


def plot(scn: DayScenario, plain: DayRun, kept: DayRun, path: Path) -> None:
    """b's share per hour, with and without history (needs matplotlib: the bench extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [h + 0.5 for h in range(len(plain.b_share))]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(hours, plain.b_share, marker="o", label="b, no history")
    ax.plot(hours, kept.b_share, marker="s", label=f"b, half-life {kept.half_life / HOUR:g} h")
    ax.plot(hours, kept.b_fair, linestyle="--", label="b's fair share with history")
    ax.axhline(0.5, color="grey", linewidth=0.8, label="instantaneous fair share 1/2")
    ax.axvline(scn.b_arrives / HOUR, color="black", linewidth=0.6, linestyle=":")
    ax.set_xlabel("hour of the day (b arrives at the dotted line)")
    ax.set_ylabel("b's share of the GPUs (hourly average)")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fairshare.simulator.day", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--half-life", default="1h", help="usageHistory.halfLife (default 1h)")
    ap.add_argument("--strength", type=float, default=1.0, help="usageHistory.strength")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--png", type=Path, help="write the plot here (needs matplotlib)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    try:
        parse_duration(args.half_life)
    except ValueError as exc:
        ap.error(str(exc))
    if args.png is not None and not args.png.parent.is_dir():
        ap.error(f"--png: directory {args.png.parent} does not exist")
    scn = DayScenario(seed=args.seed)
    plain = run_day(scn, None)
    try:
        kept = run_day(scn, args.half_life, strength=args.strength)
    except ConfigError as exc:
        ap.error("; ".join(f"{e.path}: {e.message}" for e in exc.errors) or str(exc))
    if args.json:
        json.dump(
            {
                "halfLife": args.half_life,
                "strength": args.strength,
                "bShareNoHistory": [round(v, 4) for v in plain.b_share],
                "bShareWithHistory": [round(v, 4) for v in kept.b_share],
                "bFairShareWithHistory": [round(v, 4) for v in kept.b_fair],
                "aWeightFactor": [round(v, 4) for v in kept.a_factor],
            },
            sys.stdout,
            indent=1,
        )
        print()
    else:
        print(table(scn, plain, kept))
    if args.png is not None:
        try:
            plot(scn, plain, kept, args.png)
        except ImportError:
            print("error: --png needs matplotlib (pip install -e '.[bench]')", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
