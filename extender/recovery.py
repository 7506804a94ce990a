"""Runs lost to a hardware fault, on the extender (``health.recoverGangs``,
``health.forgiveFaults``; ``fairshare.recovery`` holds the pure rules, docs/recovery.md).

``LossTracker`` is a sink fed before the cache: it reads each Node's GPU health
(``hardware.read_node_health``), the DRA devices with a NoExecute taint (ResourceSlices,
DeviceTaintRules) and the devices each ResourceClaim holds, and, from the pod events,
the pods lost to hardware (a pod that ends while its node is fatal or gone or a device
of its claims has a NoExecute taint it does not tolerate, or fails on unhealthy GPUs; a
pod-group member as soon as its node turns fatal), with what they held (the cache's ledger, still
holding them when the tracker runs). Every replica keeps one, so a new leader knows the
losses its predecessor saw.

``Recovery`` runs on the leader every ``PERIOD`` seconds: for each pod group that lost a
member it evicts (Eviction API) the members bound before the loss, so that the group's
controller recreates it whole, with an Event on each (``HardwareRecovery``) and on the
lost ones (``LostToHardware``); it counts ``fairshare_gangs_recovered_total``; it keeps
the lost runs (``fairshare.recovery.LostRun``) in the ConfigMap
``fairshare-lost-runs`` (``fairshare explain`` reads them, and a new leader starts from
them). A PodDisruptionBudget that refuses an eviction is asked again next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import serving
from extender.cache import Cache
from extender.leader import call_raw, evict_pod, json_configmap, parse_time, write_configmap
from fairshare import dra, gangs, recovery
from fairshare import metrics as metrics_mod
from fairshare.config.schema import FairShareConfig
from fairshare.errors import FairshareError
from fairshare.hardware import NodeHealth, read_node_health
from fairshare.recovery import LostPod, LostRun
from fairshare.state import objects
from fairshare.state.cluster import BoundPod

log = logging.getLogger("fairshare.extender.recovery")

PERIOD: Final = 1.0
"""Seconds between two looks at the losses."""
CONFIGMAP: Final = "fairshare-lost-runs"
DATA_KEY: Final = "runs.json"
LOST_KEEP: Final = 6 * 3600.0
"""Seconds a lost pod is remembered (forgiveness by a later leader)."""
ASKED_KEEP: Final = 120.0
"""Seconds an accepted eviction is not asked again (the pod is on its way out)."""
UNLED_KEEP: Final = 60.0
"""Seconds a loss seen while not leading is kept, should this replica lead soon."""
REASON_RECOVERY: Final = "HardwareRecovery"
"""On a member fairshare evicts so that its group restarts whole."""
REASON_LOST: Final = "LostToHardware"
"""On a pod lost to a hardware fault."""
COMPONENT: Final = "fairshare-extender"
KIND_SLICE: Final = "ResourceSlice"
KIND_RULE: Final = "DeviceTaintRule"
KIND_CLAIM: Final = "ResourceClaim"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class LossTracker:
    """Node health and the pods lost to hardware, from the watch (module docstring)."""

    def __init__(
        self,
        cache: Cache,
        config: Callable[[], FairShareConfig],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache, self.config, self.clock = cache, config, clock
        self.health: dict[str, NodeHealth] = {}
        self.gone: set[str] = set()
        self.to_scan: set[str] = set()
        """Nodes that failed since the controller's last look (``scan``)."""
        self.bound_at: dict[str, float] = {}
        self.lost: dict[str, LostPod] = {}
        """Every pod lost within ``LOST_KEEP``, by uid."""
        self.new: list[LostPod] = []
        """Losses the controller has not looked at yet."""
        self.slice_taints: dict[str, dict[recovery.DeviceKey, list[Mapping[str, Any]]]] = {}
        """ResourceSlice name -> its devices with a NoExecute taint."""
        self.rule_taints: dict[str, Any] = {}
        """DeviceTaintRule name -> (selector, taint) of its NoExecute taint."""
        self.claims: dict[str, list[tuple[recovery.DeviceKey, list[Mapping[str, Any]]]]] = {}
        """``namespace/name`` of an allocated ResourceClaim -> its devices and tolerations."""

    # -- the sink ---------------------------------------------------------------------

    def on_resync(self, kind: str, items: list[dict[str, Any]]) -> None:
        # Fed before the cache: a reading that fails here must not keep the event from it.
        try:
            self._resync(kind, items)
        except Exception:
            log.exception("hardware loss tracking: %s list not read", kind)

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        try:
            self._event(kind, event_type, obj)
        except Exception:
            log.exception("hardware loss tracking: %s %s not read", kind, event_type)

    def _resync(self, kind: str, items: list[dict[str, Any]]) -> None:
        if kind == "Node":
            names = {str(_meta(n).get("name", "")) for n in items}
            for node in items:
                self._node(node)
            for name in sorted(set(self.health) - names):
                self._node_gone(name)
        elif kind in (KIND_SLICE, KIND_RULE, KIND_CLAIM):
            {KIND_SLICE: self.slice_taints, KIND_RULE: self.rule_taints, KIND_CLAIM: self.claims}[
                kind
            ].clear()
            for obj in items:
                self._dra(kind, obj, deleted=False)
        elif kind == "Pod":
            uids = set()
            for pod in items:
                uids.add(objects.pod_uid(pod))
                self._pod(pod, listing=True)
            for uid, bound in sorted(self.cache.state.pods.items()):
                if uid not in uids:
                    self._ended(uid, bound, failed=False)
                    self.bound_at.pop(uid, None)

    def _event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        if kind == "Node":
            name = str(_meta(obj).get("name", ""))
            if event_type == "DELETED":
                self._node_gone(name)
            else:
                self._node(obj)
        elif kind == "Pod":
            self._pod(obj, deleted=event_type == "DELETED")
        elif kind in (KIND_SLICE, KIND_RULE, KIND_CLAIM):
            self._dra(kind, obj, deleted=event_type == "DELETED")

    def _dra(self, kind: str, obj: Mapping[str, Any], *, deleted: bool) -> None:
        meta = _meta(obj)
        name = str(meta.get("name", ""))
        if kind == KIND_SLICE:
            taints = {} if deleted else recovery.no_execute_taints(obj)
            if taints:
                self.slice_taints[name] = taints
            else:
                self.slice_taints.pop(name, None)
        elif kind == KIND_RULE:
            rule = None if deleted else recovery.rule_taint(obj)
            if rule is not None:
                self.rule_taints[name] = rule
            else:
                self.rule_taints.pop(name, None)
        else:
            key = f"{meta.get('namespace', '')}/{name}"
            devices = [] if deleted else recovery.allocated_devices(obj)
            if devices:
                self.claims[key] = devices
            else:
                self.claims.pop(key, None)

    def _device_loss(self, pod: Mapping[str, Any]) -> str | None:
        """Why the pod's DRA devices are lost (an untolerated NoExecute taint), or None."""
        if not self.slice_taints and not self.rule_taints:
            return None
        ns = str(_meta(pod).get("namespace", ""))
        devices = [d for c in dra.pod_claim_names(pod) for d in self.claims.get(f"{ns}/{c}", ())]
        if not devices:
            return None
        taints: dict[recovery.DeviceKey, list[Mapping[str, Any]]] = {}
        for per_slice in self.slice_taints.values():
            for key, found in per_slice.items():
                taints.setdefault(key, []).extend(found)
        for (driver, pool, device), taint in self.rule_taints.values():
            for key, _ in devices:
                if all(want is None or want == got for want, got in zip(
                    (driver, pool, device), key, strict=True
                )):  # fmt: skip
                    taints.setdefault(key, []).append(taint)
        return recovery.device_loss(devices, taints)

    # -- reading --------------------------------------------------------------------------

    def _node(self, node: Mapping[str, Any]) -> None:
        name = str(_meta(node).get("name", ""))
        health = read_node_health(node, self.config().health)
        old = self.health.get(name)
        self.health[name] = health
        self.gone.discard(name)
        if health.healthy or not self.config().health.recover_gangs:
            return
        if old is not None and not old.healthy:
            return  # failed before: its members were lost then (no pod binds there since)
        self.to_scan.add(name)  # again once the cache holds every pod (``scan``)
        self._scan(name, health)

    def _scan(self, name: str, health: NodeHealth) -> None:
        """A group member on a failed node is lost now: its group cannot finish there."""
        for uid, bound in sorted(self.cache.state.pods.items()):
            if bound.node == name and uid not in self.lost and self.cache.group_of(uid):
                self._lose(uid, bound, f"node {name}: {health.reason}")

    def scan(self) -> None:
        """The members on the nodes that failed since the last call, looked for again:
        a node seen failed before the cache knew its pods (the first listing) loses them
        here."""
        names, self.to_scan = self.to_scan, set()
        if not self.config().health.recover_gangs:
            return
        for name in sorted(names):
            health = self.health.get(name)
            if health is not None and not health.healthy:
                self._scan(name, health)

    def _node_gone(self, name: str) -> None:
        self.health.pop(name, None)
        self.gone.add(name)
        for uid, bound in sorted(self.cache.state.pods.items()):
            if bound.node == name and uid not in self.lost:
                self._lose(uid, bound, f"node {name} was deleted")

    def _pod(self, pod: Mapping[str, Any], *, deleted: bool = False, listing: bool = False) -> None:
        uid = objects.pod_uid(pod)
        meta = _meta(pod)
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if objects.is_bound(pod) and uid not in self.bound_at:
            created = parse_time(meta.get("creationTimestamp"))
            # First seen bound in a listing: bound before this process looked; its
            # creation time is the earliest it can have been bound.
            self.bound_at[uid] = created if listing and created is not None else self.clock()
        ending = deleted or bool(meta.get("deletionTimestamp")) or phase == "Failed"
        bound = self.cache.state.pods.get(uid)
        if ending and bound is not None and phase != "Succeeded":
            device = self._device_loss(pod)
            if device is not None and uid not in self.lost:
                self._lose(uid, bound, device)
            else:
                self._ended(uid, bound, failed=phase == "Failed")
        if deleted or phase in ("Failed", "Succeeded"):
            self.bound_at.pop(uid, None)

    def _ended(self, uid: str, bound: BoundPod, *, failed: bool) -> None:
        if uid in self.lost:
            return
        why = recovery.loss_reason(
            bound.node,
            self.health.get(bound.node),
            node_gone=bound.node in self.gone,
            failed=failed,
        )
        if why is not None:
            self._lose(uid, bound, why)

    def _lose(self, uid: str, bound: BoundPod, reason: str, *, evicted: bool = False) -> LostPod:
        pod = self.cache.pods.get(uid) or {}
        meta = _meta(pod)
        now = self.clock()
        created = parse_time(meta.get("creationTimestamp"))
        group = self.cache.group_of(uid)
        lost = LostPod(
            uid=uid,
            name=str(meta.get("name") or bound.name or uid),
            namespace=str(meta.get("namespace") or ""),
            tenant=bound.tenant,
            node=bound.node,
            row=tuple(bound.row),
            bound_at=self.bound_at.get(uid, created if created is not None else now),
            lost_at=now,
            created=created,
            group=str(group) if group is not None else "",
            reason=reason,
            evicted=evicted,
        )
        self.lost[uid] = lost
        self.new.append(lost)
        if evicted:
            log.info("pod %s/%s goes with its group %s: %s", lost.namespace, lost.name,
                     lost.group, reason)  # fmt: skip
        else:
            log.info("pod %s/%s lost to hardware: %s", lost.namespace, lost.name, reason)
        return lost

    # -- for the controller and the history -------------------------------------------

    def take(self) -> list[LostPod]:
        """The losses not looked at yet (and forget those older than ``LOST_KEEP``)."""
        out, self.new = self.new, []
        now = self.clock()
        self.lost = {u: p for u, p in self.lost.items() if now - p.lost_at <= LOST_KEEP}
        return out

    def put_back(self, pods: list[LostPod]) -> None:
        """Losses to look at again next round (``take`` returned them)."""
        self.new = pods + self.new

    def evicted(self, uid: str, reason: str, lost_at: float) -> LostPod | None:
        """A member fairshare evicts to restart its group: its run is lost too."""
        bound = self.cache.state.pods.get(uid)
        if bound is None or uid in self.lost:
            return self.lost.get(uid)
        got = self._lose(uid, bound, reason, evicted=True)
        self.new.remove(got)  # the controller made it: not a new loss to look at
        return got

    def forgivable(self) -> Mapping[str, LostPod]:
        """The lost pods whose run the usage history takes back (``forgiveFaults``)."""
        return self.lost if self.config().health.forgive_faults else {}


