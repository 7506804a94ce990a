"""The extender on DRA GPU nodes against the same fleet on the device plugin (issue 32).

``python -m tests.bench.bench_dra [--nodes 500]``: per fleet, the tracker's first sync
(nodes, and for DRA the DeviceClass and one ResourceSlice of 8 GPUs per node, as NVIDIA's
driver publishes them; 4 pods per node bound, 200 pending), the filter verb of a 1-GPU pod
over every node (200 calls), and for DRA one ResourceSlice event (a new pool generation).
Figures only, no assertion: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare.config.loading import config_from_mapping
from fairshare.resources import GPU
from tests import nvidia_dra as nv
from tests.extender_side import Side
from tests.unit.test_state_objects import node, pod

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": t, "namespaces": [t]} for t in "abcd"],
    }
)


def dra_node(name: str) -> dict[str, Any]:
    obj = node(name, gpus=0)
    del obj["status"]["allocatable"][GPU]
    return obj


def build(kind: str, n: int) -> tuple[Side, float]:
    tr = Side(lambda: CONFIG)
    t0 = time.perf_counter()
    if kind == "dra":
        tr.on_resync("DeviceClass", [nv.device_class()])
        tr.on_resync("ResourceSlice", [nv.resource_slice(f"n{i}", 8) for i in range(n)])
        tr.on_resync("Node", [dra_node(f"n{i}") for i in range(n)])
    else:
        tr.on_resync("Node", [node(f"n{i}", gpus=8) for i in range(n)])
    pods = [pod(f"p{i}", ns="abcd"[i % 4], gpu=1, node_name=f"n{i % n}") for i in range(4 * n)]
    pods += [pod(f"q{i}", ns="abcd"[i % 4], gpu=1, phase="Pending") for i in range(200)]
    tr.on_resync("Pod", pods)
    return tr, time.perf_counter() - t0


def measure(n: int, rounds: int = 200) -> dict[str, Any]:
    """Per fleet: the first sync, the filter verb over all nodes, and (DRA) slice events."""
    out: dict[str, Any] = {"nodes": n}
    for kind in ("device-plugin", "dra"):
        tr, sync = build(kind, n)
        body = {
            "Pod": pod("x", ns="a", gpu=1, phase="Pending"),
            "NodeNames": [f"n{i}" for i in range(n)],
        }
        lat = []
        passing = 0
        for _ in range(rounds):
            args = wire.decode_extender_args(body)
            t0 = time.perf_counter()
            view = Snapshot.of(tr.state, pending=tr.pending_queue(), fair=tr.fair_shares(CONFIG))
            res = verbs.filter_result(args, view, CONFIG)
            lat.append(time.perf_counter() - t0)
            passing = len(res.encode()["NodeNames"] or [])
        row: dict[str, Any] = {
            "first_sync_ms": round(sync * 1000, 1),
            "filter_median_ms": round(statistics.median(lat) * 1000, 3),
            "filter_p99_ms": round(sorted(lat)[int(0.99 * len(lat)) - 1] * 1000, 3),
            "passing": passing,
        }
        if kind == "dra":
            events = []
            for gen in range(2, 22):
                rs = nv.resource_slice("n7", 8 if gen % 2 else 7, generation=gen, name="n7-new")
                t0 = time.perf_counter()
                tr.on_event("ResourceSlice", "ADDED", rs)
                events.append(time.perf_counter() - t0)
            row["slice_event_median_ms"] = round(statistics.median(events) * 1000, 2)
        out[kind] = row
    return out


def markdown(data: dict[str, Any]) -> str:
    n = data["nodes"]
    lines = [
        f"## DRA: the extender on {n} DRA GPU nodes against the same fleet on the device plugin",
        "",
        "| fleet | first sync (ms) | filter, all nodes: median / p99 (ms) | slice event (ms) |",
        "|---|---:|---|---:|",
    ]
    for kind in ("device-plugin", "dra"):
        r = data[kind]
        event = r.get("slice_event_median_ms", "-")
        lines.append(
            f"| {kind} | {r['first_sync_ms']} | {r['filter_median_ms']} / "
            f"{r['filter_p99_ms']} | {event} |"
        )
    return "\n".join(lines) + "\n"


def run(quick: bool) -> None:
    """The ``make bench`` part: 500 DRA nodes (100 with ``--quick``)."""
    from tests.bench import common

    nodes = 100 if quick else 500
    common.progress(f"dra: {nodes} nodes")
    data = measure(nodes, 50 if quick else 200)
    md = markdown(data)
    common.write_results("dra", data, md)
    print(md)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    n = parser.parse_args().nodes
    data = measure(n)
    for kind in ("device-plugin", "dra"):
        r = data[kind]
        line = (
            f"{kind:14s} {n} nodes: first sync {r['first_sync_ms']:.0f} ms; filter over all "
            f"nodes median {r['filter_median_ms']:.2f} ms, p99 {r['filter_p99_ms']:.2f} ms "
            f"({r['passing']} pass)"
        )
        if "slice_event_median_ms" in r:
            line += f"; a ResourceSlice event {r['slice_event_median_ms']:.1f} ms"
        print(line)


if __name__ == "__main__":
    main()
