"""Bounded soak of the webhook at a steady offered load, loopback only (issue 8, part 3).

The webhook app runs in a background thread on 127.0.0.1 behind TLS (the production
path: handshake, ``CertReloader``'s SNI switch); a client on this thread's event loop
offers ``SOAK_RATE`` requests a second (open loop: requests are started on schedule
whether or not earlier ones have finished, up to ``SOAK_CONCURRENCY`` in flight) for
``SOAK_SECONDS`` (default 20; ``make soak`` sets 600). Half the traffic is /mutate,
half /validate, over three tenants; a simulated informer "watches" admitted pods
(releasing their reservations) and deletes them again, so the state stays bounded as in
a real cluster.

Pass: no errors (anything but HTTP 200 with a well-formed AdmissionReview whose denials
are policy denials, not internal errors), the offered rate held (>= 90 %), and flat
memory: VmRSS from /proc/self/status, sampled every second, grows by less than
``SOAK_RSS_GROWTH_MIB`` (default 32) between the end of the warm-up (first 25 %) and the
end. Rate, duration, errors, p50/p99 latency and RSS are printed in the terminal summary.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import ssl
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fairshare import tls
from tests.reliability.conftest import SOAK_RESULTS, LiveServer, webhook_app
from tests.reliability.test_hostile_input import admission_review, check_admission_answer

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "20"))
SOAK_RATE = float(os.environ.get("SOAK_RATE", "100"))
SOAK_CONCURRENCY = int(os.environ.get("SOAK_CONCURRENCY", "64"))
RSS_GROWTH_MIB = float(os.environ.get("SOAK_RSS_GROWTH_MIB", "32"))

pytestmark = pytest.mark.slow


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_body(i: int) -> tuple[str, bytes, str]:
    namespace = ("nlp", "vision", "open")[i % 3]
    review = admission_review(uid=f"soak-{i}", namespace=namespace, gpus=str(i % 2))
    pod = review["request"]["object"]
    pod["metadata"]["name"] = review["request"]["name"] = f"soak-{i}"
    pod["metadata"]["annotations"] = {}
    path = "/mutate" if i % 2 else "/validate"
    return path, json.dumps(review).encode(), namespace


def watched_pod(i: int, namespace: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"soak-{i}", "namespace": namespace, "uid": f"uid-{i}"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    now = dt.datetime.now(dt.UTC)
    root = tmp_path_factory.mktemp("soak-pki")
    ca, ca_key = tls.make_ca("soak-ca", days=1, now=now)
    cert, key = tls.make_serving_cert(
        ca, ca_key, dns_names=["localhost"], ip_addresses=["127.0.0.1"], days=1, now=now
    )
    for name, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
        (root / name).write_bytes(data)
    return root / "ca.crt", root / "tls.crt", root / "tls.key"


async def drive(port: int, ca: Path, server: LiveServer, deps: Any) -> dict[str, Any]:
    client_ctx = ssl.create_default_context(cafile=str(ca))
    connector = aiohttp.TCPConnector(ssl=client_ctx, limit=SOAK_CONCURRENCY)
    latencies: list[float] = []
    stamped: list[tuple[float, float]] = []  # (start offset, latency)
    outcomes: Counter[str] = Counter()
    errors: list[str] = []
    rss: list[tuple[float, int]] = []
    in_flight = asyncio.Semaphore(SOAK_CONCURRENCY)
    tasks: set[asyncio.Task[None]] = set()
    watched: list[tuple[int, str]] = []

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        path, body, namespace = make_body(i)
        t0 = time.perf_counter()
        try:
            async with session.post(
                f"https://127.0.0.1:{port}{path}",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as resp:
                data = await resp.read()
                status = resp.status
        except Exception as exc:  # any transport failure is an error of the soak
            errors.append(f"{type(exc).__name__}: {exc}")
            return
        finally:
            in_flight.release()
        latencies.append(time.perf_counter() - t0)
        stamped.append((t0 - start, latencies[-1]))
        if status != 200:
            errors.append(f"HTTP {status}: {data[:200]!r}")
            return
        try:
            check_admission_answer(data)
            response = json.loads(data)["response"]
            if not response["allowed"] and response["status"]["code"] >= 500:
                raise AssertionError(response["status"])
        except (AssertionError, ValueError, KeyError) as exc:
            errors.append(f"bad answer: {exc}")
            return
        outcomes["allowed" if response["allowed"] else f"denied {response['status']['code']}"] += 1
        if response["allowed"] and path == "/validate":
            watched.append((i, namespace))

    def informer() -> None:
        # Pods admitted a moment ago appear in the watch, older ones go away.
        batch, watched[:] = list(watched), []
        for i, namespace in batch:
            deps.tracker.on_event("Pod", "ADDED", watched_pod(i, namespace))
        for i, namespace in batch:
            deps.tracker.on_event("Pod", "DELETED", watched_pod(i, namespace))

    interval = 1.0 / SOAK_RATE
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        next_sample = start
        i = 0
        while True:
            now = time.perf_counter()
            if now - start >= SOAK_SECONDS:
                break
            if now >= next_sample:
                rss.append((now - start, rss_kib()))
                server.loop.call_soon_threadsafe(informer)  # never block the client
                next_sample += 1.0
            due = start + i * interval
            if due > now:
                await asyncio.sleep(due - now)
            await in_flight.acquire()
            task = asyncio.create_task(one(session, i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    rss.append((elapsed, rss_kib()))
    return {
        "sent": i,
        "elapsed": elapsed,
        "latencies": latencies,
        "stamped": stamped,
        "outcomes": outcomes,
        "errors": errors,
        "rss": rss,
    }


def test_webhook_soak_steady_load(tls_files):
    ca, cert, key = tls_files
    reloader = tls.CertReloader(cert, key)
    app, deps = webhook_app()
    deps.ledger.ttl = 2.0  # reservations of pods never watched expire quickly, as in prod
    with LiveServer(app, ssl_context=reloader.context) as server:
        result = asyncio.run(drive(server.port, ca, server, deps))
        ledger_size = server.call(lambda: len(deps.ledger))
    lat = result["latencies"]
    warmup = max(3.0, 0.25 * SOAK_SECONDS)
    steady = [latency for t0, latency in result["stamped"] if t0 > warmup]
    rate = result["sent"] / result["elapsed"]
    samples = result["rss"]
    warm = [kib for t, kib in samples if t <= max(3.0, 0.25 * SOAK_SECONDS)]
    after = [kib for t, kib in samples if t > max(3.0, 0.25 * SOAK_SECONDS)]
    baseline = warm[-1]
    growth_mib = (max(after or [baseline]) - baseline) / 1024
    summary = {
        "duration_s": round(result["elapsed"], 1),
        "offered_rate_per_s": SOAK_RATE,
        "achieved_rate_per_s": round(rate, 1),
        "requests": result["sent"],
        "errors": len(result["errors"]),
        "p50_ms": round(percentile(lat, 0.50) * 1000, 2),
        "p99_ms": round(percentile(lat, 0.99) * 1000, 2),
        "p99_after_warmup_ms": round(percentile(steady, 0.99) * 1000, 2),
        "max_ms": round(max(lat) * 1000, 2),
        "rss_start_mib": round(samples[0][1] / 1024, 1),
        "rss_after_warmup_mib": round(baseline / 1024, 1),
        "rss_end_mib": round(samples[-1][1] / 1024, 1),
        "rss_growth_after_warmup_mib": round(growth_mib, 1),
        "outcomes": dict(result["outcomes"]),
        "ledger_entries_at_end": ledger_size,
    }
    SOAK_RESULTS.update(summary)
    print("soak:", json.dumps(summary))
    assert not result["errors"], result["errors"][:10]
    assert len(lat) == result["sent"]
    assert rate >= 0.9 * SOAK_RATE, summary
    assert growth_mib < RSS_GROWTH_MIB, summary