# -- the API ---------------------------------------------------------------------------------


class RecoveryApi(Protocol):
    """What the controller does to the cluster (a fake in unit tests)."""

    async def evict(self, namespace: str, name: str) -> tuple[str, str]:
        """``("evicted" | "blocked" | "failed", message)``."""
        ...

    async def record_event(
        self, namespace: str, name: str, uid: str, *, reason: str, message: str
    ) -> None: ...

    async def read_runs(self) -> dict[str, Any] | None: ...

    async def write_runs(self, data: dict[str, Any]) -> None: ...


class KubeRecoveryApi:
    """``RecoveryApi`` over a kubernetes_asyncio ``ApiClient`` (raw JSON in and out)."""

    def __init__(self, api_client: Any, namespace: str | None) -> None:
        from kubernetes_asyncio import client

        self.core: Any = client.CoreV1Api(api_client)
        self.namespace = namespace

    async def evict(self, namespace: str, name: str) -> tuple[str, str]:
        status, message = await evict_pod(self.core, namespace, name)
        if 200 <= status < 300 or status == 404:
            return "evicted", "" if status != 404 else "already gone"
        if status == 429:
            return "blocked", message
        return "failed", f"HTTP {status}: {message}"

    async def record_event(
        self, namespace: str, name: str, uid: str, *, reason: str, message: str
    ) -> None:
        from extender import events

        body = events.event_body(namespace, name, uid, reason, message, warning=True)
        await events.post_event(self.core, body)

    async def read_runs(self) -> dict[str, Any] | None:
        if self.namespace is None:
            return None
        status, current = await call_raw(
            self.core.read_namespaced_config_map(CONFIGMAP, self.namespace, _preload_content=False)
        )
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise FairshareError(f"reading ConfigMap {self.namespace}/{CONFIGMAP}: HTTP {status}")
        return parse_runs((current.get("data") or {}).get(DATA_KEY))

    async def write_runs(self, data: dict[str, Any]) -> None:
        if self.namespace is None:
            return
        await write_configmap(self.core, runs_body(self.namespace, data), key=DATA_KEY)


