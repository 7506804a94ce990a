"""Kubernetes objects → ``ClusterState``: nodes, bound pods, GPU health and device ledger.

The informers, the ``--state`` file (``load_state_file``, the one function that reads a
file) and the tests all build the state through these functions. ``state.readers`` (pod
identity and phase) and ``state.nodes`` (nodes, GPU health) are re-exported here.

The devices a pod holds are in its ``fairshare.io/gpu-devices`` annotation, written by the
extender's bind: ``"<device>:<milli-GPU>[,...]"``, device indexes >= 0 in the node's GPU
order, milli-GPU in 1..1000, sorted by device, no spaces (``"0:1000,1:1000"``,
``"3:250"``). An annotation is restored even if it oversubscribes a device; a pod without
one (placed by another scheduler) gets the devices the extender would choose. So a List
loads nodes, then namespaces, then annotated pods, then the rest: a guessed placement
never takes a device an annotated pod holds. Bound non-terminal pods are placed; unbound
ones are the pending queue.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import yaml

from fairshare import eligibility, resources, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.podrequest import PodRequest
from fairshare.resources import ANN_GPU_DEVICES, ANN_GPU_GROUP, MILLI_GPU, ResourceIndex
from fairshare.state.cluster import LABEL_GPU_PRODUCT, BoundPod, ClusterState, StateError
from fairshare.state.devices import choose_devices, mig_row, mig_use
from fairshare.state.nodes import (
    ANN_HAMI_REGISTER,
    apply_node,
    delete_node,
    hami_device_count,
    node_gpu_health,
    node_taints,
)
from fairshare.state.readers import (
    LABEL_GPU_GROUP,
    TERMINAL_PHASES,
    UNSCHEDULABLE,
    is_bound,
    is_terminal,
    metadata,
    pod_uid,
    slim_pod,
    str_map,
    unschedulable_message,
)

__all__ = [
    "ANN_HAMI_REGISTER",
    "DRA_GROUP_PREFIX",
    "LABEL_GPU_GROUP",
    "TERMINAL_PHASES",
    "UNSCHEDULABLE",
    "LoadedState",
    "apply_node",
    "apply_pod",
    "delete_node",
    "delete_pod",
    "format_gpu_devices",
    "hami_device_count",
    "is_bound",
    "is_share",
    "is_terminal",
    "largest_device_memory",
    "legacy_group_id",
    "load_state_file",
    "new_group_id",
    "node_gpu_health",
    "node_taints",
    "parse_gpu_devices",
    "pod_group",
    "pod_request",
    "pod_tenant",
    "pod_uid",
    "share_group",
    "slim_pod",
    "unschedulable_message",
    "with_claim_gpus",
]

Devices = tuple[tuple[int, float], ...]


# -- the device annotation ---------------------------------------------------------


def format_gpu_devices(devices: Iterable[tuple[int, float]]) -> str:
    """``((1, 500.0), (0, 500.0))`` → ``"0:500,1:500"`` (see the module docstring)."""
    return ",".join(f"{dev}:{math.ceil(milli)}" for dev, milli in sorted(devices))


def parse_gpu_devices(text: str) -> Devices:
    """Parse a ``fairshare.io/gpu-devices`` value; raises ``ValueError`` with the reason."""
    out: list[tuple[int, float]] = []
    seen: set[int] = set()
    for part in text.split(","):
        dev_s, sep, milli_s = part.partition(":")
        if not sep or not dev_s.isdigit() or not milli_s.isdigit():
            raise ValueError(f"{part!r} is not <device>:<milli-GPU>")
        dev, milli = int(dev_s), int(milli_s)
        if not 0 < milli <= MILLI_GPU:
            raise ValueError(f"{part!r}: milli-GPU must be in 1..{MILLI_GPU}")
        if dev in seen:
            raise ValueError(f"device {dev} listed twice")
        seen.add(dev)
        out.append((dev, float(milli)))
    return tuple(sorted(out))


# -- pods -------------------------------------------------------------------------------


def pod_tenant(
    pod: Mapping[str, Any],
    *,
    config: FairShareConfig,
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> str | None:
    """The pod's tenant, resolved from its namespace (and that namespace's labels)."""
    ns = str(metadata(pod).get("namespace") or "default")
    return tenancy.resolve_tenant(ns, namespace_labels.get(ns, {}), config).tenant


def largest_device_memory(state: ClusterState) -> int | None:
    """Bytes of the largest GPU device among the state's nodes, None when none is known."""
    return max((n.device_memory for n in state.nodes), default=0) or None


