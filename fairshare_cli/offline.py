"""``fairshare config`` and ``fairshare simulate``: commands that need no cluster.

Errors a user can cause (bad config, bad scenario, missing trace) print a clear message
and exit 1, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any, TextIO

from fairshare.errors import ConfigError
from fairshare_cli.output import print_config_error, write_report

DEFAULT_TRACE = Path("../shared/data/openb")


def cmd_config_validate(args: argparse.Namespace) -> int:
    from fairshare.config import loading

    try:
        cfg = loading.load_config_file(args.file)
    except ConfigError as exc:
        print_config_error(str(args.file), exc, sys.stderr)
        return 1
    names = ", ".join(t.name for t in cfg.tenants) or "none"
    print(f"{args.file}: valid ({len(cfg.tenants)} tenant(s): {names})")
    return 0


def cmd_config_example(args: argparse.Namespace) -> int:
    from fairshare.config import loading

    sys.stdout.write(loading.dump_default_config())
    return 0


class Progress:
    """A progress bar on a terminal; a line every 10 % elsewhere (logs, CI)."""

    def __init__(self, label: str, out: TextIO = sys.stderr) -> None:
        self.label, self.out = label, out
        self.tty = out.isatty()
        self.last = -1
        self.start = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        pct = 100 * done // max(total, 1)
        step = pct if self.tty else pct // 10 * 10
        if step == self.last and done != total:
            return
        self.last = step
        secs = time.monotonic() - self.start
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        line = f"{self.label} [{bar}] {pct:3d}% {done}/{total} pods {secs:.0f}s"
        if self.tty:
            self.out.write("\r" + line + ("\n" if done >= total else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()


def cmd_simulate(args: argparse.Namespace) -> int:
    from fairshare.simulator import runner, scenario

    if args.trace is not None or args.pods is not None:
        return _simulate_trace(args)
    if args.demo:
        text = (
            importlib_resources.files("fairshare.simulator")
            .joinpath("scenarios/demo.yaml")
            .read_text(encoding="utf-8")
        )
        what = "built-in demo scenario"
        try:
            loaded = scenario.parse_scenario(text)
        except ConfigError as exc:
            print_config_error(what, exc, sys.stderr)
            return 1
    elif args.scenario is None:
        print("error: give a SCENARIO file, --demo, or --trace DIR", file=sys.stderr)
        return 1
    else:
        what = str(args.scenario)
        try:
            loaded = scenario.load_scenario(args.scenario)
        except ConfigError as exc:
            print_config_error(what, exc, sys.stderr)
            return 1
    sim = runner.run_scenario(loaded, policy=args.policy, seed=args.seed)
    report = runner.build_report(sim)
    print(f"fairshare simulate: {what}\n")
    print(runner.render_text(report))
    write_report(report, args.out)
    if args.plot is not None:
        shares = {n: t["dominantShare"] for n, t in report["tenants"].items()}
        runner.plot(args.plot, curves={}, shares=shares)
    return 0


def _simulate_trace(args: argparse.Namespace) -> int:
    from fairshare.simulator import openb, runner

    trace = args.trace if args.trace is not None else DEFAULT_TRACE
    if not trace.is_dir():
        print(f"error: trace folder {trace} not found. {openb.TRACE_HELP}", file=sys.stderr)
        return 1
    pods = args.pods or "default"
    progress: Callable[[int, int], None] | None = None
    if not args.quiet:
        progress = Progress(f"openb {pods} seed {args.seed} {args.policy}")
    try:
        sim, result = openb.run_trace(
            trace,
            pods=pods,
            seed=args.seed,
            policy=args.policy,
            arrival=args.arrival,
            tenants=args.tenants,
            progress=progress,
        )
    except openb.TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    report = runner.build_report(sim)
    report["trace"] = {
        "pods": pods,
        "seed": args.seed,
        "arrival": args.arrival,
        "placed": result.placed,
        "failed": result.failed,
        "allocationAt100": result.allocation_at(100),
        "curve": {str(k): round(v, 3) for k, v in result.curve.items()},
        "attribution": "Alibaba Cluster Trace Program, cluster-trace-gpu-v2023 (openb); "
        "Weng et al., USENIX ATC '23",
    }
    report.pop("pending", None)
    print(runner.render_text({**report, "pending": {}}))
    at100 = result.allocation_at(100)
    if at100 is not None:
        print(f"GPU allocation at 100 % arrived: {at100:.2f} %")
    write_report(report, args.out)
    if args.plot is not None:
        shares = {n: t["dominantShare"] for n, t in report["tenants"].items()}
        runner.plot(args.plot, curves={args.policy: result.curve}, shares=shares)
    return 0


def add_parsers(sub: Any) -> None:
    """Add this family's commands to the ``fairshare`` subparsers ``sub``."""
    cfg = sub.add_parser("config", help="validate or print FairShareConfig documents")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    v = cfg_sub.add_parser("validate", help="check a config file; exit 1 listing every error")
    v.add_argument("file", type=Path)
    v.set_defaults(func=cmd_config_validate)
    ex = cfg_sub.add_parser("example", help="print a commented example config")
    ex.set_defaults(func=cmd_config_example)

    sim = sub.add_parser("simulate", help="replay a scenario or the openb trace")
    sim.add_argument("scenario", nargs="?", type=Path, help="a kind: Scenario YAML file")
    sim.add_argument("--demo", action="store_true", help="run the built-in demo scenario")
    sim.add_argument("--trace", type=Path, default=None, help="openb trace folder")
    sim.add_argument("--pods", default=None, help="openb pod list name (default: default)")
    sim.add_argument("--seed", type=int, default=42)
    sim.add_argument("--policy", choices=("ours", "bestfit", "fgd"), default="ours")
    sim.add_argument("--arrival", type=float, default=1.0, help="trace: stop at this × GPUs")
    sim.add_argument("--tenants", type=int, default=0, help="trace: K synthetic tenants")
    sim.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    sim.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.set_defaults(func=cmd_simulate)
