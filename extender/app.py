"""The extender's aiohttp application: the only place that speaks HTTP.

Each verb handler decodes kube-scheduler's JSON (``wire``), takes the cache's snapshot,
calls the pure verb (``verbs``) and encodes the answer. A body that cannot be decoded gets
400; an unexpected exception is logged, counted and answered 500 (bind: ``Error``), so
kube-scheduler retries the pod and nothing is half-bound. Binds are decided one at a
time (``_bind_now``). With ``--lease`` only the Lease holder decides: a follower refuses
filter and preempt with 503 and bind with ``Error``, and still answers prioritize.
``--client-ca`` guards every route but the public ones (``serving``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry

import serving
from extender import statuspage, verbs, wire
from extender.cache import Cache
from extender.feedback import Feedback
from extender.ganging import GangCoordinator
from extender.snapshot import Snapshot
from fairshare import metrics as metrics_mod
from fairshare import resources
from fairshare.config.schema import FairShareConfig
from fairshare.errors import WireFormatError
from fairshare.placement import PodRequest
from fairshare.runtime import Fanout
from fairshare.state import objects
from fairshare.state.cluster import StateError

log = logging.getLogger("fairshare.extender")

Binder = Callable[[verbs.BindPlan], Awaitable[None]]
CleanupCtx = Callable[[web.Application], AsyncIterator[None]]
MAX_BODY = 64 * 1024 * 1024
"""A filter call with ``nodeCacheCapable: false`` carries every candidate Node object."""


NOT_LEADER = "fairshare: this extender replica is not the leader; retry"
"""The answer of a follower to a deciding verb (kube-scheduler retries the pod)."""
DECIDING = frozenset({"filter", "preempt", "bind"})
LEADER_LABEL = "fairshare.io/extender-leader"
"""Set to ``"true"`` on the leader's own pod (``--leader-label-pod``); the Service selects it."""


async def bind_locally(plan: verbs.BindPlan) -> None:
    """The binder of ``--state`` runs: nothing to POST, the state is the cluster."""


def _always() -> bool:
    return True


class BindHooks(Protocol):
    """What a GPU handoff does around the Binding POST.

    ``before_binding`` runs after the pod is accounted and before its Binding; it returns
    the plan to POST (it may add annotations) or why the bind must fail (the pod is then
    un-accounted and kube-scheduler retries it). ``after_binding`` runs once the Binding
    was accepted; ``started`` is the ``time.monotonic()`` the bind call arrived at.
    """

    async def before_binding(self, plan: verbs.BindPlan) -> verbs.BindPlan | str: ...

    def after_binding(self, plan: verbs.BindPlan, started: float) -> None: ...

    async def binding_failed(self, plan: verbs.BindPlan) -> None: ...


class NoHandoff:
    """The hooks of ``--state`` runs and of handoff ``none``: nothing around the Binding."""

    async def before_binding(self, plan: verbs.BindPlan) -> verbs.BindPlan | str:
        return plan

    def after_binding(self, plan: verbs.BindPlan, started: float) -> None:
        return None

    async def binding_failed(self, plan: verbs.BindPlan) -> None:
        return None


@dataclass
class ChainedHooks:
    """Several handoffs' hooks in turn (each acts only when the config selects it)."""

    hooks: list[BindHooks]

    async def before_binding(self, plan: verbs.BindPlan) -> verbs.BindPlan | str:
        for hook in self.hooks:
            out = await hook.before_binding(plan)
            if isinstance(out, str):
                for done in self.hooks[: self.hooks.index(hook)]:
                    await done.binding_failed(plan)
                return out
            plan = out
        return plan

    def after_binding(self, plan: verbs.BindPlan, started: float) -> None:
        for hook in self.hooks:
            hook.after_binding(plan, started)

    async def binding_failed(self, plan: verbs.BindPlan) -> None:
        for hook in self.hooks:
            await hook.binding_failed(plan)