def pod_request(
    pod: Mapping[str, Any],
    *,
    config: FairShareConfig,
    tenant: str | None,
    index: ResourceIndex,
    device_memory: Callable[[], int | None] | None = None,
) -> PodRequest:
    """A pod object as a ``PodRequest`` (exact demand, kernel row, allowed GPU models).

    The row counts the pod as usage counts it (``resources.counted_demand``): a
    GPU-memory request is a share of the device ``device_memory()`` answers (called only
    for such pods: the bound node's, or the largest device for a pending pod), a whole
    GPU when it answers None or is not given. ``demand`` keeps the request as asked, so
    placement resolves it per node (``PodRequest.gpu_milli_for``).
    Raises ``resources.DemandError`` when the pod's resources or GPU annotations are invalid.
    """
    meta = metadata(pod)
    demand = resources.pod_demand(pod, mig=config.mig_fractions())
    counted = demand
    if demand.gpu.memory is not None:
        counted = resources.counted_demand(demand, device_memory() if device_memory else None)
    try:
        row = tuple(index.kernel_vector(counted.amounts))
    except OverflowError:
        # "1e9999" is a valid quantity, but no float (and no node) holds it.
        raise resources.DemandError("a resource request is too large to place") from None
    gpu_models = resources.gpu_models(meta.get("annotations"))
    uid = pod_uid(pod)
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    constraints = eligibility.parse_node_constraints(spec)
    if not gpu_models and demand.gpu.count:
        # A GPU pod whose node selector or required affinity pins the GPU product
        # label is as model-restricted as one annotated with the models: its task
        # class must say so, or the fragmentation term sends other pods to the only
        # nodes it can use.
        pinned = constraints.pinned_values(LABEL_GPU_PRODUCT)
        if pinned:
            gpu_models = pinned
    return PodRequest(
        uid=uid,
        name=str(meta.get("name") or uid),
        namespace=str(meta.get("namespace") or "default"),
        tenant=tenant,
        demand=demand,
        row=row,
        gpu_models=gpu_models,
        constraints=constraints,
        waiting=eligibility.is_waiting(spec, eligibility.served_schedulers(config.scheduler_name)),
    )


def new_group_id(node: str, uid: str) -> str:
    """The id of a shared GPU first taken by pod ``uid`` on ``node``: deterministic,
    unique while pod UIDs are, and a valid label value (``gpu-<12 hex>``)."""
    return "gpu-" + hashlib.sha256(f"{node}/{uid}".encode()).hexdigest()[:12]


def legacy_group_id(node: str, slot: int) -> str:
    """The shared GPU of a fractional pod bound before groups existed (only
    ``fairshare.io/gpu-devices: "<slot>:<milli>"``): one group per node slot."""
    return "slot-" + hashlib.sha256(f"{node}/{slot}".encode()).hexdigest()[:12]


def _whole_slots(state: ClusterState, i: int, count: int, hint: Devices) -> Devices:
    """Whole GPUs are counts: any fully free slots (the annotated ones first)."""
    devs = state.node_devices(i)
    order = [d for d, _ in hint if d < len(devs)] + list(range(len(devs)))
    picked: list[int] = []
    for d in order:
        if d not in picked and devs[d] >= MILLI_GPU and len(picked) < count:
            picked.append(d)
    if len(picked) < count:
        # An overloaded node: keep the pod counted (on its annotated slots when valid).
        present = [d for d in range(len(devs)) if devs[d] >= 0]
        rest = [d for d, _ in hint if d in present] + present
        for d in rest:
            if d not in picked and len(picked) < count:
                picked.append(d)
    return tuple((d, float(MILLI_GPU)) for d in sorted(picked))


