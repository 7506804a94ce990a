"""The extender's live view of the cluster, fed by a state source (list + watch events).

Pure: no network; its one clock, ``clock`` (injectable), is read only to tell a lapsed
reclaim hold. Must not import aiohttp, kubernetes_asyncio or prometheus_client.

``ExtenderTracker`` is a sink (``on_resync`` / ``on_event`` with API-JSON dicts) that
keeps:

* the ``ClusterState`` arrays hot: nodes through ``objects.apply_node``, bound pods
  through ``objects.apply_pod`` (whatever scheduler placed them; the device ledger comes
  back from each pod's ``fairshare.io/gpu-devices`` annotation);
* the pending queue (unbound, non-terminal pods, in arrival order) for the gate;
* namespace labels (tenancy);
* the workload mix FGD measures fragmentation against, rebuilt from the pods seen
  after a tenth of them changed (at most every ``mix_every`` pod changes: it is a
  distribution, not an exact count), and as soon as a pod of a GPU shape the mix has
  not seen arrives (a new shape, e.g. the first pod restricted to a GPU model, changes
  which nodes count as fragment, so it must not wait 100 changes in a small cluster);
* the score context, rebuilt only when the node set changes.

DRA: GPUs that bound pods get through ``resource.k8s.io/v1`` ResourceClaims of a GPU
device class (``fairshare.dra``) count in their tenant's usage (``state.tenant_usage``),
once per claim, so shares, the gate and reclaim see them. On a DRA GPU node (below) the
bound pod carrying a claim (the smallest uid among its bound users) holds the claim's
GPUs as devices of its own row (``_claim_devices``), so they are taken from that node's
free GPUs as kube-scheduler's DynamicResources took them; elsewhere (a node whose GPUs
are the device plugin's) a claim counts in its tenant's usage only.
A node's capacity does include its DRA GPUs: the devices that the configured GPU
DeviceClasses select in its ResourceSlices (``dra.slice_capacity``, followed live: a
slice or class event re-applies the nodes whose count changed) are its GPU devices when
it has no ``nvidia.com/gpu`` allocatable, as kube-scheduler delegates such a node's
``nvidia.com/gpu`` requests to DRA (``objects.apply_node``). So shares, the gate and
fragmentation see one fleet, and a pod asking ``nvidia.com/gpu`` (KEP-5004) fits a
DRA-only node; the claim kube-scheduler generates for it counts 0 (``dra.claim_gpus``).

Design choices: a pod whose node is not known yet is remembered and applied when the
node arrives; a pod whose resources cannot be read is kept out of the state and listed
in ``unreadable`` (never fatal). Everything in the config is read live. A config whose
``resources`` (the arrays' columns) differ from the running ones is applied live too:
the first read of ``state`` after the swap rebuilds the whole tracker (arrays, pending
rows, mix, caches) from the nodes and pods it holds, in a fresh tracker that replaces
this one's fields only once complete, so no verb ever sees arrays of the old columns
with the new config, nor a half-built state. Binds the extender assumed but the watch
has not reported yet are carried over.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from extender import handoff, verbs
from fairshare import (
    cluster_shares,
    dra,
    eligibility,
    fairness,
    gangs,
    reclaim,
    resources,
    tenancy,
)
from fairshare.config.schema import FairShareConfig
from fairshare.gate import GateDecision, GroupFits
from fairshare.placement import (
    ClassKey,
    PodRequest,
    ScoreContext,
    WorkloadMix,
    build_workload_mix,
    class_key,
    score_context,
)
from fairshare.resources import CPU, MILLI_GPU, REQUEUE_DEVICE_CLASS, ResourceIndex
from fairshare.state import objects, usage
from fairshare.state.cluster import BoundPod, ClusterState, StateError, allocatable_from_node

KIND_PVC = "PersistentVolumeClaim"

GONE_MEMORY = 10_000
"""How many deleted pod uids to remember (a late filter call must not revive them)."""
VERB_READS = 256
"""How many pods sent by kube-scheduler to keep parsed (``ExtenderTracker.request``)."""


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _annotations(obj: dict[str, Any]) -> dict[str, Any]:
    ann = _meta(obj).get("annotations")
    return ann if isinstance(ann, dict) else {}


def slim_node(node: dict[str, Any]) -> dict[str, Any]:
    """A Node without what the extender never reads again (managed fields, the image
    list, kubelet endpoints and node info), kept to rebuild the arrays."""
    out = dict(node)
    meta = out.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    status = out.get("status")
    if isinstance(status, dict):
        drop = ("images", "daemonEndpoints", "nodeInfo", "volumesInUse", "volumesAttached")
        out["status"] = {k: v for k, v in status.items() if k not in drop}
    return out


def _rebind(state: ClusterState, held: BoundPod, row: Sequence[float]) -> None:
    """Account ``held`` (from another state) again in ``state`` with the kernel ``row``:
    same node, devices, MIG slices and shared GPU."""
    state.bind(
        uid=held.uid,
        node=held.node,
        row=row,
        devices=held.devices,
        tenant=held.tenant,
        name=held.name,
        allow_overcommit=True,
        mig=held.mig,
        group=held.group,
    )


def _inputs(slim: dict[str, Any], tenant: str | None) -> tuple[Any, ...]:
    """What reading a (slim) pod depends on besides the config and the node set: all of
    the slim pod but its phase (a terminal phase never gets this far), and its tenant."""
    status = slim.get("status")
    claims = status.get("resourceClaimStatuses") if isinstance(status, dict) else None
    return (slim.get("metadata"), slim.get("spec"), claims, tenant)


def _version_key(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(uid, resourceVersion) of a pod, when it has both (one API version of the pod)."""
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    return (uid, version) if isinstance(uid, str) and isinstance(version, str) else None


def _claim_key(claim: dict[str, Any]) -> str:
    meta = _meta(claim)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


DRA_GROUP_PREFIX: Final = objects.DRA_GROUP_PREFIX
"""Shared-GPU group ids of DRA devices (``objects.DRA_GROUP_PREFIX``)."""


def _allocated(claim: Mapping[str, Any]) -> bool:
    """Does the claim (as the API or ``_slim_claim`` has it) carry an allocation?"""
    status = claim.get("status")
    return isinstance(status, dict) and isinstance(status.get("allocation"), dict)


def _slim_claim(claim: dict[str, Any]) -> dict[str, Any]:
    """What ``dra.claim_gpus`` reads of a claim (its requests, allocation, annotations)."""
    meta = _meta(claim)
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    out: dict[str, Any] = {
        "kind": claim.get("kind", dra.KIND_CLAIM),
        "metadata": {
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "annotations": meta.get("annotations") or {},
        },
        "spec": claim.get("spec") or {},
    }
    if isinstance(allocation, dict):
        out["status"] = {"allocation": {"devices": allocation.get("devices") or {}}}
    return out


