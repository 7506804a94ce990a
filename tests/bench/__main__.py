"""``make bench``: every benchmark in one run, figures printed and written, never asserted.

    python -m tests.bench [--quick] [--only kernels|servers|memory|gangs|dra|cluster ...]
                          [--keep-cluster]

Runs, in order: the kernel micro-benchmark (``bench_kernels``: C against the pure twin
and NumPy), the extender and webhook servers alone on loopback (``bench_servers``), the
extender's peak memory holding a large cluster (``bench_memory``), the extender's verbs
for the members of a 64-pod group at 1,000 nodes (``bench_gangs``), its verbs on 500 DRA
GPU nodes against the same fleet on the device plugin (``bench_dra``), and the real control
plane (``bench_cluster``: scheduler throughput with and without the
extender, admission overhead). Each part merges its section into
``bench/results/<date>.json`` and ``bench/results/<date>.md`` (the quality results of
``make bench-quality``, when present for the date, are merged in as well); the combined
markdown is printed at the end.

``--quick`` is a smoke version (a few minutes): small sizes, one repetition.
A part that fails is reported and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import traceback
from typing import Any

from tests.bench import common
from tests.bench.common import progress

PARTS = ("kernels", "servers", "memory", "gangs", "dra", "cluster")


def run_kernels(quick: bool) -> None:
    from tests.bench import bench_kernels

    budget = 0.2 if quick else 1.0
    sizes = (1_000, 5_000) if quick else bench_kernels.SIZES
    report = bench_kernels.run(budget, tuple(sizes))
    md = "## Kernels (one call)\n\n" + bench_kernels.table(report)
    out = common.RESULTS / f"kernels-{report['date']}{'-quick' if quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    common.write_results("kernels", report, md)
    print(md)


def merge_quality() -> None:
    """Fold ``quality-<date>.json`` (``make bench-quality``) into the dated results."""
    path = common.RESULTS / f"quality-{common.today()}.json"
    if not path.exists():
        return
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except ValueError:
        return
    md = data.get("summary") if isinstance(data.get("summary"), str) else None
    if md is not None:
        md = "## Quality (`make bench-quality`, simulator, openb)\n\n" + md
    else:
        md = (
            "## Quality (`make bench-quality`)\n\n"
            f"Results of `make bench-quality` for this date are in `{path.name}` "
            "(merged into this JSON under `sections.quality`)."
        )
    common.write_results("quality", data, md)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small smoke version (~3 minutes)")
    p.add_argument("--only", action="append", choices=PARTS, help="run only this part (repeat)")
    p.add_argument("--keep-cluster", action="store_true", help="leave .e2e-bench running")
    args = p.parse_args(argv)
    common.set_quick(args.quick)
    parts = args.only or list(PARTS)
    t0 = time.monotonic()
    others = common.other_apiservers(common.ROOT / ".e2e-bench")
    if others:
        progress(
            f"note: {len(others)} other kube-apiserver process(es) running on this machine; "
            "figures may include CPU contention"
        )
    failed = []
    for part in parts:
        progress(f"=== {part} ===")
        try:
            if part == "kernels":
                run_kernels(args.quick)
            elif part == "servers":
                from tests.bench import bench_servers

                bench_servers.run(args.quick)
            elif part == "memory":
                from tests.bench import bench_memory

                bench_memory.run(args.quick)
            elif part == "gangs":
                from tests.bench import bench_gangs

                bench_gangs.run(args.quick)
            elif part == "dra":
                from tests.bench import bench_dra

                bench_dra.run(args.quick)
            elif part == "cluster":
                from tests.bench import bench_cluster

                extra = ["--quick"] if args.quick else []
                if args.keep_cluster:
                    extra.append("--keep-cluster")
                bench_cluster.run(extra)
        except Exception:  # one broken part must not hide the others' figures
            traceback.print_exc()
            failed.append(part)
    if not args.quick:
        with contextlib.suppress(Exception):
            merge_quality()
    md_path = common.result_paths()[1]
    if md_path.exists():
        buf = io.StringIO()
        buf.write("\n" + "=" * 80 + "\n")
        buf.write(md_path.read_text())
        print(buf.getvalue())
    progress(
        f"done in {time.monotonic() - t0:.0f}s; results in {md_path}"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