def parse_runs(text: object) -> dict[str, Any] | None:
    """The ConfigMap's ``runs.json`` as a dict (None: absent or not a JSON object)."""
    if not isinstance(text, str) or not text:
        return None
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        if isinstance(data, dict):
            return data
    log.warning("ConfigMap %s: %s is not a JSON object; ignored", CONFIGMAP, DATA_KEY)
    return None


def runs_body(namespace: str, data: Mapping[str, Any]) -> dict[str, Any]:
    return json_configmap(
        CONFIGMAP, namespace, DATA_KEY, data, stamp_annotation="fairshare.io/recorded-at"
    )


# -- the controller --------------------------------------------------------------------------


class Recovery:
    """The leader's look at the losses every ``PERIOD`` seconds (module docstring)."""

    def __init__(
        self,
        *,
        tracker: LossTracker,
        config: Callable[[], FairShareConfig],
        api: RecoveryApi,
        metrics: metrics_mod.Metrics,
        is_leader: Callable[[], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tracker, self.config, self.api, self.metrics = tracker, config, api, metrics
        self.is_leader, self.clock = is_leader, clock
        self.runs: dict[str, LostRun] = {}
        self.recovering: dict[str, tuple[float, str]] = {}
        """Group key -> (loss time, reason) of the groups whose rest is still to evict."""
        self._loaded = False
        self._dirty = False
        self.asked: dict[str, float] = {}
        """Uid -> when its eviction was accepted (not asked again for ``ASKED_KEEP``)."""

    def background(self, synced: asyncio.Event) -> Any:
        async def run() -> None:
            await synced.wait()
            while True:
                try:
                    await self.once()
                except Exception as exc:  # logged, retried next period
                    log.warning("hardware recovery: %s", exc)
                    self.metrics.count_unexpected_error("recovery")
                await asyncio.sleep(PERIOD)

        return serving.background_task(run, "hardware-recovery")

    async def once(self) -> None:
        """One look: take the new losses, evict the rest of their groups, keep the runs."""
        if not self.is_leader():
            now = self.clock()
            self._loaded = False
            kept = [p for p in self.tracker.take() if now - p.lost_at <= UNLED_KEEP]
            self.tracker.put_back(kept)
            return
        if not self._loaded:
            await self._load()
        self.tracker.scan()
        new = self.tracker.take()
        policy = self.config().health
        # Noted before any await: the filter's queue hold reads the runs meanwhile.
        for pod in new:
            self.metrics.count_hardware_lost(pod.tenant or "")
            if pod.group and policy.recover_gangs:
                at, why = self.recovering.get(pod.group, (pod.lost_at, pod.reason))
                self.recovering[pod.group] = (min(at, pod.lost_at), why)
            self._note(pod.group or f"{pod.namespace}/{pod.name}", bool(pod.group), [pod])
        for pod in new:
            with contextlib.suppress(Exception):
                await self.api.record_event(
                    pod.namespace, pod.name, pod.uid, reason=REASON_LOST,
                    message=f"lost to a hardware fault: {pod.reason}",
                )  # fmt: skip
        if policy.recover_gangs:
            for key in sorted(self.recovering):
                await self._recover(key)
        else:
            self.recovering.clear()
        now = self.clock()
        pruned = recovery.prune_runs(self.runs, now)
        if pruned.keys() != self.runs.keys():
            self.runs, self._dirty = pruned, True
        if self._dirty:
            await self.api.write_runs(recovery.runs_to_dict(self.runs))
            self._dirty = False

    async def _load(self) -> None:
        try:
            data = await self.api.read_runs()
        except Exception as exc:  # recovery goes on; explain misses the older runs
            log.warning("ConfigMap %s not read (starting without it): %s", CONFIGMAP, exc)
            data = None
        runs, problems = recovery.runs_from_dict(data)
        for p in problems:
            log.warning("ConfigMap %s: %s (skipped)", CONFIGMAP, p)
        for key, run in runs.items():
            have = self.runs.get(key)
            self.runs[key] = run if have is None else recovery.merge_run(run, have)
        self._loaded = True

    def _note(self, key: str, gang: bool, pods: list[LostPod]) -> None:
        run = recovery.run_of(key, gang, pods)
        have = self.runs.get(key)
        if have is not None and have.lost_at + recovery.RUN_TTL > run.lost_at:
            if not set(run.uids) <= set(have.uids) or have.gang != gang:
                run = recovery.merge_run(have, run) if have.lost_at <= run.lost_at else run
            else:
                return
        self.runs[key] = run
        self._dirty = True

    async def _recover(self, key: str) -> None:
        lost_at, reason = self.recovering[key]
        cache = self.tracker.cache
        members = [
            recovery.Member(
                uid=uid,
                created=parse_time(_meta(cache.pods.get(uid) or {}).get("creationTimestamp")),
                leaving=bool(_meta(cache.pods.get(uid) or {}).get("deletionTimestamp")),
            )
            for uid in sorted(cache.state.pods)
            if (g := cache.group_of(uid)) is not None and str(g) == key
        ]
        lost = [u for u, p in self.tracker.lost.items() if p.group == key and not p.evicted]
        rest = recovery.gang_rest(members, lost, lost_at)
        # A lost member still running (its node is fatal, nothing evicts it): it goes too.
        rest += sorted(
            m.uid
            for m in members
            if m.uid in lost and not m.leaving and self._still_running_on_failed_node(m.uid)
        )
        evicted: list[LostPod] = []
        blocked = False
        now = self.clock()
        self.asked = {u: t for u, t in self.asked.items() if now - t < ASKED_KEEP}
        for uid in sorted(set(rest) - set(self.asked)):
            pod = cache.pods.get(uid) or {}
            meta = _meta(pod)
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            outcome, message = await self.api.evict(ns, name)
            if outcome != "evicted":
                blocked = blocked or outcome == "blocked"
                log.warning("recovery of pod group %s: eviction of %s/%s %s: %s",
                            key, ns, name, outcome, message)  # fmt: skip
                continue
            self.asked[uid] = now
            was = self.tracker.lost.get(uid)
            got = was if was is not None else self.tracker.evicted(uid, reason, lost_at)
            if got is not None and was is None:
                evicted.append(got)
            text = (
                f"evicted so that pod group {key} restarts whole: a member was lost to a "
                f"hardware fault ({reason})"
            )
            with contextlib.suppress(Exception):
                await self.api.record_event(ns, name, uid, reason=REASON_RECOVERY, message=text)
        if evicted:
            self._note(key, True, evicted)
            tenant = evicted[0].tenant or ""
            self.metrics.count_gang_recovered(tenant)
            log.info("pod group %s: evicted %d members to restart it whole after %s",
                     key, len(evicted), reason)  # fmt: skip
        if not blocked:
            del self.recovering[key]

    def queue_hold(self, uid: str) -> str | None:
        """Why pending pod ``uid`` must let a group of its tenant restarted after a
        hardware fault go first (``recovery.waits_behind``), or None. For the filter, on
        the leader, with ``forgiveFaults``; a failure to judge holds nothing."""
        try:
            return self._queue_hold(uid)
        except Exception:
            log.exception("queue hold for %s not judged", uid)
            return None

    def _queue_hold(self, uid: str) -> str | None:
        if not (self.runs or self.tracker.new) or not self.config().health.forgive_faults:
            return None
        if not self.is_leader():
            return None
        cache = self.tracker.cache
        req = cache.pending.get(uid)
        if req is None or req.tenant is None:
            return None
        now = self.clock()
        # The runs noted, and the losses the watch saw since the last look (a node that
        # frees up in between must not go to a newer pod first).
        runs = dict(self.runs)
        fresh: dict[str, list[LostPod]] = {}
        for p in self.tracker.new:
            if p.group and p.tenant == req.tenant:
                fresh.setdefault(p.group, []).append(p)
        for key, pods in fresh.items():
            got = recovery.run_of(key, True, pods)
            runs[key] = recovery.merge_run(runs[key], got) if key in runs else got
        live = {
            k: r
            for k, r in runs.items()
            if r.gang and r.tenant == req.tenant and 0.0 <= now - r.lost_at <= recovery.QUEUE_HOLD
        }
        if not live:
            return None
        replaced: dict[str, int] = {}
        for other, bound in cache.state.pods.items():
            g = cache.group_of(other)
            run = live.get(str(g)) if g is not None else None
            if run is None or bound.tenant != req.tenant:
                continue
            created = parse_time(_meta(cache.pods.get(other) or {}).get("creationTimestamp"))
            if created is None or created >= run.lost_at - 1.0:
                replaced[run.key] = replaced.get(run.key, 0) + 1
        group = cache.group_of(uid)
        created = parse_time(_meta(cache.pods.get(uid) or {}).get("creationTimestamp"))
        run = recovery.waits_behind(
            req.tenant, str(group) if group else None, created, live, now, replaced=replaced
        )
        if run is None:
            return None
        when = dt.datetime.fromtimestamp(run.lost_at, dt.UTC).strftime("%H:%M:%SZ")
        return (
            f"pod group {run.key} of tenant {run.tenant} restarts after a hardware fault "
            f"at {when} and keeps its place ahead of the tenant's newer pods "
            "(health.forgiveFaults)"
        )

    def _still_running_on_failed_node(self, uid: str) -> bool:
        bound = self.tracker.cache.state.pods.get(uid)
        if bound is None:
            return False
        health = self.tracker.health.get(bound.node)
        return health is not None and not health.healthy


async def read_runs(core: Any, namespace: str) -> dict[str, LostRun]:
    """The lost runs recorded in ``namespace`` (``fairshare explain``); none when there is
    no record or it cannot be read. ``core``: a CoreV1Api."""
    status, current = await call_raw(
        core.read_namespaced_config_map(CONFIGMAP, namespace, _preload_content=False)
    )
    if not 200 <= status < 300:
        return {}
    runs, _ = recovery.runs_from_dict(parse_runs((current.get("data") or {}).get(DATA_KEY)))
    return runs


def explain_run(pod: Mapping[str, Any], runs: Mapping[str, LostRun]) -> dict[str, Any] | None:
    """What ``fairshare explain`` says of a pod and the hardware: the run it belongs to (it
    was lost or evicted) or the run it replaces (None: neither)."""
    meta = _meta(pod)
    name, ns = str(meta.get("name", "")), str(meta.get("namespace", ""))
    uid = objects.pod_uid(pod)
    group = gangs.group_of(pod)
    key = str(group) if group is not None else f"{ns}/{name}"
    run = runs.get(key)
    if run is None:
        return None
    out = run.to_dict()
    out.pop("uids", None)
    if uid in run.uids:
        out["role"] = "evicted" if name in run.evicted else "lost"
    else:
        created = parse_time(meta.get("creationTimestamp"))
        if recovery.inherited_queue_time(key if group else None, created, runs) is None:
            return None
        out["role"] = "replaces"
    out["text"] = recovery.describe(run)
    return out