def _share_slot(state: ClusterState, i: int, milli: float, group: str, hint: Devices) -> Devices:
    """The slot of a fractional pod of shared GPU ``group``: the group's slot when the
    ledger knows it, else the annotated slot if it has room and no other group holds it,
    else the fullest slot with room that no other group holds (a whole-GPU pod may
    have taken the old slot: its index means nothing), else the annotated slot (an
    overloaded node), else none (the pod still counts, on no device)."""
    node = state.nodes[i].name
    known = state.groups.get(group)
    if known is not None and known.node == node:
        return ((known.slot, milli),)
    devs = state.node_devices(i)
    own = [d for d in range(len(devs)) if devs[d] >= 0 and state.group_at(node, d) is None]
    for d, _ in hint:
        if d in own and devs[d] >= milli:
            return ((d, milli),)
    fitting = sorted((devs[d], d) for d in own if devs[d] >= milli)
    if fitting:
        return ((fitting[0][1], milli),)
    for d, _ in hint:
        # No room anywhere: the node is overloaded; the annotated slot keeps it counted.
        if d in own:
            return ((d, milli),)
    return ()


def is_share(req: PodRequest) -> bool:
    """A pod that asks for part of one GPU by annotation (fraction or GPU memory): it
    holds a share of a shared GPU. MIG slices and whole GPUs are device-plugin resources."""
    return req.demand.gpu.source in ("fraction", "memory") and req.demand.gpu.count == 1


def share_group(
    state: ClusterState, req: PodRequest, node: str, devices: Sequence[tuple[int, float]]
) -> tuple[str, bool]:
    """(group id, is new) for a fractional pod placed on ``devices`` of ``node``; ("",
    False) for other pods. A share on a slot that holds a shared GPU joins it; on a free
    slot it starts a new one, named after the pod (``new_group_id``). The extender's bind
    and the simulator both use it."""
    if len(devices) != 1 or not is_share(req):
        return "", False
    existing = state.group_at(node, devices[0][0])
    if existing:
        return existing, False
    return new_group_id(node, req.uid), True


DRA_GROUP_PREFIX: Final = "dra:"
"""Shared-GPU group ids of DRA devices (MIG partitions, shares of a shareable GPU): the
physical GPU their claims hold, so that they land on one device slot of the node."""


def with_claim_gpus(
    req: PodRequest,
    gpu_col: int,
    *,
    whole: int,
    parts: Mapping[str, Fraction],
    bound: bool,
) -> tuple[PodRequest, str | None]:
    """``req`` plus the GPUs of its DRA claims as devices of its own row (the extender's
    cache and the simulator both use it): ``whole`` devices and ``parts`` of physical
    GPUs (by GPU key; a pending pod's unallocated part under any key); and the shared GPU
    the parts take when bound (one GPU's parts alone: ``dra:<gpu>``, so several pods'
    parts of one GPU land on one slot). Parts of several GPUs, or parts besides whole
    devices, take each GPU whole. A pod that asks a fraction of a GPU itself keeps its
    own request only."""
    gpu = req.demand.gpu
    if gpu.source not in ("none", "device") or gpu.memory is not None:
        return req, None
    if gpu.count and gpu.per_device != 1:
        return req, None
    group: str | None = None
    per_device = Fraction(1)
    if parts and not whole and not gpu.count and len(parts) == 1:
        ((key, part),) = parts.items()
        per_device = min(Fraction(1), part)
        whole = 1
        group = DRA_GROUP_PREFIX + key if bound else None
    else:
        whole += len(parts)
    if whole <= 0:
        return req, None
    total = per_device * whole
    row = list(req.row)
    row[gpu_col] += float(total * MILLI_GPU)
    amounts = dict(req.demand.amounts)
    amounts[resources.GPU] = amounts.get(resources.GPU, Fraction(0)) + total
    demand = dataclasses.replace(
        req.demand,
        amounts=amounts,
        gpu=dataclasses.replace(
            gpu,
            count=gpu.count + whole,
            per_device=per_device,
            source="device" if per_device == 1 else "dra",
        ),
    )
    return dataclasses.replace(req, demand=demand, row=tuple(row)), group


