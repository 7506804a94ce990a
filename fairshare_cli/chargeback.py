"""``fairshare chargeback``: per-tenant GPU-hours, cost, idle share, usage and cost per
token over a period, from the chargeback series Prometheus scraped
(``fairshare.chargeback``, ``docs/chargeback.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime as dt
import html
import io
import json
import math
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fairshare.chargeback import (
    DEFAULT_TOKEN_COUNTERS,
    Inputs,
    Report,
    Series,
    build_report,
    lost_pods,
)
from fairshare.config.fields import parse_duration
from fairshare.errors import FairshareError

HOLD = "namespace, pod, container, node, device, tenant, gpu_model"
QUERIES = {
    "holdings": f"max by ({HOLD}) (fairshare_pod_gpu_allocation)",
    "capacity": "max by (node, device, gpu_model) (fairshare_gpu_capacity)",
    "gpu_prices": "max by (node) (fairshare_node_gpu_hourly_price)",
    "opencost_prices": "max by (node) (node_gpu_hourly_cost)",
    "resources": "max by (namespace, pod, node, tenant, resource) "
    "(fairshare_pod_resource_allocation)",
    "resource_prices": "max by (node, resource) (fairshare_node_resource_hourly_price)",
    "usage": 'avg by (namespace, pod) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod!=""})',
    "memory_used": 'sum by (namespace, pod) (DCGM_FI_DEV_FB_USED{pod!=""})',
}
MAX_POINTS = 10_000  # Prometheus refuses a range query of more than 11,000 points a series


def _seconds(text: str) -> float:
    """Seconds as a number (``30``) or a duration (``30s``, ``1m``, ``1m30s``)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither seconds nor a duration such as 30s or 1m"
        ) from None


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "chargeback",
        help="per-tenant GPU-hours and cost over a period, from Prometheus",
        description="Per tenant: GPU-hours by GPU model, cost, idle share, usage against "
        "allocation and cost per million tokens over [--from, --to), from the chargeback "
        "series Prometheus scraped from the extender (docs/chargeback.md). The tenants' "
        "cost plus cluster idle reconciles to the cluster's GPU cost.",
    )
    p.add_argument(
        "--from",
        dest="start",
        required=True,
        metavar="TIME",
        help="start: RFC 3339 (2026-11-01T00:00:00Z), a date (2026-11-01, UTC) or unix seconds",
    )
    p.add_argument("--to", dest="end", required=True, metavar="TIME", help="end, as --from")
    p.add_argument(
        "--prometheus",
        default="http://localhost:9090",
        metavar="URL",
        help="Prometheus base URL (default: %(default)s)",
    )
    p.add_argument(
        "--step",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="sampling step; at most the scrape interval for exact lifetimes "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--token-counter",
        action="append",
        default=None,
        metavar="METRIC",
        help="a token counter (labels namespace, pod, model_name); repeat for "
        "several (default: vLLM's prompt and generation counters)",
    )
    p.add_argument(
        "--lost-runs",
        default=None,
        metavar="FILE",
        help="the lost runs of the extender's hardware recovery (runs.json of ConfigMap "
        "fairshare-lost-runs): their pods' GPU-hours are marked as lost to hardware",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="per request (default: %(default)s)",
    )
    p.add_argument("-o", "--output", choices=("table", "json", "csv", "html"), default="table")
    p.set_defaults(func=run)


