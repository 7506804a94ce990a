"""The quarantine of failed GPU nodes (``health.quarantine``, opt-in), run by the leader.

Every ``interval`` seconds, while this replica leads and its watches are synced, the
``Quarantiner`` plans over the cache's Nodes (``fairshare.quarantine.plan_quarantine``)
and carries the plan out:

* **cordon** a failed node: ``spec.unschedulable``, the label ``fairshare.io/quarantine``
  and the annotations of when and why, in one merge patch conditioned on the node's
  ``resourceVersion`` (a node changed meanwhile, e.g. cordoned by hand, answers 409 and
  is planned again next round); a Warning Event on the node;
* **drain** (``drain: true``) the pods of each node fairshare holds cordoned: listed from
  the API (DaemonSet pods and mirror pods stay, as ``kubectl drain`` leaves them), each
  evicted through the Eviction API, so PodDisruptionBudgets hold. A pod of a pod group
  (``Cache.group_of``) takes its whole group with it, on every node, as reclaim does; a
  budget that refuses the group's first member keeps the whole group for
  ``PDB_BACKOFF`` seconds, a refusal after that keeps that member. A 429 is tried again
  in a later round, never forced. An Event on each evicted pod says why;
* **uncordon** a node fairshare cordoned once its signals cleared (label and reason
  removed; the time stays, for the circuit breaker); an Event on the node;
* a node fairshare cordoned and someone uncordoned while its signal persists loses the
  label and gets ``fairshare.io/quarantine-overridden``: it is not cordoned again until
  its signal clears;
* the **circuit breaker**: a failed node past the breaker's limit is held back; the
  breaker's state is exported (``fairshare_quarantine_breaker_open``), shown on
  ``/quarantine.json`` and told once per held-back node in a Warning Event.

The cache sees the controller's own patches a moment later; until then the node as the
patch returned it stands in for the cache's copy, so a round never counts a node twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from extender.cache import Cache
from extender.events import event_body
from extender.leader import call_raw, evict_pod
from fairshare import metrics as metrics_mod
from fairshare import quarantine as q
from fairshare.config.schema import FairShareConfig
from fairshare.state.readers import is_terminal

log = logging.getLogger("fairshare.extender.quarantine")

INTERVAL: Final = 5.0
"""Seconds between two rounds."""
PDB_BACKOFF: Final = 30.0
"""Seconds a pod whose eviction a PodDisruptionBudget refused is not tried again."""
IN_FLIGHT: Final = 120.0
"""Seconds an evicted pod is not asked again while it terminates."""
OVERLAY_TTL: Final = 30.0
"""Seconds a node as the controller's patch returned it stands in for the cache's copy."""
REASON_QUARANTINED: Final = "FairShareQuarantined"
REASON_DRAINED: Final = "FairShareQuarantineDrained"
REASON_LIFTED: Final = "FairShareQuarantineLifted"
REASON_OVERRIDDEN: Final = "FairShareQuarantineOverridden"
REASON_BREAKER: Final = "FairShareQuarantineBreakerOpen"
REASON_EVICTED: Final = "FairShareNodeQuarantined"
REASON_BLOCKED: Final = "FairShareQuarantineDrainBlocked"
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class Outcome:
    """An API call's result: ``done``, ``conflict`` (409), ``gone`` (404), ``blocked``
    (429 on an eviction) or ``failed``; ``node`` is the patched Node when one came back."""

    outcome: str
    message: str = ""
    node: dict[str, Any] | None = None


class QuarantineApi(Protocol):
    """What the controller does to the cluster (a fake in unit tests)."""

    async def patch_node(self, name: str, body: dict[str, Any]) -> Outcome: ...

    async def node_pods(self, name: str) -> list[dict[str, Any]]: ...

    async def evict(self, namespace: str, name: str) -> Outcome: ...

    async def event(self, body: dict[str, Any]) -> None: ...


def node_event(
    node: Mapping[str, Any], reason: str, message: str, *, warning: bool
) -> dict[str, Any]:
    """A core/v1 Event on a Node (in namespace ``default``, where node Events live)."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    body = event_body("default", name, str(meta.get("uid") or name), reason, message,
                      warning=warning)  # fmt: skip
    body["involvedObject"] = {"apiVersion": "v1", "kind": "Node", "name": name,
                              "uid": str(meta.get("uid") or name)}  # fmt: skip
    return body


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def stays(pod: Mapping[str, Any]) -> bool:
    """Is this a pod a drain leaves (a DaemonSet's, a mirror pod, one already finished or
    going)?"""
    meta = _meta(pod)
    owners = meta.get("ownerReferences")
    if isinstance(owners, list) and any(
        isinstance(o, Mapping) and o.get("kind") == "DaemonSet" for o in owners
    ):
        return True
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and MIRROR_ANNOTATION in annotations:
        return True
    return bool(meta.get("deletionTimestamp")) or is_terminal(pod)


