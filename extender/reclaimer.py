"""The reclaim controller (``fairshare reclaimer``): acts on ``preemption.reclaim`` plans.

Every ``interval`` seconds, while it holds the leader Lease (checked before every round),
it plans over the extender's ``Cache`` (pods being evicted count as room freed, pods a
PodDisruptionBudget just protected are skipped); holds the room on the pod it is for
(``holds.hold_annotations``) before any victim goes; evicts through the Eviction API (a
429 protects that pod for ``PDB_BACKOFF`` seconds and the round is planned again); records
Events on the victims, on the pod they made room for and on pods left waiting; and evicts
at most ``max_per_minute`` pods in any sliding minute.

A pod group is evicted whole, as one decision: a budget that refuses its first member
protects the whole group, one that refuses a later member only that member. With
``usageHistory`` it plans with the weights the extender's leader recorded
(``usagehistory.RecordedHistory``), so reclaim and the gate agree. ``time.monotonic``
drives the cool-down, the rate limit and the restore timer; wall time is used only for
Lease and Event timestamps, history decay and hold end times (another process reads them).
One module: the controller, its API adapter and the process that runs it (``serve``), which
nothing else shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, Unpack

from extender.cache import Cache
from extender.feedback import Feedback
from extender.leader import (
    KubeLeaseApi,
    LeaseElector,
    call_raw,
    evict_pod,
    lease_decision,
    micro_time,
    parse_time,
)
from extender.snapshot import Snapshot
from extender.usagehistory import RecordedHistory, read_recorded
from fairshare import gangs
from fairshare import metrics as metrics_mod
from fairshare.config.schema import FairShareConfig
from fairshare.preemption import holds, reclaim
from fairshare.runtime import Fanout

if TYPE_CHECKING:  # the controller itself runs without aiohttp; only ``serve`` needs it
    import serving

log = logging.getLogger("fairshare.reclaimer")

COMPONENT: Final = "fairshare-reclaimer"
PDB_BACKOFF: Final = 30.0
"""Seconds a pod whose eviction a PodDisruptionBudget refused is not chosen again."""
IN_FLIGHT_TIMEOUT: Final = 300.0
"""Seconds an evicted pod still counts as leaving if it has not gone by then."""
REASON_BLOCKED: Final = "ReclaimBlocked"
REPLANS: Final = 10
HOLD_RENEW: Final = holds.HOLD_TIMEOUT / 2
"""Seconds left on a hold below which the next round writes it again (room still kept)."""
"""Plans per round at most: each PodDisruptionBudget refusal replans at once."""
WINDOW: Final = 60.0
KINDS: Final = (
    "Namespace",
    "Node",
    "Pod",
    "PersistentVolumeClaim",
    "ResourceClaim",
    "ResourceSlice",
    "DeviceClass",
    "DeviceTaintRule",
)


# -- the API surface the controller needs ---------------------------------------------------


@dataclass(frozen=True)
class EvictResult:
    """Outcome of one eviction request: ``evicted``, ``blocked`` (429) or ``failed``."""

    outcome: str
    message: str = ""


class ClusterApi(Protocol):
    """What the controller does to the cluster (a fake in unit tests)."""

    async def evict(self, namespace: str, name: str, grace: int | None) -> EvictResult: ...

    async def record_event(
        self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool = False
    ) -> None: ...

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def write_lease(self, namespace: str, body: dict[str, Any], *, create: bool) -> bool: ...

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge ``annotations`` into the pod's (the reclaim hold, ``holds.hold_annotations``)."""
        ...


_parse_time = parse_time  # the pure time parsing, as the tests have long called it


# -- the controller -------------------------------------------------------------------------


def _created(pod: Mapping[str, Any]) -> float | None:
    return _parse_time((pod.get("metadata") or {}).get("creationTimestamp"))