def pod_group(state: ClusterState, pod: Mapping[str, Any], req: PodRequest, node: str) -> str:
    """The shared GPU a bound fractional pod belongs to ("" for other pods): its
    ``fairshare.io/gpu-group``, or, for a pod bound before groups, one per annotated slot."""
    if not is_share(req):
        return ""
    annotations = str_map(metadata(pod).get("annotations"))
    group = annotations.get(ANN_GPU_GROUP, "")
    if group:
        return group
    devs = _parse_or_none(annotations.get(ANN_GPU_DEVICES, "")) or ()
    if len(devs) == 1:
        return legacy_group_id(node, devs[0][0])
    return new_group_id(node, req.uid)


def _devices_for(
    state: ClusterState, req: PodRequest, i: int, annotation: str | None, group: str
) -> Devices:
    hint = (_parse_or_none(annotation) or ()) if annotation is not None else ()
    milli = req.gpu_milli_for(state.nodes[i].device_memory)
    if not math.isfinite(milli):
        return ()
    if group:
        return _share_slot(state, i, milli, group, hint)
    if milli >= MILLI_GPU:
        return _whole_slots(state, i, req.gpu_count, hint)
    if hint and all(d < state.max_dev and state.node_devices(i)[d] >= 0 for d, _ in hint):
        return hint
    return choose_devices(state, req, i, milli=milli)


def apply_pod(
    state: ClusterState,
    pod: Mapping[str, Any],
    config: FairShareConfig,
    tenant: str | None,
    *,
    request: PodRequest | None = None,
    group: str | None = None,
) -> BoundPod | None:
    """Account a bound, non-terminal pod on its node; returns what the state holds.

    A terminal or unbound pod is released (returns None). A pod already accounted on
    the same node with the same row is left as it is (informer resyncs are no-ops). A pod
    whose node the state does not know yet is skipped (None): the caller re-applies pods
    when their node arrives. Raises ``resources.DemandError`` for unreadable resources.
    ``request``: the pod's ``pod_request`` under ``config`` and ``tenant`` when the caller
    has it already (not used for a pod asking by GPU memory: its row depends on the node).

    A fractional pod joins its shared GPU (``fairshare.io/gpu-group``), so the shares
    of one group land on one slot whatever order the pods come back in; whole-GPU pods
    take any fully free slots (their slot index is not authoritative). ``group`` names
    the shared GPU of a pod whose device share the caller knows (a DRA device's
    partitions and shares, by physical GPU) instead of the pod's annotations.
    """
    uid = pod_uid(pod)
    if is_terminal(pod) or not is_bound(pod):
        state.unbind(uid)
        return None
    node = str(pod["spec"]["nodeName"])
    i = state.node_index.get(node)
    if i is None:
        state.unbind(uid)
        return None
    node_memory = state.nodes[i].device_memory
    req = request
    if req is None or req.demand.gpu.memory is not None:
        req = pod_request(
            pod,
            config=config,
            tenant=tenant,
            index=state.index,
            device_memory=lambda: node_memory or largest_device_memory(state),
        )
    annotation = str_map(metadata(pod).get("annotations")).get(ANN_GPU_DEVICES)
    row = req.row
    slices = mig_use(state, req, i)
    if slices is not None:
        row = mig_row(state, req, i, slices)
    elif req.demand.wants_gpu:
        # A GPU-memory pod on a node of unknown device memory keeps the row's share of
        # the largest device (or a whole GPU), as the webhook counts it: never 0.
        row = req.row_on(state.gpu_col, req.gpu_milli_for(node_memory))
    if group is None:
        group = pod_group(state, pod, req, node)
    old = state.pods.get(uid)
    if old is not None and (old.node, old.row, old.tenant, old.group) == (node, row, tenant, group):
        return old
    state.unbind(uid)
    devices: Devices = ()
    if req.demand.wants_gpu and slices is None:
        devices = _devices_for(state, req, i, annotation, group)
    return state.bind(
        uid=uid,
        node=node,
        row=row,
        devices=devices,
        tenant=tenant,
        name=req.name,
        allow_overcommit=True,
        mig=slices,
        group=group if devices else "",
    )


