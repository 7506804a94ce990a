"""The extender process: what ``fairshare extender`` starts around the app.

``serve`` builds the runtime (config, watches or a state file), the app's deps, the
Binding client, the GPU handoffs, the requeuer, the usage history keeper and the
last-good config recorder; ``lead`` runs the Lease election (``--lease``);
``publish_metrics`` sets the per-tenant figures every period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Unpack

from aiohttp import web

import _native
import serving
from extender import leader, recovery, usagehistory
from extender.app import (
    LEADER_LABEL,
    Binder,
    ChainedHooks,
    CleanupCtx,
    ExtenderDeps,
    bind_locally,
    build_deps,
    make_app,
)
from extender.leader import timing_error
from extender.snapshot import Snapshot
from fairshare import __version__, chargeback, cluster_shares, runtime
from fairshare import metrics as metrics_mod
from fairshare.config.schema import FairShareConfig
from fairshare.errors import FairshareError
from fairshare.fleet import fleet_health
from fairshare.placement import cluster_fragmentation
from fairshare.runtime import parse_ref
from fairshare.state import objects, sources

log = logging.getLogger("fairshare.extender")


@dataclass(frozen=True)
class Election:
    """``--lease NAMESPACE/NAME`` and its timings (seconds; see ``leader.timing_error``)."""

    namespace: str
    name: str
    identity: str
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    label_pod: str | None = None
    """NAMESPACE/NAME of this replica's own pod: labelled ``LEADER_LABEL=true`` while it
    leads, so a Service selecting that label sends kube-scheduler to the leader only."""

    def __post_init__(self) -> None:

        problem = timing_error(self.lease_duration, self.renew_deadline, self.retry_period)
        if problem is not None:
            raise FairshareError(problem)


def lead(
    deps: ExtenderDeps, source: sources.Source, api_client: Any, election: Election
) -> CleanupCtx:
    """Run the election for the app's lifetime: the replica decides (``deps.leading``)
    only while it leads; a new term first waits for the initial sync and then re-lists
    pods (a consistent read), so binds the previous leader made are accounted, and then
    labels its pod (``label_pod``). ``/readyz`` stays "synced" on every replica, so
    rolling updates and the PodDisruptionBudget see two ready replicas; the Service
    routes by the leader label. On shutdown it stops deciding, drops the label, lets the
    binds in flight land and releases the Lease."""

    elector = leader.LeaseElector(
        leader.KubeLeaseApi(api_client),
        election.namespace,
        election.name,
        election.identity,
        duration=election.lease_duration,
    )

    async def catch_up() -> None:
        await source.ready.wait()
        await source.relist(("Pod",))

    advertise = None
    if election.label_pod is not None:
        pod_ns, _, pod_name = election.label_pod.partition("/")
        advertise = leader.KubePodLabel(api_client, pod_ns, pod_name, LEADER_LABEL)
    leadership = leader.Leadership(
        elector,
        renew_deadline=election.renew_deadline,
        retry_period=election.retry_period,
        catch_up=catch_up,
        on_change=deps.metrics.set_extender_leader,
        advertise=advertise,
    )
    deps.leading = leadership.leading

    async def drained() -> None:
        for _ in range(100):
            if deps.binds_in_flight == 0:
                return
            await asyncio.sleep(0.1)

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(leadership.run(stop), name="leader-election")
        try:
            yield
        finally:
            stop.set()
            await task
            await leadership.step_down(drained)

    return ctx


def publish_metrics(deps: ExtenderDeps, *, seconds: float) -> None:
    """Per-tenant shares, gated pods, cluster figures and chargeback (called periodically)."""
    config = deps.config()
    with deps.reading(config) as snap:
        _publish(deps, config, snap, seconds)


def _publish(deps: ExtenderDeps, config: FairShareConfig, snap: Snapshot, seconds: float) -> None:
    state = snap.state
    shares = cluster_shares.current_shares(state, config)
    fair = snap.fair if snap.fair is not None else {}
    gated = deps.feedback.gated_by_tenant(snap.pending)
    # An inner tenant of a tree shows what its whole subtree holds. Chargeback accrues
    # the pods' own tenants only (``billed``): bound pods belong to leaves, so each pod
    # is charged once, to its leaf, and an organisation's bill is the sum of its leaves'.
    usage: dict[str, dict[str, float]] = {}
    billed: dict[str, dict[str, float]] = {}
    for tenant in sorted(set(shares) | set(fair)):
        own = state.usage_of(tenant)
        billed[tenant] = {k: float(v) for k, v in state.index.amounts(own).items()}
        if config.children(tenant):
            subtree = cluster_shares.subtree_usage(state, config, tenant)
            usage[tenant] = {k: float(v) for k, v in state.index.amounts(subtree).items()}
        else:
            usage[tenant] = billed[tenant]
        deps.metrics.set_tenant_figures(
            tenant,
            usage=usage[tenant],
            dominant_share=shares.get(tenant, 0.0),
            fair_share=fair[tenant].share if tenant in fair else 0.0,
        )
        deps.metrics.set_gated_pods(tenant, gated.get(tenant, 0))
    publish_gang_metrics(deps, config, snap, sorted(set(shares) | set(fair)))
    cap = state.total_capacity()[state.gpu_col]
    free = state.total_free()[state.gpu_col]
    frag = cluster_fragmentation(state, snap.mix)
    deps.metrics.set_cluster_figures(
        gpu_allocation_ratio=(cap - free) / cap if cap > 0 else 0.0,
        gpu_fragmentation_ratio=frag / cap if cap > 0 else 0.0,
    )
    fleet = fleet_health(state, config)
    deps.metrics.set_fleet_health(
        in_service=fleet.gpus_in_service,
        failed=fleet.gpus_failed,
        unhealthy_devices=fleet.unhealthy_devices,
        coverage={c.resource: c.ratio for c in fleet.coverage},
        on_failed=fleet.tenants_on_failed,
    )
    flat = config.pricing.resources if config.pricing is not None else None
    deps.metrics.accrue_chargeback(billed, seconds, flat)


def chargeback_rows(deps: ExtenderDeps) -> metrics_mod.ChargebackRows | None:
    """The chargeback gauges of the ledger now (``fairshare.chargeback.export_rows``), at
    scrape time; None until the first sync (a replica that has not listed the cluster
    exports nothing rather than a partial picture)."""
    if not deps.ready():
        return None
    config = deps.config()
    pods = deps.cache.pods

    def meta(uid: str) -> chargeback.PodMeta | None:
        pod = pods.get(uid)
        if pod is None:
            return None
        md = pod.get("metadata") or {}
        return chargeback.PodMeta(str(md.get("namespace", "")), _gpu_container(pod))

    with deps.reading(config) as snap:
        return chargeback.export_rows(snap.state, meta, config.pricing, config.mig_fractions())


def _gpu_container(pod: dict[str, Any]) -> str:
    """The first container that asks for a GPU resource (or claims), else the first."""
    containers = (pod.get("spec") or {}).get("containers") or []
    names = [str(c.get("name", "")) for c in containers if isinstance(c, dict)]
    for c in containers:
        if not isinstance(c, dict):
            continue
        res = c.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        if any(k.startswith("nvidia.com/") for k in asked) or res.get("claims"):
            return str(c.get("name", ""))
    return names[0] if names else ""


def publish_gang_metrics(
    deps: ExtenderDeps, config: FairShareConfig, snap: Snapshot, tenants: list[str]
) -> None:
    """Per tenant (a tenant with children: its subtree's), the gangs waiting and the GPUs
    held by incomplete gangs (``gangs.status``, without the gate and plan judgements)."""
    waiting: dict[str, int] = {}
    held: dict[str, float] = {}
    if deps.gangs is not None:
        for g in deps.gangs.statuses(config, snap, judge=False):
            if g.tenant is None or g.state == "running" or not g.pending:
                continue
            waiting[g.tenant] = waiting.get(g.tenant, 0) + 1
            held[g.tenant] = held.get(g.tenant, 0.0) + g.held_gpus
    for tenant in tenants:
        members = config.subtree(tenant) if config.children(tenant) else (tenant,)
        deps.metrics.set_gang_figures(
            tenant,
            waiting=sum(waiting.get(m, 0) for m in members),
            held_gpus=sum(held.get(m, 0.0) for m in members),
        )


async def serve(
    options: serving.ServerOptions | None = None,
    *,
    period: float = 15.0,
    client_ca: str | None = None,
    stale_after: float = 10.0,
    election: Election | None = None,
    pick_in_filter: bool = False,
    **flags: Unpack[serving.ServerFlags],
) -> None:
    """Run the extender until SIGTERM/SIGINT (the ``fairshare extender`` command).

    ``options`` (or its fields as keywords, ``serving.ServerFlags``): config, cluster,
    address and serving certificate. ``client_ca``: verify kube-scheduler's client
    certificate against this CA on the verbs (needs the certificate files).
    ``election``: decide only while holding its Lease. ``pick_in_filter``: filter keeps
    only the node prioritize would score highest.
    """

    opts = serving.ServerOptions.given(options, flags)
    opts.check_client_ca(client_ca)
    state_file = opts.state_file
    if election is not None and state_file is not None:
        raise FairshareError("--lease needs the API; a --state run has a single replica")

    box: dict[str, metrics_mod.Metrics] = {}
    rt = await opts.build_runtime(
        kinds=(
            "Namespace",
            "Node",
            "Pod",
            "PersistentVolumeClaim",
            "ResourceClaim",
            "ResourceSlice",
            "DeviceClass",
            "DeviceTaintRule",
        ),
        on_reload=lambda: box["m"].observe_config_reload(ok=True),
        on_error=lambda: box["m"].observe_config_reload(ok=False),
        stale_after=stale_after,
        # Pods are slimmed as each list page (or the state file) is parsed, not after the
        # whole list is held: the peak memory of a large cluster's first sync.
        transform={"Pod": objects.slim_pod},
    )
    api_client = None
    binder: Binder = bind_locally
    api_binder = None
    if state_file is None:
        # The API's modules only with the API: a --state run needs no API client.
        from extender import binding
        from fairshare.state import informers

        api_client = await informers.make_api_client(opts.kubeconfig)
        timeout = binding.bind_timeout(
            election.lease_duration if election else None,
            election.renew_deadline if election else None,
        )
        binder = api_binder = binding.api_binder(api_client, timeout=timeout)

    # ``usageHistory``: the decisions read the weights the leader's history adjusted
    # (the config in force itself while the block is absent).
    feed = usagehistory.UsageHistoryFeed(rt.holder.get)
    deps = build_deps(config=feed.config, ready=rt.source.is_ready, binder=binder)
    deps.usage_history = feed.status
    deps.pick_in_filter = pick_in_filter
    if api_client is not None and deps.gangs is not None:
        deps.gangs.fetch = informers.podgroup_fetcher(api_client)
    box["m"] = deps.metrics
    deps.metrics.set_chargeback_source(lambda: chargeback_rows(deps))
    # Runs lost to hardware: read from the watch before the cache forgets the pods.
    losses = recovery.LossTracker(deps.cache, rt.holder.get)
    feed.lost = losses.forgivable
    feed.on_forgiven = deps.metrics.count_forgiven
    deps.metrics.set_extender_leader(election is None)
    if election is not None and api_client is not None:
        deps.background.append(lead(deps, rt.source, api_client, election))
    deps.metrics.set_build_info(__version__)
    deps.metrics.set_native_info(_native.IMPLEMENTATION)
    reloader = opts.cert_reloader(client_ca=client_ca, metrics=deps.metrics)
    deps.background.append(
        runtime.background(
            rt,
            rt.sink_for(losses, deps.sink),
            tls_reloader=reloader,
            periodic=lambda: publish_metrics(deps, seconds=period),
            period=period,
        )
    )
    deps.background.append(serving.freeze_after_sync(rt.source.ready))
    if api_client is not None:
        from extender import events, hami_hooks, lastgood, quarantine, requeue, reserving

        controller = reserving.HandoffController(
            api_client=api_client,
            cache=deps.cache,
            config=rt.holder.get,
            metrics=deps.metrics,
            synced=rt.source.ready,
            is_leader=lambda: deps.leading(),  # with --lease, only the leader sweeps
        )
        hami = hami_hooks.HamiHooks(
            api_client=api_client, pods=deps.cache.pods, config=rt.holder.get
        )
        deps.hooks = ChainedHooks([controller, hami])
        deps.background.append(controller.background())

        requeuer = requeue.Requeuer(
            snapshot=deps.reading,
            feedback=deps.feedback,
            config=feed.config,
            patch=requeue.api_patch(api_client),
            synced=rt.source.ready,
            is_leader=lambda: deps.leading(),
            ring=requeue.api_ring(api_client),
        )
        deps.background.append(requeuer.background())

        quarantiner = quarantine.Quarantiner(
            cache=deps.cache,
            config=rt.holder.get,
            api=quarantine.KubeQuarantineApi(api_client),
            metrics=deps.metrics,
            is_leader=lambda: deps.leading(),  # with --lease, only the leader acts
            synced=rt.source.is_ready,
        )
        deps.quarantine = quarantiner.status
        deps.background.append(quarantiner.background())

        config_ns = parse_ref(opts.configmap)[0] if opts.configmap is not None else None
        healer = recovery.Recovery(
            tracker=losses,
            config=rt.holder.get,
            api=recovery.KubeRecoveryApi(api_client, config_ns),
            metrics=deps.metrics,
            is_leader=lambda: deps.leading(),
        )
        deps.background.append(healer.background(rt.source.ready))
        deps.queue_hold = healer.queue_hold

        deps.on_preempt = events.preemption_recorder(api_client)
        if deps.gangs is not None:
            deps.gangs.on_wait = events.gang_recorder(api_client)
        if opts.configmap is not None:
            recorder = lastgood.LastGoodRecorder(
                api_client=api_client,
                ref=parse_ref(opts.configmap),
                config=rt.holder.get,
                synced=rt.source.ready,
                is_leader=lambda: deps.leading(),
            )
            deps.background.append(recorder.background())
            keeper = usagehistory.UsageHistoryKeeper(
                api_client=api_client,
                namespace=parse_ref(opts.configmap)[0],
                feed=feed,
                snapshot=deps.reading,
                synced=rt.source.ready,
                is_leader=lambda: deps.leading(),
                metrics=deps.metrics,
            )
            deps.background.append(keeper.background())
    app = make_app(deps, client_cert=client_ca is not None)
    log.info(
        "fairshare extender on %s:%s (kernels: %s)", opts.host, opts.port, _native.IMPLEMENTATION
    )
    try:
        await opts.run(app, reloader)
    finally:
        if api_binder is not None:
            await api_binder.close()
        if api_client is not None:
            await api_client.close()
