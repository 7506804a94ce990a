"""The extender's cache: the one object that writes its picture of the cluster.

In come the watches' events and the app's own decisions (``assume`` a bind before its
Binding is POSTed, ``forget`` it when the POST fails, ``reserve`` / ``release`` a pod
group's room); out goes a frozen ``Snapshot`` for the verbs (a write after a snapshot
copies the ``ClusterState`` first). A pod whose node is not known yet waits for it; an
object that cannot be read is listed in ``unreadable``, never fatal. A config with other
resource columns is followed live (``extender.columns``). One module because the cache
is the one writer: a pod read in, a claim carried, a bind assumed each update the arrays,
the queue and the ledgers together; its ledgers (``claims``, ``volumes``) are apart.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from extender import columns, handoff
from extender.claims import ClaimLedger, ClaimRefs, claim_key
from extender.feedback import Feedback
from extender.snapshot import FairMemo, LazyFair, Snapshot
from extender.volumes import KIND_PVC, VolumeLedger
from fairshare import cluster_shares, dra, eligibility, fairness, gangs, resources
from fairshare.config.schema import FairShareConfig
from fairshare.gate import GroupFits
from fairshare.placement import (
    ClassKey,
    PodRequest,
    ScoreContext,
    WorkloadMix,
    build_workload_mix,
    class_key,
    score_context,
)
from fairshare.preemption import holds
from fairshare.resources import CPU, REQUEUE_DEVICE_CLASS, ResourceIndex
from fairshare.state import objects
from fairshare.state.cluster import ClusterState, StateError

GONE_MEMORY = 10_000
"""How many deleted pod uids to remember (a late filter call must not revive them)."""
VERB_READS = 256
"""How many pod versions to keep read (``read``)."""

PodGroupFacts = tuple[
    Mapping[gangs.GroupKey, int | None], Mapping[gangs.GroupKey, Mapping[str, Any] | None]
]
"""What the gang coordinator read of PodGroups: sizes, and the objects (topology keys)."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    ann = _meta(obj).get("annotations")
    return ann if isinstance(ann, Mapping) else {}


def slim_node(node: dict[str, Any]) -> dict[str, Any]:
    """A Node without what the cache never reads again (managed fields, images, ...)."""
    out = dict(node)
    meta = out.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    status = out.get("status")
    if isinstance(status, dict):
        drop = ("images", "daemonEndpoints", "nodeInfo", "volumesInUse", "volumesAttached")
        out["status"] = {k: v for k, v in status.items() if k not in drop}
    return out