def parse_time(text: str, what: str) -> float:
    """RFC 3339, a date (UTC midnight) or unix seconds; FairshareError otherwise."""
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if math.isfinite(value) and value >= 0:
            return value
        raise FairshareError(f"{what}: {text!r} is not a time")
    try:
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise FairshareError(
            f"{what}: {text!r} is not a time (RFC 3339, YYYY-MM-DD or unix seconds)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


def query_range(
    base: str, query: str, start: float, end: float, step: float, timeout: float
) -> list[Series]:
    """One range query, cut into pieces Prometheus accepts; [(labels, samples)]."""
    merged: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    t0 = start
    while t0 <= end:
        t1 = min(end, t0 + step * (MAX_POINTS - 1))
        body = _get(
            base,
            "/api/v1/query_range",
            {"query": query, "start": f"{t0:.3f}", "end": f"{t1:.3f}", "step": f"{step:g}"},
            timeout,
        )
        for item in body.get("result", []):
            key = tuple(sorted(item.get("metric", {}).items()))
            seen = merged.setdefault(key, [])
            for t, v in item.get("values", []):
                if not seen or float(t) > seen[-1][0]:
                    seen.append((float(t), float(v)))
        t0 = t1 + step
    return [(dict(k), v) for k, v in merged.items()]


def _get(base: str, path: str, params: dict[str, str], timeout: float) -> dict[str, Any]:
    url = base.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            payload = json.loads(resp.read().decode())
    except urllib.error.HTTPError as exc:
        detail = ""
        with contextlib.suppress(ValueError, OSError):
            detail = json.loads(exc.read().decode()).get("error", "")
        raise FairshareError(f"Prometheus at {base}: HTTP {exc.code} {detail}".strip()) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FairshareError(f"Prometheus at {base} is unreachable: {reason}") from None
    if payload.get("status") != "success":
        raise FairshareError(f"Prometheus at {base}: {payload.get('error', 'query failed')}")
    data = payload.get("data")
    return data if isinstance(data, dict) else {}


def collect(
    base: str, start: float, end: float, step: float, counters: Sequence[str], timeout: float
) -> Inputs:
    got = {k: query_range(base, q, start, end, step, timeout) for k, q in QUERIES.items()}
    tokens: list[Series] = []
    for name in counters:
        q = f'sum by (namespace, pod, model_name) ({{__name__="{name}"}})'
        tokens += query_range(base, q, max(0.0, start - step), end, step, timeout)
    return Inputs(
        holdings=got["holdings"],
        capacity=got["capacity"],
        gpu_prices=got["gpu_prices"],
        opencost_prices=got["opencost_prices"],
        resources=got["resources"],
        resource_prices=got["resource_prices"],
        usage=got["usage"],
        memory_used=got["memory_used"],
        tokens=tokens,
    )


def run(args: argparse.Namespace) -> int:
    start = parse_time(args.start, "--from")
    end = parse_time(args.end, "--to")
    if end <= start:
        raise FairshareError(f"empty range: --to ({args.end}) is not after --from ({args.start})")
    if not (math.isfinite(args.step) and args.step > 0):
        raise FairshareError("--step must be > 0 seconds")
    if not args.timeout > 0:
        raise FairshareError("--timeout must be > 0 seconds")
    counters = args.token_counter or list(DEFAULT_TOKEN_COUNTERS)
    lost: frozenset[tuple[str, str]] = frozenset()
    if args.lost_runs is not None:
        try:
            lost = lost_pods(json.loads(Path(args.lost_runs).read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise FairshareError(f"--lost-runs {args.lost_runs}: {exc}") from None
    inputs = collect(args.prometheus, start, end, args.step, counters, args.timeout)
    inputs = dataclasses.replace(inputs, lost=lost)
    if not inputs.capacity and not inputs.holdings:
        raise FairshareError(
            f"no fairshare chargeback series in Prometheus at {args.prometheus} between "
            f"{_iso(start)} and {_iso(end)} (is it scraping the extender?)"
        )
    report = build_report(inputs, start, end, args.step)
    render = {"json": as_json, "csv": as_csv, "html": as_html}.get(args.output, as_table)
    sys.stdout.write(render(report))
    sys.stdout.flush()
    return 0


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def _num(x: float | None, digits: int = 9) -> float | None:
    return None if x is None else round(x, digits)


def as_dict(r: Report) -> dict[str, Any]:
    return {
        "from": _iso(r.start),
        "to": _iso(r.end),
        "stepSeconds": r.step,
        "tenants": [
            {
                "tenant": t.tenant,
                "gpuHours": _num(t.gpu_hours),
                "gpuCost": _num(t.gpu_cost),
                "idleGpuHours": _num(t.idle_gpu_hours),
                "idleCost": _num(t.idle_cost),
                "idleShare": _num(t.idle_share),
                "otherCost": _num(t.other_cost),
                "lostToHardwareGpuHours": _num(t.lost_gpu_hours),
                "lostToHardwareCost": _num(t.lost_cost),
                "cost": _num(t.cost),
                "usageRatio": _num(t.usage_ratio),
                "gpuMemoryUsedMiB": _num(t.memory_used_mib),
                "tokens": t.tokens,
                "costPerMillionTokens": _num(t.cost_per_million_tokens),
            }
            for t in r.tenants
        ],
        "byGpuModel": [
            {
                "tenant": m.tenant,
                "gpuModel": m.gpu_model,
                "gpuHours": _num(m.gpu_hours),
                "cost": _num(m.cost),
                "idleGpuHours": _num(m.idle_gpu_hours),
                "idleCost": _num(m.idle_cost),
                "usageRatio": _num(m.usage_ratio),
            }
            for m in r.by_model
        ],
        "deployments": [
            {
                "namespace": d.namespace,
                "model": d.model,
                "tenant": d.tenant,
                "tokens": d.tokens,
                "cost": _num(d.cost),
                "costPerMillionTokens": _num(d.cost_per_million_tokens),
            }
            for d in r.deployments
        ],
        "cluster": {
            "gpuHours": _num(r.cluster_gpu_hours),
            "gpuCost": _num(r.cluster_gpu_cost),
            "idleGpuHours": _num(r.cluster_idle_gpu_hours),
            "idleCost": _num(r.cluster_idle_cost),
            "billedGpuCost": _num(r.billed_gpu_cost),
            "maxGpuLoad": _num(r.max_gpu_load),
            "opencostPricedGpuHours": _num(r.opencost_priced_gpu_hours),
            "unpricedGpuHours": _num(r.unpriced_gpu_hours),
        },
    }


def as_json(r: Report) -> str:
    return json.dumps(as_dict(r), indent=2) + "\n"


def as_csv(r: Report) -> str:
    """One row per tenant and GPU model, then a cluster idle row and a total row."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(
        [
            "tenant",
            "gpu_model",
            "gpu_hours",
            "gpu_cost",
            "idle_gpu_hours",
            "idle_cost",
            "usage_ratio",
        ]
    )
    for m in r.by_model:
        usage = "" if m.usage_ratio is None else f"{m.usage_ratio:.4f}"
        w.writerow(
            [
                m.tenant,
                m.gpu_model,
                f"{m.gpu_hours:.6f}",
                f"{m.cost:.6f}",
                f"{m.idle_gpu_hours:.6f}",
                f"{m.idle_cost:.6f}",
                usage,
            ]
        )
    w.writerow(
        [
            "__idle__",
            "",
            "0",
            "0",
            f"{r.cluster_idle_gpu_hours:.6f}",
            f"{r.cluster_idle_cost:.6f}",
            "",
        ]
    )
    w.writerow(
        ["__cluster__", "", f"{r.cluster_gpu_hours:.6f}", f"{r.cluster_gpu_cost:.6f}", "", "", ""]
    )
    return out.getvalue()


def _rows(r: Report) -> tuple[list[str], list[list[str]]]:
    head = [
        "TENANT",
        "GPU-HOURS",
        "GPU COST",
        "IDLE GPU-H",
        "IDLE COST",
        "IDLE SHARE",
        "OTHER COST",
        "TOTAL",
        "USAGE",
        "TOKENS",
        "$/1M TOKENS",
    ]
    rows = []
    for t in r.tenants:
        rows.append(
            [
                t.tenant,
                f"{t.gpu_hours:.4f}",
                f"{t.gpu_cost:.4f}",
                f"{t.idle_gpu_hours:.4f}",
                f"{t.idle_cost:.4f}",
                f"{t.idle_share:.1%}",
                f"{t.other_cost:.4f}",
                f"{t.cost:.4f}",
                "-" if t.usage_ratio is None else f"{t.usage_ratio:.0%}",
                f"{t.tokens:.0f}",
                "-" if t.cost_per_million_tokens is None else f"{t.cost_per_million_tokens:.4f}",
            ]
        )
    return head, rows


def _table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [head, *rows]
    ]
    return "\n".join(lines) + "\n"


def as_table(r: Report) -> str:
    out = [f"chargeback {_iso(r.start)} .. {_iso(r.end)} (step {r.step:g}s)\n"]
    out.append(_table(*_rows(r)))
    out.append("\nby GPU model\n")
    out.append(
        _table(
            ["TENANT", "GPU MODEL", "GPU-HOURS", "COST", "IDLE GPU-H", "IDLE COST", "USAGE"],
            [
                [
                    m.tenant,
                    m.gpu_model,
                    f"{m.gpu_hours:.4f}",
                    f"{m.cost:.4f}",
                    f"{m.idle_gpu_hours:.4f}",
                    f"{m.idle_cost:.4f}",
                    "-" if m.usage_ratio is None else f"{m.usage_ratio:.0%}",
                ]
                for m in r.by_model
            ],
        )
    )
    if r.deployments:
        out.append("\nmodel deployments\n")
        out.append(
            _table(
                ["NAMESPACE", "MODEL", "TENANT", "TOKENS", "COST", "$/1M TOKENS"],
                [
                    [
                        d.namespace,
                        d.model,
                        d.tenant,
                        f"{d.tokens:.0f}",
                        f"{d.cost:.4f}",
                        "-"
                        if d.cost_per_million_tokens is None
                        else f"{d.cost_per_million_tokens:.4f}",
                    ]
                    for d in r.deployments
                ],
            )
        )
    out.append(
        f"\ncluster: {r.cluster_gpu_hours:.4f} GPU-hours costing {r.cluster_gpu_cost:.4f}; "
        f"idle no tenant holds: {r.cluster_idle_gpu_hours:.4f} GPU-hours "
        f"({r.cluster_idle_cost:.4f}); tenants + cluster idle = {r.billed_gpu_cost:.4f}; "
        f"max load of one GPU {r.max_gpu_load:.3f}\n"
    )
    return "".join(out)


def as_html(r: Report) -> str:
    """A standalone page with the tables of ``as_table``."""
    head, rows = _rows(r)

    def table(h: list[str], rs: list[list[str]]) -> str:
        th = "".join(f"<th>{html.escape(x)}</th>" for x in h)
        trs = "".join(
            "<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in row) + "</tr>" for row in rs
        )
        return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"

    d = as_dict(r)["cluster"]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>fairshare chargeback</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}</style></head><body>"
        f"<h1>Chargeback {_iso(r.start)} to {_iso(r.end)}</h1>"
        + table(head, rows)
        + "<h2>By GPU model</h2>"
        + table(
            ["tenant", "GPU model", "GPU-hours", "cost", "idle GPU-hours", "idle cost"],
            [
                [
                    m.tenant,
                    m.gpu_model,
                    f"{m.gpu_hours:.4f}",
                    f"{m.cost:.4f}",
                    f"{m.idle_gpu_hours:.4f}",
                    f"{m.idle_cost:.4f}",
                ]
                for m in r.by_model
            ],
        )
        + "<h2>Cluster</h2>"
        + table(list(d), [[str(v) for v in d.values()]])
        + "</body></html>\n"
    )