@dataclass
class Reclaimer:
    """One reclaim round per ``tick``; holds the cool-down, rate-limit and timers."""

    cache: Cache
    config: Callable[[], FairShareConfig]
    api: ClusterApi
    metrics: metrics_mod.Metrics
    cooldown: float = 60.0
    max_per_minute: int = 10
    grace_period: int | None = None
    clock: Callable[[], float] = time.monotonic
    last_evictions: dict[tuple[str, str], float] = field(default_factory=dict)
    recent: deque[float] = field(default_factory=deque)
    in_flight: dict[str, float] = field(default_factory=dict)
    protected: dict[str, float] = field(default_factory=dict)
    deficit_since: dict[str, float] = field(default_factory=dict)
    explained: set[tuple[str, str]] = field(default_factory=set)
    restored: deque[tuple[str, float]] = field(default_factory=lambda: deque(maxlen=100))
    """The latest (tenant, seconds) restores, for logs and tests (the metric has them all)."""
    history: RecordedHistory | None = None
    """The extender's recorded usage history, read before every round (None: weights as
    written)."""
    wall_clock: Callable[[], float] = time.time
    """Unix time, to decay the recorded history to the moment of the plan."""
    feedback: Feedback = field(default_factory=Feedback)
    """kube-scheduler's verdicts on the pending pods (which of them count as waiting)."""

    @property
    def sink(self) -> Fanout:
        """What the watches feed: the cache, then kube-scheduler's feedback."""
        return Fanout([self.cache, self.feedback])

    def _budget(self, now: float) -> int:
        while self.recent and now - self.recent[0] >= WINDOW:
            self.recent.popleft()
        return max(0, self.max_per_minute - len(self.recent))

    def _releasing(self, now: float) -> frozenset[str]:
        pods = self.cache.pods
        for uid, at in list(self.in_flight.items()):
            if uid not in pods or now - at > IN_FLIGHT_TIMEOUT:
                del self.in_flight[uid]
        leaving = {u for u, p in pods.items() if (p.get("metadata") or {}).get("deletionTimestamp")}
        return frozenset(leaving | set(self.in_flight))

    def plan(self, now: float) -> reclaim.ReclaimPlan:
        """The planner's answer on a snapshot of the cache."""
        for uid, until in list(self.protected.items()):
            if now >= until:
                del self.protected[uid]
        pods = self.cache.pods
        created = {u: c for u, p in pods.items() if (c := _created(p)) is not None}
        selectors = {
            uid: {str(k): str(v) for k, v in sel.items()}
            for uid in self.cache.pending
            if isinstance(sel := (pods.get(uid, {}).get("spec") or {}).get("nodeSelector"), dict)
        }
        config = self.config()
        snap = self.cache.snapshot(config, feedback=self.feedback, now=self.wall_clock())
        state = snap.state
        groups = {
            uid: str(key)
            for uid, p in pods.items()
            if uid in state.pods and (key := gangs.group_of(p)) is not None
        }
        wall, keep = self.wall_clock(), config.take_back_after_seconds()
        given = {
            uid: tenants
            for uid, p in pods.items()
            if (
                tenants := holds.given_in_force(
                    (p.get("metadata") or {}).get("annotations"), now=wall, keep=keep
                )
            )
        }
        if self.history is not None:
            config = self.history.config(config, state, snap.queue, wall)
        try:
            return self._plan(snap, config, now, created, selectors, groups, given)
        finally:
            self.cache.give_back(snap)

    def _plan(
        self,
        snap: Snapshot,
        config: FairShareConfig,
        now: float,
        created: dict[str, float],
        selectors: dict[str, dict[str, str]],
        groups: dict[str, str],
        given: dict[str, Any],
    ) -> reclaim.ReclaimPlan:
        return reclaim.plan_reclaim(
            snap.state,
            config=config,
            pending=list(snap.queue),
            now=now,
            last_evictions=self.last_evictions,
            cooldown=self.cooldown,
            max_evictions=self._budget(now),
            created=created,
            releasing=self._releasing(now),
            protected=frozenset(self.protected),
            node_selectors=selectors,
            groups=groups,
            given=given,
        )

    async def tick(self) -> reclaim.ReclaimPlan:
        """Plan, evict, explain; replan at once (up to 10 times) after a PDB refusal."""
        plan = reclaim.ReclaimPlan()
        if self.history is not None:
            await self.history.refresh()
        for _ in range(REPLANS):
            now = self.clock()
            plan = self.plan(now)
            self._track_deficits(plan, now)
            blocked = False
            # The hold first: a victim that goes before its room is held lets kube-scheduler
            # place another tenant's pending pod there at once.
            await self._hold_room(plan)
            for batch in _decisions(plan.evictions):
                if len(batch) == 1 and not batch[0].group:
                    blocked |= not await self._evict(batch[0], now)
                else:
                    blocked |= not await self._evict_group(batch, now)
            if not blocked:
                break
        await self._explain_waiting(plan)
        return plan

    async def _hold_room(self, plan: reclaim.ReclaimPlan) -> None:
        """Annotate each pod the plan makes room for with its hold (``holds.RoomHold``),
        before its victims are evicted, so that the extender's filter keeps other tenants'
        pods off that room; an annotation already there for the same node is renewed only
        in its second half. A plan a PodDisruptionBudget spoils is made again at once, and
        its new node written over the old one."""
        wall = self.wall_clock()
        givers = plan.givers()
        for uid, node in sorted((plan.room or {}).items()):
            pod, req = self.cache.pods.get(uid), self.cache.pending.get(uid)
            if pod is None or req is None:
                continue
            meta = pod.get("metadata") or {}
            have = meta.get("annotations")
            given = holds.given_annotation(
                holds.given_of(have), givers.get(uid, frozenset()), at=wall
            )
            held = holds.hold_of(req, have)
            fresh = held is not None and held.node == node and held.until - wall > HOLD_RENEW
            if fresh and not given:
                continue
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            ann = {**holds.hold_annotations(node, wall + holds.HOLD_TIMEOUT), **given}
            try:
                await self.api.annotate_pod(ns, name, ann)
            except Exception as exc:  # a hold not written costs churn, not correctness
                log.warning("could not hold %s for %s/%s: %s", node, ns, name, exc)

    def _track_deficits(self, plan: reclaim.ReclaimPlan, now: float) -> None:
        for tenant in plan.deficits:
            self.deficit_since.setdefault(tenant, now)
        for tenant in sorted(set(self.deficit_since) - set(plan.deficits)):
            waited = now - self.deficit_since.pop(tenant)
            self.metrics.observe_guarantee_restored(tenant, waited)
            self.restored.append((tenant, waited))
            log.info("tenant %s: guaranteed share restored after %.1fs", tenant, waited)

    async def _evict(self, ev: reclaim.Eviction, now: float) -> bool:
        """Evict one victim; False when a PodDisruptionBudget refused it."""
        victim = self.cache.pods.get(ev.victim_uid)
        beneficiary = self.cache.pods.get(ev.beneficiary_uid)
        if victim is None:
            return True
        meta = victim.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        result = await self.api.evict(ns, name, self.grace_period)
        labels = {"tenant": ev.victim_tenant, "beneficiary": ev.beneficiary_tenant}
        self.metrics.count_reclaim_eviction(result.outcome, **labels)
        if result.outcome == "evicted":
            self.in_flight[ev.victim_uid] = now
            self.recent.append(now)
            self.last_evictions[(ev.victim_tenant, ev.beneficiary_tenant)] = now
            log.info(
                "evicted %s/%s for %s/%s", ns, name, ev.beneficiary_namespace, ev.beneficiary_name
            )
            await self.api.record_event(victim, reason=reclaim.REASON_RECLAIMED, message=ev.message)
            if beneficiary is not None:
                goal = "its guaranteed share" if ev.toward == "guarantee" else "its fair share"
                text = (
                    f"evicted {ns}/{name} (tenant {ev.victim_tenant}) on {ev.node} to give "
                    f"tenant {ev.beneficiary_tenant} {goal}"
                )
                await self.api.record_event(
                    beneficiary, reason=reclaim.REASON_MADE_ROOM, message=text
                )
            return True
        if result.outcome == "blocked":
            self.protected[ev.victim_uid] = now + PDB_BACKOFF
            log.info("eviction of %s/%s refused: %s", ns, name, result.message)
            if beneficiary is not None:
                text = (
                    f"eviction of {ns}/{name} (tenant {ev.victim_tenant}) refused by a "
                    f"PodDisruptionBudget ({result.message}); choosing another victim or waiting"
                )
                await self.api.record_event(
                    beneficiary, reason=REASON_BLOCKED, message=text, warning=True
                )
            return False
        log.warning("eviction of %s/%s failed: %s", ns, name, result.message)
        return True

    async def _evict_group(self, batch: list[reclaim.Eviction], now: float) -> bool:
        """Evict every bound member of one pod group for one pod; False when a
        PodDisruptionBudget refused a member (see the module docstring)."""
        first = batch[0]
        beneficiary = self.cache.pods.get(first.beneficiary_uid)
        labels = {"tenant": first.victim_tenant, "beneficiary": first.beneficiary_tenant}
        done: list[str] = []
        refused = False
        for ev in batch:
            victim = self.cache.pods.get(ev.victim_uid)
            if victim is None:
                continue
            meta = victim.get("metadata") or {}
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            result = await self.api.evict(ns, name, self.grace_period)
            self.metrics.count_reclaim_eviction(result.outcome, **labels)
            if result.outcome == "evicted":
                self.in_flight[ev.victim_uid] = now
                self.recent.append(now)
                self.last_evictions[(ev.victim_tenant, ev.beneficiary_tenant)] = now
                done.append(f"{ns}/{name}")
                await self.api.record_event(
                    victim, reason=reclaim.REASON_RECLAIMED, message=ev.message
                )
                continue
            if result.outcome != "blocked":
                log.warning("eviction of %s/%s failed: %s", ns, name, result.message)
                continue
            refused = True
            self.protected[ev.victim_uid] = now + PDB_BACKOFF
            if done:
                log.warning(
                    "eviction of %s/%s (pod group %s) refused after %d member(s) went: %s",
                    ns, name, ev.group, len(done), result.message,
                )  # fmt: skip
                continue
            for other in batch:
                self.protected[other.victim_uid] = now + PDB_BACKOFF
            log.info("eviction of %s/%s refused: %s; its pod group %s stays whole",
                     ns, name, result.message, ev.group)  # fmt: skip
            if beneficiary is not None:
                text = (
                    f"eviction of {ns}/{name} (tenant {ev.victim_tenant}, pod group "
                    f"{ev.group}) refused by a PodDisruptionBudget ({result.message}); "
                    "the group stays whole; choosing another victim or waiting"
                )
                await self.api.record_event(
                    beneficiary, reason=REASON_BLOCKED, message=text, warning=True
                )
            return False
        if done:
            log.info(
                "evicted pod group %s (%d pods: %s) for %s/%s",
                first.group, len(done), ", ".join(done),
                first.beneficiary_namespace, first.beneficiary_name,
            )  # fmt: skip
            if beneficiary is not None:
                nodes = ", ".join(sorted({ev.node for ev in batch}))
                goal = "its guaranteed share" if first.toward == "guarantee" else "its fair share"
                text = (
                    f"evicted pod group {first.group} ({len(done)} pods: {', '.join(done)}; "
                    f"tenant {first.victim_tenant}) on {nodes} to give tenant "
                    f"{first.beneficiary_tenant} {goal}"
                )
                await self.api.record_event(
                    beneficiary, reason=reclaim.REASON_MADE_ROOM, message=text
                )
        return not refused

    async def _explain_waiting(self, plan: reclaim.ReclaimPlan) -> None:
        for w in plan.waiting:
            self.metrics.count_reclaim_waiting(w.reason, w.tenant)
            key = (w.uid, w.reason)
            pod = self.cache.pods.get(w.uid)
            if key in self.explained or pod is None or w.reason == reclaim.WAIT_EVICTING:
                continue
            self.explained.add(key)
            text = f"tenant {w.tenant} is under its guaranteed share but reclaim waits: {w.detail}"
            await self.api.record_event(pod, reason=w.reason, message=text)
        live = set(self.cache.pods)
        self.explained = {k for k in self.explained if k[0] in live}


