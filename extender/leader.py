"""Lease-based leader election, shared by the reclaimer and the extender.

``LeaseElector`` makes one attempt on a ``coordination.k8s.io/v1`` Lease: read it, then
create it or replace it with the read ``resourceVersion`` (a 409 means another replica
won). Another replica takes it only once ``renewTime + leaseDurationSeconds`` has passed
by its own clock, or at once if it was released. ``Term`` (pure, on a monotonic clock)
leads until ``renew_deadline`` after the start of the last successful attempt, which is
shorter than the lease duration, so an old leader stops deciding before anyone may take
the Lease. ``Leadership`` runs the attempts and, on each new term, a ``catch_up`` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fairshare.errors import FairshareError

log = logging.getLogger("fairshare.leader")


class LeaseApi(Protocol):
    """Reading and writing one Lease (a fake in unit tests)."""

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def write_lease(self, namespace: str, body: dict[str, Any], *, create: bool) -> bool: ...


# -- pure parts -------------------------------------------------------------------------------


def micro_time(at: float) -> str:
    """A ``MicroTime`` (``renewTime``, ``acquireTime``) for the Unix time ``at``."""
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def lease_decision(spec: Mapping[str, Any], *, identity: str, now: float) -> str:
    """``renew`` (we hold it), ``acquire`` (free, released or expired) or ``wait``."""
    holder = spec.get("holderIdentity")
    if holder == identity:
        return "renew"
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if not holder or renewed is None or not isinstance(duration, int):
        return "acquire"
    return "acquire" if now > renewed + duration else "wait"


def timing_error(lease_duration: float, renew_deadline: float, retry_period: float) -> str | None:
    """Why these election timings are unsafe, or None: the leader must give up (renew
    deadline) before the Lease expires for the others, and retry more than once first."""
    if not retry_period > 0:
        return f"the retry period must be > 0 seconds (got {retry_period})"
    if not renew_deadline > retry_period:
        return (
            f"the renew deadline ({renew_deadline} s) must be longer than the retry period "
            f"({retry_period} s)"
        )
    if not lease_duration > renew_deadline:
        return (
            f"the lease duration ({lease_duration} s) must be longer than the renew "
            f"deadline ({renew_deadline} s), or two replicas could lead at once"
        )
    return None


@dataclass
class Term:
    """This replica's own leadership, from attempt outcomes (pure; monotonic seconds).

    ``observe(outcome, started)``: ``True`` the attempt begun at ``started`` holds the
    Lease, ``False`` another replica holds it, ``None`` the attempt failed (API error):
    we keep leading until the renew deadline, as we may still hold it.
    """

    renew_deadline: float
    renewed_at: float | None = None
    """Start of the last successful attempt of the current term (None: not leading)."""
    number: int = 0
    """Terms begun so far; a term's catch-up counts only while it is still current."""
    caught_up: bool = False

    def holds(self, now: float) -> bool:
        return self.renewed_at is not None and now - self.renewed_at < self.renew_deadline

    def leading(self, now: float) -> bool:
        """Decide now: the Lease is ours (renewed within the deadline) and caught up."""
        return self.caught_up and self.holds(now)

    def observe(self, outcome: bool | None, started: float) -> str:
        """Record one attempt: ``acquired`` (a new term), ``renewed``, ``kept`` (an error
        within the deadline), ``lost`` (the term ended) or ``following``."""
        if outcome:
            if self.holds(started):
                self.renewed_at = started
                return "renewed"
            self.renewed_at = started
            self.number += 1
            self.caught_up = False
            return "acquired"
        if outcome is None and self.holds(started):
            return "kept"
        was = self.renewed_at is not None
        self.renewed_at = None
        self.caught_up = False
        return "lost" if was else "following"

    def mark_caught_up(self, number: int) -> bool:
        """The catch-up of term ``number`` is done; True if that term is still current."""
        if number == self.number and self.renewed_at is not None:
            self.caught_up = True
        return self.caught_up and number == self.number


# -- one attempt ------------------------------------------------------------------------------


@dataclass
class LeaseElector:
    """Acquire, renew or release one Lease by compare-and-swap (see the module docstring)."""

    api: LeaseApi
    namespace: str
    name: str
    identity: str
    duration: int = 15
    wall: Callable[[], float] = time.time

    async def try_lead(self) -> bool:
        """Acquire or renew the Lease; True while we hold it."""
        now = self.wall()
        lease = await self.api.read_lease(self.namespace, self.name)
        if lease is None:
            body = self._body(None, self._spec(now, transitions=0, acquired=now))
            return await self.api.write_lease(self.namespace, body, create=True)
        spec = lease.get("spec") or {}
        decision = lease_decision(spec, identity=self.identity, now=now)
        if decision == "wait":
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if decision == "acquire":
            new = self._spec(now, transitions=transitions + 1, acquired=now)
        else:
            acquired = parse_time(spec.get("acquireTime")) or now
            new = self._spec(now, transitions=transitions, acquired=acquired)
        return await self.api.write_lease(self.namespace, self._body(lease, new), create=False)

    async def release(self) -> bool:
        """Give the Lease up if we hold it (no holder: the next attempt elsewhere takes it
        at once rather than after the lease duration). True if released."""
        lease = await self.api.read_lease(self.namespace, self.name)
        spec = (lease or {}).get("spec") or {}
        if lease is None or spec.get("holderIdentity") != self.identity:
            return False
        now = micro_time(self.wall())
        new = {
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0),
        }
        return await self.api.write_lease(self.namespace, self._body(lease, new), create=False)

    def _body(self, lease: Mapping[str, Any] | None, spec: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            meta["resourceVersion"] = (lease.get("metadata") or {}).get("resourceVersion")
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def _spec(self, now: float, *, transitions: int, acquired: float) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration,
            "acquireTime": micro_time(acquired),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }


