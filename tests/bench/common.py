"""Shared helpers of the benchmarks: statistics, formatting, machine facts, processes.

Nothing here asserts a time: the benchmarks print figures and write them to
``bench/results``. Progress goes to stderr, tables to stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PY = sys.executable


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def today() -> str:
    return datetime.date.today().isoformat()


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank-with-interpolation percentile (numpy's default 'linear')."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def spread(values: Iterable[float]) -> dict[str, Any]:
    """Median and min–max of repetitions."""
    xs = [v for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
        "values": xs,
    }


def fmt_ms(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "n/a"
    ms = seconds * 1e3
    if ms < 1:
        return f"{ms:.3f} ms"
    if ms < 10:
        return f"{ms:.2f} ms"
    return f"{ms:.1f} ms"


def fmt_num(x: float | None, digits: int = 0) -> str:
    if x is None or math.isnan(x):
        return "n/a"
    return f"{x:,.{digits}f}"


def cell(s: dict[str, Any], fmt: Any = fmt_ms) -> str:
    """``median (min–max)`` of a ``spread``; just the value when there is one rep."""
    if not s or s.get("median") is None:
        return "n/a"
    if s["n"] == 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float, ctx: Any = None, proc: Any = None) -> float:
    """Poll ``url`` until it answers 200; returns seconds waited."""
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except Exception as exc:
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s: {last}")


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    fh = log.open("wb")
    return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
            if line.startswith("VmHWM:"):
                pass
    except OSError:
        pass
    return math.nan


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def histogram_from_metrics(text: str, name: str, label: str) -> list[tuple[float, float]]:
    """Cumulative ``(le, count)`` pairs of one Prometheus histogram series."""
    out = []
    for line in text.splitlines():
        if not line.startswith(f"{name}_bucket{{") or label not in line:
            continue
        labels, value = line.rsplit(" ", 1)
        le = labels.split('le="', 1)[1].split('"', 1)[0]
        out.append((math.inf if le == "+Inf" else float(le), float(value)))
    return sorted(out)


def histogram_delta(
    before: list[tuple[float, float]], after: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    old = dict(before)
    return [(le, c - old.get(le, 0.0)) for le, c in after]


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus ``histogram_quantile``: linear interpolation inside the bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def other_apiservers(own_state_dir: Path | None) -> list[str]:
    """kube-apiserver processes that are not ours (for the contention note)."""
    try:
        out = subprocess.run(
            ["pgrep", "-fa", "kube-apiserver"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return []
    mine = str(own_state_dir) if own_state_dir else "\0"
    return [line[:160] for line in out.splitlines() if line.strip() and mine not in line]


_SUFFIX = {"value": ""}


def set_quick(quick: bool) -> None:
    """``--quick`` runs write ``<date>-quick.*`` so they never overwrite a full run."""
    _SUFFIX["value"] = "-quick" if quick else ""


def result_paths() -> tuple[Path, Path]:
    stem = f"{today()}{_SUFFIX['value']}"
    return RESULTS / f"{stem}.json", RESULTS / f"{stem}.md"


def _portable(text: str) -> str:
    """Results name paths relative to the checkout and the home directory, so a result
    file says nothing about the machine it was measured on beyond its ``machine``."""
    root = str(Path(__file__).resolve().parents[2]) + "/"
    return text.replace(root, "").replace(str(Path.home()), "~")


def write_results(section: str, data: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    """Merge ``data`` under ``section`` into ``bench/results/<date>.json`` and the
    markdown into ``<date>.md`` (sections kept in a fixed order)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    jpath, mpath = result_paths()
    doc: dict[str, Any] = {}
    if jpath.exists():
        try:
            doc = json.loads(jpath.read_text())
        except ValueError:
            doc = {}
    doc.setdefault("date", today())
    doc["quick"] = bool(_SUFFIX["value"])
    doc.setdefault("sections", {})
    doc["sections"][section] = {"data": data, "markdown": markdown}
    doc["machine"] = machine()
    jpath.write_text(_portable(json.dumps(doc, indent=2, default=str)) + "\n")
    order = ["kernels", "quality", "servers", "memory", "gangs", "dra", "cluster"]
    names = sorted(doc["sections"], key=lambda n: (order.index(n) if n in order else 99, n))
    m = doc["machine"]
    head = (
        f"# fairshare benchmarks, {doc['date']}\n\n"
        f"Machine: {m['cpu_count']} cores ({m['cpu_model']}), {m['platform']}, "
        f"Python {m['python']}. Produced by `make bench` (`python -m tests.bench`"
        f"{' --quick: a smoke run, not figures to quote' if doc['quick'] else ''}).\n"
    )
    body = "\n\n".join(doc["sections"][n]["markdown"] for n in names)
    mpath.write_text(_portable(head + "\n" + body) + "\n")
    return jpath, mpath


def make_certs(out: Path) -> Path:
    """A CA and a serving certificate for 127.0.0.1 from ``fairshare certs``; the CA path."""
    argv = [PY, "-m", "fairshare_cli", "certs", "--service", "fairshare-webhook"]
    argv += ["--namespace", "bench", "--ip", "127.0.0.1", "--out", str(out)]
    subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
    return out / "ca.crt"


async def follow_pods(
    api: Any,
    ns: str,
    rv: str,
    on_pod: Callable[[dict[str, Any]], None],
    stop: asyncio.Event,
    errors: list[str],
    what: str = "",
) -> None:
    """Watch ``ns``'s pods from ``rv`` until ``stop``: ``on_pod`` gets every ADDED or
    MODIFIED pod. A watch that ends or fails is resumed from the last resourceVersion
    seen; after a failure the pods are relisted (each listed pod to ``on_pod``), so
    nothing is missed meanwhile. ``api`` is bench_cluster's ``Api``; failures go to
    ``errors`` (prefixed ``what``)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    while not stop.is_set():
        url = f"{api.server}/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={rv}"
        url += "&allowWatchBookmarks=true&timeoutSeconds=600"
        try:
            async with api.session.get(url, timeout=timeout) as r:
                async for line in r.content:
                    if stop.is_set():
                        return
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    obj = ev.get("object", {})
                    if ev.get("type") == "ERROR":
                        raise RuntimeError(str(obj.get("message", obj))[:200])
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        on_pod(obj)
        except Exception as exc:  # resume below
            errors.append(f"{what}{type(exc).__name__}: {exc}"[:200])
            await asyncio.sleep(0.5)
            with contextlib.suppress(Exception):
                _, lst = await api.call("GET", f"/api/v1/namespaces/{ns}/pods")
                rv = lst["metadata"]["resourceVersion"]
                for obj in lst["items"]:
                    on_pod(obj)