# -- kubernetes_asyncio ------------------------------------------------------------------------


class KubeApi(KubeLeaseApi):
    """``ClusterApi`` over a kubernetes_asyncio ``ApiClient`` (raw JSON in and out)."""

    def __init__(self, api_client: Any, *, identity: str) -> None:
        from kubernetes_asyncio import client

        super().__init__(api_client)

        # Raw JSON in and out (``_preload_content=False``), so the generated models' types
        # do not apply: the client is used untyped, as in ``binding``.
        self._client: Any = client
        self.core: Any = self._client.CoreV1Api(api_client)
        self.identity = identity

    async def evict(self, namespace: str, name: str, grace: int | None) -> EvictResult:
        status, message = await evict_pod(self.core, namespace, name, grace=grace)
        if 200 <= status < 300:
            return EvictResult("evicted")
        if status == 429:
            return EvictResult("blocked", message)
        if status == 404:
            return EvictResult("evicted", "already gone")
        return EvictResult("failed", f"HTTP {status}: {message}")

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        status, data = await call_raw(
            self.core.patch_namespaced_pod(
                name, namespace, body,
                _content_type="application/merge-patch+json", _preload_content=False,
            )
        )  # fmt: skip
        if not 200 <= status < 300:
            raise RuntimeError(f"HTTP {status}: {data.get('message', '')}")

    async def record_event(
        self, pod: Mapping[str, Any], *, reason: str, message: str, warning: bool = False
    ) -> None:
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace", "default"))
        stamp = micro_time(time.time())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'pod')}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta.get("name"),
                "namespace": ns,
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": stamp[:19] + "Z",
            "lastTimestamp": stamp[:19] + "Z",
            "count": 1,
        }
        status, data = await call_raw(
            self.core.create_namespaced_event(ns, body, _preload_content=False)
        )
        if not 200 <= status < 300:
            log.warning(
                "event %s on %s/%s not recorded: HTTP %s %s",
                reason, ns, meta.get("name"), status, data.get("message", ""),
            )  # fmt: skip


