"""The admission webhook's aiohttp application: the only place that speaks HTTP.

Each handler decodes (``wire.decode_review``), decides (the pure ``review`` / ``admit``)
and encodes (``wire.encode_response``). A body that is not an AdmissionReview gets HTTP
400 (the apiserver then applies the ``failurePolicy``); a policy denial is HTTP 200 with
``allowed: false``. An unexpected exception is logged, counted and answered as a denial
(code 500), so a bug cannot let pods past a quota silently. Until the state source has
listed every kind once, a request waits up to ``sync_wait`` seconds and is otherwise
denied with 503 (``NOT_SYNCED_MESSAGE``): a partial view would admit tenants past their
limits and label pods with the wrong tenant. ``--client-ca`` guards every route but the
public ones (``serving``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Unpack

from aiohttp import web
from prometheus_client import CollectorRegistry

import serving
from fairshare import gangs
from fairshare import metrics as metrics_mod
from fairshare.config.schema import FairShareConfig
from fairshare.errors import FairshareError, WireFormatError
from fairshare.gangs.podgroups import FetchPodGroup, PodGroupReader
from fairshare.state.usage import CLAIM_SEEN, UsageTracker
from webhook import review, wire
from webhook.coordination import SharedReservations
from webhook.gangquota import GangBook
from webhook.policies.config_guard import ConfigMapRef
from webhook.reservations import PodKey, ReservationLedger, pod_key

log = logging.getLogger("fairshare.webhook")

MAX_BODY = 3 * 1024 * 1024
"""kube-apiserver caps request bodies at 3 MiB; an AdmissionReview is at most that."""

FIRST_SYNC_WAIT = 2.0
"""Seconds a request that arrives before the first complete list of the cluster waits for
it before it is denied (the webhook configurations give kube-apiserver 5 s)."""

SERVICE_UNAVAILABLE = 503

NOT_SYNCED_MESSAGE = (
    "fairshare: the webhook has not finished its first list of the cluster yet (it has "
    "just started), so it cannot count the tenant's usage and refuses rather than admit "
    "past a limit; retry in a few seconds"
)


CleanupCtx = Callable[[web.Application], AsyncIterator[None]]

PODGROUPS_KEPT = 4096
"""Groups whose PodGroup reads are kept before the stale ones are forgotten."""


@dataclass
class WebhookDeps:
    """Everything the handlers need, built by the caller (CLI or test)."""

    config: Callable[[], FairShareConfig]
    tracker: UsageTracker
    ledger: ReservationLedger
    registry: CollectorRegistry
    metrics: metrics_mod.Metrics
    ready: Callable[[], bool]
    config_map: ConfigMapRef | None = None
    clock: Callable[[], float] = time.monotonic
    background: list[CleanupCtx] = field(default_factory=list)
    shared: SharedReservations | None = None
    """Set when several replicas run: reservations live in the API (compare-and-swap)."""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the state source has listed every kind (``sources.Source.ready``);
    until then admission requests wait up to ``sync_wait`` seconds and are denied."""
    sync_wait: float = FIRST_SYNC_WAIT
    gang_book: GangBook | None = None
    """The pod groups' accounts (``webhook.gangquota``): gang members are judged for their
    whole group. None judges every pod alone."""
    podgroups: FetchPodGroup | None = None
    """Reads a group's coscheduling PodGroup (its ``spec.minMember``); None: never read
    (the ``fairshare.io/gang-min-members`` annotation alone gives a group's size)."""
    _podgroup_reads: PodGroupReader = field(
        default_factory=lambda: PodGroupReader(max_entries=PODGROUPS_KEPT)
    )


DEPS = web.AppKey("deps", WebhookDeps)


def build_deps(
    *,
    config: Callable[[], FairShareConfig],
    ready: Callable[[], bool],
    config_map: ConfigMapRef | None = None,
    reservation_ttl: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    synced: asyncio.Event | None = None,
    sync_wait: float = FIRST_SYNC_WAIT,
) -> WebhookDeps:
    """Deps with a fresh tracker, ledger and metrics registry; the tracker releases a
    reservation as soon as its pod is seen in the watched usage.

    ``synced``: the state source's first-list event (``Source.ready``); None means the
    state is complete already (tests that fill the tracker by hand)."""
    if synced is None:
        synced = asyncio.Event()
        synced.set()
    registry = CollectorRegistry()
    metrics = metrics_mod.Metrics(registry)
    tracker = UsageTracker(config)
    ledger = ReservationLedger(ttl=reservation_ttl)

    def release(name: str, event: str) -> None:
        if event == CLAIM_SEEN:  # as review.judge keys an admitted ResourceClaim
            ledger.release(PodKey(f"claim:{name}"))
            return
        ns, _, pod = name.partition("/")
        ledger.release(pod_key(ns, pod))

    tracker.listeners.append(release)
    book = GangBook(config, device_memory=tracker.max_device_memory)
    return WebhookDeps(
        gang_book=book,
        config=config,
        tracker=tracker,
        ledger=ledger,
        registry=registry,
        metrics=metrics,
        ready=ready,
        config_map=config_map,
        clock=clock,
        synced=synced,
        sync_wait=sync_wait,
    )