def _parse_or_none(annotation: str) -> Devices | None:
    """``parse_gpu_devices`` that answers None for an invalid value."""
    try:
        return parse_gpu_devices(annotation)
    except ValueError:
        return None


def delete_pod(state: ClusterState, uid: str) -> BoundPod | None:
    """Release a deleted pod (unknown uids are ignored)."""
    return state.unbind(uid)


# -- a whole List -------------------------------------------------------------------------


@dataclass
class LoadedState:
    """What a ``List`` of Nodes, Namespaces and Pods gives the extender."""

    state: ClusterState
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    pending: list[PodRequest] = field(default_factory=list)
    """Unbound non-terminal pods, in list order (the fair-share gate's queue)."""
    skipped: list[str] = field(default_factory=list)
    """Items that could not be applied, with the reason (never fatal)."""


def _read_list(source: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    text = Path(source).read_text(encoding="utf-8")
    data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise StateError(f"{source}: expected a Kubernetes List object")
    return data


def _items_by_kind(items: Sequence[Any]) -> dict[str, list[Mapping[str, Any]]]:
    by_kind: dict[str, list[Mapping[str, Any]]] = {"Node": [], "Namespace": [], "Pod": []}
    for item in items:
        if isinstance(item, Mapping) and item.get("kind") in by_kind:
            by_kind[str(item["kind"])].append(item)
    return by_kind


def load_state_file(source: Mapping[str, Any] | str | Path, config: FairShareConfig) -> LoadedState:
    """Build the state from a Kubernetes ``List`` (a parsed object, or a JSON/YAML file).

    Items of other kinds are ignored; an item that cannot be applied is reported in
    ``skipped`` and the rest still loads. See the module docstring for the order.
    """
    obj = _read_list(source)
    items = obj.get("items")
    if not isinstance(items, list):
        raise StateError("a List needs an items array")
    by_kind = _items_by_kind(items)
    loaded = LoadedState(ClusterState(ResourceIndex(config.resource_names())))
    for node in by_kind["Node"]:
        try:
            apply_node(loaded.state, node, config)
        except (StateError, resources.DemandError) as exc:
            loaded.skipped.append(f"Node {metadata(node).get('name')}: {exc}")
    for ns in by_kind["Namespace"]:
        loaded.namespace_labels[str(metadata(ns).get("name"))] = str_map(metadata(ns).get("labels"))
    pods = [p for p in by_kind["Pod"] if not is_terminal(p)]
    bound = [p for p in pods if is_bound(p)]
    # Shares of shared GPUs first (their groups take their slots), then other annotated
    # pods: a guessed placement must not take a device they hold.
    bound.sort(key=_load_order)
    for pod in bound + [p for p in pods if not is_bound(p)]:
        _load_pod(loaded, pod, config)
    return loaded


def _load_order(pod: Mapping[str, Any]) -> tuple[bool, bool]:
    annotations = str_map(metadata(pod).get("annotations"))
    return (ANN_GPU_GROUP not in annotations, ANN_GPU_DEVICES not in annotations)


def _load_pod(loaded: LoadedState, pod: Mapping[str, Any], config: FairShareConfig) -> None:
    tenant = pod_tenant(pod, config=config, namespace_labels=loaded.namespace_labels)
    meta = metadata(pod)
    label = f"Pod {meta.get('namespace')}/{meta.get('name')}"
    try:
        if not is_bound(pod):
            state = loaded.state
            req = pod_request(
                pod,
                config=config,
                tenant=tenant,
                index=state.index,
                device_memory=lambda: largest_device_memory(state),
            )
            loaded.pending.append(req)
        elif apply_pod(loaded.state, pod, config, tenant) is None:
            loaded.skipped.append(f"{label}: unknown node {pod['spec']['nodeName']}")
    except (StateError, resources.DemandError) as exc:
        loaded.skipped.append(f"{label}: {exc}")
