"""A small HTTP/1.1 load generator on raw asyncio streams, run as its own process.

    python -m tests.bench.loadgen --port 8443 --path /validate --bodies FILE \
        [--tls-ca CA] --mode closed --concurrency 16 --duration 5 --warmup 1
    python -m tests.bench.loadgen ... --mode open --rate 1000 --duration 10

``FILE`` holds one request body per line (compact JSON); they are sent in turn. Every
connection is kept alive (HTTP/1.1, one request in flight per connection).

* ``closed``: ``--concurrency`` connections, each sending its next request as soon as
  the previous answer arrived (saturation throughput), for ``--duration`` seconds or
  ``--requests`` requests in all.
* ``open``: requests are *scheduled* at a fixed ``--rate`` whatever the answers do
  (open loop); latency is measured from the scheduled send time, so a stalled server
  is not hidden by the client waiting for it (no coordinated omission). Up to
  ``--concurrency`` connections.

Prints one JSON object: counts, throughput, client-side latency percentiles, and the
load generator's own CPU use (so a reader can see whether the client was the limit).
A hand-written client is used rather than aiohttp's to keep the generator's own cost
per request low on a small machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import ssl
import sys
import time
from pathlib import Path
from typing import Any

from tests.bench.common import percentile


class Conn:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int, ctx: ssl.SSLContext | None) -> Conn:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ctx, server_hostname=host if ctx else None, limit=1 << 24
        )
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        chunked = False
        for line in head.split(b"\r\n")[1:]:
            low = line.lower()
            if low.startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
            elif low.startswith(b"transfer-encoding:") and b"chunked" in low:
                chunked = True
        if chunked:
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n"))[:-2], 16)
                body += await self.reader.readexactly(size + 2)
                if size == 0:
                    break
            return status, body
        return status, await self.reader.readexactly(length) if length else b""

    def close(self) -> None:
        self.writer.close()


def build_requests(host: str, path: str, bodies: list[bytes]) -> list[bytes]:
    out = []
    for body in bodies:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


async def closed_loop(
    conns: list[Conn], reqs: list[bytes], duration: float, total: int, warmup: float
) -> tuple[list[float], int, int, float]:
    lat: list[float] = []
    counter = {"i": 0, "err": 0, "sent": 0}
    t_start = time.perf_counter()
    t_measure = t_start + warmup
    t_end = t_measure + duration if duration > 0 else float("inf")

    async def worker(c: Conn) -> None:
        while True:
            now = time.perf_counter()
            if now >= t_end or (total and counter["sent"] >= total):
                return
            i = counter["i"]
            counter["i"] += 1
            t0 = time.perf_counter()
            status, _ = await c.request(reqs[i % len(reqs)])
            t1 = time.perf_counter()
            if t0 >= t_measure:
                counter["sent"] += 1
                if status != 200:
                    counter["err"] += 1
                lat.append(t1 - t0)

    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - t_measure
    return lat, counter["sent"], counter["err"], elapsed


async def open_loop(
    conns: list[Conn], reqs: list[bytes], rate: float, duration: float, warmup: float
) -> tuple[list[float], int, int, float, int]:
    pool: asyncio.Queue[Conn] = asyncio.Queue()
    for c in conns:
        pool.put_nowait(c)
    lat: list[float] = []
    errs = {"n": 0, "late": 0}
    n_warm = int(rate * warmup)
    n_total = n_warm + int(rate * duration)
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int, due: float) -> None:
        c = await pool.get()
        try:
            status, _ = await c.request(reqs[i % len(reqs)])
        finally:
            pool.put_nowait(c)
        done = time.perf_counter()
        if i >= n_warm:
            lat.append(done - due)
            if status != 200:
                errs["n"] += 1

    t0 = time.perf_counter() + 0.01
    i = 0
    while i < n_total:
        now = time.perf_counter()
        while i < n_total and t0 + i / rate <= now:
            t = asyncio.create_task(one(i, t0 + i / rate))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1
        if i < n_total:
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
    await asyncio.gather(*list(tasks))
    elapsed = time.perf_counter() - (t0 + n_warm / rate)
    return lat, len(lat), errs["n"], elapsed, errs["late"]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bodies = [b for b in Path(args.bodies).read_bytes().split(b"\n") if b.strip()]
    reqs = build_requests(args.host, args.path, bodies)
    ctx = None
    if args.tls_ca:
        ctx = ssl.create_default_context(cafile=args.tls_ca)
    conns = [await Conn.open(args.host, args.port, ctx) for _ in range(args.concurrency)]
    # One request per connection first: TLS handshakes and first-call costs out of the way.
    for c in conns:
        await c.request(reqs[0])
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {"mode": args.mode, "concurrency": args.concurrency, "tls": bool(ctx)}
    if args.mode == "closed":
        lat, n, err, elapsed = await closed_loop(
            conns, reqs, args.duration, args.requests, args.warmup
        )
    else:
        lat, n, err, elapsed, _ = await open_loop(
            conns, reqs, args.rate, args.duration, args.warmup
        )
        out["offered_rate"] = args.rate
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    for c in conns:
        c.close()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    out.update(
        {
            "requests": n,
            "errors": err,
            "elapsed_s": elapsed,
            "throughput": n / elapsed if elapsed > 0 else 0.0,
            "p50_s": percentile(lat, 50),
            "p90_s": percentile(lat, 90),
            "p99_s": percentile(lat, 99),
            "max_s": max(lat) if lat else None,
            "mean_s": sum(lat) / len(lat) if lat else None,
            "client_cpu_s": cpu,
            "client_cpu_util": cpu / elapsed if elapsed > 0 else None,
        }
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--bodies", required=True, help="file: one request body per line")
    p.add_argument("--tls-ca", default=None, help="CA bundle: speak TLS and verify with it")
    p.add_argument("--mode", choices=("closed", "open"), default="closed")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=0.0, help="measured seconds")
    p.add_argument("--requests", type=int, default=0, help="closed: stop after N measured")
    p.add_argument("--warmup", type=float, default=0.0, help="seconds not measured")
    p.add_argument("--rate", type=float, default=1000.0, help="open: requests per second")
    args = p.parse_args(argv)
    if args.mode == "closed" and not (args.duration or args.requests):
        p.error("closed mode needs --duration or --requests")
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