def _outcome(resp: wire.AdmissionResponse) -> tuple[str, str]:
    if resp.allowed:
        return ("patched" if resp.patch else "allowed"), ""
    return "denied", str(resp.status.code if resp.status else "")


async def _first_sync(deps: WebhookDeps) -> bool:
    """Whether the first complete list is done, waiting up to ``deps.sync_wait`` for it."""
    if deps.synced.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(deps.synced.wait(), deps.sync_wait)
    return deps.synced.is_set()


async def gang_context(deps: WebhookDeps, req: wire.AdmissionRequest) -> review.GangContext | None:
    """The pod groups' accounts for a validate call, with the judged pod's PodGroup read
    (reused ``gangs.podgroups.TTL`` seconds) when it is a gang member. A PodGroup that
    cannot be read is not a refusal: the group is sized by its annotation, or judged pod
    by pod, and the answer warns."""
    if deps.gang_book is None:
        return None
    obj = req.object
    is_pod = (req.kind.group, req.kind.kind) == ("", "Pod") and req.operation == "CREATE"
    key = gangs.group_of(obj) if is_pod and obj is not None else None
    if key is None or deps.podgroups is None:
        return review.GangContext(deps.gang_book)
    try:
        podgroup = await deps._podgroup_reads.read(key, deps.podgroups, now=deps.clock())
    except Exception as exc:
        log.warning("gang %s: PodGroup not read: %s", key, exc)
        problem = f"gang {key}: its PodGroup could not be read ({exc})"
        return review.GangContext(deps.gang_book, podgroup_problem=problem)
    if podgroup is None:
        return review.GangContext(deps.gang_book)
    n = gangs.podgroup_min_count(podgroup)
    if n is None:
        problem = f"gang {key}: its PodGroup has no positive spec.minMember"
        return review.GangContext(deps.gang_book, podgroup_problem=problem)
    return review.GangContext(deps.gang_book, podgroup_min=n)


async def _handle(request: web.Request, phase: review.Phase) -> web.Response:
    deps = request.app[DEPS]
    start = time.perf_counter()
    body = await request.read()
    try:
        req = wire.decode_review(body)
    except (WireFormatError, ValueError) as exc:
        # ValueError: json.loads refuses an integer of more than 4300 digits with a plain
        # ValueError, which decode_review does not translate; still a malformed body.
        deps.metrics.observe_admission("?", "malformed", "400", time.perf_counter() - start)
        return web.Response(
            status=400, text=serving.plain_text(f"malformed AdmissionReview: {exc}\n")
        )
    if not await _first_sync(deps):
        log.warning(
            "refused uid=%s (%s %s/%s): no complete list of the cluster after %.1fs",
            req.uid,
            req.operation,
            req.namespace,
            req.name,
            deps.sync_wait,
        )
        resp = wire.deny(SERVICE_UNAVAILABLE, NOT_SYNCED_MESSAGE)
        decision, reason = _outcome(resp)
        deps.metrics.observe_admission(req.operation, decision, reason, time.perf_counter() - start)
        return web.json_response(wire.encode_response(req.uid, resp))
    try:
        gang = await gang_context(deps, req) if phase == "validate" else None
        if phase == "validate" and deps.shared is not None:
            resp = await deps.shared.admit(
                req,
                view=deps.tracker,
                config=deps.config(),
                config_map=deps.config_map,
                gang=gang,
            )
        elif phase == "validate":
            resp = review.admit(
                req,
                view=deps.tracker,
                config=deps.config(),
                ledger=deps.ledger,
                now=deps.clock(),
                config_map=deps.config_map,
                gang=gang,
            )
        else:
            resp = review.review(
                req,
                view=deps.tracker,
                config=deps.config(),
                phase=phase,
                config_map=deps.config_map,
            )
    except Exception:
        log.exception(
            "unexpected error reviewing uid=%s (%s %s/%s)",
            req.uid,
            req.operation,
            req.namespace,
            req.name,
        )
        deps.metrics.count_unexpected_error("webhook")
        resp = wire.deny(500, "fairshare: internal error, see the webhook logs")
    decision, reason = _outcome(resp)
    deps.metrics.observe_admission(req.operation, decision, reason, time.perf_counter() - start)
    return web.json_response(wire.encode_response(req.uid, resp))


async def mutate(request: web.Request) -> web.Response:
    """POST /mutate: tenant label, canonical GPU annotations, scheduler name."""
    return await _handle(request, "mutate")


async def validate(request: web.Request) -> web.Response:
    """POST /validate: quotas across the tenant's namespaces, GPU sharing, config edits."""
    return await _handle(request, "validate")


def make_app(deps: WebhookDeps, *, client_cert: bool = False) -> web.Application:
    """The webhook application over ``deps`` (background tasks via ``cleanup_ctx``).

    ``client_cert``: admission paths need a verified TLS client certificate (serve it
    with a context from ``fairshare.tls`` built with ``client_ca``).
    """
    middlewares = [serving.require_client_cert] if client_cert else []
    app = web.Application(client_max_size=MAX_BODY, middlewares=middlewares)
    app[DEPS] = deps
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/validate", validate)
    serving.add_ops_routes(app, ready=deps.ready, registry=deps.registry)
    app.cleanup_ctx.extend(deps.background)
    return app


