"""The extender's aiohttp application: the only place that speaks HTTP.

An adapter. Each verb handler decodes the kube-scheduler JSON (``wire``), calls the
pure verb (``verbs``) on the tracker's hot state, and encodes the answer. A body that
cannot be decoded gets HTTP 400 with a short reason; kube-scheduler treats any non-200
as an error of this extender (``ignorable`` decides what happens next). An unexpected
exception is logged, counted, and answered 500 for filter/prioritize/preempt and with
``Error`` set for bind: the scheduler retries the pod, nothing is half-bound.

Bind is serialised per node (an ``asyncio.Lock`` each), so two fractional pods can
never be given the same free share of a device: choose devices, POST the Binding (the
device annotation rides on the Binding's metadata, so it lands on the pod in the same
write as ``nodeName``), then account the pod in the state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from fairshare import metrics as metrics_mod
from fairshare.config.schema import FairShareConfig
from fairshare.errors import WireFormatError
from fairshare.state.cluster import StateError
from scheduler_plugin import verbs, wire
from scheduler_plugin.tracking import ExtenderTracker

log = logging.getLogger("fairshare.extender")

Binder = Callable[[verbs.BindPlan], Awaitable[None]]
CleanupCtx = Callable[[web.Application], AsyncIterator[None]]
MAX_BODY = 64 * 1024 * 1024
"""A filter call with ``nodeCacheCapable: false`` carries every candidate Node object."""


async def bind_locally(plan: verbs.BindPlan) -> None:
    """The binder of ``--state`` runs: nothing to POST, the state is the cluster."""


@dataclass
class ExtenderDeps:
    """Everything the handlers need, built by the caller (CLI or test)."""

    config: Callable[[], FairShareConfig]
    tracker: ExtenderTracker
    registry: CollectorRegistry
    metrics: metrics_mod.Metrics
    ready: Callable[[], bool]
    binder: Binder = bind_locally
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    background: list[CleanupCtx] = field(default_factory=list)


DEPS = web.AppKey("deps", ExtenderDeps)


def build_deps(
    *,
    config: Callable[[], FairShareConfig],
    ready: Callable[[], bool],
    binder: Binder = bind_locally,
) -> ExtenderDeps:
    """Deps with a fresh tracker and metrics registry."""
    registry = CollectorRegistry()
    return ExtenderDeps(
        config=config,
        tracker=ExtenderTracker(config),
        registry=registry,
        metrics=metrics_mod.Metrics(registry),
        ready=ready,
        binder=binder,
    )


def _labels(deps: ExtenderDeps) -> Mapping[str, Mapping[str, str]]:
    return deps.tracker.namespace_labels


async def _verb(
    request: web.Request, verb: str, run: Callable[[ExtenderDeps, bytes], Awaitable[Any]]
) -> web.Response:
    deps = request.app[DEPS]
    start = time.perf_counter()
    body = await request.read()
    try:
        out = await run(deps, body)
    except WireFormatError as exc:
        deps.metrics.observe_extender(verb, "malformed", time.perf_counter() - start)
        return web.Response(status=400, text=f"malformed {verb} request: {exc}\n")
    except Exception:
        log.exception("unexpected error in %s", verb)
        deps.metrics.count_unexpected_error("extender")
        deps.metrics.observe_extender(verb, "error", time.perf_counter() - start)
        return web.Response(status=500, text=f"fairshare: internal error in {verb}\n")
    deps.metrics.observe_extender(verb, "ok", time.perf_counter() - start)
    return web.json_response(out)


async def _filter(deps: ExtenderDeps, body: bytes) -> Any:
    args = wire.decode_extender_args(body)
    deps.tracker.remember(dict(args.pod))
    return verbs.filter_verb(
        args,
        state=deps.tracker.state,
        config=deps.config(),
        pending=deps.tracker.pending_queue(),
        namespace_labels=_labels(deps),
    )


async def _prioritize(deps: ExtenderDeps, body: bytes) -> Any:
    args = wire.decode_extender_args(body)
    return verbs.prioritize_verb(
        args,
        state=deps.tracker.state,
        config=deps.config(),
        namespace_labels=_labels(deps),
        mix=deps.tracker.mix(),
        context=deps.tracker.context(),
    )


async def _preempt(deps: ExtenderDeps, body: bytes) -> Any:
    args = wire.decode_preemption_args(body)
    return verbs.preempt_verb(
        args, state=deps.tracker.state, config=deps.config(), namespace_labels=_labels(deps)
    )


async def _bind(deps: ExtenderDeps, body: bytes) -> Any:
    args = wire.decode_binding_args(body)
    lock = deps.locks.setdefault(args.node, asyncio.Lock())
    async with lock:
        plan = verbs.bind_plan(
            args,
            state=deps.tracker.state,
            pending=deps.tracker.pending_queue(),
            mix=deps.tracker.mix(),
        )
        if plan.error:
            log.warning("bind refused: %s", plan.error)
            return plan.result()
        try:
            await deps.binder(plan)
        except Exception as exc:
            log.warning("binding %s/%s to %s failed: %s", plan.namespace, plan.name, plan.node, exc)
            return wire.ExtenderBindingResult(f"binding failed: {exc}").encode()
        try:
            verbs.commit_bind(deps.tracker.state, plan)
        except StateError as exc:
            # The watch already placed it differently; the API is the truth, keep going.
            log.warning("bound %s/%s but could not account it: %s", plan.namespace, plan.name, exc)
        deps.tracker.pending.pop(plan.uid, None)
        return plan.result()


async def filter_handler(request: web.Request) -> web.Response:
    return await _verb(request, "filter", _filter)


async def prioritize_handler(request: web.Request) -> web.Response:
    return await _verb(request, "prioritize", _prioritize)


async def preempt_handler(request: web.Request) -> web.Response:
    return await _verb(request, "preempt", _preempt)


async def bind_handler(request: web.Request) -> web.Response:
    return await _verb(request, "bind", _bind)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    if request.app[DEPS].ready():
        return web.Response(text="ok\n")
    return web.Response(status=503, text="cluster state not synced yet\n")


async def metrics_handler(request: web.Request) -> web.Response:
    body, content_type = metrics_mod.render(
        request.app[DEPS].registry, request.headers.get("Accept")
    )
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = content_type
    return resp


def make_app(deps: ExtenderDeps) -> web.Application:
    """The extender application; routes are relative to the scheduler's ``urlPrefix``."""
    app = web.Application(client_max_size=MAX_BODY)
    app[DEPS] = deps
    for prefix in ("", "/scheduler"):
        app.router.add_post(f"{prefix}/filter", filter_handler)
        app.router.add_post(f"{prefix}/prioritize", prioritize_handler)
        app.router.add_post(f"{prefix}/preempt", preempt_handler)
        app.router.add_post(f"{prefix}/bind", bind_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.cleanup_ctx.extend(deps.background)
    return app


def publish_metrics(deps: ExtenderDeps, *, seconds: float) -> None:
    """Per-tenant shares, gated pods, cluster figures and chargeback (called periodically)."""
    from fairshare import gating
    from fairshare.placement import cluster_fragmentation

    state, config = deps.tracker.state, deps.config()
    shares = gating.current_shares(state, config)
    fair = gating.fair_shares_for(
        state, config, gating.demand_rows(state, deps.tracker.pending_queue())
    )
    gated = deps.tracker.gated_by_tenant()
    usage: dict[str, dict[str, float]] = {}
    for tenant in sorted(set(shares) | set(fair)):
        amounts = state.index.amounts(state.usage_of(tenant))
        usage[tenant] = {k: float(v) for k, v in amounts.items()}
        deps.metrics.set_tenant_figures(
            tenant,
            usage=usage[tenant],
            dominant_share=shares.get(tenant, 0.0),
            fair_share=fair[tenant].share if tenant in fair else 0.0,
        )
        deps.metrics.set_gated_pods(tenant, gated.get(tenant, 0))
    cap = state.total_capacity()[state.gpu_col]
    free = state.total_free()[state.gpu_col]
    frag = cluster_fragmentation(state, deps.tracker.mix())
    deps.metrics.set_cluster_figures(
        gpu_allocation_ratio=(cap - free) / cap if cap > 0 else 0.0,
        gpu_fragmentation_ratio=frag / cap if cap > 0 else 0.0,
    )
    deps.metrics.accrue_chargeback(usage, seconds, config.pricing)


async def serve(
    *,
    config_file: str | None,
    configmap: str | None,
    kubeconfig: str | None,
    state_file: str | None,
    host: str,
    port: int,
    tls_cert: str | None,
    tls_key: str | None,
    period: float = 15.0,
) -> None:
    """Run the extender until SIGTERM/SIGINT (the ``fairshare extender`` command)."""
    import _native
    from fairshare import __version__, runtime, tls

    box: dict[str, metrics_mod.Metrics] = {}
    rt = await runtime.build_runtime(
        config_file=config_file,
        configmap=configmap,
        kubeconfig=kubeconfig,
        state_file=state_file,
        kinds=("Namespace", "Node", "Pod"),
        on_reload=lambda: box["m"].observe_config_reload(ok=True),
        on_error=lambda: box["m"].observe_config_reload(ok=False),
    )
    api_client = None
    binder: Binder = bind_locally
    if state_file is None:
        from fairshare.state import informers
        from scheduler_plugin import binding

        api_client = await informers.make_api_client(kubeconfig)
        binder = binding.api_binder(api_client)
    deps = build_deps(config=rt.holder.get, ready=rt.source.ready.is_set, binder=binder)
    box["m"] = deps.metrics
    deps.metrics.set_build_info(__version__)
    deps.metrics.set_native_info(_native.IMPLEMENTATION)
    reloader = None
    if tls_cert and tls_key:
        reloader = tls.CertReloader(
            tls_cert, tls_key, on_error=lambda _e: deps.metrics.observe_tls_reload(ok=False)
        )
    deps.background.append(
        runtime.background(
            rt,
            rt.sink_for(deps.tracker),
            tls_reloader=reloader,
            periodic=lambda: publish_metrics(deps, seconds=period),
            period=period,
        )
    )
    app = make_app(deps)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=reloader.context if reloader else None)
    await site.start()
    log.info("fairshare extender on %s:%s (kernels: %s)", host, port, _native.IMPLEMENTATION)
    try:
        await runtime.wait_for_signal()
    finally:
        await runner.cleanup()
        if api_client is not None:
            await api_client.close()
