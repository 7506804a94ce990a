"""aiohttp plumbing shared by the webhook and the extender: the operational routes
(``/healthz``, ``/readyz``, ``/metrics``), the client-certificate guard, and running a site
until a signal. ``ServerOptions`` is what every server command takes alike: config,
cluster, listen address and serving certificate.

With ``--client-ca`` the TLS context verifies any certificate offered
(``ssl.CERT_OPTIONAL``) and ``require_client_cert`` answers 403 on every path but
``PUBLIC_PATHS`` without a verified one: kube-apiserver and kube-scheduler must present
one, while probes and Prometheus use the same port without. Default-deny: a new route is
protected unless listed as public.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypedDict

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry

from fairshare import metrics as metrics_mod
from fairshare import runtime, tls
from fairshare.errors import FairshareError

log = logging.getLogger("fairshare.serving")

PUBLIC_PATHS = frozenset(
    {"/healthz", "/readyz", "/metrics", "/status", "/status.json", "/quarantine.json"}
)
"""Reachable without a client certificate when ``--client-ca`` is set (probes, scrapes,
and the extender's read-only status page, which shows what the metrics already do plus
pod names)."""


def background_task(
    start: Callable[[], Coroutine[Any, Any, None]], name: str
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` that runs ``start()`` as a task for the app's lifetime and
    cancels it (and waits for it) at shutdown."""

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(start(), name=name)
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return ctx


def freeze_after_sync(
    synced: asyncio.Event,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx``: once ``synced`` is set, collect and ``gc.freeze()`` what is alive.

    What is alive then (imported modules, the first full sync of the watched state) lives
    as long as the process. Frozen, it is no longer traversed by the full collections that
    a handler's allocations trigger now and then, which otherwise stall the event loop
    (and every request waiting on it) for tens of milliseconds.
    """

    async def freeze() -> None:
        await synced.wait()
        gc.collect()
        gc.freeze()
        log.debug("gc: %d objects frozen after the initial sync", gc.get_freeze_count())

    return background_task(freeze, "gc-freeze")


def plain_text(text: str) -> str:
    """``text`` safe to send as UTF-8: lone surrogates and the like become escapes.

    Error messages quote parts of hostile bodies; they must never make the error itself
    fail to encode (which aiohttp would answer with a bare 500).
    """
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def add_ops_routes(
    app: web.Application, *, ready: Callable[[], bool], registry: CollectorRegistry
) -> None:
    """``GET /healthz`` (alive), ``/readyz`` (state synced) and ``/metrics``."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="cluster state not synced yet\n")

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = metrics_mod.render(registry, request.headers.get("Accept"))
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


@web.middleware
async def require_client_cert(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse all but ``PUBLIC_PATHS`` without a verified TLS client certificate."""
    if request.path in PUBLIC_PATHS:
        return await handler(request)
    transport = request.transport
    if transport is None or not transport.get_extra_info("peercert"):
        log.warning("refused %s %s: no verified client certificate", request.method, request.path)
        return web.Response(status=403, text="fairshare: client certificate required\n")
    return await handler(request)


def cert_reloader(
    cert_file: str, key_file: str, *, client_ca: str | None, metrics: metrics_mod.Metrics
) -> tls.CertReloader:
    """The serving certificate's reloader, reporting to ``metrics``: the expiry gauge
    (set now and on every reload, what the certificate-expiry alerts read), the
    reload counters and the handshake counter (new connections: whether the clients
    keep theirs alive)."""

    def reloaded(not_after: dt.datetime) -> None:
        metrics.observe_tls_reload(ok=True)
        metrics.set_tls_cert_expiry(not_after.timestamp())

    reloader = tls.CertReloader(
        cert_file,
        key_file,
        on_error=lambda _e: metrics.observe_tls_reload(ok=False),
        on_reload=reloaded,
        client_ca=client_ca,
    )
    metrics.set_tls_cert_expiry(reloader.not_after.timestamp())
    context = reloader.context
    select = context.sni_callback  # runs once in every handshake, with or without SNI

    def counted(connection: Any, server_name: Any, ctx: ssl.SSLContext) -> Any:
        metrics.count_tls_handshake()
        return select(connection, server_name, ctx) if select is not None else None

    context.sni_callback = counted
    return reloader


async def run_until_signal(
    app: web.Application, *, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> None:
    """Serve ``app`` on ``host:port`` until SIGTERM/SIGINT, then clean up."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    try:
        await runtime.wait_for_signal()
    finally:
        await runner.cleanup()


class ServerFlags(TypedDict, total=False):
    """``ServerOptions``' fields as keywords (how the command line calls ``serve()``)."""

    config_file: str | None
    configmap: str | None
    kubeconfig: str | None
    state_file: str | None
    host: str
    port: int
    tls_cert: str | None
    tls_key: str | None


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """The options every server command takes: its config (``--config FILE`` or
    ``--configmap NAMESPACE/NAME``), its cluster (``--kubeconfig``, or ``--state FILE``
    instead of the API), where it listens (``--host``, ``--port``) and its serving
    certificate (``--tls-cert``, ``--tls-key``; neither: plain HTTP)."""

    host: str
    port: int
    config_file: str | None = None
    configmap: str | None = None
    kubeconfig: str | None = None
    state_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def given(cls, options: ServerOptions | None, flags: ServerFlags) -> ServerOptions:
        """``options``, or the same options given one by one as keywords (not both)."""
        if options is None:
            return cls(**flags)
        if flags:
            raise TypeError(f"server options given twice: {', '.join(sorted(flags))}")
        return options

    @property
    def https(self) -> bool:
        """Serves HTTPS (both certificate files given)."""
        return bool(self.tls_cert and self.tls_key)

    def check_client_ca(self, client_ca: str | None) -> None:
        """``--client-ca`` verifies client certificates: only over TLS."""
        if client_ca is not None and not self.https:
            raise FairshareError("--client-ca needs --tls-cert and --tls-key")

    async def build_runtime(self, **kw: Any) -> runtime.Runtime:
        """``runtime.build_runtime`` over these options' config and cluster (``kw``: the
        server's kinds, reload hooks, staleness and transforms)."""
        return await runtime.build_runtime(
            config_file=self.config_file,
            configmap=self.configmap,
            kubeconfig=self.kubeconfig,
            state_file=self.state_file,
            **kw,
        )

    def cert_reloader(
        self, *, client_ca: str | None, metrics: metrics_mod.Metrics
    ) -> tls.CertReloader | None:
        """The serving certificate's reloader (``cert_reloader``); None over plain HTTP."""
        if not (self.tls_cert and self.tls_key):
            return None
        return cert_reloader(self.tls_cert, self.tls_key, client_ca=client_ca, metrics=metrics)

    async def run(self, app: web.Application, reloader: tls.CertReloader | None) -> None:
        """Serve ``app`` on these options' address until SIGTERM/SIGINT
        (``run_until_signal``), over TLS when ``reloader`` is given."""
        await run_until_signal(
            app,
            host=self.host,
            port=self.port,
            ssl_context=reloader.context if reloader is not None else None,
        )