@dataclass
class ExtenderDeps:
    """Everything the handlers need, built by the caller (CLI or test)."""

    config: Callable[[], FairShareConfig]
    cache: Cache
    registry: CollectorRegistry
    metrics: metrics_mod.Metrics
    ready: Callable[[], bool]
    binder: Binder = bind_locally
    hooks: BindHooks = field(default_factory=NoHandoff)
    bind_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    background: list[CleanupCtx] = field(default_factory=list)
    leading: Callable[[], bool] = _always
    """May this replica decide now (it holds the Lease and caught up)? Always, alone."""
    binds_in_flight: int = 0
    pick_in_filter: bool = False
    """``--pick-in-filter``: filter answers only the node prioritize would score highest."""
    on_preempt: Callable[[PodRequest, str], None] | None = None
    """Told what the preemption policy refused for a preemptor (an Event on the pod)."""
    gangs: GangCoordinator | None = None
    """Pod groups placed all or nothing (``extender.ganging``); None: per pod."""
    usage_history: Callable[[], dict[str, Any]] | None = None
    """The leader's usage history as ``/status.json`` shows it (``usagehistory``)."""
    feedback: Feedback = field(default_factory=Feedback)
    """What kube-scheduler told the extender about its pods (``extender.feedback``)."""
    quarantine: Callable[[], dict[str, Any]] | None = None
    """The quarantine of failed GPU nodes as ``/quarantine.json`` shows it
    (``extender.quarantine``); None: not run (a ``--state`` run)."""
    queue_hold: Callable[[str], str | None] | None = None
    """Why a pending pod (by uid) lets a group of its tenant restarted after a hardware
    fault go first (``recovery.Recovery.queue_hold``); None: it need not."""

    def snapshot(self, config: FairShareConfig | None = None) -> Snapshot:
        """The cache's snapshot for ``config`` (default: the one in force), with
        kube-scheduler's verdicts applied and the pod groups judged as ``gangs`` reads them."""
        grouped = self.gangs is not None and self.cache.has_groups
        facts = self.gangs.podgroup_facts() if self.gangs is not None and grouped else None
        return self.cache.snapshot(config or self.config(), feedback=self.feedback, podgroups=facts)

    @contextmanager
    def reading(self, config: FairShareConfig | None = None) -> Iterator[Snapshot]:
        """``snapshot`` for the length of a ``with`` block, given back to the cache at its
        end (a later write then needs no copy of the state)."""
        snap = self.snapshot(config)
        try:
            yield snap
        finally:
            self.cache.give_back(snap)

    @property
    def sink(self) -> Fanout:
        """What the watches feed: the cache, then kube-scheduler's feedback."""
        return Fanout([self.cache, self.feedback])

    def note_gate(self, req: PodRequest, gate: Any) -> None:
        self.feedback.note_filter(req, gate, self.cache.pending)


DEPS = web.AppKey("deps", ExtenderDeps)


class HandoffError(Exception):
    """A GPU handoff refused the bind (``BindHooks.before_binding``)."""


def build_deps(
    *,
    config: Callable[[], FairShareConfig],
    ready: Callable[[], bool],
    binder: Binder = bind_locally,
) -> ExtenderDeps:
    """Deps with a fresh cache, feedback and metrics registry."""
    registry = CollectorRegistry()
    cache = Cache(config)
    deps = ExtenderDeps(
        config=config,
        cache=cache,
        registry=registry,
        metrics=metrics_mod.Metrics(registry),
        ready=ready,
        binder=binder,
        gangs=GangCoordinator(cache),
    )
    assert deps.gangs is not None
    deps.gangs.on_gate = deps.note_gate
    return deps


async def _verb(
    request: web.Request, verb: str, run: Callable[[ExtenderDeps, bytes], Awaitable[Any]]
) -> web.Response:
    deps = request.app[DEPS]
    start = time.perf_counter()
    body = await request.read()
    if verb in DECIDING and not deps.leading():
        deps.metrics.observe_extender(verb, "not_leader", time.perf_counter() - start)
        if verb == "bind":
            result = wire.ExtenderBindingResult(NOT_LEADER).encode()
            refusal = web.json_response(result, dumps=wire.dumps)
        else:
            refusal = web.Response(status=503, text=NOT_LEADER + "\n")
        # The caller dials again for its retry, and the Service (which selects the
        # leader's pod) routes the new connection to the leader.
        refusal.force_close()
        return refusal
    try:
        out = await run(deps, body)
    except WireFormatError as exc:
        deps.metrics.observe_extender(verb, "malformed", time.perf_counter() - start)
        return web.Response(
            status=400, text=serving.plain_text(f"malformed {verb} request: {exc}\n")
        )
    except Exception:
        log.exception("unexpected error in %s", verb)
        deps.metrics.count_unexpected_error("extender")
        deps.metrics.observe_extender(verb, "error", time.perf_counter() - start)
        return web.Response(status=500, text=f"fairshare: internal error in {verb}\n")
    deps.metrics.observe_extender(verb, "ok", time.perf_counter() - start)
    if isinstance(out, wire.Scores | wire.ExtenderFilterResult):  # the names in one pass
        return web.Response(body=out.body(), content_type="application/json", charset="utf-8")
    return web.json_response(out, dumps=wire.dumps)


_D = TypeVar("_D")


def _decode(decoder: Callable[[bytes], _D], body: bytes) -> _D:
    """``decoder(body)``; any exception the pure decoder raises on a hostile shape (an
    object where it expected another, say) is a body that cannot be decoded: a 400
    (``WireFormatError``), not an internal error. Errors after decoding stay 500."""
    try:
        return decoder(body)
    except WireFormatError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, RecursionError) as exc:
        raise WireFormatError(f"unexpected shape ({type(exc).__name__})") from exc


