"""Handoff ``reservation``, the adapter: reservation pods, ConfigMaps, events, cleanup.
Every decision is ``handoff``'s.

* **Bind** (``before_binding``): the first pod of a new shared GPU creates the group's
  reservation pod (one quick POST; bind never waits for the GPU's report).
* **Sweep** (``run``), on watch changes and every ``PERIOD`` seconds while leading: write
  each waiting pod's ConfigMap once its reservation reported a UUID; delete reservations
  without live pods (or duplicate, or finished); recreate a missing one while no pod of
  the group has its GPU; warn, on the pods and in a metric, about a reservation that never
  reported within ``reportTimeoutSeconds`` (``GPUReportTimeout``) or went away while its
  pods run (``GPUReservationLost``).

Everything it needs is in the cluster, so a restarted extender picks up where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from kubernetes_asyncio import client as k8s_client

import serving
from extender import events, handoff, verbs
from extender.cache import Cache
from extender.leader import call_raw
from fairshare.config.schema import FairShareConfig
from fairshare.metrics import Metrics
from fairshare.resources import ANN_GPU_UUID, MILLI_GPU
from fairshare.state.objects import DRA_GROUP_PREFIX

log = logging.getLogger("fairshare.extender.handoff")

_client: Any = k8s_client
PERIOD: Final = 2.0
COMPONENT: Final = "fairshare-extender"
REASON_TIMEOUT: Final = "GPUReportTimeout"
REASON_LOST: Final = "GPUReservationLost"
REASON_CONFLICT: Final = "GPUConfigMapConflict"
REASON_READY: Final = "GPUAssigned"


def _portion(milli: float) -> str:
    return f"{milli / MILLI_GPU:g}"


class HandoffController:
    """Bind hooks and the sweep of the reservation handoff (see the module docstring)."""

    def __init__(
        self,
        *,
        api_client: Any,
        cache: Cache,
        config: Callable[[], FairShareConfig],
        metrics: Metrics,
        synced: asyncio.Event,
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self.core = _client.CoreV1Api(api_client)
        self.cache = cache
        self.config = config
        self.synced = synced
        # Hook for several replicas: only the leader sweeps (binds already only reach it).
        self.is_leader = is_leader
        self.wake = asyncio.Event()
        self.bound_at: dict[str, float] = {}
        self.pending_create: dict[str, float] = {}
        self.waiting_since: dict[str, float] = {}
        self.warned: set[str] = set()
        self.lost_warned: set[str] = set()
        """Pods told that their shared GPU lost its reservation."""
        self.done: set[str] = set()
        self.deleting: dict[str, float] = {}
        """Reservation pods whose delete was sent (the watch may still show them)."""
        self.handoff_seconds = metrics.gpu_handoff_seconds
        self.problems = metrics.gpu_handoff_problems
        self.reservation_ops = metrics.gpu_reservations
        cache.on_change = self.wake.set

    # -- bind hooks ---------------------------------------------------------------------

    async def before_binding(self, plan: verbs.BindPlan) -> verbs.BindPlan | str:
        """Create the reservation of a new shared GPU; the plan, or why bind must fail."""
        config = self.config()
        if config.gpu_sharing.handoff != "reservation" or not plan.new_group:
            return plan
        pod = self.cache.pods.get(plan.uid)
        if pod is None or handoff.member_of(plan.uid, pod) is None:
            return plan  # not prepared by the webhook: accounting only
        err = await self._create_reservation(plan.group, plan.node, config)
        return plan if not err else f"cannot reserve the shared GPU on {plan.node}: {err}"

    async def binding_failed(self, plan: verbs.BindPlan) -> None:
        """Nothing to undo: the sweep deletes a reservation whose group stayed empty."""

    def after_binding(self, plan: verbs.BindPlan, started: float) -> None:
        if plan.group:
            self.bound_at[plan.uid] = started
            self.waiting_since.setdefault(plan.uid, time.monotonic())
            self.wake.set()

    async def _create_reservation(self, group: str, node: str, config: FairShareConfig) -> str:
        policy = config.gpu_sharing.reservation
        body = handoff.reservation_pod(group, node, policy)
        status, data = await call_raw(
            self.core.create_namespaced_pod(policy.namespace, body, _preload_content=False)
        )
        if status == 409:
            return ""  # the same name: this group's reservation already exists
        if not 200 <= status < 300:
            where = f"{policy.namespace}/{body['metadata']['name']}"
            return f"creating pod {where}: HTTP {status} {data.get('message', '')}"
        self.pending_create[group] = time.monotonic()
        self.reservation_ops.labels("created").inc()
        log.info("reservation %s for shared GPU %s on %s", body["metadata"]["name"], group, node)
        return ""

    # -- the sweep ----------------------------------------------------------------------

    def background(self) -> Callable[[Any], AsyncIterator[None]]:
        """A ``cleanup_ctx`` running the sweep loop."""
        return serving.background_task(self.run, "gpu-handoff")

    async def run(self) -> None:
        await self.synced.wait()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), PERIOD)
            self.wake.clear()
            if not self.is_leader():
                continue
            try:
                await self.sweep()
            except Exception:
                log.exception("GPU handoff sweep failed")
                self.problems.labels("api_error").inc()

    def _groups(self) -> dict[str, tuple[str, list[handoff.Member]]]:
        out: dict[str, tuple[str, list[handoff.Member]]] = {}
        for gid, shared in self.cache.state.groups.items():
            if gid.startswith(DRA_GROUP_PREFIX):
                continue  # a DRA device: its driver hands it over, no reservation pod
            members = []
            for uid in shared.members:
                pod = self.cache.pods.get(uid)
                m = handoff.member_of(uid, pod) if pod is not None else None
                if m is not None:
                    members.append(m)
            out[gid] = (shared.node, members)
        return out

    async def sweep(self) -> None:
        config = self.config()
        policy = config.gpu_sharing.reservation
        now = time.monotonic()
        groups = self._groups()
        live = {m.uid for _, ms in groups.values() for m in ms}
        for m_uid in [u for u in self.waiting_since if u not in live]:
            self.waiting_since.pop(m_uid, None)
            self.bound_at.pop(m_uid, None)
        self.done &= live
        self.warned &= live
        for m in (m for _, ms in groups.values() for m in ms):
            if not m.uuid and m.uid not in self.done:
                self.waiting_since.setdefault(m.uid, now)
        for seen in {r.group for r in self.cache.reservations.values()}:
            # The watch shows it: no longer "created, maybe not seen yet".
            self.pending_create.pop(seen, None)
        plan = handoff.plan_sweep(
            groups=groups,
            reservations=list(self.cache.reservations.values()),
            pending_create=self.pending_create,
            waiting_since=self.waiting_since,
            warned=self.warned,
            done=self.done,
            now=now,
            timeout=policy.report_timeout_seconds,
        )
        for r in plan.delete:
            await self._delete(r)
        active = config.gpu_sharing.handoff == "reservation"
        if not active:
            return
        for group, node in plan.create:
            err = await self._create_reservation(group, node, config)
            if err:
                log.warning("recreating the reservation of %s: %s", group, err)
        await asyncio.gather(*(self._write(m, uuid) for m, uuid, _ in plan.write))
        for m, group in plan.overdue:
            self.warned.add(m.uid)
            self.problems.labels("report_timeout").inc()
            await self._event(
                m,
                REASON_TIMEOUT,
                f"shared GPU {group}: its reservation pod (namespace {policy.namespace}, label "
                f"{handoff.LABEL_GROUP}={group}) has not reported a GPU UUID "
                f"({handoff.ANN_RESERVED_UUID}) within {policy.report_timeout_seconds:g}s; the "
                "pod waits for its ConfigMap. Check the reservation pod's status and logs "
                "(image, runtimeClass, device plugin).",
            )
        for group in plan.lost:
            # Its GPU is no longer held: no new share may join it.
            self.cache.close_group(group)
            fresh = [m for m in groups[group][1] if m.uid not in self.lost_warned]
            if fresh:
                self.problems.labels("reservation_lost").inc()
            for m in fresh:
                self.lost_warned.add(m.uid)
                await self._event(
                    m,
                    REASON_LOST,
                    f"shared GPU {group} lost its reservation pod: its GPU is no longer held "
                    "for the pods sharing it and may be given to another pod; delete and "
                    "recreate this pod to get a reserved GPU again.",
                )
        self.lost_warned &= live
        for group in [g for g, t in self.pending_create.items() if now - t > handoff.CREATE_GRACE]:
            self.pending_create.pop(group, None)

    async def _delete(self, r: handoff.Reservation) -> None:
        now = time.monotonic()
        if now - self.deleting.get(r.uid, -handoff.CREATE_GRACE) < handoff.CREATE_GRACE:
            return
        self.deleting = {u: t for u, t in self.deleting.items() if now - t < handoff.CREATE_GRACE}
        self.deleting[r.uid] = now
        status, data = await call_raw(
            self.core.delete_namespaced_pod(
                r.name,
                r.namespace,
                grace_period_seconds=0,
                _preload_content=False,
            )
        )
        if 200 <= status < 300:
            self.reservation_ops.labels("deleted").inc()
            log.info("reservation %s/%s of shared GPU %s deleted", r.namespace, r.name, r.group)
        elif status != 404:
            self.deleting.pop(r.uid, None)
            log.warning("deleting reservation %s: HTTP %s %s", r.name, status, data.get("message"))

    async def _write(self, m: handoff.Member, uuid: str) -> None:
        bound = self.cache.state.pods.get(m.uid)
        if bound is None or not bound.devices:
            return
        body = handoff.configmap_body(
            name=m.configmap,
            namespace=m.namespace,
            pod_name=m.name,
            pod_uid=m.uid,
            uuid=uuid,
            portion=_portion(bound.devices[0][1]),
        )
        status, data = await call_raw(
            self.core.create_namespaced_config_map(m.namespace, body, _preload_content=False)
        )
        if status == 409:
            status, data = await self._existing(m)
        if not 200 <= status < 300:
            if status == 409:
                self.warned.add(m.uid)
                self.done.add(m.uid)
                self.problems.labels("configmap_conflict").inc()
                await self._event(m, REASON_CONFLICT, str(data.get("message", "")))
            else:
                log.warning("ConfigMap %s/%s: HTTP %s %s", m.namespace, m.configmap, status,
                            data.get("message"))  # fmt: skip
            return
        self.done.add(m.uid)
        started = self.bound_at.pop(m.uid, None)
        if started is not None:
            self.handoff_seconds.observe(time.monotonic() - started)
        self.waiting_since.pop(m.uid, None)
        status, _ = await call_raw(
            self.core.patch_namespaced_pod(
                m.name,
                m.namespace,
                {"metadata": {"annotations": {ANN_GPU_UUID: uuid}}},
                _preload_content=False,
            )
        )
        if not 200 <= status < 300 and status != 404:
            log.warning("annotating %s/%s: HTTP %s", m.namespace, m.name, status)
        await self._event(m, REASON_READY, f"GPU {uuid} handed over in ConfigMap {m.configmap}",
                          warning=False)  # fmt: skip

    async def _existing(self, m: handoff.Member) -> tuple[int, dict[str, Any]]:
        """The ConfigMap exists: done if it is this pod's own (written before a restart,
        the group's UUID never changes), else a conflict. Never rewritten: the extender
        may create ConfigMaps but not update any."""
        status, current = await call_raw(
            self.core.read_namespaced_config_map(m.configmap, m.namespace, _preload_content=False)
        )
        if status != 200:
            return status, current
        owners = (current.get("metadata") or {}).get("ownerReferences") or []
        if any(o.get("uid") == m.uid for o in owners):
            return 200, current
        return 409, {
            "message": f"ConfigMap {m.namespace}/{m.configmap} exists and is not this pod's: "
            "its GPU was not handed over; recreate the pod under another name"
        }

    async def _event(
        self, m: handoff.Member, reason: str, message: str, *, warning: bool = True
    ) -> None:
        body = events.event_body(
            m.namespace, m.name, m.uid, reason, message, warning=warning, component=COMPONENT
        )
        status, _ = await call_raw(
            self.core.create_namespaced_event(m.namespace, body, _preload_content=False)
        )
        if not 200 <= status < 300:
            log.warning("event %s on %s/%s: HTTP %s", reason, m.namespace, m.name, status)