# -- the loop ---------------------------------------------------------------------------------


@dataclass
class Leadership:
    """Keeps trying to lead every ``retry_period`` seconds; ``leading()`` says whether this
    replica may decide now. ``catch_up`` runs once per new term, before it leads."""

    elector: LeaseElector
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    catch_up: Callable[[], Awaitable[None]] | None = None
    on_change: Callable[[bool], None] | None = None
    advertise: Callable[[bool], Awaitable[None]] | None = None
    """Tells the world whether we lead (the extender labels its own pod, which the
    Service selects); called when ``leading()`` changes, and again until it succeeds."""
    clock: Callable[[], float] = time.monotonic
    term: Term = field(init=False)
    _catching_up: asyncio.Task[None] | None = field(default=None, init=False)
    _advertised: bool | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.term = Term(self.renew_deadline)

    def leading(self) -> bool:
        return self.term.leading(self.clock())

    async def attempt(self) -> str:
        """One acquire-or-renew attempt; returns what ``Term.observe`` said."""
        started = self.clock()
        outcome: bool | None
        try:
            outcome = await asyncio.wait_for(self.elector.try_lead(), self.renew_deadline)
        except Exception as exc:  # API down, timeout, refused: unknown, not lost
            log.warning("lease %s/%s: attempt failed: %r", self.elector.namespace,
                        self.elector.name, exc)  # fmt: skip
            outcome = None
        was_leading = self.leading()
        what = self.term.observe(outcome, started)
        if what == "acquired":
            log.info("lease %s/%s acquired as %s (term %d); catching up", self.elector.namespace,
                     self.elector.name, self.elector.identity, self.term.number)  # fmt: skip
            self._start_catch_up(self.term.number)
        elif what == "lost" and was_leading:
            log.warning("lease %s/%s lost: no longer deciding", self.elector.namespace,
                        self.elector.name)  # fmt: skip
            self._changed(False)
        return what

    def _start_catch_up(self, number: int) -> None:
        if self._catching_up is not None:
            self._catching_up.cancel()

        async def run() -> None:
            while self.catch_up is not None:
                try:
                    await self.catch_up()
                    break
                except Exception:  # never hold the Lease without ever deciding
                    log.exception("term %d: catching up failed; retrying", number)
                    await asyncio.sleep(self.retry_period)
                if number != self.term.number or self.term.renewed_at is None:
                    return  # that term is over
            if self.term.mark_caught_up(number):
                log.info("term %d caught up: leading", number)
                self._changed(True)
                await self.reconcile_advert()

        self._catching_up = asyncio.create_task(run(), name="leader-catch-up")

    async def reconcile_advert(self) -> None:
        """Make the advertised state match ``leading()`` (no call when it already does)."""
        want = self.leading()
        if self.advertise is None or want == self._advertised:
            return
        try:
            await self.advertise(want)
            self._advertised = want
        except Exception as exc:
            log.warning("advertising leading=%s failed (retried): %r", want, exc)

    def _changed(self, leading: bool) -> None:
        if self.on_change is not None:
            self.on_change(leading)

    async def run(self, stop: asyncio.Event) -> None:
        """Attempt every ``retry_period`` until ``stop`` is set."""
        try:
            while not stop.is_set():
                try:
                    await self.attempt()
                    await self.reconcile_advert()
                except Exception:
                    log.exception("leader election attempt failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.retry_period)
        finally:
            if self._catching_up is not None:
                self._catching_up.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._catching_up

    async def step_down(self, drained: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop deciding, wait for ``drained`` (decisions already made to land), then
        release the Lease so another replica takes over without waiting it out."""
        held = self.term.renewed_at is not None
        self.term.observe(False, self.clock())
        if not held:
            return
        self._changed(False)
        await self.reconcile_advert()
        if drained is not None:
            await drained()
        try:
            if await self.elector.release():
                log.info("lease %s/%s released", self.elector.namespace, self.elector.name)
        except (FairshareError, OSError) as exc:
            log.warning("lease release failed (it will expire): %s", exc)


# -- kubernetes_asyncio ------------------------------------------------------------------------


class KubeLeaseApi:
    """``LeaseApi`` over a kubernetes_asyncio ``ApiClient`` (raw JSON in and out)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client  # only with the API: a --state run needs none

        # Raw JSON (``_preload_content=False``): the generated models are not used.
        self.coordination: Any = client.CoordinationV1Api(api_client)

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, data = await call_raw(
            self.coordination.read_namespaced_lease(name, namespace, _preload_content=False)
        )
        if status == 404:
            return None
        if status != 200:
            raise FairshareError(f"reading Lease {namespace}/{name}: HTTP {status}")
        return data

    async def write_lease(self, namespace: str, body: dict[str, Any], *, create: bool) -> bool:
        name = body["metadata"]["name"]
        if create:
            call = self.coordination.create_namespaced_lease(
                namespace, body, _preload_content=False
            )
        else:
            call = self.coordination.replace_namespaced_lease(
                name, namespace, body, _preload_content=False
            )
        status, data = await call_raw(call)
        if 200 <= status < 300:
            return True
        if status in (409, 422):
            return False  # another replica won the compare-and-swap
        raise FairshareError(f"writing Lease {namespace}/{name}: HTTP {status}: {data}")


class KubePodLabel:
    """Sets or removes one label on one pod (merge patch): a replica's own pod."""

    def __init__(self, api_client: Any, namespace: str, name: str, key: str) -> None:
        from kubernetes_asyncio import client

        self.core: Any = client.CoreV1Api(api_client)
        self.namespace, self.name, self.key = namespace, name, key

    async def __call__(self, on: bool) -> None:
        body = {"metadata": {"labels": {self.key: "true" if on else None}}}
        status, data = await call_raw(
            self.core.patch_namespaced_pod(
                self.name, self.namespace, body,
                _content_type="application/merge-patch+json", _preload_content=False,
            )
        )  # fmt: skip
        if not 200 <= status < 300:
            raise FairshareError(
                f"labelling pod {self.namespace}/{self.name}: HTTP {status}: "
                f"{data.get('message', '')}"
            )


async def write_configmap(core: Any, body: dict[str, Any], *, key: str) -> bool:
    """Create or replace the ConfigMap ``body`` (namespace and name in its metadata) with
    kubernetes_asyncio's ``CoreV1Api`` ``core``: replaced over the version read (a
    concurrent writer makes the replace fail, never lost silently); left alone when its
    ``data[key]`` already holds the same text (False). Raises ``FairshareError``."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    status, current = await call_raw(
        core.read_namespaced_config_map(name, namespace, _preload_content=False)
    )
    if status == 404:
        call = core.create_namespaced_config_map(namespace, body, _preload_content=False)
    elif 200 <= status < 300:
        if (current.get("data") or {}).get(key) == body["data"][key]:
            return False
        meta["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
        call = core.replace_namespaced_config_map(name, namespace, body, _preload_content=False)
    else:
        raise FairshareError(f"reading ConfigMap {namespace}/{name}: HTTP {status}")
    status, data = await call_raw(call)
    if not 200 <= status < 300:
        raise FairshareError(
            f"writing ConfigMap {namespace}/{name}: HTTP {status}: {data.get('message', '')}"
        )
    return True


def json_configmap(
    name: str, namespace: str, key: str, data: Mapping[str, Any], *, stamp_annotation: str
) -> dict[str, Any]:
    """A ConfigMap holding ``data`` as sorted JSON under ``key``, stamped with the time
    of writing (UTC, seconds) in ``stamp_annotation``: the body ``write_configmap``
    writes for the leader's records (usage history, lost runs)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "fairshare"},
            "annotations": {stamp_annotation: stamp},
        },
        "data": {key: json.dumps(data, sort_keys=True)},
    }