@dataclass
class Quarantiner:
    """One quarantine round per ``tick`` (module docstring)."""

    cache: Cache
    config: Callable[[], FairShareConfig]
    api: QuarantineApi
    metrics: metrics_mod.Metrics
    is_leader: Callable[[], bool] = lambda: True
    synced: Callable[[], bool] = lambda: True
    wall_clock: Callable[[], float] = time.time
    clock: Callable[[], float] = time.monotonic
    overlay: dict[str, tuple[dict[str, Any], bool, float]] = field(default_factory=dict)
    """node -> (the node as a patch returned it, whether it carries the label, when)."""
    protected: dict[str, float] = field(default_factory=dict)
    """pod uid -> monotonic time until which a PodDisruptionBudget refusal protects it."""
    in_flight: dict[str, float] = field(default_factory=dict)
    told_breaker: set[str] = field(default_factory=set)
    told_blocked: set[str] = field(default_factory=set)
    """Pods already told that a PodDisruptionBudget holds their eviction (told once)."""
    drained: set[str] = field(default_factory=set)
    last: q.QuarantinePlan | None = None
    state: str = "disabled"
    """``disabled``, ``standby`` (not leading or not synced) or ``active``."""

    def status(self) -> dict[str, Any]:
        """What ``/quarantine.json`` shows: the state and the last round's plan."""
        out: dict[str, Any] = {"state": self.state}
        if self.last is not None and self.state == "active":
            out.update(self.last.as_dict())
        return out

    def nodes(self) -> list[Mapping[str, Any]]:
        """The cache's Nodes, with the controller's own patches the cache has not seen."""
        now = self.clock()
        out: dict[str, Mapping[str, Any]] = dict(self.cache.nodes)
        for name, (node, labelled, at) in list(self.overlay.items()):
            cached = out.get(name)
            seen = (
                cached is not None
                and ((_meta(cached).get("labels") or {}).get(q.LABEL) == q.LABEL_VALUE) == labelled
            )
            if cached is None or seen or now - at > OVERLAY_TTL:
                del self.overlay[name]
            else:
                out[name] = node
        return list(out.values())

    def _quiet(self, state: str) -> None:
        self.state = state
        self.metrics.set_quarantine(
            breaker_open=False,
            nodes={s: 0 for s in ("cordoned", "held_back", "others", "remediator", "by_hand")},
            window_nodes=0,
            limit=0,
        )

    async def tick(self) -> q.QuarantinePlan | None:
        """One round: plan, act, export. None when the quarantine is off or this
        replica does not act."""
        config = self.config()
        if not config.health.quarantine.enabled:
            self._quiet("disabled")
            return None
        if not self.is_leader() or not self.synced():
            self._quiet("standby")
            return None
        self.state = "active"
        plan = q.plan_quarantine(self.nodes(), config.health, self.wall_clock())
        self.last = plan
        self._export(plan)
        for name, reason in plan.cordon:
            await self._cordon(name, reason)
        for name in plan.uncordon:
            await self._uncordon(name)
        for name in plan.released:
            await self._release(name, plan)
        for name in plan.forget_override:
            forget = {"metadata": {"annotations": {q.ANN_OVERRIDDEN: None}}}
            await self._patch(name, "forget_override", forget, None)
        await self._tell_breaker(plan)
        if config.health.quarantine.drain:
            newly = [n for n, _ in plan.cordon if n in self.overlay]
            for name in sorted(set(plan.drain) | set(newly)):
                await self._drain(name)
        self.drained &= set(plan.drain) | {n for n, _ in plan.cordon}
        self.told_blocked &= set(self.cache.pods)
        return plan

    def _export(self, plan: q.QuarantinePlan) -> None:
        self.metrics.set_quarantine(
            breaker_open=plan.breaker.open,
            nodes={
                "cordoned": len(plan.drain) + len(plan.held) + len(plan.cordon),
                "held_back": len(plan.breaker.held_back),
                "others": len(plan.others),
                "remediator": len(plan.remediated),
                "by_hand": len(plan.by_hand) + len(plan.released),
            },
            window_nodes=len(plan.breaker.used) + len(plan.cordon),
            limit=plan.breaker.limit,
        )

    def _node(self, name: str) -> Mapping[str, Any] | None:
        held = self.overlay.get(name)
        return held[0] if held is not None else self.cache.nodes.get(name)

    async def _patch(
        self, name: str, action: str, body: dict[str, Any], labelled: bool | None
    ) -> Outcome | None:
        node = self._node(name)
        if node is None:
            return None
        version = _meta(node).get("resourceVersion")
        if isinstance(version, str) and version:
            body.setdefault("metadata", {})["resourceVersion"] = version
        try:
            result = await self.api.patch_node(name, body)
        except Exception as exc:  # the next round tries again
            result = Outcome("failed", str(exc))
        self.metrics.count_quarantine_action(action, result.outcome)
        if result.outcome == "done":
            if labelled is not None and result.node is not None:
                self.overlay[name] = (result.node, labelled, self.clock())
            return result
        if result.outcome == "conflict":
            log.info("quarantine %s of node %s: changed meanwhile, planned again", action, name)
        else:
            log.warning("quarantine %s of node %s failed: %s", action, name, result.message)
        return None

    async def _cordon(self, name: str, reason: str) -> None:
        body = {
            "metadata": {
                "labels": {q.LABEL: q.LABEL_VALUE},
                "annotations": {q.ANN_AT: q.format_time(self.wall_clock()),
                                q.ANN_REASON: reason[:1024]},
            },
            "spec": {"unschedulable": True},
        }  # fmt: skip
        done = await self._patch(name, "cordon", body, True)
        if done is None or done.node is None:
            return
        drain = self.config().health.quarantine.drain
        text = (
            f"fairshare cordoned this node: its GPUs report a fatal fault ({reason}). "
            + ("Its pods are evicted (pod groups whole, within PodDisruptionBudgets); "
               if drain else "Its pods are left running (drain: false); ")
            + "it is uncordoned when the signal clears."
        )  # fmt: skip
        log.warning("quarantined node %s: %s", name, reason)
        await self.api.event(node_event(done.node, REASON_QUARANTINED, text, warning=True))

    async def _uncordon(self, name: str) -> None:
        body = {
            "metadata": {"labels": {q.LABEL: None}, "annotations": {q.ANN_REASON: None}},
            "spec": {"unschedulable": None},
        }
        done = await self._patch(name, "uncordon", body, False)
        if done is None or done.node is None:
            return
        log.info("quarantine of node %s lifted: its GPU signals cleared", name)
        text = "fairshare uncordoned this node: its GPU fault signals cleared."
        await self.api.event(node_event(done.node, REASON_LIFTED, text, warning=False))

    async def _release(self, name: str, plan: q.QuarantinePlan) -> None:
        del plan  # the release is the same whatever else the round does
        body = {
            "metadata": {
                "labels": {q.LABEL: None},
                "annotations": {q.ANN_REASON: None,
                                q.ANN_OVERRIDDEN: q.format_time(self.wall_clock())},
            },
        }  # fmt: skip
        done = await self._patch(name, "release", body, False)
        if done is None or done.node is None:
            return
        log.warning("node %s was uncordoned by hand; fairshare leaves it in service", name)
        text = (
            "this node, cordoned by fairshare, was uncordoned by someone else while its GPU "
            "fault persists: fairshare leaves it in service and does not cordon it again "
            "until the signal clears."
        )
        await self.api.event(node_event(done.node, REASON_OVERRIDDEN, text, warning=True))

    async def _tell_breaker(self, plan: q.QuarantinePlan) -> None:
        b = plan.breaker
        held = set(b.held_back)
        for name in sorted(held - self.told_breaker):
            node = self._node(name)
            if node is None:
                continue
            log.warning(
                "quarantine circuit breaker open: node %s not cordoned (%d of %d nodes "
                "quarantined within %.0fs: %s)",
                name, len(b.used), b.limit, b.window_seconds, ", ".join(b.used) or "none",
            )  # fmt: skip
            text = (
                f"this node's GPUs report a fatal fault but fairshare's quarantine circuit "
                f"breaker is open: {len(b.used)} of the {b.limit} node(s) allowed were "
                f"quarantined within {b.window_seconds:.0f}s. The node is left in service; "
                "check the fleet (a wider problem, such as a bad driver rollout, trips it)."
            )
            await self.api.event(node_event(node, REASON_BREAKER, text, warning=True))
        self.told_breaker = held

    def _batches(self, pods: list[dict[str, Any]]) -> list[list[Mapping[str, Any]]]:
        """The node's pods to evict, as decisions: a lone pod, or a pod group whole (its
        known members on any node, bound and not leaving)."""
        members = self.cache.group_members()
        seen: set[str] = set()
        out: list[list[Mapping[str, Any]]] = []
        for pod in sorted(pods, key=lambda p: (str(_meta(p).get("namespace")),
                                               str(_meta(p).get("name")))):  # fmt: skip
            uid = str(_meta(pod).get("uid", ""))
            if not uid or uid in seen or stays(pod):
                continue
            group = members.get(uid)
            if group is None:
                seen.add(uid)
                out.append([pod])
                continue
            batch: list[Mapping[str, Any]] = [pod]
            seen.add(uid)
            for other in group[1]:
                if other in seen:
                    continue
                mate = self.cache.pods.get(other)
                seen.add(other)
                if mate is None or stays(mate) or not (mate.get("spec") or {}).get("nodeName"):
                    continue
                batch.append(mate)
            out.append(batch)
        return out

    async def _drain(self, name: str) -> None:
        try:
            pods = await self.api.node_pods(name)
        except Exception as exc:
            log.warning("quarantine: cannot list the pods of node %s: %s", name, exc)
            return
        now = self.clock()
        for uid, until in list(self.protected.items()):
            if now >= until:
                del self.protected[uid]
        for uid, at in list(self.in_flight.items()):
            if now - at > IN_FLIGHT:
                del self.in_flight[uid]
        batches = self._batches(pods)
        if not batches:
            if name not in self.drained:
                self.drained.add(name)
                node = self._node(name)
                if node is not None:
                    text = "fairshare drained this quarantined node: no pod of a workload left."
                    await self.api.event(node_event(node, REASON_DRAINED, text, warning=False))
            return
        node = self._node(name)
        why = ""
        if node is not None:
            why = str((_meta(node).get("annotations") or {}).get(q.ANN_REASON, ""))
        for batch in batches:
            uids = [str(_meta(p).get("uid")) for p in batch]
            if any(u in self.protected or u in self.in_flight for u in uids[:1]):
                continue
            await self._evict_batch(name, why, batch, now)

    async def _evict_batch(
        self, node: str, why: str, batch: list[Mapping[str, Any]], now: float
    ) -> None:
        group = self.cache.group_of(str(_meta(batch[0]).get("uid")))
        went = 0
        for pod in batch:
            meta = _meta(pod)
            uid, ns, name = str(meta.get("uid")), str(meta.get("namespace")), str(meta.get("name"))
            if uid in self.in_flight or uid in self.protected:
                continue
            try:
                result = await self.api.evict(ns, name)
            except Exception as exc:
                result = Outcome("failed", str(exc))
            outcome = "evicted" if result.outcome in ("done", "gone") else result.outcome
            self.metrics.count_quarantine_eviction(outcome)
            if outcome == "evicted":
                went += 1
                self.in_flight[uid] = now
                self.told_blocked.discard(uid)
                if result.outcome == "gone":
                    continue
                where = str((pod.get("spec") or {}).get("nodeName") or node)
                text = (
                    f"evicted: node {node} is quarantined by fairshare, its GPUs report a "
                    f"fatal fault ({why or 'see the node'})"
                )
                if group is not None:
                    text += f"; the pod group {group.name} goes whole (this member ran on {where})"
                body = event_body(ns, name, uid, REASON_EVICTED, text, warning=True)
                await self.api.event(body)
                continue
            if outcome != "blocked":
                log.warning("quarantine eviction of %s/%s failed: %s", ns, name, result.message)
                continue
            if went == 0:
                for other in batch:  # the group stays whole: retried later, never forced
                    self.protected[str(_meta(other).get("uid"))] = now + PDB_BACKOFF
            else:
                self.protected[uid] = now + PDB_BACKOFF
            log.info("quarantine eviction of %s/%s refused: %s", ns, name, result.message)
            if uid in self.told_blocked:
                if went == 0:
                    return
                continue
            self.told_blocked.add(uid)
            text = (
                f"fairshare could not evict this pod from quarantined node {node}: a "
                f"PodDisruptionBudget refused it ({result.message}); tried again every "
                f"{PDB_BACKOFF:.0f}s, never forced"
            )
            await self.api.event(event_body(ns, name, uid, REASON_BLOCKED, text, warning=True))
            if went == 0:
                return

    def background(self, interval: float = INTERVAL) -> Callable[[Any], AsyncIterator[None]]:
        """An aiohttp ``cleanup_ctx``: rounds every ``interval`` seconds for the app's life."""

        async def loop(stop: asyncio.Event) -> None:
            while not stop.is_set():
                try:
                    await self.tick()
                except Exception:
                    log.exception("quarantine round failed")
                    self.metrics.count_unexpected_error("quarantine")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=interval)

        async def ctx(_app: Any) -> AsyncIterator[None]:
            stop = asyncio.Event()
            task = asyncio.create_task(loop(stop), name="quarantine")
            try:
                yield
            finally:
                stop.set()
                await task

        return ctx