# -- the command ------------------------------------------------------------------------------


async def run_loop(
    reclaimer: Reclaimer,
    elector: LeaseElector,
    *,
    interval: float,
    ready: Callable[[], bool],
    stop: asyncio.Event,
) -> None:
    """Lead, plan and evict every ``interval`` seconds until ``stop`` is set."""
    while not stop.is_set():
        try:
            leader = await elector.try_lead()
            reclaimer.metrics.set_reclaim_leader(leader)
            if leader and ready():
                await reclaimer.tick()
        except Exception:
            log.exception("reclaim round failed")
            reclaimer.metrics.count_unexpected_error("reclaimer")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)


async def serve(
    options: serving.ServerOptions | None = None,
    *,
    interval: float,
    cooldown: float,
    max_per_minute: int,
    grace_period: int | None,
    lease: str,
    identity: str,
    lease_duration: int,
    **flags: Unpack[serving.ServerFlags],
) -> None:
    """Run the reclaim controller until SIGTERM/SIGINT (the ``fairshare reclaimer`` command).

    ``options`` (or its fields as keywords, ``serving.ServerFlags``): its config, the API
    (a reclaimer evicts: no ``state_file``) and the address of its plain-HTTP
    ``/metrics``, ``/healthz`` and ``/readyz`` (no serving certificate)."""
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    import serving
    from fairshare import __version__, runtime
    from fairshare.errors import FairshareError
    from fairshare.state import informers

    opts = serving.ServerOptions.given(options, flags)
    if opts.state_file is not None or opts.tls_cert or opts.tls_key:
        raise FairshareError("the reclaimer needs the API and serves plain HTTP: no state, no TLS")
    box: dict[str, metrics_mod.Metrics] = {}
    rt = await opts.build_runtime(
        kinds=KINDS,
        on_reload=lambda: box["m"].observe_config_reload(ok=True),
        on_error=lambda: box["m"].observe_config_reload(ok=False),
    )
    registry = CollectorRegistry()
    metrics = box["m"] = metrics_mod.Metrics(registry)
    metrics.set_build_info(__version__)
    cache = Cache(rt.holder.get)
    api_client = await informers.make_api_client(opts.kubeconfig)
    api = KubeApi(api_client, identity=identity)
    lease_ns, lease_name = runtime.parse_ref(lease)
    elector = LeaseElector(api, lease_ns, lease_name, identity, duration=lease_duration)
    reclaimer = Reclaimer(
        cache,
        rt.holder.get,
        api,
        metrics,
        cooldown=cooldown,
        max_per_minute=max_per_minute,
        grace_period=grace_period,
    )
    if opts.configmap is not None:
        config_ns = runtime.parse_ref(opts.configmap)[0]
        reclaimer.history = RecordedHistory(lambda: read_recorded(api.core, config_ns))

    async def metrics_handler(request: web.Request) -> web.Response:
        body, ctype = metrics_mod.render(registry, request.headers.get("Accept"))
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = ctype
        return resp

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if rt.source.ready.is_set():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="cluster state not synced yet\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.cleanup_ctx.append(runtime.background(rt, rt.sink_for(reclaimer.sink)))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, opts.host, opts.port).start()
    log.info("fairshare reclaimer on %s:%s as %s (lease %s)", opts.host, opts.port, identity, lease)
    stop = asyncio.Event()
    loop_task = asyncio.create_task(
        run_loop(reclaimer, elector, interval=interval, ready=rt.source.is_ready, stop=stop)
    )
    try:
        await runtime.wait_for_signal()
    finally:
        stop.set()
        await loop_task
        await runner.cleanup()
        await api_client.close()


def _decisions(evictions: tuple[reclaim.Eviction, ...]) -> list[list[reclaim.Eviction]]:
    """The plan's evictions as decisions: a lone pod, or every member of one pod group
    evicted for one pod (the planner lists a group's members one after the other)."""
    out: list[list[reclaim.Eviction]] = []
    for ev in evictions:
        prev = out[-1][-1] if out else None
        if (
            prev is not None
            and ev.group
            and (prev.group, prev.beneficiary_uid) == (ev.group, ev.beneficiary_uid)
        ):
            out[-1].append(ev)
        else:
            out.append([ev])
    return out


def plan_summary(plan: reclaim.ReclaimPlan) -> dict[str, Any]:
    """A JSON-able digest of a plan (for logs and tests)."""
    return {
        "evictions": [
            (e.victim_uid, e.victim_tenant, e.beneficiary_tenant) for e in plan.evictions
        ],
        "waiting": [(w.uid, w.reason) for w in plan.waiting],
        "deficits": list(plan.deficits),
    }


__all__ = [
    "ClusterApi",
    "EvictResult",
    "KubeApi",
    "LeaseElector",
    "Reclaimer",
    "lease_decision",
    "plan_summary",
    "run_loop",
    "serve",
]
