"""The per-pod budget of a scheduling round: API requests and CPU per scheduled pod.

Pure (no network): parsing Prometheus text from kube-apiserver's ``/metrics``, deltas
between two scrapes, and the markdown tables of ``bench_cluster``.

* ``apiserver_request_total`` (labels ``verb``, ``group``, ``resource``, ``subresource``,
  ``code``...) counts every request kube-apiserver served, from every client; the delta
  over a round divided by the pods bound is the round's requests per pod by verb and
  resource (``POST pods/binding``, ``PATCH pods/status``, ``WATCH pods``...).
* ``apiserver_flowcontrol_dispatched_requests_total`` (label ``flow_schema``) says which
  client group sent them: kube-scheduler has its own flow schema; system:masters clients
  (the bench client, the extenders, kwok) are ``exempt``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric ``name`` in Prometheus text format: (labels, value).
    Comments and other metrics are skipped; a line of ``name`` that cannot be read is a
    ``ValueError`` naming it."""
    out: list[tuple[dict[str, str], float]] = []
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            raise ValueError(f"unreadable Prometheus sample: {line[:200]!r}")
        if m.group(1) != name:
            continue  # a longer name with the same prefix
        labels = {
            k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL.findall(m.group(2) or "")
        }
        try:
            value = float(m.group(3))
        except ValueError:
            raise ValueError(f"{name}: value {m.group(3)!r} is not a number") from None
        out.append((labels, value))
    return out


def request_key(labels: Mapping[str, str]) -> str:
    """``VERB resource[.group][/subresource]``, e.g. ``POST pods/binding``,
    ``PUT leases.coordination.k8s.io``."""
    res = labels.get("resource", "") or "-"
    if labels.get("group"):
        res += "." + labels["group"]
    if labels.get("subresource"):
        res += "/" + labels["subresource"]
    return f"{labels.get('verb', '?')} {res}"


def request_counts(text: str) -> dict[str, float]:
    """``apiserver_request_total`` summed over codes, scopes and versions, by
    :func:`request_key`."""
    out: dict[str, float] = {}
    for labels, value in parse_samples(text, "apiserver_request_total"):
        k = request_key(labels)
        out[k] = out.get(k, 0.0) + value
    return out


def flow_counts(text: str) -> dict[str, float]:
    """``apiserver_flowcontrol_dispatched_requests_total`` by flow schema."""
    out: dict[str, float] = {}
    for labels, value in parse_samples(text, "apiserver_flowcontrol_dispatched_requests_total"):
        k = labels.get("flow_schema", "?")
        out[k] = out.get(k, 0.0) + value
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """after − before per key (a key new in ``after`` counts from 0); keys that did not
    grow are left out. A counter that went down (the server restarted) is a ValueError."""
    out: dict[str, float] = {}
    for k, v in after.items():
        d = v - before.get(k, 0.0)
        if d < 0:
            raise ValueError(f"counter {k!r} went down ({before[k]} -> {v}): server restarted?")
        if d > 0:
            out[k] = d
    return out


def per_pod(counts: Mapping[str, float], pods: int) -> dict[str, float]:
    return {k: v / pods for k, v in counts.items()} if pods > 0 else {}


def top_keys(columns: Sequence[Mapping[str, float]], n: int) -> list[str]:
    """The ``n`` keys with the largest value in any column, largest first (ties by name)."""
    best: dict[str, float] = {}
    for col in columns:
        for k, v in col.items():
            best[k] = max(best.get(k, 0.0), v)
    return sorted(best, key=lambda k: (-best[k], k))[:n]


def _num(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def cpu_table(
    configs: Sequence[str], cpu: Mapping[str, Mapping[str, float | None]], processes: Iterable[str]
) -> list[str]:
    """Markdown: rows = processes, columns = configurations, cells = CPU ms per pod; a
    process that did not run in a configuration shows "–"; a total row at the end."""
    procs = list(processes)
    lines = ["| CPU ms per pod | " + " | ".join(configs) + " |", "|---|" + "---:|" * len(configs)]
    totals: dict[str, float] = {}
    for p in procs:
        cells = []
        for c in configs:
            v = cpu.get(c, {}).get(p)
            cells.append(_num(v))
            if v is not None and not math.isnan(v):
                totals[c] = totals.get(c, 0.0) + v
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines.append("| **all of these** | " + " | ".join(_num(totals.get(c)) for c in configs) + " |")
    return lines


def requests_table(
    configs: Sequence[str], reqs: Mapping[str, Mapping[str, float]], n: int = 12
) -> list[str]:
    """Markdown: rows = the top ``n`` ``VERB resource`` keys, columns = configurations,
    cells = requests per pod; then the total of all keys."""
    cols = [reqs.get(c, {}) for c in configs]
    lines = [
        "| API requests per pod | " + " | ".join(configs) + " |",
        "|---|" + "---:|" * len(configs),
    ]
    for k in top_keys(cols, n):
        lines.append(f"| `{k}` | " + " | ".join(_num(col.get(k, 0.0)) for col in cols) + " |")
    lines.append(
        "| **all requests** | "
        + " | ".join(_num(sum(col.values())) if col else "–" for col in cols)
        + " |"
    )
    return lines


def summarise_round(before: str, after: str, pods: int) -> dict[str, Any]:
    """Requests per pod by ``VERB resource`` and by flow schema between two scrapes."""
    return {
        "requests_per_pod": per_pod(delta(request_counts(before), request_counts(after)), pods),
        "flow_schema_per_pod": per_pod(delta(flow_counts(before), flow_counts(after)), pods),
    }