class KubeQuarantineApi:
    """``QuarantineApi`` over a kubernetes_asyncio ``ApiClient`` (raw JSON in and out)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client

        self.core: Any = client.CoreV1Api(api_client)

    async def patch_node(self, name: str, body: dict[str, Any]) -> Outcome:
        status, data = await call_raw(
            self.core.patch_node(
                name, body, _content_type="application/merge-patch+json", _preload_content=False
            )
        )
        if 200 <= status < 300:
            return Outcome("done", node=data)
        message = str(data.get("message") or f"HTTP {status}")
        if status == 409:
            return Outcome("conflict", message)
        if status == 404:
            return Outcome("gone", message)
        return Outcome("failed", f"HTTP {status}: {message}")

    async def node_pods(self, name: str) -> list[dict[str, Any]]:
        status, data = await call_raw(
            self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={name}", _preload_content=False
            )
        )
        if not 200 <= status < 300:
            raise RuntimeError(f"HTTP {status}: {data.get('message', '')}")
        items = data.get("items")
        return [p for p in items if isinstance(p, dict)] if isinstance(items, list) else []

    async def evict(self, namespace: str, name: str) -> Outcome:
        status, message = await evict_pod(self.core, namespace, name)
        if 200 <= status < 300:
            return Outcome("done")
        if status == 429:
            return Outcome("blocked", message)
        if status == 404:
            return Outcome("gone", message)
        return Outcome("failed", f"HTTP {status}: {message}")

    async def event(self, body: dict[str, Any]) -> None:
        ns = str(body["metadata"]["namespace"])
        try:
            status, data = await call_raw(
                self.core.create_namespaced_event(ns, body, _preload_content=False)
            )
            if not 200 <= status < 300:
                log.warning("event %s: HTTP %s %s", body.get("reason"), status,
                            data.get("message", ""))  # fmt: skip
        except Exception as exc:  # an Event explains; it is never worth a failure
            log.warning("event %s: %s", body.get("reason"), exc)


__all__ = [
    "KubeQuarantineApi",
    "Outcome",
    "QuarantineApi",
    "Quarantiner",
    "node_event",
    "stays",
]