async def evict_pod(
    core: Any, namespace: str, name: str, *, grace: int | None = None
) -> tuple[int, str]:
    """Ask the Eviction API (``policy/v1``, so PodDisruptionBudgets hold) to evict pod
    ``namespace/name`` with kubernetes_asyncio's ``CoreV1Api`` ``core``; ``grace``: its
    grace period in seconds (None: the pod's own). Returns the HTTP status (2xx
    accepted, 429 a budget refused, 404 already gone) and the API's message."""
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if grace is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace}
    status, data = await call_raw(
        core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False)
    )
    return status, str(data.get("message") or f"HTTP {status}")


async def call_raw(request: Awaitable[Any]) -> tuple[int, dict[str, Any]]:
    """Await a raw (``_preload_content=False``) call: HTTP status and decoded JSON body.

    Raw calls do not raise ``ApiException`` for error statuses: callers check the status.
    """
    resp = await request
    try:
        raw = await resp.read()
    finally:
        resp.release()
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        data = {"message": raw[:200].decode("utf-8", "replace")}
    return int(resp.status), data if isinstance(data, dict) else {}


__all__ = [
    "KubeLeaseApi",
    "KubePodLabel",
    "Leadership",
    "LeaseApi",
    "LeaseElector",
    "Term",
    "call_raw",
    "lease_decision",
    "micro_time",
    "parse_time",
    "timing_error",
    "write_configmap",
]