VICTIM_WAIT = 2.0
"""Seconds filter waits for a preemptor's victims to leave the extender's view."""


async def _await_victims(deps: ExtenderDeps, pod: Mapping[str, Any]) -> None:
    """A preemptor retried on its nominated node: wait (at most ``VICTIM_WAIT``) until the
    victims the preempt verb answered for that node are gone from the state too.

    kube-scheduler deletes the victims and retries the preemptor as soon as its own cache
    drops them; the extender's watch may lag by a few milliseconds. A filter that still
    counts a victim answers "Insufficient", and kube-scheduler, finding no terminating pod
    on the nominated node any more, preempts again on another node: two victims for one
    pod."""
    status = pod.get("status")
    node = status.get("nominatedNodeName") if isinstance(status, Mapping) else None
    uid = objects.pod_uid(pod)
    if not isinstance(node, str) or not node or uid not in deps.feedback.preempted:
        return
    deadline = time.monotonic() + VICTIM_WAIT
    while (
        deps.feedback.victims_pending(uid, node, deps.cache.state) and time.monotonic() < deadline
    ):
        await asyncio.sleep(0.02)


def _take_in(deps: ExtenderDeps, pod: Mapping[str, Any]) -> str:
    """A pod of a scheduler call, maybe before the watch brought it: into the cache and
    the feedback. Returns its uid."""
    uid = objects.pod_uid(pod)
    if uid not in deps.cache.pods:
        deps.cache.remember(dict(pod))
    deps.feedback.remember(dict(pod), uid)
    return uid


def _read(deps: ExtenderDeps, pod: Mapping[str, Any], config: FairShareConfig) -> verbs.Reading:
    """The cache's reading of the pod in a call (once per pod version), or why not."""
    try:
        return deps.cache.request(pod, config)
    except resources.DemandError as exc:
        return exc


async def _filter(deps: ExtenderDeps, body: bytes) -> Any:
    args = _decode(wire.decode_extender_args, body)
    await _await_victims(deps, args.pod)
    config = deps.config()
    uid = _take_in(deps, args.pod)
    # A tenant's newer pods let its group restarted after a hardware fault go first.
    behind = deps.queue_hold(uid) if deps.queue_hold is not None and uid else None
    # A pod group's member is answered for its whole group (``ganging``); others as ever.
    gang = None
    grouped = deps.gangs is not None and (deps.gangs.plans or deps.cache.group_of(uid) is not None)
    if behind is None and grouped and deps.gangs is not None:
        gang = await deps.gangs.filter(args, config, lambda: deps.reading(config))
    if behind is not None:
        refused = dict.fromkeys(args.candidate_names(), behind)
        result = verbs.filter_result_of(args, (), refused, {})
    elif gang is not None:
        result = gang.result
    else:
        req = _read(deps, args.pod, config)
        with deps.reading(config) as snap:
            answer = verbs.filter_answer(args, snap, config, pick=deps.pick_in_filter, req=req)
            if answer.req is not None:
                deps.feedback.note_filter(answer.req, answer.gate, snap.pending)
        result = answer.result
    # kube-scheduler asks only about pods its own plugins passed some node for: the pod's
    # last Unschedulable verdict is out of date (``Feedback.note_asked``).
    if uid:
        answers = {*(result.failed_nodes or {}).values()}
        answers.update((result.failed_and_unresolvable_nodes or {}).values())
        deps.feedback.note_asked(uid, answers)
    return result


async def _prioritize(deps: ExtenderDeps, body: bytes) -> Any:
    args = _decode(wire.decode_extender_args, body)
    config = deps.config()
    req = _read(deps, args.pod, config)
    with deps.reading(config) as snap:
        names, scores = verbs.prioritize_scores(args, snap, config, req)
    return wire.Scores(names, scores)


async def _preempt(deps: ExtenderDeps, body: bytes) -> Any:
    args = _decode(wire.decode_preemption_args, body)
    # kube-scheduler asks before its filter passed any node, maybe before the extender's
    # watch brought the pod: its demand must count in the fair shares the victims are
    # judged by (the pod is why the cluster is short).
    config = deps.config()
    _take_in(deps, args.pod)
    req = _read(deps, args.pod, config)
    with deps.reading(config) as snap:
        answer = verbs.preempt_answer(args, snap, config, deps.cache.pods, req)
    if answer.note and answer.preemptor is not None and deps.on_preempt is not None:
        deps.on_preempt(answer.preemptor, answer.note)
    result = answer.result
    victims = {n: v.pod_uids for n, v in result.node_name_to_meta_victims.items()}
    deps.feedback.note_preempted(objects.pod_uid(args.pod), victims)
    return result.encode()