@dataclass
class ExtenderTracker:
    """Cluster state for the extender's verbs, kept up to date from events."""

    config: Callable[[], FairShareConfig]
    mix_every: int = 100
    _state: ClusterState = field(init=False, repr=False)
    _columns_of: FairShareConfig | None = field(default=None, init=False, repr=False)
    """The config whose resource columns ``_state`` was last checked against."""
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every known Node, as ``slim_node`` keeps it (to rebuild the arrays)."""
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every known non-terminal pod, as ``objects.slim_pod`` keeps it."""
    pending: dict[str, PodRequest] = field(default_factory=dict)
    held_room: set[str] = field(default_factory=set)
    """Pods whose annotations carry a reclaim hold (``reclaim.ANN_HELD_NODE``)."""
    clock: Callable[[], float] = time.time
    """Unix time, to tell a lapsed reclaim hold (the reclaimer writes wall time)."""
    gated: set[str] = field(default_factory=set)
    """Pending pods whose last filter the fair-share gate refused (``note_filter``)."""
    preempted: OrderedDict[str, dict[str, tuple[str, ...]]] = field(default_factory=OrderedDict)
    """Per preemptor uid, the victims the preempt verb last answered, by node (the filter
    waits for those of the preemptor's nominated node to be gone: ``victims_pending``)."""
    requeued: set[str] = field(default_factory=set)
    """Gated pods the requeuer nudged since their last filter (``extender.requeue``)."""
    verdicts: dict[str, str] = field(default_factory=dict)
    """Pending pods kube-scheduler found unschedulable for a reason fairshare does not
    check (``eligibility.rejected_by_kube_scheduler``), with its message: they do not
    count as waiting until kube-scheduler asks the extender about them again
    (``note_asked``) or their verdict changes."""
    dra_refused: set[str] = field(default_factory=set)
    """Pending pods whose ``PodScheduled`` verdict says kube-scheduler's DynamicResources
    found no free devices for them (``eligibility.refused_for_dra_devices``)."""
    dra_released: int = 0
    """Counts ResourceClaims seen deleted while still allocated: devices freed with no
    deallocation first. kube-scheduler does that to the claim it generated for a KEP-5004
    pod whose bind failed after PreBind wrote the claim (one the gate held at bind), and
    DynamicResources retries the pods it refused on a claim's deallocation, not on its
    deletion (``extender.requeue`` makes up for it)."""
    queue_version: int = 0
    """Counts changes of the pending queue and of its pods' verdicts (the requeuer looks
    at the gate again only after one)."""
    _asked: dict[str, str | None] = field(default_factory=dict, init=False, repr=False)
    """Per pod, the verdict it carried when kube-scheduler last asked the extender about
    it: that verdict is older than the ask, so it no longer stops the pod from waiting."""
    _answers: dict[str, frozenset[str]] = field(default_factory=dict, init=False, repr=False)
    """Per pod, the failure texts the extender's filter last answered (so a verdict that
    carries one is known as made with fairshare's part in it)."""
    unreadable: dict[str, str] = field(default_factory=dict)
    class_keys: dict[str, ClassKey] = field(default_factory=dict)
    """Each known pod's FGD task class, so the mix is rebuilt without re-reading pods."""
    resource_claims: dict[str, Fraction] = field(default_factory=dict)
    """GPUs of each known ResourceClaim, by ``namespace/name``."""
    claim_objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each known ResourceClaim, slimmed (``_slim_claim``): counted again when the
    slices' devices change (a MIG partition's fraction, a shareable GPU's capacity)."""
    claim_held: dict[str, list[tuple[dra.DeviceKey, Fraction]]] = field(default_factory=dict)
    """The GPU devices each allocated claim holds and what each gives it."""
    claim_pods: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """Pods that reference claims: uid -> (namespace, claim names)."""
    dra_usage: dict[str, float] = field(default_factory=dict)
    """Milli-GPU added to each tenant's usage for its bound pods' claims."""
    resource_slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Known ResourceSlices by name (``resource.k8s.io/v1``)."""
    device_classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Known DeviceClasses by name."""
    taint_rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Known DeviceTaintRules by name (``resource.k8s.io/v1beta2``, where served)."""
    slice_gpus: dra.SliceCapacity = field(default_factory=lambda: dra.SliceCapacity({}))
    """The DRA GPUs per node the slices and classes give (``dra.slice_capacity``)."""
    _book: dra.SliceBook | None = field(default=None, init=False, repr=False)
    """The slices' counts per pool, over the three dicts above (a slice event counts only
    its slice and combines only its pool)."""
    claim_users: dict[str, set[str]] = field(default_factory=dict)
    """Per claim (``namespace/name``), the pods that reference it (``claim_pods`` inverted)."""
    carried: dict[str, str] = field(default_factory=dict)
    """Claims whose GPUs a bound pod on a DRA GPU node holds as devices of its own row
    (``_claim_devices``), by claim: that pod's uid. Not counted again by ``_recount_dra``."""
    volume_claims: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Bound PersistentVolumeClaims by uid: (namespace, storage bytes requested)."""
    storage_usage: dict[str, float] = field(default_factory=dict)
    """Bytes added to each tenant's ``storage`` column for its bound PVCs."""
    reservations: dict[str, handoff.Reservation] = field(default_factory=dict)
    """Reservation pods of shared GPUs, by uid: not workload (their group holds the slot)."""
    on_change: Callable[[], None] | None = None
    """Called after a reservation pod or a bound pod changed (wakes the handoff sweep)."""
    _gone: OrderedDict[str, None] = field(default_factory=OrderedDict, init=False)
    """Recently deleted or finished pods: a late scheduler call must not revive them."""
    _fair: tuple[Any, dict[str, fairness.FairShare]] | None = field(default=None, init=False)
    _demand_version: int = field(default=0, init=False)
    """Counts pending pods read again with another row (their claims allocated or counted
    again): the queue's uids alone do not say the fair allocation is stale."""
    _fair_inputs: (
        tuple[
            int,
            ResourceIndex,
            FairShareConfig,
            dict[str, list[float]],
            dict[str, fairness.FairShare],
        ]
        | None
    ) = field(default=None, init=False, repr=False)
    """The last allocation and what it was computed from: (nodes version, columns,
    config, demand rows, allocation)."""
    _group_of: dict[str, gangs.GroupKey] = field(default_factory=dict, init=False, repr=False)
    """Each known pod of a pod group: its group (kept as pods come and go)."""
    _groups_version: int = field(default=0, init=False, repr=False)
    """Counts changes of ``_group_of`` (the key of ``group_members``)."""
    _group_members: tuple[int, dict[str, tuple[gangs.GroupKey, tuple[str, ...]]]] | None = field(
        default=None, init=False, repr=False
    )
    _mix: WorkloadMix | None = field(default=None, init=False)
    _mix_changes: int = field(default=0, init=False)
    _mix_shapes: set[tuple[float, int, frozenset[str]]] = field(default_factory=set, init=False)
    """The GPU shapes (milli-GPU per device, devices, models) of the pods the mix was
    last built from: a pod of another shape makes it stale."""
    _mix_stale: bool = field(default=False, init=False)
    _ctx: tuple[int, ScoreContext] | None = field(default=None, init=False)
    _largest: tuple[int, int | None] | None = field(default=None, init=False)
    _memory_uids: set[str] = field(default_factory=set, init=False)
    """Pods that ask by GPU memory: their rows depend on the nodes' device memory."""
    _read: dict[str, tuple[FairShareConfig, tuple[Any, ...], bool]] = field(
        default_factory=dict, init=False, repr=False
    )
    """Per pod, what its last reading depended on (``_inputs``), with the config it was
    read under and whether it is a GPU share: a watch event that changes none of it (a
    status update, the phase going Pending -> Running) is not parsed again."""
    _verb_reads: OrderedDict[tuple[str, str], tuple[Any, ...]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    """The pods of the last scheduler calls by (uid, resourceVersion), parsed (``request``)."""
    group_fits: Callable[[FairShareConfig], GroupFits | None] | None = None
    """How other tenants' waiting pod groups count at the gate (the gang coordinator's
    ``group_fits``; None: every pod is judged alone), for ``view``."""
    _pending_edits: int = field(default=0, init=False, repr=False)
    """Counts the adapter's own changes of the queue (``take_pending``, ``requeue``)."""
    _view: tuple[Any, ...] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        config = self.config()
        self._state = ClusterState(ResourceIndex(config.resource_names()))
        self._columns_of = config
        self._declare_capacity(config)

    def _declare_capacity(self, config: FairShareConfig) -> None:
        """The config's declared ``capacity`` stands in for resources no node reports
        (``storage``: bound PVCs count in usage, so shares need its capacity)."""
        declared = config.capacity_amounts() or {}
        self._state.declare_capacity(cluster_shares.kernel_amounts(self._state, declared))

    @property
    def state(self) -> ClusterState:
        """The arrays, with the columns of the config in force (rebuilt after a swap that
        changed ``resources``; the check is one identity test when nothing changed)."""
        config = self.config()
        if config is not self._columns_of:
            self._follow_config(config)
        return self._state

    def _follow_config(self, config: FairShareConfig) -> None:
        if config.resource_names() == self._state.index.names:
            before = self._columns_of
            self._columns_of = config
            self._declare_capacity(config)
            dra_changed = before is not None and (before.dra, before.mig) != (
                config.dra,
                config.mig,
            )
            if dra_changed and self.resource_slices:
                self._recount_slices()  # other GPU classes: other DRA capacity
            return
        fresh = self._rebuilt(config)
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(fresh, f.name))

    def _rebuilt(self, config: FairShareConfig) -> ExtenderTracker:
        """A new tracker for ``config``'s columns from the objects this one holds.

        Columns only dropped or reordered: every row is cut down to the new columns
        (exact: the units do not change), so nothing is parsed again. A new column: the
        pods are read again (their rows lack it), as at the first sync, and the binds the
        extender assumed but the watch has not reported are carried over.
        """
        fresh = ExtenderTracker(lambda: config, mix_every=self.mix_every)
        fresh.namespace_labels = {k: dict(v) for k, v in self.namespace_labels.items()}
        fresh.resource_claims = dict(self.resource_claims)
        fresh.claim_objects = dict(self.claim_objects)
        fresh.claim_held = dict(self.claim_held)
        fresh.resource_slices, fresh.device_classes = self.resource_slices, self.device_classes
        fresh.taint_rules = self.taint_rules
        fresh._recount_slices()  # no node known yet: only the counts
        fresh._asked, fresh._answers = dict(self._asked), dict(self._answers)
        fresh.on_resync("Node", list(self.nodes.values()))
        old, new = self._state, fresh._state
        if all(old.index.has(name) for name in new.index.names):
            self._project(fresh)
        else:
            self._replay(fresh)
        if fresh.claim_pods:
            fresh._recount_dra()
        fresh.volume_claims = dict(self.volume_claims)
        fresh._recount_storage()
        fresh._gone = self._gone
        # Shared GPUs: reservation pods, and groups closed because their GPU was lost.
        fresh.reservations = dict(self.reservations)
        fresh.on_change = self.on_change
        fresh.group_fits = self.group_fits
        for gid, shared in old.groups.items():
            if shared.closed:
                new.close_group(gid)
        fresh.gated = {uid for uid in self.gated if uid in fresh.pending}
        fresh.dra_refused = {uid for uid in self.dra_refused if uid in fresh.pending}
        fresh.dra_released = self.dra_released
        fresh.config = self.config
        fresh._columns_of = config
        return fresh

    def _project(self, fresh: ExtenderTracker) -> None:
        old, new = self._state, fresh._state
        cols = [old.index.column(name) for name in new.index.names]

        def cut(row: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(row[c] for c in cols)

        for held in old.pods.values():
            if held.node in new.node_index:
                _rebind(new, held, cut(held.row))
        fresh.pods = dict(self.pods)
        fresh.held_room = set(self.held_room)
        fresh._group_of = dict(self._group_of)
        fresh.pending = {
            uid: dataclasses.replace(req, row=cut(req.row)) for uid, req in self.pending.items()
        }
        fresh.verdicts = dict(self.verdicts)
        fresh.class_keys = dict(self.class_keys)  # (CPU amount, GPU shape): no column in it
        fresh.unreadable = {**self.unreadable, **fresh.unreadable}
        fresh.claim_pods = dict(self.claim_pods)
        fresh.claim_users = {k: set(v) for k, v in self.claim_users.items()}
        fresh.carried = dict(self.carried)
        fresh._memory_uids = set(self._memory_uids)

    def _replay(self, fresh: ExtenderTracker) -> None:
        pods = list(self.pods.values())
        bound = [p for p in pods if objects.is_bound(p)]
        # Annotated pods first: a guessed placement must not take a device they hold.
        bound.sort(key=lambda p: resources.ANN_GPU_DEVICES not in _annotations(p))
        fresh.on_resync("Pod", bound + [p for p in pods if not objects.is_bound(p)])
        old, new = self._state, fresh._state
        for uid, held in old.pods.items():
            # Assumed binds (accounted at bind, not yet reported by the watch) stay held.
            if uid in new.pods or uid not in self.pods or held.node not in new.node_index:
                continue
            _rebind(new, held, new.index.kernel_vector(old.index.amounts(held.row)))
            fresh.pending.pop(uid, None)

    # -- sink ------------------------------------------------------------------

    def on_resync(self, kind: str, objects_: list[dict[str, Any]]) -> None:
        """Replace what is known of ``kind`` with the complete list ``objects_``."""
        if kind == "Node":
            largest = self.largest_device_memory()
            self.nodes.clear()
            names = {str(_meta(n).get("name", "")) for n in objects_}
            for gone in [n.name for n in self.state.nodes if n.name not in names]:
                objects.delete_node(self.state, gone)
            for node in objects_:
                self._node(node)
            self._reapply_pods()
            self._recount_memory_pods(largest)
        elif kind == "Pod":
            uids = {objects.pod_uid(p) for p in objects_}
            for uid in [u for u in self.pods if u not in uids]:
                self._forget_pod(uid)
            for uid in [u for u in self.reservations if u not in uids]:
                self._forget_pod(uid)
            for pod in objects_:
                self._pod(pod)
        elif kind == "Namespace":
            self.namespace_labels.clear()
            for ns in objects_:
                self.on_event(kind, "ADDED", ns)
        elif kind == dra.KIND_CLAIM:
            listed = {_claim_key(c) for c in objects_}
            if any(_allocated(c) for k, c in self.claim_objects.items() if k not in listed):
                self.dra_released += 1  # deleted allocated while the watch was away
            for key in list(self.claim_objects):
                self._forget_claim(key)
            for claim in objects_:
                self._claim(claim)
            self._reread_claim_users(list(self.claim_users))
            self._recount_dra()
        elif kind == KIND_PVC:
            self.volume_claims.clear()
            for pvc in objects_:
                self._volume_claim(pvc, deleted=False)
            self._recount_storage()
        elif kind in (dra.KIND_SLICE, dra.KIND_DEVICE_CLASS, dra.KIND_TAINT_RULE):
            held = self._dra_objects(kind)
            held.clear()
            held.update((str(_meta(o).get("name", "")), o) for o in objects_)
            if kind == dra.KIND_DEVICE_CLASS:
                held.pop(REQUEUE_DEVICE_CLASS, None)  # fairshare's own: see on_event
            self._recount_slices()

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """Apply one watch event (ADDED / MODIFIED / DELETED)."""
        deleted = event_type == "DELETED"
        if kind == "Node":
            largest = self.largest_device_memory() if self._memory_uids else None
            if deleted:
                self.nodes.pop(str(_meta(obj).get("name", "")), None)
                objects.delete_node(self.state, str(_meta(obj).get("name", "")))
                if self.claim_pods:
                    self._recount_dra()
                self._recount_memory_pods(largest)
            else:
                name = str(_meta(obj).get("name", ""))
                known = name in self.state.node_index
                self._node(obj)
                # Pods of a node already known are accounted; only a node that just
                # appeared has pods waiting for it (heartbeats must not rescan pods).
                if not known:
                    self._reapply_pods(node=name)
                self._recount_memory_pods(largest)
        elif kind == "Pod":
            if deleted:
                self._forget_pod(objects.pod_uid(obj))
            else:
                self._pod(obj, skip_unchanged=True)
        elif kind == dra.KIND_CLAIM:
            key = _claim_key(obj)
            before = self.resource_claims.get(key), self.claim_held.get(key)
            if deleted:
                if _allocated(obj) or _allocated(self.claim_objects.get(key) or {}):
                    self.dra_released += 1
                self._forget_claim(key)
            else:
                self._claim(obj)
            if (self.resource_claims.get(key), self.claim_held.get(key)) != before:
                self._reread_claim_users([key])
            self._recount_dra()
        elif kind == KIND_PVC:
            self._volume_claim(obj, deleted=deleted)
            self._recount_storage()
        elif kind in (dra.KIND_SLICE, dra.KIND_DEVICE_CLASS, dra.KIND_TAINT_RULE):
            held = self._dra_objects(kind)
            name = str(_meta(obj).get("name", ""))
            if kind == dra.KIND_DEVICE_CLASS and name == REQUEUE_DEVICE_CLASS:
                return  # fairshare's own (it selects no device), annotated at each requeue
            if deleted:
                held.pop(name, None)
            else:
                held[name] = obj
            self._recount_slices(name if kind == dra.KIND_SLICE else None)
        elif kind == "Namespace":
            name = str(_meta(obj).get("name", ""))
            if deleted:
                self.namespace_labels.pop(name, None)
            else:
                labels = _meta(obj).get("labels") or {}
                self.namespace_labels[name] = {str(k): str(v) for k, v in labels.items()}
            # Tenancy may have changed for every pod of the namespace.
            for pod in [p for p in self.pods.values() if _meta(p).get("namespace") == name]:
                self._pod(pod)
            if self.volume_claims or self.storage_usage:
                self._recount_storage()

    def _dra_objects(self, kind: str) -> dict[str, dict[str, Any]]:
        if kind == dra.KIND_SLICE:
            return self.resource_slices
        return self.device_classes if kind == dra.KIND_DEVICE_CLASS else self.taint_rules

    def _node(self, node: dict[str, Any]) -> None:
        name = str(_meta(node).get("name", ""))
        self.nodes[name] = slim_node(node)
        try:
            dra_gpus = self.slice_gpus.node_gpus.get(name, 0)
            objects.apply_node(self.state, node, self.config(), dra_gpus=dra_gpus)
        except (StateError, resources.DemandError) as exc:
            self.unreadable[f"Node/{_meta(node).get('name')}"] = str(exc)

    def largest_device_memory(self) -> int | None:
        """Bytes of the largest GPU device known (cached per node-set version)."""
        version = self.state._nodes_version
        if self._largest is None or self._largest[0] != version:
            self._largest = (version, objects.largest_device_memory(self.state))
        return self._largest[1]

    def _recount_memory_pods(self, before: int | None) -> None:
        """GPU-memory pods count a share of the largest device while pending (and on a
        node of unknown device memory): when that device changes, count them again."""
        if not self._memory_uids or self.largest_device_memory() == before:
            return
        for uid in sorted(self._memory_uids):
            pod = self.pods.get(uid)
            if pod is not None:
                self._pod(pod)

    def _reapply_pods(self, node: str | None = None) -> None:
        for pod in list(self.pods.values()):
            spec = pod.get("spec") or {}
            if spec.get("nodeName") and (node is None or spec.get("nodeName") == node):
                self._pod(pod)

    def _recount_slices(self, changed_slice: str | None = None) -> None:
        """Derive the DRA GPUs per node again (counting the devices of ``changed_slice``
        alone when only that slice changed); re-apply the known nodes whose count changed
        (their GPU capacity; pods bound there stay counted)."""
        book = self._book
        if book is None or book.slices is not self.resource_slices:
            book = self._book = dra.SliceBook(
                self.resource_slices, self.device_classes, self.taint_rules
            )
            changed_slice = None
        config = self.config()
        before = self.slice_gpus.node_gpus
        changed = book.recount(config.dra.gpu_device_classes, config.mig_fractions(), changed_slice)
        self.slice_gpus = book.capacity
        if (changed is None or changed) and self.claim_objects:
            self._recount_claims()
        after = self.slice_gpus.node_gpus
        reapplied = False
        for name in sorted(set(before) | set(after)):
            if before.get(name, 0) != after.get(name, 0) and name in self.nodes:
                self._node(self.nodes[name])
                reapplied = True
        if reapplied and self.claim_users:
            self._sync_carried(list(self.claim_users))
            self._recount_dra()
        # A GPU class that counts nothing is worth saying once a driver publishes slices.
        for key in [k for k in self.unreadable if k.startswith("DeviceClass/")]:
            del self.unreadable[key]
        if self.resource_slices:
            for name, why in self.slice_gpus.problems.items():
                self.unreadable[f"DeviceClass/{name}"] = why

    # -- claims held as devices on DRA GPU nodes ---------------------------------------

    def _set_claim_pod(self, uid: str, entry: tuple[str, tuple[str, ...]] | None) -> set[str]:
        """Set (None: drop) the claims pod ``uid`` references; returns the claim keys
        whose users changed."""
        keys: set[str] = set()
        old = self.claim_pods.pop(uid, None)
        if old is not None:
            keys |= {f"{old[0]}/{n}" for n in old[1]}
        now: set[str] = set()
        if entry is not None:
            self.claim_pods[uid] = entry
            now = {f"{entry[0]}/{n}" for n in entry[1]}
            keys |= now
        for key in keys:
            users = self.claim_users.setdefault(key, set())
            if key in now:
                users.add(uid)
            else:
                users.discard(uid)
            if not users:
                del self.claim_users[key]
        return keys

    def _is_dra_gpu_node(self, name: str) -> bool:
        """Are ``name``'s GPUs its DRA devices (``objects.apply_node``'s rule)?"""
        node = self.nodes.get(name)
        if node is None or self.slice_gpus.node_gpus.get(name, 0) <= 0:
            return False
        return allocatable_from_node(node).get(resources.GPU, 0) <= 0

    def _carrier(self, key: str) -> str | None:
        """The pod that holds claim ``key``'s GPUs as devices: the smallest uid among the
        bound pods on a DRA GPU node that reference it (None: counted by ``_recount_dra``)."""
        best = None
        for uid in self.claim_users.get(key, ()):
            spec = (self.pods.get(uid) or {}).get("spec") or {}
            node = spec.get("nodeName")
            if node and (best is None or uid < best) and self._is_dra_gpu_node(str(node)):
                best = uid
        return best

    def _sync_carried(self, keys: Iterable[str], reading: str = "") -> None:
        """Re-derive the carriers of ``keys``; a pod that starts or stops carrying a claim
        is read again (its row changes), except ``reading``, the pod being read now."""
        for key in sorted(keys):
            new, old = self._carrier(key), self.carried.get(key)
            if new == old:
                continue
            if new is None:
                del self.carried[key]
            else:
                self.carried[key] = new
            for uid in (old, new):
                if uid is not None and uid != reading and uid in self.pods:
                    self._pod(self.pods[uid])

    def _claim_devices(
        self,
        uid: str,
        req: PodRequest,
        *,
        bound: bool,
        ns_names: tuple[str, tuple[str, ...]] | None = None,
    ) -> tuple[PodRequest, str | None]:
        """``req`` plus the GPUs of the pod's claims as devices of its own row, and the
        shared-GPU group they take (None: none).

        Bound (``bound``): the claims it carries on a DRA GPU node, so the devices
        kube-scheduler allocated are taken from the node's free GPUs and count in the
        tenant's usage through the row. Whole devices are whole GPUs; the parts of one
        physical GPU (MIG partitions, shares of a shareable GPU) are one fractional device
        in the group ``dra:<gpu>``, so several pods' parts of one GPU land on one slot.
        Parts of several GPUs, or parts besides whole devices, take each GPU whole.

        Pending: the claims no bound pod holds yet (what placing the pod will take), so
        the gate, the filter and explain see its GPUs; only while the slices publish GPUs
        and none of them is network-attached (a pod's node then bounds its devices).
        A pod that asks a fraction of a GPU itself keeps its own request only.
        ``ns_names``: the pod's claims, when the watch has not shown the pod yet."""
        ns_names = self.claim_pods.get(uid) or ns_names
        if ns_names is None:
            return req, None
        ns = ns_names[0]
        keys = [f"{ns}/{name}" for name in ns_names[1]]
        whole = 0
        parts: dict[str, Fraction] = {}
        if bound:
            for key in keys:
                if self.carried.get(key) != uid:
                    continue
                held = self.claim_held.get(key)
                if held is None:
                    whole += math.ceil(self.resource_claims.get(key, 0))
                    continue
                for device, gives in held:
                    dev = self.slice_gpus.devices.get(device)
                    if dev is None or gives >= 1:
                        whole += math.ceil(gives)
                    else:
                        parts[dev.gpu] = parts.get(dev.gpu, Fraction(0)) + gives
        else:
            slices = self.slice_gpus
            if not slices.node_gpus or slices.unattributed:
                return req, None
            n = sum(
                (
                    self.resource_claims.get(key, Fraction(0))
                    for key in keys
                    if not any(u in self.state.pods for u in self.claim_users.get(key, ()))
                ),
                Fraction(0),
            )
            if 0 < n < 1:
                parts["pending"] = n
            else:
                whole = math.ceil(n)
        return objects.with_claim_gpus(
            req, self.state.gpu_col, whole=whole, parts=parts, bound=bound
        )

    def _claim(self, claim: dict[str, Any]) -> None:
        policy = self.config().dra
        key = _claim_key(claim)
        slim = _slim_claim(claim)
        self.claim_objects[key] = slim
        classes = frozenset(policy.gpu_device_classes)
        self.resource_claims[key] = dra.claim_gpus(
            slim,
            device_classes=classes,
            all_devices=policy.all_devices_count,
            devices=self.slice_gpus,
        )
        held = dra.allocated_devices(slim, device_classes=classes, devices=self.slice_gpus)
        if held:
            self.claim_held[key] = held
        else:
            self.claim_held.pop(key, None)

    def _forget_claim(self, key: str) -> None:
        self.resource_claims.pop(key, None)
        self.claim_objects.pop(key, None)
        self.claim_held.pop(key, None)

    def _recount_claims(self) -> None:
        """Count every known claim again (the devices behind them changed); re-read the
        pods whose claims now give other GPUs."""
        before = dict(self.resource_claims), dict(self.claim_held)
        for claim in list(self.claim_objects.values()):
            self._claim(claim)
        changed = [
            k
            for k in self.claim_objects
            if self.resource_claims.get(k) != before[0].get(k)
            or self.claim_held.get(k) != before[1].get(k)
        ]
        if changed:
            self._reread_claim_users(changed)
            self._recount_dra()

    def _reread_claim_users(self, keys: Iterable[str]) -> None:
        """Read again the pods whose request includes claims ``keys``: their carriers, and
        the pending pods that reference them."""
        uids = {self.carried[k] for k in keys if k in self.carried}
        uids |= {
            uid
            for k in keys
            for uid in self.claim_users.get(k, ())
            if uid in self.pending or uid in self.gated
        }
        for uid in sorted(uids):
            if uid in self.pods:
                self._pod(self.pods[uid])

    def _recount_dra(self) -> None:
        """Re-derive the DRA GPUs of every tenant from the bound pods' claims."""
        want: dict[str, float] = {}
        seen: set[str] = set()
        for uid, (ns, names) in sorted(self.claim_pods.items()):
            bound = self.state.pods.get(uid)
            if bound is None or bound.tenant is None:
                continue
            for name in names:
                key = f"{ns}/{name}"
                if key in seen:
                    continue
                seen.add(key)
                if self.carried.get(key, "") in self.state.pods:
                    continue  # held as devices by the pod carrying it (its row)
                milli = float(self.resource_claims.get(key, 0) * MILLI_GPU)
                want[bound.tenant] = want.get(bound.tenant, 0.0) + milli
        col = self.state.gpu_col
        for tenant in sorted(set(want) | set(self.dra_usage)):
            delta = want.get(tenant, 0.0) - self.dra_usage.get(tenant, 0.0)
            if delta:
                row = self.state.tenant_usage.setdefault(tenant, [0.0] * self.state.n_res)
                row[col] += delta
                self.state._pod_changes += 1  # cached shares depend on usage
        self.dra_usage = {t: v for t, v in want.items() if v}

    def _volume_claim(self, pvc: dict[str, Any], *, deleted: bool) -> None:
        """Remember a PVC's storage request while it is Bound (what it holds)."""
        meta = _meta(pvc)
        key = str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        status = pvc.get("status")
        phase = status.get("phase") if isinstance(status, dict) else None
        size = usage.claim_storage(pvc)
        if deleted or phase != "Bound" or not size:
            self.volume_claims.pop(key, None)
            return
        ns = str(meta.get("namespace") or "default")
        self.volume_claims[key] = (ns, resources.to_kernel_units(resources.STORAGE, size))

    def _recount_storage(self) -> None:
        """Re-derive each tenant's ``storage`` from its namespaces' bound PVCs (the webhook
        counts the same requests against ``limit.storage``)."""
        state = self.state
        if not state.index.has(resources.STORAGE):
            self.storage_usage = {}
            return
        config = self.config()
        by_ns: dict[str, float] = {}
        for ns, size in self.volume_claims.values():
            by_ns[ns] = by_ns.get(ns, 0.0) + size
        want: dict[str, float] = {}
        for ns, size in sorted(by_ns.items()):
            labels = self.namespace_labels.get(ns, {})
            owner = tenancy.resolve_tenant(ns, labels, config).tenant
            if owner is not None:
                want[owner] = want.get(owner, 0.0) + size
        col = state.index.column(resources.STORAGE)
        for tenant in sorted(set(want) | set(self.storage_usage)):
            delta = want.get(tenant, 0.0) - self.storage_usage.get(tenant, 0.0)
            if delta:
                row = state.tenant_usage.setdefault(tenant, [0.0] * state.n_res)
                row[col] += delta
                state._pod_changes += 1  # cached shares depend on usage
        self.storage_usage = {t: v for t, v in want.items() if v}

    def _forget_pod(self, uid: str) -> None:
        self._gone[uid] = None
        while len(self._gone) > GONE_MEMORY:
            self._gone.popitem(last=False)
        if self.reservations.pop(uid, None) is not None:
            self._changed()
            return
        had_claims = uid in self.claim_pods
        keys = self._set_claim_pod(uid, None) if had_claims else set()
        self.pods.pop(uid, None)
        self.held_room.discard(uid)
        self._note_group(uid, None)
        self._read.pop(uid, None)
        self.gated.discard(uid)
        self.requeued.discard(uid)
        self.preempted.pop(uid, None)
        self.verdicts.pop(uid, None)
        self.dra_refused.discard(uid)
        self._asked.pop(uid, None)
        self._answers.pop(uid, None)
        self.queue_version += 1
        self._memory_uids.discard(uid)
        self.class_keys.pop(uid, None)
        self.pending.pop(uid, None)
        self.unreadable.pop(uid, None)
        if objects.delete_pod(self.state, uid) is not None:
            self._changed()
        self._mix_changes += 1
        if had_claims:
            self._sync_carried(keys)  # another pod of its claims may carry them now
            self._recount_dra()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _settled(self, uid: str, slim: dict[str, Any]) -> bool:
        """Is the pod held as its last reading left it (so reading it again changes
        nothing)? Bound: accounted on its node. Pending: queued, or known unreadable."""
        if objects.is_bound(slim):
            held = self.state.pods.get(uid)
            node = (slim.get("spec") or {}).get("nodeName")
            return held is not None and held.node == node and uid not in self.pending
        return uid in self.pending or uid in self.unreadable

    def _pod(self, pod: dict[str, Any], *, skip_unchanged: bool = False) -> None:
        """Read one pod into the state. ``skip_unchanged``: a watch event whose pod
        differs from the last reading only where nothing here looks (``_inputs``) is
        not parsed again (the node set, namespace labels and config changes re-read pods
        without it)."""
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
        # Only what a later re-read needs is kept: at 100,000 pods the whole objects
        # would be most of the process' memory.
        slim = objects.slim_pod(pod)
        self.queue_version += 1
        self._note_group(uid, slim)
        self._judge_verdict(uid, slim)
        tenant = objects.pod_tenant(pod, config=config, namespace_labels=self.namespace_labels)
        if reclaim.ANN_HELD_NODE in _annotations(slim):
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
        had_claims = uid in self.claim_pods
        if names or had_claims:
            ns = str(_meta(pod).get("namespace") or "default")
            self._sync_carried(self._set_claim_pod(uid, (ns, names) if names else None), uid)
        share = False
        try:
            req = objects.pod_request(
                pod,
                config=config,
                tenant=tenant,
                index=self.state.index,
                device_memory=self.largest_device_memory,
            )
            share = objects.is_share(req)
            if req.demand.gpu.memory is not None:
                self._memory_uids.add(uid)
            else:
                self._memory_uids.discard(uid)
            bound = objects.is_bound(pod)
            # A pod's claims are part of its shape (the mix) and demand (the gate).
            held_req, group = self._claim_devices(uid, req, bound=bound)
            key = class_key(held_req, cpu_col=self.state.index.column(CPU))
            self.class_keys[uid] = key
            if key[1:] not in self._mix_shapes:
                self._mix_stale = True
            if bound:
                self.pending.pop(uid, None)
                self.gated.discard(uid)
                objects.apply_pod(self.state, pod, config, tenant, request=held_req, group=group)
                if self.on_change is not None and share:
                    self.on_change()
            else:
                req = held_req
                before = self.pending.get(uid)
                if before is not None and (before.row, before.tenant) != (req.row, req.tenant):
                    self._demand_version += 1
                self.pending[uid] = self._with_verdict(uid, req)
                self._keep_read(pod, config, tenant, req)
        except (StateError, resources.DemandError) as exc:
            self.unreadable[uid] = str(exc)
            self.pending.pop(uid, None)
        self._read[uid] = (config, inputs, share)
        if names or had_claims:
            self._recount_dra()

    # -- derived ---------------------------------------------------------------

    def mix(self) -> WorkloadMix | None:
        """The workload mix of the pods seen (bound and pending), rebuilt lazily: when
        a tenth of the pods (at most ``mix_every``) came or went since the last build,
        or a pod of a GPU shape that build did not see arrived."""
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

    def remember(self, pod: dict[str, Any]) -> None:
        """Take in a pod seen in a scheduler call before its watch event (bind needs it)."""
        uid = objects.pod_uid(pod)
        if uid and uid not in self.pods and uid not in self._gone and not objects.is_bound(pod):
            try:
                self._pod(pod)
            except (TypeError, ValueError, AttributeError, KeyError) as exc:
                # A pod body we cannot read is the scheduler's problem to report, not
                # ours to crash on; it simply does not join the pending queue.
                self.pods.pop(uid, None)
                self._note_group(uid, None)
                self.pending.pop(uid, None)
                self.unreadable[uid] = f"{type(exc).__name__}: {exc}"

    def request(self, pod: Mapping[str, Any], config: FairShareConfig) -> PodRequest:
        """The ``PodRequest`` of a pod sent by kube-scheduler (``verbs.request_for``),
        read once per pod version: filter and prioritize of one scheduling attempt carry
        the same pod (uid and ``resourceVersion``), so prioritize reuses filter's reading,
        and filter the watch's reading of that pending pod version, as long as the
        tenant, config, columns and largest device are the same. Raises
        ``resources.DemandError`` (not remembered: the next call reads the pod again)."""
        tenant = objects.pod_tenant(pod, config=config, namespace_labels=self.namespace_labels)
        state = self.state
        key = _version_key(pod)
        held = self._verb_reads.get(key) if key is not None else None
        stamp = (tenant, self.largest_device_memory())
        if held is not None and held[0] is config and held[1] is state.index and held[2] == stamp:
            req: PodRequest = held[3]
            return req
        req = objects.pod_request(
            pod,
            config=config,
            tenant=tenant,
            index=state.index,
            device_memory=self.largest_device_memory,
        )
        names = dra.pod_claim_names(pod)
        if names and not objects.is_bound(pod):
            ns = str((pod.get("metadata") or {}).get("namespace") or "default")
            uid = objects.pod_uid(pod)
            req = self._claim_devices(uid, req, bound=False, ns_names=(ns, names))[0]
        self._keep_read(pod, config, tenant, req)
        return req

    def _keep_read(
        self, pod: Mapping[str, Any], config: FairShareConfig, tenant: str | None, req: PodRequest
    ) -> None:
        """Remember ``req`` as the reading of this pod version for ``request``: the watch's
        reading of a pending pod serves the scheduler calls that carry the same version."""
        key = _version_key(pod)
        if key is None:
            return
        stamp = (tenant, self.largest_device_memory())
        self._verb_reads[key] = (config, self.state.index, stamp, req)
        self._verb_reads.move_to_end(key)
        while len(self._verb_reads) > VERB_READS:
            self._verb_reads.popitem(last=False)

    def fair_shares(self, config: FairShareConfig) -> dict[str, fairness.FairShare]:
        """The fair allocation over bound + pending demand, cached until either changes.

        When they changed, the per-tenant demand rows are summed again, and the
        allocation is computed again only if those rows differ (or the capacity, columns
        or config do): a bind moves a pod's request from pending to bound, which mostly
        leaves every tenant's demand as it was."""
        state = self.state
        key = (state.version, tuple(self.pending), self._demand_version, id(config))
        if self._fair is not None and self._fair[0] == key:
            return self._fair[1]
        rows = cluster_shares.demand_rows(state, self.pending.values())
        nodes, index = state._nodes_version, state.index
        held = self._fair_inputs
        if (
            held is not None
            and held[0] == nodes
            and held[1] is index
            and held[2] is config
            and held[3] == rows
        ):
            fair = held[4]
        else:
            fair = cluster_shares.fair_shares_for(state, config, rows)
            self._fair_inputs = (nodes, index, config, rows, fair)
        self._fair = (key, fair)
        return fair

    def pending_queue(self) -> list[PodRequest]:
        return list(self.pending.values())

    def view(self, config: FairShareConfig) -> verbs.ExtenderView:
        """What the verbs read (``verbs.ExtenderView``), made once per version of what
        the tracker holds: the same view until a node, a bound pod, the queue or a pending
        pod's demand changes, or another config is in force. Its fair allocation is
        computed at its first use and kept with it; its mix and score context are the
        tracker's (each kept until what it is built from changes)."""
        state = self.state
        counts = (state.version, self.queue_version, self._demand_version, self._pending_edits)
        held, fits = self._view, self.group_fits
        if (
            held is not None
            and held[0] is state
            and held[1] is config
            and held[2] == counts
            and held[3] == fits  # the same coordinator's bound method compares equal
        ):
            view: verbs.ExtenderView = held[4]
            return view
        view = verbs.ExtenderView(
            state,
            self.pending,
            self.namespace_labels,
            self.pods,
            lambda pod: self.request(pod, config),
            verbs.Once(lambda: self.fair_shares(config)),
            self.mix,  # both kept by the tracker until what they are built from changes
            self.context,
            (lambda: fits(config)) if fits is not None else (lambda: None),
            self.room_holds,
        )
        self._view = (state, config, counts, fits, view)
        return view

    def room_holds(self) -> list[reclaim.RoomHold]:
        """The reclaim holds in force now (``reclaim.holds_in_force``): of pods still
        pending, not lapsed; and of pods bound on another node than the one their hold is
        on, until it lapses (``reclaim.held_off``: the room stays held for their tenant).
        Asked at each filter, as a hold lapses with time alone."""
        if not self.held_room:
            return []
        pods, now = self.pods, self.clock()
        out = reclaim.holds_in_force(
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
            if ann.get(reclaim.ANN_HELD_NODE) == bound.node:
                continue  # bound in its room (most of these): the hold is over
            until = reclaim.hold_until(ann)
            if until is None or now >= until:
                continue
            try:
                req = self.request(pods[uid], self.config())
            except resources.DemandError:
                continue
            hold = reclaim.hold_of(req, ann)
            if hold is not None:
                out.append(hold)
        return out

    def take_pending(self, uid: str) -> None:
        """The adapter accounted pod ``uid`` (assumed before its Binding): not pending."""
        if self.pending.pop(uid, None) is not None:
            self._pending_edits += 1

    def requeue(self, uid: str, req: PodRequest) -> None:
        """A Binding failed: the pod is pending again, if it still exists (a 404 means it
        was deleted meanwhile, and a phantom pending pod would hold other tenants back)."""
        if uid in self.pods and uid not in self.pending:
            self.pending[uid] = req
            self._pending_edits += 1

    def group_members(self) -> dict[str, tuple[gangs.GroupKey, tuple[str, ...]]]:
        """Each known pod of a pod group -> (its group, the uids of the group's known
        pods); built again only when a pod joins or leaves a group
        (``gangs.waiting.lookup_over``)."""
        held = self._group_members
        if held is not None and held[0] == self._groups_version:
            return held[1]
        by: dict[gangs.GroupKey, list[str]] = {}
        for uid, g in self._group_of.items():
            by.setdefault(g, []).append(uid)
        out = {uid: (g, tuple(uids)) for g, uids in by.items() for uid in uids}
        self._group_members = (self._groups_version, out)
        return out

    def _note_group(self, uid: str, slim: Mapping[str, Any] | None) -> None:
        """Keep ``_group_of`` for pod ``uid`` (``slim``: its reading; None: it is gone)."""
        g = gangs.group_of(slim) if slim is not None else None
        if self._group_of.get(uid) == g:
            return
        if g is None:
            del self._group_of[uid]
        else:
            self._group_of[uid] = g
        self._groups_version += 1

    def note_preempted(self, uid: str, victims: Mapping[str, Sequence[str]]) -> None:
        """Remember the victims the preempt verb answered for preemptor ``uid``."""
        self.preempted[uid] = {node: tuple(v) for node, v in victims.items()}
        self.preempted.move_to_end(uid)
        while len(self.preempted) > VERB_READS:
            self.preempted.popitem(last=False)

    def victims_pending(self, uid: str, node: str) -> tuple[str, ...]:
        """The victims answered for preemptor ``uid`` on ``node`` that the state still
        holds there (their DELETED event has not arrived yet)."""
        held = self.state.pods
        return tuple(
            v
            for v in self.preempted.get(uid, {}).get(node, ())
            if v in held and held[v].node == node
        )

    # -- kube-scheduler's verdicts ---------------------------------------------------------

    def _judge_verdict(self, uid: str, slim: dict[str, Any]) -> None:
        """Take in the pod's ``PodScheduled`` verdict (``objects.unschedulable_message``)."""
        message = None if objects.is_bound(slim) else objects.unschedulable_message(slim)
        if message is not None and eligibility.refused_for_dra_devices(message):
            self.dra_refused.add(uid)
        else:
            self.dra_refused.discard(uid)
        if message is None:
            self._asked.pop(uid, None)
            self._set_verdict(uid, None)
        elif uid in self._asked and self._asked[uid] == message:
            return  # kube-scheduler asked the extender since it wrote this verdict
        elif eligibility.rejected_by_kube_scheduler(
            message, self._answers.get(uid, ()), dra_gpus_checked=dra.asks_gpus_without_claims(slim)
        ):
            self._asked.pop(uid, None)
            self._set_verdict(uid, message)
        else:
            self._set_verdict(uid, None)

    def _set_verdict(self, uid: str, message: str | None) -> None:
        if message is None:
            if self.verdicts.pop(uid, None) is None:
                return
        elif self.verdicts.get(uid) == message:
            return
        else:
            self.verdicts[uid] = message
        self.queue_version += 1
        req = self.pending.get(uid)
        if req is not None:
            self.pending[uid] = self._with_verdict(uid, req)

    def _with_verdict(self, uid: str, req: PodRequest) -> PodRequest:
        """``req`` with ``waiting`` and ``unschedulable`` as the pod's verdict says."""
        message = self.verdicts.get(uid, "")
        if message and not gangs.waiting.is_group_refusal(message):
            if req.unschedulable == message and not req.waiting:
                return req
            return dataclasses.replace(req, waiting=False, unschedulable=message)
        if req.unschedulable == message:
            return req
        # no verdict, or the extender's own refusal of the pod's group, which keeps the
        # member waiting with its group (``gangs.waiting``; the message stays for the views)
        slim = self.pods.get(uid) or {}
        spec = slim.get("spec")
        served = eligibility.served_schedulers(self.config().scheduler_name)
        waiting = eligibility.is_waiting(spec if isinstance(spec, dict) else {}, served)
        return dataclasses.replace(req, waiting=waiting, unschedulable=message)

    def note_asked(self, uid: str, answers: Iterable[str] = ()) -> None:
        """kube-scheduler asked the extender's filter about pod ``uid``: its plugins passed
        some node, so its last verdict no longer says it cannot run. ``answers``: the
        failure texts the filter gave (a verdict that carries one was fairshare's)."""
        if uid not in self.pods:
            return
        slim = self.pods[uid]
        self._asked[uid] = None if objects.is_bound(slim) else objects.unschedulable_message(slim)
        texts = frozenset(answers)
        if texts:
            self._answers[uid] = texts
        else:
            self._answers.pop(uid, None)
        self._set_verdict(uid, None)

    def note_filter(self, req: PodRequest, gate: GateDecision | None) -> None:
        """Remember whether the fair-share gate refused ``req`` at this filter."""
        self.requeued.discard(req.uid)
        if gate is not None and not gate.allowed and req.uid in self.pending:
            self.gated.add(req.uid)
        else:
            self.gated.discard(req.uid)

    def gated_by_tenant(self) -> dict[str, int]:
        """Pending pods per tenant that the fair-share gate refused at their last filter
        (for the gated-pods gauge); a pod leaves the count when bound, deleted, or let
        through by a later filter."""
        out: dict[str, int] = {}
        for uid in self.gated:
            req = self.pending.get(uid)
            if req is not None and req.tenant is not None:
                out[req.tenant] = out.get(req.tenant, 0) + 1
        return out