def version_key(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(uid, resourceVersion) of a pod, when it has both: one API version of the pod."""
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    return (uid, version) if isinstance(uid, str) and isinstance(version, str) else None


def _inputs(slim: dict[str, Any], tenant: str | None) -> tuple[Any, ...]:
    """What reading a (slim) pod depends on besides the config and the node set."""
    status = slim.get("status")
    claims = status.get("resourceClaimStatuses") if isinstance(status, dict) else None
    return (slim.get("metadata"), slim.get("spec"), claims, tenant)


@dataclass
class Cache:
    """The extender's state, written here only (module docstring)."""

    config: Callable[[], FairShareConfig]
    mix_every: int = 100
    clock: Callable[[], float] = time.time
    """Unix time, for the reclaim holds in force (the reclaimer writes wall time)."""
    on_change: Callable[[], None] | None = None
    """Called after a reservation pod or a shared GPU's pod changed (the handoff sweep)."""
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every known non-terminal pod, as ``objects.slim_pod`` keeps it."""
    pending: dict[str, PodRequest] = field(default_factory=dict)
    held_room: set[str] = field(default_factory=set)
    """Pods whose annotations carry a reclaim hold (``holds.ANN_HELD_NODE``)."""
    unreadable: dict[str, str] = field(default_factory=dict)
    class_keys: dict[str, ClassKey] = field(default_factory=dict)
    """Each known pod's FGD task class (the mix is rebuilt without reading pods)."""
    reservations: dict[str, handoff.Reservation] = field(default_factory=dict)
    """Reservation pods of shared GPUs, by uid: not workload."""
    claims: ClaimLedger = field(default_factory=ClaimLedger)
    volumes: VolumeLedger = field(default_factory=VolumeLedger)
    queue_version: int = 0
    """Counts changes of the pending queue."""
    _state: ClusterState = field(init=False, repr=False)
    _lent: int = field(default=0, init=False, repr=False)
    """Snapshots of ``_state`` handed out and not given back (``give_back``): while any is
    out, the next write copies the state first."""
    copies: int = field(default=0, init=False, repr=False)
    """How many times a write copied the state (a snapshot was still being read)."""
    _columns_of: FairShareConfig | None = field(default=None, init=False, repr=False)
    _gone: OrderedDict[str, None] = field(default_factory=OrderedDict, init=False, repr=False)
    _read: dict[str, tuple[FairShareConfig, tuple[Any, ...], bool]] = field(
        default_factory=dict, init=False, repr=False
    )
    """Per pod, what its last reading depended on: an event changing none of it (a status
    update, Pending -> Running) is not parsed again."""
    _reads: OrderedDict[tuple[str, str], tuple[Any, ...]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    _group_of: dict[str, gangs.GroupKey] = field(default_factory=dict, init=False, repr=False)
    _groups_version: int = field(default=0, init=False, repr=False)
    _group_members: tuple[int, dict[str, tuple[gangs.GroupKey, tuple[str, ...]]]] | None = field(
        default=None, init=False, repr=False
    )
    _mix: WorkloadMix | None = field(default=None, init=False, repr=False)
    _mix_changes: int = field(default=0, init=False, repr=False)
    _mix_shapes: set[tuple[float, int, frozenset[str]]] = field(
        default_factory=set, init=False, repr=False
    )
    _mix_stale: bool = field(default=False, init=False, repr=False)
    _ctx: tuple[int, ScoreContext] | None = field(default=None, init=False, repr=False)
    _largest: tuple[int, int | None] | None = field(default=None, init=False, repr=False)
    _memory_uids: set[str] = field(default_factory=set, init=False, repr=False)
    """Pods that ask by GPU memory: their rows depend on the nodes' device memory."""
    _demand_version: int = field(default=0, init=False, repr=False)
    """Counts pending pods read again with another row."""
    _fair: FairMemo = field(default_factory=FairMemo, init=False, repr=False)
    _snap: tuple[tuple[Any, ...], Snapshot] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        config = self.config()
        self._state = ClusterState(ResourceIndex(config.resource_names()))
        self._columns_of = config
        self._declare_capacity(config)

    # -- the state, read and written ----------------------------------------------------

    @property
    def state(self) -> ClusterState:
        """The arrays with the columns of the config in force, to read."""
        config = self.config()
        if config is not self._columns_of:
            columns.follow(self, config)
        return self._state

    def writable(self) -> ClusterState:
        """The arrays, to write. A write makes the last snapshot stale; the arrays are
        copied first while a snapshot of them is out (not given back), so no snapshot
        changes under its reader."""
        state = self.state
        self._snap = None
        if self._lent:
            state = self._state = state.copy()
            self._lent = 0
            self.copies += 1
        return state

    def give_back(self, snap: Snapshot) -> None:
        """Give back a snapshot the caller no longer reads (a later write need not copy
        the state for it). A snapshot never given back stays valid: it costs one copy."""
        if snap.state is self._state and self._lent > 0:
            self._lent -= 1

    def _declare_capacity(self, config: FairShareConfig) -> None:
        """The config's ``capacity`` stands in for resources no node reports (``storage``)."""
        declared = config.capacity_amounts() or {}
        amounts = cluster_shares.kernel_amounts(self._state, declared)
        if dict(amounts) != self._state.declared_capacity:
            self.writable().declare_capacity(amounts)

    def assume(self, bind: Callable[[ClusterState], object], uid: str) -> None:
        """Account a bind the app decided (``bind(state)`` binds it; raises
        ``StateError``), before its Binding is POSTed: the pod is no longer pending."""
        bind(self.writable())
        self.take_pending(uid)

    def forget(self, uid: str, req: PodRequest | None) -> None:
        """Undo ``assume``: the Binding failed. The pod is pending again (``req``), if it
        still exists (a phantom pending pod would hold other tenants back)."""
        self.writable().unbind(uid)
        if req is not None:
            self.requeue(uid, req)

    def take_pending(self, uid: str) -> None:
        if self.pending.pop(uid, None) is not None:
            self.queue_version += 1

    def requeue(self, uid: str, req: PodRequest) -> None:
        if uid in self.pods and uid not in self.pending:
            self.pending[uid] = req
            self.queue_version += 1

    def reserve(self, plan: gangs.GangPlan) -> None:
        """Hold a pod group's planned room (``gangs.reserve``)."""
        gangs.reserve(self.writable(), plan)

    def release(self, plan: gangs.GangPlan, uids: tuple[str, ...] | None = None) -> None:
        gangs.release(self.writable(), plan, uids)

    def close_group(self, group: str) -> None:
        """A shared GPU lost its device: no new pod joins it."""
        self.writable().close_group(group)

    # -- the sink ------------------------------------------------------------------------

    def on_resync(self, kind: str, objects_: list[dict[str, Any]]) -> None:
        """Replace what is known of ``kind`` with the complete list ``objects_``."""
        if kind == "Node":
            largest = self.largest_device_memory()
            self.nodes.clear()
            names = {str(_meta(n).get("name", "")) for n in objects_}
            for gone in [n.name for n in self.state.nodes if n.name not in names]:
                objects.delete_node(self.writable(), gone)
            for node in objects_:
                self._node(node)
            self._reapply_pods()
            self._recount_memory_pods(largest)
        elif kind == "Pod":
            uids = {objects.pod_uid(p) for p in objects_}
            for uid in [u for u in (*self.pods, *self.reservations) if u not in uids]:
                self._forget_pod(uid)
            for pod in objects_:
                self._pod(pod)
        elif kind == "Namespace":
            self.namespace_labels.clear()
            for ns in objects_:
                self.on_event(kind, "ADDED", ns)
        elif kind == dra.KIND_CLAIM:
            for key in list(self.claims.claim_objects):
                self.claims.forget(key)
            for claim in objects_:
                self.claims.take(claim, self.config().dra)
            self._reread(self.claims.readers(list(self.claims.claim_users), self.pending))
            self.claims.recount_usage(self.state, self.writable)
        elif kind == KIND_PVC:
            self.volumes.volume_claims.clear()
            for pvc in objects_:
                self.volumes.take(pvc, deleted=False)
            self._recount_storage()
        elif kind in (dra.KIND_SLICE, dra.KIND_DEVICE_CLASS, dra.KIND_TAINT_RULE):
            held = self.claims.objects_of(kind)
            held.clear()
            held.update((str(_meta(o).get("name", "")), o) for o in objects_)
            if kind == dra.KIND_DEVICE_CLASS:
                held.pop(REQUEUE_DEVICE_CLASS, None)  # fairshare's own: see on_event
            self.recount_slices()

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """Apply one watch event (ADDED / MODIFIED / DELETED)."""
        deleted = event_type == "DELETED"
        name = str(_meta(obj).get("name", ""))
        if kind == "Node":
            largest = self.largest_device_memory() if self._memory_uids else None
            if deleted:
                self.nodes.pop(name, None)
                objects.delete_node(self.writable(), name)
                if self.claims.claim_pods:
                    self.claims.recount_usage(self.state, self.writable)
            else:
                known = name in self.state.node_index
                self._node(obj)
                if not known:  # only a new node has pods waiting for it
                    self._reapply_pods(node=name)
            self._recount_memory_pods(largest)
        elif kind == "Pod":
            if deleted:
                self._forget_pod(objects.pod_uid(obj))
            else:
                self._pod(obj, skip_unchanged=True)
        elif kind == dra.KIND_CLAIM:
            key = claim_key(obj)
            before = self.claims.counted(key)
            if deleted:
                self.claims.forget(key)
            else:
                self.claims.take(obj, self.config().dra)
            if self.claims.counted(key) != before:
                self._reread(self.claims.readers([key], self.pending))
            self.claims.recount_usage(self.state, self.writable)
        elif kind == KIND_PVC:
            self.volumes.take(obj, deleted=deleted)
            self._recount_storage()
        elif kind in (dra.KIND_SLICE, dra.KIND_DEVICE_CLASS, dra.KIND_TAINT_RULE):
            if kind == dra.KIND_DEVICE_CLASS and name == REQUEUE_DEVICE_CLASS:
                return  # fairshare's own (it selects no device), annotated at each requeue
            held = self.claims.objects_of(kind)
            if deleted:
                held.pop(name, None)
            else:
                held[name] = obj
            self.recount_slices(name if kind == dra.KIND_SLICE else None)
        elif kind == "Namespace":
            if deleted:
                self.namespace_labels.pop(name, None)
            else:
                labels = _meta(obj).get("labels") or {}
                self.namespace_labels[name] = {str(k): str(v) for k, v in labels.items()}
            # Tenancy may have changed for every pod of the namespace.
            for pod in [p for p in self.pods.values() if _meta(p).get("namespace") == name]:
                self._pod(pod)
            if self.volumes.volume_claims or self.volumes.storage_usage:
                self._recount_storage()

    def _recount_storage(self) -> None:
        self.volumes.recount(self.state, self.writable, self.config(), self.namespace_labels)

    def remember(self, pod: dict[str, Any]) -> None:
        """Take in a pod seen in a scheduler call before its watch event (bind needs it)."""
        uid = objects.pod_uid(pod)
        if uid and uid not in self.pods and uid not in self._gone and not objects.is_bound(pod):
            try:
                self._pod(pod)
            except (TypeError, ValueError, AttributeError, KeyError) as exc:
                # A pod body we cannot read is the scheduler's to report, not ours to
                # crash on; it does not join the queue.
                self.pods.pop(uid, None)
                self._note_group(uid, None)
                self.pending.pop(uid, None)
                self.unreadable[uid] = f"{type(exc).__name__}: {exc}"

    # -- nodes ---------------------------------------------------------------------------

    def _node(self, node: dict[str, Any]) -> None:
        name = str(_meta(node).get("name", ""))
        self.nodes[name] = slim_node(node)
        try:
            slices = self.claims.slice_gpus
            objects.apply_node(
                self.writable(),
                node,
                self.config(),
                dra_gpus=slices.node_gpus.get(name, 0),
                dra_tainted=slices.tainted.get(name, 0),
                dra_warned=slices.warned.get(name, 0),
            )
        except (StateError, resources.DemandError) as exc:
            self.unreadable[f"Node/{name}"] = str(exc)

    def largest_device_memory(self) -> int | None:
        """Bytes of the largest GPU device known (kept per node-set version)."""
        version = self.state._nodes_version
        if self._largest is None or self._largest[0] != version:
            self._largest = (version, objects.largest_device_memory(self.state))
        return self._largest[1]

    def _recount_memory_pods(self, before: int | None) -> None:
        """GPU-memory pods count a share of the largest device while pending: when that
        device changes, read them again."""
        if self._memory_uids and self.largest_device_memory() != before:
            self._reread(sorted(self._memory_uids))

    def _reapply_pods(self, node: str | None = None) -> None:
        for pod in list(self.pods.values()):
            spec = pod.get("spec") or {}
            if spec.get("nodeName") and (node is None or spec.get("nodeName") == node):
                self._pod(pod)

    def recount_slices(self, changed_slice: str | None = None) -> None:
        """Derive the DRA GPUs per node again; re-read the users of claims that now give
        other GPUs, and re-apply the nodes whose count changed."""
        nodes, changed_claims = self.claims.recount_slices(self.config(), changed_slice)
        if changed_claims:
            self._reread(self.claims.readers(changed_claims, self.pending))
            self.claims.recount_usage(self.state, self.writable)
        reapplied = False
        for name in sorted(nodes):
            if name in self.nodes:
                self._node(self.nodes[name])
                reapplied = True
        if reapplied and self.claims.claim_users:
            self._sync_carried(list(self.claims.claim_users))
            self.claims.recount_usage(self.state, self.writable)
        for key in [k for k in self.unreadable if k.startswith("DeviceClass/")]:
            del self.unreadable[key]
        self.unreadable.update(self.claims.problems())

    # -- pods ----------------------------------------------------------------------------

    def _reread(self, uids: list[str]) -> None:
        for uid in uids:
            pod = self.pods.get(uid)
            if pod is not None:
                self._pod(pod)

    def _sync_carried(self, keys: list[str] | set[str], reading: str = "") -> None:
        """Re-derive the carriers of ``keys``; a pod that starts or stops carrying a claim
        is read again (its row changes), except ``reading``, the pod being read now."""
        for key in sorted(keys):
            moved = self.claims.move_carrier(key, self.pods, self.nodes)
            for uid in moved or ():
                if uid is not None and uid != reading and uid in self.pods:
                    self._pod(self.pods[uid])

    def _forget_pod(self, uid: str) -> None:
        self._gone[uid] = None
        while len(self._gone) > GONE_MEMORY:
            self._gone.popitem(last=False)
        if self.reservations.pop(uid, None) is not None:
            self._changed()
            return
        had_claims = uid in self.claims.claim_pods
        keys = self.claims.set_pod(uid, None) if had_claims else set()
        self.pods.pop(uid, None)
        self.held_room.discard(uid)
        self._note_group(uid, None)
        self._read.pop(uid, None)
        self.queue_version += 1
        self._memory_uids.discard(uid)
        self.class_keys.pop(uid, None)
        self.pending.pop(uid, None)
        self.unreadable.pop(uid, None)
        if uid in self.state.pods and objects.delete_pod(self.writable(), uid) is not None:
            self._changed()
        self._mix_changes += 1
        if had_claims:
            self._sync_carried(keys)  # another pod of its claims may carry them now
            self.claims.recount_usage(self.state, self.writable)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _settled(self, uid: str, slim: dict[str, Any]) -> bool:
        """Is the pod held as its last reading left it? Bound: accounted on its node.
        Pending: queued, or known unreadable."""
        if objects.is_bound(slim):
            held = self.state.pods.get(uid)
            node = (slim.get("spec") or {}).get("nodeName")
            return held is not None and held.node == node and uid not in self.pending
        return uid in self.pending or uid in self.unreadable

    def _pod(self, pod: dict[str, Any], *, skip_unchanged: bool = False) -> None:
        """Read one pod in. ``skip_unchanged``: a watch event whose pod differs from the
        last reading only where nothing here looks (``_inputs``) is not parsed again."""
        uid = objects.pod_uid(pod)
        config = self.config()
        if handoff.is_reservation_pod(pod, config.gpu_sharing.reservation):
            self.reservations[uid] = handoff.reservation_of(pod)
            self._changed()
            return
        if objects.is_terminal(pod):
            self._forget_pod(uid)
            return
        if uid not in self.pods:
            self._mix_changes += 1
        slim = objects.slim_pod(pod)  # at 100,000 pods whole objects would be most memory
        self.queue_version += 1
        self._note_group(uid, slim)
        tenant = objects.pod_tenant(pod, config=config, namespace_labels=self.namespace_labels)
        if holds.ANN_HELD_NODE in _annotations(slim):
            self.held_room.add(uid)
        else:
            self.held_room.discard(uid)
        inputs = _inputs(slim, tenant)
        held = self._read.get(uid)
        unchanged = held is not None and held[0] is config and held[1] == inputs
        if skip_unchanged and unchanged and self._settled(uid, slim):
            self.pods[uid] = slim
            if held is not None and held[2] and objects.is_bound(slim):
                self._changed()  # as below: a shared GPU's sweep looks at its pods
            return
        self.pods[uid] = slim
        self.unreadable.pop(uid, None)
        names = dra.pod_claim_names(pod)
        had_claims = uid in self.claims.claim_pods
        if names or had_claims:
            refs = (str(_meta(pod).get("namespace") or "default"), names) if names else None
            self._sync_carried(self.claims.set_pod(uid, refs), uid)
        share = False
        try:
            req = self._read_pod(pod, config, tenant)
            share = objects.is_share(req)
            if req.demand.gpu.memory is not None:
                self._memory_uids.add(uid)
            else:
                self._memory_uids.discard(uid)
            bound = objects.is_bound(pod)
            # A pod's claims are part of its shape (the mix) and demand (the gate).
            held_req, group = self.claims.devices(uid, req, bound=bound, state=self.state)
            key = class_key(held_req, cpu_col=self.state.index.column(CPU))
            self.class_keys[uid] = key
            if key[1:] not in self._mix_shapes:
                self._mix_stale = True
            if bound:
                self.pending.pop(uid, None)
                objects.apply_pod(
                    self.writable(), pod, config, tenant, request=held_req, group=group
                )
                if share:
                    self._changed()
            else:
                before = self.pending.get(uid)
                if before is not None and (before.row, before.tenant) != (
                    held_req.row,
                    held_req.tenant,
                ):
                    self._demand_version += 1
                self.pending[uid] = held_req
                self._keep_read(pod, config, tenant, held_req)
        except (StateError, resources.DemandError) as exc:
            self.unreadable[uid] = str(exc)
            self.pending.pop(uid, None)
        self._read[uid] = (config, inputs, share)
        if names or had_claims:
            self.claims.recount_usage(self.state, self.writable)

    # -- readings of pods kube-scheduler sends ------------------------------------------

    def request(self, pod: Mapping[str, Any], config: FairShareConfig) -> PodRequest:
        """The ``PodRequest`` of a pod kube-scheduler sent, read once per pod version:
        filter and prioritize of one attempt carry the same pod (uid and
        ``resourceVersion``) and share one reading, and the watch's reading of a pending
        pod serves them too, while the tenant, config, columns and largest device are the
        same. Raises ``resources.DemandError`` (not remembered)."""
        tenant = objects.pod_tenant(pod, config=config, namespace_labels=self.namespace_labels)
        key = version_key(pod)
        held = self._reads.get(key) if key is not None else None
        stamp = (tenant, self.largest_device_memory())
        fresh = held is not None and held[0] is config and held[1] is self.state.index
        if held is not None and fresh and held[2] == stamp:
            got: PodRequest = held[3]
            return got
        req = self._read_pod(pod, config, tenant)
        names = dra.pod_claim_names(pod)
        if names and not objects.is_bound(pod):
            refs: ClaimRefs = (str(_meta(pod).get("namespace") or "default"), names)
            uid = objects.pod_uid(pod)
            req = self.claims.devices(uid, req, bound=False, state=self.state, refs=refs)[0]
        self._keep_read(pod, config, tenant, req)
        return req

    def _read_pod(
        self, pod: Mapping[str, Any], config: FairShareConfig, tenant: str | None
    ) -> PodRequest:
        """The pod's ``PodRequest`` on the current columns (raises ``DemandError``)."""
        return objects.pod_request(
            pod,
            config=config,
            tenant=tenant,
            index=self.state.index,
            device_memory=self.largest_device_memory,
        )

    def _keep_read(
        self, pod: Mapping[str, Any], config: FairShareConfig, tenant: str | None, req: PodRequest
    ) -> None:
        key = version_key(pod)
        if key is None:
            return
        stamp = (tenant, self.largest_device_memory())
        self._reads[key] = (config, self.state.index, stamp, req)
        self._reads.move_to_end(key)
        while len(self._reads) > VERB_READS:
            self._reads.popitem(last=False)

    # -- derived figures -----------------------------------------------------------------

    def mix(self) -> WorkloadMix | None:
        """The workload mix of the pods seen, rebuilt when a tenth of them (at most
        ``mix_every``) came or went, or a pod of a shape it did not see arrived."""
        every = min(self.mix_every, max(1, len(self.class_keys) // 10))
        if self._mix is None or self._mix_stale or self._mix_changes >= every:
            keys = list(self.class_keys.values())
            self._mix = build_workload_mix(keys, model_ids=self.state.model_ids) if keys else None
            self._mix_shapes = {k[1:] for k in keys}
            self._mix_changes = 0
            self._mix_stale = False
        return self._mix

    def context(self) -> ScoreContext:
        """Score normalisers and mix, rebuilt when the node set or the mix changed."""
        version = self.state._nodes_version
        mix = self.mix()
        if self._ctx is None or self._ctx[0] != version or self._ctx[1].mix is not mix:
            self._ctx = (version, score_context(self.state, mix))
        return self._ctx[1]

    def fair_shares(
        self, config: FairShareConfig, queue: tuple[PodRequest, ...] | None = None
    ) -> Mapping[str, fairness.FairShare]:
        """The fair allocation over bound + pending demand (``FairMemo``: computed again
        only when the demand rows, the capacity, the columns or the config changed)."""
        pending = queue if queue is not None else tuple(self.pending.values())
        return self._fair.allocation(self.state, config, pending)

    def group_members(self) -> dict[str, tuple[gangs.GroupKey, tuple[str, ...]]]:
        """Each known pod of a pod group -> (its group, the uids of its known pods)."""
        held = self._group_members
        if held is not None and held[0] == self._groups_version:
            return held[1]
        by: dict[gangs.GroupKey, list[str]] = {}
        for uid, g in self._group_of.items():
            by.setdefault(g, []).append(uid)
        out = {uid: (g, tuple(uids)) for g, uids in by.items() for uid in uids}
        self._group_members = (self._groups_version, out)
        return out

    @property
    def has_groups(self) -> bool:
        """Does some known pod belong to a pod group?"""
        return bool(self._group_of)

    def group_of(self, uid: str) -> gangs.GroupKey | None:
        """The pod group known pod ``uid`` belongs to (None: none, or not known)."""
        return self._group_of.get(uid)

    def _note_group(self, uid: str, slim: Mapping[str, Any] | None) -> None:
        g = gangs.group_of(slim) if slim is not None else None
        if self._group_of.get(uid) == g:
            return
        if g is None:
            del self._group_of[uid]
        else:
            self._group_of[uid] = g
        self._groups_version += 1

    def room_holds(self, config: FairShareConfig, now: float) -> list[holds.RoomHold]:
        """The reclaim holds in force at ``now``: of pods still pending, not lapsed; and
        of pods bound on another node than their hold's, until it lapses (the room stays
        held for their tenant: ``holds.held_off``)."""
        if not self.held_room:
            return []
        pods = self.pods
        out = holds.holds_in_force(
            sorted(self.held_room),
            self.pending,
            lambda uid: _annotations(pods.get(uid) or {}),
            now=now,
        )
        for uid in sorted(self.held_room):
            bound = self.state.pods.get(uid)
            if bound is None or uid in self.pending:
                continue
            ann = _annotations(pods.get(uid) or {})
            if ann.get(holds.ANN_HELD_NODE) == bound.node:
                continue  # bound in its room: the hold is over
            until = holds.hold_until(ann)
            if until is None or now >= until:
                continue
            try:
                req = self.request(pods[uid], config)
            except resources.DemandError:
                continue
            hold = holds.hold_of(req, ann)
            if hold is not None:
                out.append(hold)
        return out

    # -- the snapshot --------------------------------------------------------------------

    def snapshot(
        self,
        config: FairShareConfig,
        *,
        feedback: Feedback | None = None,
        podgroups: PodGroupFacts | None = None,
        now: float | None = None,
    ) -> Snapshot:
        """The frozen value the verbs read (``extender.snapshot``), the same one until
        something it is made of changes. ``feedback``: kube-scheduler's verdicts, applied
        to the queue; ``podgroups``: the gang coordinator's PodGroups (None: every pod is
        judged alone at the gate); ``now``: the time the holds are judged at."""
        state = self.state
        when = self.clock() if now is None else now
        in_force = tuple(self.room_holds(config, when))
        key = (
            id(state),
            state.version,
            self.queue_version,
            self._demand_version,
            feedback.version if feedback is not None else -1,
            id(config),
            podgroups,
            in_force,
            self.largest_device_memory(),
        )
        held = self._snap
        if held is not None and held[0] == key:
            self._lent += 1
            return held[1]
        if feedback is not None and feedback.verdicts:
            served = eligibility.served_schedulers(config.scheduler_name)
            by_uid = {
                uid: feedback.apply(req, (self.pods.get(uid) or {}).get("spec") or {}, served)
                for uid, req in self.pending.items()
            }
        else:
            by_uid = dict(self.pending)
        queue = tuple(by_uid.values())
        fair = LazyFair(self._fair, state, config, queue)
        members = self.group_members()
        gang_pods = {uid: self.pods[uid] for uid in members if uid in self.pods}
        pending = MappingProxyType(by_uid)
        groups = None
        if podgroups is not None:
            groups = _group_rule(config, members, gang_pods, pending, state, podgroups, fair)
        snap = Snapshot(
            state,
            queue,
            pending,
            MappingProxyType({k: dict(v) for k, v in self.namespace_labels.items()}),
            fair,
            self.mix(),
            self.context(),
            groups,
            in_force,
            MappingProxyType(gang_pods),
            MappingProxyType(members),
            when,
            key,
        )
        self._snap = (key, snap)
        self._lent += 1
        return snap


def _group_rule(
    config: FairShareConfig,
    members: Mapping[str, tuple[gangs.GroupKey, tuple[str, ...]]],
    gang_pods: Mapping[str, Mapping[str, Any]],
    pending: Mapping[str, PodRequest],
    state: ClusterState,
    podgroups: PodGroupFacts,
    fair: Mapping[str, fairness.FairShare],
) -> GroupFits | None:
    """How waiting pod groups count at the gate (``gangs.waiting.group_fits``), each sized by
    its PodGroup as read last, else its pods' annotation."""
    sizes, objs = podgroups

    def size(key: gangs.GroupKey, uid: str) -> int | None:
        if key in sizes:  # None: a PodGroup without a size, which the filter refuses
            return sizes[key]
        return gangs.annotated_min_count(gang_pods.get(uid) or {})

    def topology(key: gangs.GroupKey, uid: str) -> str | None:
        return gangs.topology_key(objs.get(key), gang_pods.get(uid) or {})

    lookup = gangs.waiting.lookup_over(members, pending, state.pods, size, topology)
    return gangs.waiting.group_fits(config, lookup, fair=fair)