def publish_tenant_metrics(deps: WebhookDeps) -> None:
    """Per-tenant usage, limit and reservations as gauges (called periodically)."""
    config = deps.config()
    names = [t.name for t in config.all_tenants()]
    for tenant in config.all_tenants():
        limit = tenant.limit_amounts() or {}
        # A tenant with children: the sums over its subtree (what its limit caps).
        usage: dict[str, float] = {}
        reserved: dict[str, float] = {}
        for member in config.subtree(tenant.name):
            for k, v in deps.tracker.tenant_usage(member).items():
                usage[k] = usage.get(k, 0.0) + float(v)
            for k, v in deps.ledger.reserved(member).items():
                reserved[k] = reserved.get(k, 0.0) + float(v)
        deps.metrics.set_tenant_figures(
            tenant.name,
            usage=usage,
            limit={k: float(v) for k, v in limit.items()},
            reserved=reserved,
        )
    deps.metrics.retain_tenants(names)
    deps.metrics.set_tenant_tree({t.name: t.parent for t in config.tenants})


def podgroup_fetcher(api_client: Any) -> FetchPodGroup:
    """Read a gang's PodGroup through the API (``informers.podgroup_fetcher``: the
    coscheduling or the native object; 404: None)."""
    from fairshare.state import informers

    fetch: FetchPodGroup = informers.podgroup_fetcher(api_client)
    return fetch


async def serve(
    options: serving.ServerOptions | None = None,
    *,
    reservation_ttl: float = 30.0,
    shared_reservations: str | None = None,
    client_ca: str | None = None,
    stale_after: float = 10.0,
    **flags: Unpack[serving.ServerFlags],
) -> None:
    """Run the webhook until SIGTERM/SIGINT (the ``fairshare webhook`` command).

    ``options`` (or its fields as keywords, ``serving.ServerFlags``): config, cluster,
    address and serving certificate. ``client_ca``: verify kube-apiserver's client
    certificate against this CA on the admission paths (needs the certificate files).

    ``shared_reservations`` names the namespace of the per-tenant reservation objects
    that several replicas share (``webhook.coordination``); None keeps them in memory.
    """
    import _native
    from fairshare import __version__, runtime
    from fairshare.state import sources

    opts = serving.ServerOptions.given(options, flags)
    opts.check_client_ca(client_ca)
    box: dict[str, metrics_mod.Metrics] = {}
    rt = await opts.build_runtime(
        kinds=(
            "Namespace",
            "Pod",
            "PersistentVolumeClaim",
            "Node",
            "ResourceClaim",
            "ResourceSlice",
            "DeviceClass",
        ),
        on_reload=lambda: box["m"].observe_config_reload(ok=True),
        on_error=lambda: box["m"].observe_config_reload(ok=False),
        stale_after=stale_after,
    )
    ref = ConfigMapRef(*runtime.parse_ref(opts.configmap)) if opts.configmap else None
    deps = build_deps(
        config=rt.holder.get,
        ready=rt.source.is_ready,
        config_map=ref,
        reservation_ttl=reservation_ttl,
        synced=rt.source.ready,
    )
    box["m"] = deps.metrics
    deps.metrics.set_build_info(__version__)
    deps.metrics.set_native_info(_native.IMPLEMENTATION)
    api_client: Any = None
    if shared_reservations is not None and opts.state_file is not None:
        raise FairshareError("--shared-reservations needs the API, not --state")
    if opts.state_file is None:
        from fairshare.state import informers

        api_client = await informers.make_api_client(opts.kubeconfig)
        deps.podgroups = podgroup_fetcher(api_client)
    if shared_reservations is not None:
        from kubernetes_asyncio import client as k8s_client

        from webhook.coordination import LeaseStore

        store = LeaseStore(k8s_client.CoordinationV1Api(api_client), shared_reservations)
        deps.shared = SharedReservations(store, ttl=reservation_ttl)
    reloader = opts.cert_reloader(client_ca=client_ca, metrics=deps.metrics)
    if reloader is None:
        log.warning("serving plain HTTP: kube-apiserver needs HTTPS (--tls-cert/--tls-key)")
    assert deps.gang_book is not None
    sink: sources.Sink = rt.sink_for(runtime.Fanout([deps.tracker, deps.gang_book]))
    deps.background.append(
        runtime.background(
            rt, sink, tls_reloader=reloader, periodic=lambda: publish_tenant_metrics(deps)
        )
    )
    deps.background.append(serving.freeze_after_sync(rt.source.ready))
    app = make_app(deps, client_cert=client_ca is not None)
    log.info(
        "fairshare webhook on %s:%s (kernels: %s)", opts.host, opts.port, _native.IMPLEMENTATION
    )
    try:
        await opts.run(app, reloader)
    finally:
        if api_client is not None:
            await api_client.close()