async def _bind(deps: ExtenderDeps, body: bytes) -> Any:
    started = time.monotonic()
    args = _decode(wire.decode_binding_args, body)
    if deps.gangs is not None:  # a planned member of a pod group: bound with its group
        out = await deps.gangs.bind(
            args, lambda a, before: _bind_now(deps, a, started, before), deps.reading
        )
        if out is not None:
            return out
    return await _bind_now(deps, args, started)


async def _bind_now(
    deps: ExtenderDeps,
    args: wire.ExtenderBindingArgs,
    started: float,
    before: Callable[[], None] | None = None,
) -> Any:
    """Bind one pod: under the bind lock, decide (``verbs.bind_decision``) and assume
    (account the pod, so the next filter and bind already see it); then POST the Binding
    outside the lock (binds do not queue behind API latency), and un-assume the pod if
    the POST fails. ``before`` (a gang member's: release its reservation) runs under the
    lock first, and the fair-share gate is then not judged again (it was judged for the
    whole group)."""
    async with deps.bind_lock:
        if not deps.leading():  # the term ended while this bind waited for the lock
            return wire.ExtenderBindingResult(NOT_LEADER).encode()
        config = deps.config()
        if before is not None:
            before()
        with deps.reading(config) as snap:
            decision = verbs.bind_decision(args, snap, config, judge_gate=before is None)
            plan, req = decision.plan, decision.req
            if decision.gate is not None and req is not None:
                deps.feedback.note_filter(req, decision.gate, snap.pending)  # held: gated
        if plan is None or decision.error:
            if plan is not None:
                log.warning("bind refused: %s", decision.error)
            return decision.result()
        decided = plan
        try:
            deps.cache.assume(lambda state: verbs.commit_bind(state, decided), plan.uid)
        except StateError as exc:
            return wire.ExtenderBindingResult(f"cannot account the bind: {exc}").encode()
    deps.binds_in_flight += 1
    try:
        handed = await deps.hooks.before_binding(plan)
        if isinstance(handed, str):
            raise HandoffError(handed)
        plan = handed
        await deps.binder(plan)
    except Exception as exc:
        log.warning("binding %s/%s to %s failed: %s", plan.namespace, plan.name, plan.node, exc)
        if not isinstance(exc, HandoffError):
            await deps.hooks.binding_failed(plan)
        async with deps.bind_lock:
            deps.cache.forget(plan.uid, req)
        return wire.ExtenderBindingResult(f"binding failed: {exc}").encode()
    finally:
        deps.binds_in_flight -= 1
    deps.hooks.after_binding(plan, started)
    return plan.result()


async def filter_handler(request: web.Request) -> web.Response:
    return await _verb(request, "filter", _filter)


async def prioritize_handler(request: web.Request) -> web.Response:
    return await _verb(request, "prioritize", _prioritize)


async def preempt_handler(request: web.Request) -> web.Response:
    return await _verb(request, "preempt", _preempt)


async def bind_handler(request: web.Request) -> web.Response:
    return await _verb(request, "bind", _bind)


async def quarantine_handler(request: web.Request) -> web.Response:
    """``GET /quarantine.json``: the quarantine of failed GPU nodes (``health.quarantine``):
    its state, the nodes it holds and the circuit breaker."""
    source = request.app[DEPS].quarantine
    return web.json_response(source() if source is not None else {"state": "disabled"})


def make_app(deps: ExtenderDeps, *, client_cert: bool = False) -> web.Application:
    """The extender application; routes are relative to the scheduler's ``urlPrefix``.

    ``client_cert``: the verbs need a verified TLS client certificate.
    """
    middlewares = [serving.require_client_cert] if client_cert else []
    app = web.Application(client_max_size=MAX_BODY, middlewares=middlewares)
    app[DEPS] = deps
    for prefix in ("", "/scheduler"):
        app.router.add_post(f"{prefix}/filter", filter_handler)
        app.router.add_post(f"{prefix}/prioritize", prioritize_handler)
        app.router.add_post(f"{prefix}/preempt", preempt_handler)
        app.router.add_post(f"{prefix}/bind", bind_handler)
    serving.add_ops_routes(app, ready=lambda: deps.ready(), registry=deps.registry)
    statuspage.add_routes(  # GET /status, /status.json
        app,
        deps.reading,
        deps.config,
        unreadable=lambda: deps.cache.unreadable,
        usage_history=lambda: deps.usage_history,
        gangs=lambda: deps.gangs,
    )
    app.router.add_get("/quarantine.json", quarantine_handler)
    app.cleanup_ctx.extend(deps.background)
    return app
