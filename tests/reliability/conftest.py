"""Shared helpers of the reliability suite: a live server on loopback, fuzz counting.

The servers run in a background thread with their own event loop, bound to 127.0.0.1 on
an ephemeral port, so hypothesis (which drives synchronous test bodies) can talk real
HTTP/TLS to them with ``http.client`` and the standard ``ssl`` module.
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

from fairshare.config import loading

FUZZ_CASES: Counter[str] = Counter()
"""Cases run per target (printed in the terminal summary; the lead reports it): HTTP
bodies sent, and ``property/...`` examples or steps of the property tests."""

FUZZ_NOTES: Counter[str] = Counter()
"""Notable outcomes among those cases (e.g. fail-closed internal-error denials)."""


SOAK_RESULTS: dict[str, Any] = {}
"""Figures of the soak (``test_soak.py``), printed in the terminal summary."""


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SOAK_RESULTS:
        terminalreporter.write_sep("-", "fairshare webhook soak")
        for key, value in SOAK_RESULTS.items():
            terminalreporter.write_line(f"  {key}: {value}")
    if not FUZZ_CASES:
        return
    http = sum(n for k, n in FUZZ_CASES.items() if not k.startswith("property/"))
    prop = sum(n for k, n in FUZZ_CASES.items() if k.startswith("property/"))
    terminalreporter.write_sep(
        "-", f"fairshare fuzz: {http} hostile HTTP bodies, {prop} property examples/steps"
    )
    for name, count in sorted(FUZZ_CASES.items()):
        terminalreporter.write_line(f"  {name}: {count}")
    for name, count in sorted(FUZZ_NOTES.items()):
        terminalreporter.write_line(f"  of which {name}: {count}")


WEBHOOK_CONFIG = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {
                "name": "nlp",
                "namespaces": ["nlp"],
                "limit": {"nvidia.com/gpu": "4", "cpu": "16", "memory": "64Gi"},
            },
            {"name": "vision", "namespaces": ["vision"], "limit": {"nvidia.com/gpu": "2"}},
            {"name": "open", "namespaces": ["open"]},
        ],
    }
)

EXTENDER_CONFIG = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
)


class LiveServer:
    """An aiohttp app served from a background thread on 127.0.0.1 (ephemeral port)."""

    def __init__(self, app: web.Application, *, ssl_context: ssl.SSLContext | None = None):
        self.app = app
        self.ssl_context = ssl_context
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, name="live-server", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self._stop())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> LiveServer:
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (to read or change its state safely)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)


class Client:
    """A keep-alive HTTP client for a LiveServer that reconnects after a dropped connection."""

    def __init__(self, port: int, *, timeout: float = 30.0) -> None:
        self.port = port
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        return self.conn

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body); status 0 if the server closed the connection before answering
        (allowed only for bodies over the size limit, checked by the caller)."""
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        for _attempt in range(2):
            conn = self._connect()
            try:
                conn.request(method, path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
            except (ConnectionError, http.client.HTTPException):
                self.close()  # a stale keep-alive connection, or a refused huge body
                continue
            if resp.will_close:
                self.close()
            return resp.status, data
        return 0, b""

    def post(self, path: str, body: bytes, **kw: Any) -> tuple[int, bytes]:
        return self.request("POST", path, body, **kw)

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request("GET", path)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def webhook_app(
    config: Any = WEBHOOK_CONFIG, *, client_cert: bool = False
) -> tuple[web.Application, Any]:
    from webhook import app as webhook_app_mod

    deps = webhook_app_mod.build_deps(config=lambda: config, ready=lambda: True)
    deps.tracker.on_resync(
        "Namespace",
        [{"metadata": {"name": n}} for n in ("nlp", "vision", "open", "default")],
    )
    return webhook_app_mod.make_app(deps, client_cert=client_cert), deps


def extender_node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": "81559"}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus)}},
    }


def extender_pod(i: int, *, namespace: str = "a", gpu: str = "1") -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": namespace, "uid": f"u{i}"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "resources": {
                        "requests": {"cpu": "1", "nvidia.com/gpu": gpu},
                        "limits": {"nvidia.com/gpu": gpu},
                    },
                }
            ]
        },
        "status": {"phase": "Pending"},
    }


def extender_app(*, client_cert: bool = False) -> tuple[web.Application, Any]:
    from extender import app as ext_app_mod

    async def binder(plan: Any) -> None:
        return None

    deps = ext_app_mod.build_deps(config=lambda: EXTENDER_CONFIG, ready=lambda: True, binder=binder)
    deps.sink.on_resync("Namespace", [{"metadata": {"name": n}} for n in ("a", "b")])
    deps.sink.on_resync("Node", [extender_node("n1", 4), extender_node("n2", 0)])
    deps.sink.on_resync("Pod", [extender_pod(i) for i in range(20)])
    return ext_app_mod.make_app(deps, client_cert=client_cert), deps


@pytest.fixture(scope="module")
def webhook_server() -> Iterator[tuple[LiveServer, Client]]:
    app, deps = webhook_app()
    with LiveServer(app) as server:
        server.deps = deps  # type: ignore[attr-defined]
        client = Client(server.port)
        yield server, client
        client.close()


@pytest.fixture(scope="module")
def extender_server() -> Iterator[tuple[LiveServer, Client]]:
    app, deps = extender_app()
    with LiveServer(app) as server:
        server.deps = deps  # type: ignore[attr-defined]
        client = Client(server.port)
        yield server, client
        client.close()
