"""CPU profiles of the cluster benchmark's processes, taken during one round.

kube-apiserver and kube-scheduler: Go's ``/debug/pprof/profile?seconds=N`` (kube-apiserver
needs ``--profiling``, which ``cluster.py up --apiserver-profiling`` turns on), summarised
with ``go tool pprof -top``. The extender: ``py-spy record --format raw`` (collapsed
stacks), summarised here by self and inclusive samples per function.

The parsers are pure; :func:`capture` runs the tools.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

_TOP_ROW = re.compile(
    r"^\s*([\d.]+)(\w*)\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)(\w*)\s+([\d.]+)%\s+(.+?)\s*$"
)
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "mins": 60.0, "hrs": 3600.0}


def parse_pprof_top(text: str, n: int = 10) -> list[dict[str, Any]]:
    """The first ``n`` rows of ``go tool pprof -top`` output: function, flat and cum
    seconds and percent. Header lines are skipped."""
    rows: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _TOP_ROW.match(line)
        if m is None:
            continue
        flat = float(m.group(1)) * _UNIT.get(m.group(2) or "s", 1.0)
        cum = float(m.group(5)) * _UNIT.get(m.group(6) or "s", 1.0)
        rows.append(
            {
                "function": m.group(8),
                "flat_s": round(flat, 6),
                "flat_pct": float(m.group(3)),
                "cum_s": round(cum, 6),
                "cum_pct": float(m.group(7)),
            }
        )
        if len(rows) >= n:
            break
    return rows


OURS = ("fairshare/", "extender/", "serving/", "webhook/", "_native/")
"""Frames of this project (py-spy names files relative to their sys.path entry), but not
the command line (``fairshare_cli/``), the entry point on every stack."""


def go_package(function: str) -> str:
    """``k8s.io/apiserver/pkg/storage/etcd3.(*store).Get`` → ``k8s.io/apiserver/pkg/storage/
    etcd3``; ``runtime.mallocgc`` → ``runtime``; a bare assembly symbol (``aeshashbody``,
    ``p256MulInternal``) → ``(assembly)``."""
    name = function.removesuffix(" (inline)")
    slash = name.rfind("/", 0, name.find("(") if "(" in name else len(name))
    dot = name.find(".", slash + 1)
    return name[:dot] if dot > 0 else "(assembly)"


def by_package(rows: list[dict[str, Any]], n: int = 10) -> list[dict[str, Any]]:
    """Flat CPU of :func:`parse_pprof_top` rows summed by Go package, largest first."""
    out: dict[str, float] = {}
    for r in rows:
        k = go_package(r["function"])
        out[k] = out.get(k, 0.0) + r["flat_pct"]
    best = sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [{"package": k, "flat_pct": round(v, 1)} for k, v in best]


def _frame(frame: str) -> tuple[str, str]:
    """``func (pkg/file.py:123)`` → (``func (pkg/file.py)``, ``pkg/file.py``): one row per
    function, whatever the line."""
    m = re.match(r"^(.*?) \((.*?)(?::\d+)?\)$", frame.strip())
    if m is None:
        return frame.strip(), ""
    return f"{m.group(1)} ({m.group(2)})", m.group(2)


def _package(path: str) -> str:
    """``asyncio/events.py`` → ``asyncio``; ``ssl.py`` → ``ssl``; ``<frozen runpy>`` kept."""
    first = path.split("/", 1)[0]
    return first.removesuffix(".py") if first else "?"


def collapsed_top(text: str, n: int = 10, ours: tuple[str, ...] = OURS) -> dict[str, Any]:
    """From collapsed stacks (``frame;frame;frame count`` per line, root first, as
    py-spy's ``--format raw`` writes): total samples; the top ``n`` functions by self
    samples (leaf); this project's functions (``ours``: path prefixes) by inclusive
    samples (anywhere on the stack, once per stack); self samples by package."""
    total = 0
    self_: dict[str, int] = {}
    incl: dict[str, int] = {}
    pkg: dict[str, int] = {}
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        try:
            k = int(count)
        except ValueError:
            raise ValueError(f"collapsed stack line without a count: {line[:200]!r}") from None
        frames = [_frame(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        total += k
        leaf, leaf_path = frames[-1]
        self_[leaf] = self_.get(leaf, 0) + k
        pkg[_package(leaf_path)] = pkg.get(_package(leaf_path), 0) + k
        for f in {n for n, path in frames if path.startswith(ours)}:
            incl[f] = incl.get(f, 0) + k

    def top(d: dict[str, int]) -> list[dict[str, Any]]:
        best = sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return [
            {"function": f, "samples": c, "pct": round(100.0 * c / total, 1) if total else 0.0}
            for f, c in best
        ]

    return {"samples": total, "self": top(self_), "inclusive": top(incl), "packages": top(pkg)}


def pyspy_binary() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.is_file() else shutil.which("py-spy")


async def go_profile(session: Any, base: str, seconds: float, out: Path) -> dict[str, Any]:
    """Fetch a Go CPU profile from ``base`` (an aiohttp session with the client cert) and
    summarise it with ``go tool pprof -top``."""
    import aiohttp

    url = f"{base}/debug/pprof/profile?seconds={int(seconds)}"
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=seconds + 60)) as r:
        data = await r.read()
        if r.status != 200:
            return {"error": f"GET {url}: {r.status} {data[:200]!r}"}
    out.write_bytes(data)
    if shutil.which("go") is None:
        return {"file": out.name, "error": "go not installed: no pprof summary"}
    res: dict[str, Any] = {"file": out.name}
    for key, flag in (("top_flat", ["-nodecount=100000"]), ("top_cum", ["-nodecount=40", "-cum"])):
        proc = await asyncio.to_thread(
            subprocess.run,
            ["go", "tool", "pprof", "-top", *flag, str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            return res | {"error": proc.stderr[-500:]}
        out.with_suffix(f".{key}.txt").write_text(proc.stdout)
        res[key] = parse_pprof_top(proc.stdout, 15)
        if key == "top_flat":
            res["packages"] = by_package(parse_pprof_top(proc.stdout, 100000), 12)
        for line in proc.stdout.splitlines():
            if line.strip().startswith("Duration:"):
                res["header"] = line.strip()
    return res


async def pyspy_profile(pid: int, seconds: float, out: Path) -> dict[str, Any]:
    """``py-spy record`` the process ``pid`` for ``seconds`` (collapsed stacks, idle
    frames left out, ``--nonblocking`` so the process is not paused per sample)."""
    exe = pyspy_binary()
    if exe is None:
        return {"error": "py-spy not installed (pip install -e '.[bench]')"}
    argv = [exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100"]
    argv += ["--nonblocking", "-f", "raw", "-o", str(out)]
    proc = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, check=False, timeout=seconds + 120
    )
    if proc.returncode != 0 or not out.exists():
        return {"error": f"py-spy: {proc.stderr.strip()[-500:]}"}
    return {"file": out.name} | collapsed_top(out.read_text(), 15)
