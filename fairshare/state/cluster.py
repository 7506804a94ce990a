"""ClusterState: nodes as N×R float arrays, GPU devices as N×D, pods as a ledger.

The informers, the ``--state`` file loader and the simulator all feed this one class, so
the extender and the simulator see the same arrays. The arrays are updated in place,
never rebuilt per call; amounts are kernel floats in integral canonical units, with the
exact rational kept beside fractional GPU amounts, so unbinding gives back exactly what
binding took. One module because it is one class: each method updates the arrays and the
ledger together.
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Final

from _native import names as native_names
from fairshare import eligibility, resources
from fairshare.resources import GPU, MILLI_GPU, ResourceIndex

LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per device, as GPU feature discovery writes
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"


EXACT_DENOMINATOR: Final = 100_000


def exact_amount(value: float) -> Fraction:
    """The rational a kernel amount stands for: an integral one is itself; a fractional
    one (a 1/7 partition's 142.857142857142857 milli-GPU) is the nearest rational of
    denominator at most ``EXACT_DENOMINATOR``, which is the value the float was rounded
    from whenever that value has such a denominator (float error, ~1e-13 here, is far
    below the 1e-10 between two of them)."""
    value = float(value)
    if value.is_integer():
        return Fraction(int(value))
    return Fraction(value).limit_denominator(EXACT_DENOMINATOR)


_USED: Final = ("used",)


class StateError(ValueError):
    """An update that the state cannot apply (unknown node, double bind, overflow)."""


@dataclass(frozen=True)
class NodeInfo:
    """What the state keeps per node besides its array rows."""

    name: str
    labels: Mapping[str, str]
    gpu_model: str
    device_memory: int  # bytes per GPU device, 0 when unknown
    gpu_healthy: bool
    """No fatal GPU signal: the node's GPUs are in service."""
    health_reason: str = ""
    """The fatal signals (``fairshare.hardware.NodeHealth.reason``), "" when healthy."""
    taints: tuple[eligibility.Taint, ...] = ()
    """The node's ``NoSchedule``/``NoExecute`` taints (key, value, effect)."""
    mig: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    """MIG profile -> (slices, milli-GPU per slice); see ``fairshare.mig``."""
    mig_single: str = ""
    """The profile of a ``single``-strategy MIG node (its ``nvidia.com/gpu`` are slices)."""
    mig_unknown: str = ""
    """A ``single`` profile the config's ``mig`` table lacks (its slices are not counted)."""
    health_warning: str = ""
    """Non-fatal signals: the node stays in service with a lower health score."""
    unhealthy_gpus: int = 0
    """GPUs of an otherwise healthy node that left service one by one (the device plugin's
    unhealthy devices, DRA devices tainted NoSchedule/NoExecute): not in ``capacity``,
    kept to be shown."""


def _health_flag(info: NodeInfo) -> int:
    if not info.gpu_healthy:
        return 0
    return 2 if info.health_warning else 1


def _has_mig(info: NodeInfo) -> int:
    return 1 if info.mig or info.mig_single else 0


@dataclass(frozen=True)
class BoundPod:
    """A pod the state has placed: where, what it holds, which devices."""

    uid: str
    tenant: str | None
    node: str
    row: tuple[float, ...]
    devices: tuple[tuple[int, float], ...]  # (device slot, milli-GPU)
    name: str = ""
    mig: tuple[str, int] | None = None  # (MIG profile, slices) when placed on MIG slices
    group: str = ""
    """The shared GPU this fractional pod holds a share of ("" for whole-GPU pods)."""


@dataclass
class SharedGpu:
    """A logical shared GPU: the slot fractional pods split, with an id.

    The slot is a row of the node's device array; which physical GPU backs it is
    decided on the node (the kubelet and device plugin) and learned as ``uuid`` once a
    handoff reports it. Whole-GPU pods are counts: their slot index means nothing.
    """

    id: str
    node: str
    slot: int
    members: set[str] = field(default_factory=set)
    closed: float = 0.0
    """Milli-GPU of the slot held back by ``close_group`` (no new shares join)."""


@dataclass
class ClusterState:
    """The cluster's nodes and placed pods, in arrays the kernels read directly."""

    index: ResourceIndex
    max_dev: int = 8
    nodes: list[NodeInfo] = field(default_factory=list)
    node_index: dict[str, int] = field(default_factory=dict)
    capacity: array[float] = field(default_factory=lambda: array("d"))
    free: array[float] = field(default_factory=lambda: array("d"))
    dev_free: array[float] = field(default_factory=lambda: array("d"))
    healthy: array[int] = field(default_factory=lambda: array("b"))
    """Per node: 0 its GPUs failed (a fatal signal), 1 in service, 2 in service with a
    warning (``NodeInfo.health_warning``). Truth-tested it means "in service"."""
    model_ids: dict[str, int] = field(default_factory=dict)
    node_model: array[int] = field(default_factory=lambda: array("q"))
    pods: dict[str, BoundPod] = field(default_factory=dict)
    tenant_usage: dict[str, list[float]] = field(default_factory=dict)
    node_tenant_gpu: dict[str, dict[str, float]] = field(default_factory=dict)
    """Milli-GPU each tenant holds on each node (for the tenant-spread term)."""
    mig_used: dict[str, dict[str, int]] = field(default_factory=dict)
    """MIG slices held per node and profile (nodes with none held are absent)."""
    mig_nodes: int = 0
    """How many nodes have MIG slices (0 keeps the filter on its fast path)."""
    groups: dict[str, SharedGpu] = field(default_factory=dict)
    """Shared GPUs by id (a group lives while one of its pods is bound)."""
    slot_group: dict[tuple[str, int], str] = field(default_factory=dict)
    """(node, slot) -> the shared GPU that slot holds."""
    _nodes_version: int = 0
    _pod_changes: int = 0
    _releases: int = 0
    """Counts the changes that give room back (an unbind, a shared GPU reopened)."""
    _cap_cache: tuple[int, list[float], list[float]] | None = None
    _clean_cache: tuple[int, array[int]] | None = None
    _used: list[float] = field(default_factory=list)
    _eligible: dict[eligibility.NodeConstraints, tuple[int, ...] | None] = field(
        default_factory=dict
    )
    _eligible_version: int = -1
    _memos: dict[str, tuple[tuple[int, ...], dict[Any, Any]]] = field(
        default_factory=dict, repr=False, compare=False
    )
    _tainted: tuple[int, ...] | None = None
    _selection_version: int = 0
    """Changes when a node comes or goes or its labels or taints change (not on status
    updates): the key of the ``eligible_rows`` cache."""
    _name_table: tuple[int, int, Any] | None = field(default=None, repr=False, compare=False)
    """(node-set version, node count, ``_native.names.NameTable`` of the node names)."""
    declared_capacity: dict[int, float] = field(default_factory=dict)
    """Capacity by column for resources no node reports (the config's ``capacity``, e.g.
    ``storage``); set with ``declare_capacity``. Node capacity, when there is any, wins."""
    _drained: tuple[int, ClusterState] | None = field(default=None, repr=False, compare=False)
    _exact: dict[tuple[str, ...], Fraction] = field(default_factory=dict, repr=False, compare=False)
    """The exact value of each GPU figure whose float is not integral (``_moved``): keys
    ("free", node), ("dev", node, slot), ("used",), ("usage", tenant), ("spread", node,
    tenant), ("closed", group)."""

    def _moved(self, key: tuple[str, ...], value: float, delta: float) -> float:
        """``value + delta`` for the GPU figure ``key``, exactly: plain float addition
        while both are integral, else through the exact rationals they stand for (the
        one kept for ``key``, or ``exact_amount(value)``)."""
        held = self._exact.get(key)
        if held is None:
            value, delta = float(value), float(delta)
            if value.is_integer() and delta.is_integer():
                return value + delta
            held = exact_amount(value)
        return self._set_exact(key, held + exact_amount(delta))

    def _set_exact(self, key: tuple[str, ...], value: Fraction) -> float:
        if value.denominator == 1:
            self._exact.pop(key, None)
        else:
            self._exact[key] = value
        return float(value)

    def _exact_of(self, key: tuple[str, ...], value: float) -> Fraction:
        held = self._exact.get(key)
        return held if held is not None else exact_amount(value)

    def rows_of(self, names: Sequence[str]) -> array[int]:
        """The row of each of ``names`` (int32), ``-1`` for a name that is not a node's:
        through a ``NameTable`` of the node names, built again when the node set changes
        (``node_index`` when the table cannot hold them)."""
        out = array("i", bytes(4 * len(names)))
        seq = names if isinstance(names, list | tuple) else list(names)
        held = self._name_table
        if held is None or held[0] != self._nodes_version or held[1] != self.n_nodes:
            table = native_names.NameTable([info.name for info in self.nodes])
            held = self._name_table = (self._nodes_version, self.n_nodes, table)
        if held[2].usable:
            held[2].rows_of(seq, out)
        else:
            native_names.rows_of(seq, self.node_index, out)
        return out

    def declare_capacity(self, amounts: Mapping[int, float]) -> None:
        """Set ``declared_capacity`` (kernel units by column)."""
        if dict(amounts) != self.declared_capacity:
            self.declared_capacity = dict(amounts)
            self._cap_cache = None
            self._nodes_version += 1  # shares and fair allocations depend on capacity

    def __post_init__(self) -> None:
        self._used = [0.0] * self.n_res

    @property
    def version(self) -> tuple[int, int]:
        """Changes whenever a node or a bound pod changes (a cache key for derived figures)."""
        return (self._nodes_version, self._pod_changes)

    @property
    def room_version(self) -> tuple[int, int]:
        """Changes whenever a node changes or room is given back; binding a pod leaves it
        alone (a pod that fits nowhere still fits nowhere after a bind)."""
        return (self._nodes_version, self._releases)

    def memo(self, name: str, *, growing_only: bool = False) -> dict[Any, Any]:
        """The dict named ``name`` for figures derived from this state; it starts empty
        again whenever ``version`` changes (a node or a bound pod), or with
        ``growing_only`` whenever ``room_version`` does (figures that binds cannot undo)."""
        v = (-1, *self.room_version) if growing_only else self.version
        got = self._memos.get(name)
        if got is None or got[0] != v:
            got = self._memos[name] = (v, {})
        return got[1]

    def drained(self) -> ClusterState:
        """The same nodes (labels, taints, health, GPU models, MIG slices) with no pod
        bound: what each node would offer once its current pods were gone. Built once per
        node change (``room_version``'s first part) and never bound to; its ``memo`` lasts
        as long as it does (figures that only the nodes decide)."""
        got = self._drained
        if got is not None and got[0] == self._nodes_version:
            return got[1]
        twin = ClusterState(
            self.index,
            max_dev=self.max_dev,
            nodes=list(self.nodes),
            node_index=dict(self.node_index),
            capacity=array("d", self.capacity),
            free=array("d", self.capacity),
            dev_free=array("d", (float(MILLI_GPU) if v >= 0 else -1.0 for v in self.dev_free)),
            healthy=array("b", self.healthy),
            model_ids=dict(self.model_ids),
            node_model=array("q", self.node_model),
            mig_nodes=self.mig_nodes,
            declared_capacity=dict(self.declared_capacity),
        )
        self._drained = (self._nodes_version, twin)
        return twin

    def twin(self) -> ClusterState:
        """A copy with the same nodes and bound pods that can be bound to and unbound
        from without touching this state (its memos start empty). For probes: a plan
        tried on the twin leaves this state's versions, and so its memos, as they were."""
        twin = copy.copy(self)
        twin.free = array("d", self.free)
        twin.dev_free = array("d", self.dev_free)
        twin.pods = dict(self.pods)
        twin.tenant_usage = {t: list(row) for t, row in self.tenant_usage.items()}
        twin.node_tenant_gpu = {n: dict(held) for n, held in self.node_tenant_gpu.items()}
        twin.mig_used = {n: dict(held) for n, held in self.mig_used.items()}
        twin.groups = {
            g: replace(shared, members=set(shared.members)) for g, shared in self.groups.items()
        }
        twin.slot_group = dict(self.slot_group)
        twin._used = list(self._used)
        twin._exact = dict(self._exact)
        twin._eligible = dict(self._eligible)
        twin._memos = {}
        return twin

    def copy(self) -> ClusterState:
        """A copy sharing nothing that either may change: ``twin`` plus the nodes, and
        the memos (each memo's figures stay true of the copy, which is equal to this
        state at the same versions). The extender's cache takes one before it writes to
        a state a snapshot holds."""
        out = self.twin()
        out.nodes = list(self.nodes)
        out.node_index = dict(self.node_index)
        out.capacity = array("d", self.capacity)
        out.healthy = array("b", self.healthy)
        out.model_ids = dict(self.model_ids)
        out.node_model = array("q", self.node_model)
        out.declared_capacity = dict(self.declared_capacity)
        out._memos = {name: (v, dict(held)) for name, (v, held) in self._memos.items()}
        return out

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_res(self) -> int:
        return self.index.width

    @property
    def gpu_col(self) -> int:
        return self.index.column(GPU)

    # -- nodes ---------------------------------------------------------------

    def _model_id(self, model: str) -> int:
        if not model:
            return -1
        if model not in self.model_ids:
            if len(self.model_ids) >= 63:
                return -1
            self.model_ids[model] = len(self.model_ids)
        return self.model_ids[model]

    def _grow_devices(self, want: int) -> None:
        old = self.max_dev
        new = array("d")
        for i in range(self.n_nodes):
            new.extend(self.dev_free[i * old : (i + 1) * old])
            new.extend([-1.0] * (want - old))
        self.dev_free, self.max_dev = new, want

    def add_node(
        self,
        name: str,
        allocatable: Mapping[str, Fraction],
        *,
        labels: Mapping[str, str] | None = None,
        gpu_healthy: bool = True,
        health_reason: str = "",
        taints: Iterable[eligibility.Taint] = (),
        mig: Mapping[str, tuple[int, float]] | None = None,
        mig_single: str = "",
        mig_unknown: str = "",
        health_warning: str = "",
        unhealthy_gpus: int = 0,
    ) -> int:
        """Add (or replace) a node; returns its row. Pods already bound stay counted.

        ``taints`` are (key, value, effect); only ``NoSchedule``/``NoExecute`` ones are
        kept (the others never keep a pod off a node). ``allocatable``'s
        ``nvidia.com/gpu`` is the whole devices; ``mig`` (profile -> (slices, milli-GPU
        per slice)) adds the slices to the GPU column, not to the devices."""
        labels = dict(labels or {})
        mig = dict(mig or {})
        n_dev = int(allocatable.get(GPU, Fraction(0)))
        if n_dev > self.max_dev:
            self._grow_devices(n_dev)
        mem_mib = labels.get(LABEL_GPU_MEMORY, "")
        device_memory = int(mem_mib) * 1024 * 1024 if mem_mib.isdigit() else 0
        info = NodeInfo(
            name,
            labels,
            labels.get(LABEL_GPU_PRODUCT, labels.get("model", "")),
            device_memory,
            gpu_healthy,
            health_reason,
            tuple(t for t in taints if t[2] in eligibility.BLOCKING_EFFECTS),
            mig,
            mig_single,
            mig_unknown,
            health_warning,
            unhealthy_gpus,
        )
        row = self.index.kernel_vector(allocatable)
        row[self.gpu_col] += sum(n * milli for n, milli in mig.values())
        known = self.node_index.get(name)
        if known is not None and self.nodes[known] == info:
            r = self.n_res
            if list(self.capacity[known * r : (known + 1) * r]) == list(row):
                # The same node again (a status heartbeat, a change of something not
                # read here): nothing changes, so neither does any figure cached per
                # ``version``; the devices keep as they are (same count, same capacity).
                return known
        self._nodes_version += 1
        if name in self.node_index:
            old = self.nodes[self.node_index[name]]
            if (old.labels, old.taints) != (info.labels, info.taints):
                self._selection_version += 1
            self.mig_nodes += _has_mig(info) - _has_mig(old)
            return self._replace_node(self.node_index[name], info, row, n_dev)
        self._selection_version += 1
        self.mig_nodes += _has_mig(info)
        i = self.n_nodes
        self.nodes.append(info)
        self.node_index[name] = i
        self.capacity.extend(row)
        self.free.extend(row)
        self.dev_free.extend([float(MILLI_GPU)] * n_dev + [-1.0] * (self.max_dev - n_dev))
        self.healthy.append(_health_flag(info))
        self.node_model.append(self._model_id(info.gpu_model))
        return i

    def _replace_node(self, i: int, info: NodeInfo, row: Sequence[float], n_dev: int) -> int:
        r, g, name = self.n_res, self.gpu_col, info.name
        used = [self.capacity[i * r + k] - self.free[i * r + k] for k in range(r)]
        key = ("free", name)
        gpu_used = exact_amount(self.capacity[i * r + g]) - self._exact_of(
            key, self.free[i * r + g]
        )
        for k in range(r):
            self.capacity[i * r + k] = row[k]
            self.free[i * r + k] = row[k] - used[k]
        self.free[i * r + g] = self._set_exact(key, exact_amount(row[g]) - gpu_used)
        base = i * self.max_dev
        for d in range(self.max_dev):
            held = 0.0
            if self.dev_free[base + d] >= 0:
                held = MILLI_GPU - self.dev_free[base + d]
            if d < n_dev:
                self.dev_free[base + d] = MILLI_GPU - held
            else:
                self.dev_free[base + d] = -1.0
                self._exact.pop(("dev", name, str(d)), None)
        self.nodes[i] = info
        self.healthy[i] = _health_flag(info)
        self.node_model[i] = self._model_id(info.gpu_model)
        return i

    def remove_node(self, name: str) -> list[BoundPod]:
        """Remove a node and every pod bound to it; returns those pods."""
        if name not in self.node_index:
            raise StateError(f"unknown node {name!r}")
        gone = [p for p in self.pods.values() if p.node == name]
        for p in gone:
            self.unbind(p.uid)
        self.node_tenant_gpu.pop(name, None)
        self.mig_used.pop(name, None)
        for key in [k for k in self._exact if k[0] in ("free", "dev", "spread") and k[1] == name]:
            del self._exact[key]
        self.mig_nodes -= _has_mig(self.nodes[self.node_index[name]])
        self._nodes_version += 1
        self._selection_version += 1
        i, last = self.node_index.pop(name), self.n_nodes - 1
        r, d = self.n_res, self.max_dev
        if i != last:
            for arr, w in ((self.capacity, r), (self.free, r), (self.dev_free, d)):
                arr[i * w : (i + 1) * w] = arr[last * w : (last + 1) * w]
            self.healthy[i] = self.healthy[last]
            self.node_model[i] = self.node_model[last]
            self.nodes[i] = self.nodes[last]
            self.node_index[self.nodes[i].name] = i
        for arr, w in ((self.capacity, r), (self.free, r), (self.dev_free, d)):
            del arr[last * w :]
        del self.healthy[last]
        del self.node_model[last]
        self.nodes.pop()
        return gone

    def set_health(
        self, name: str, healthy: bool, reason: str = "", *, warning: str | None = None
    ) -> None:
        """Mark ``name``'s GPUs failed (``healthy`` false, with the ``reason``) or in
        service; ``warning`` replaces the node's non-fatal warning when given."""
        i = self.node_index[name]
        info = self.nodes[i]
        info = replace(info, gpu_healthy=healthy, health_reason=reason)
        if warning is not None:
            info = replace(info, health_warning=warning)
        self.nodes[i] = info
        self._nodes_version += 1
        self.healthy[i] = _health_flag(info)

    def clean_flags(self) -> array[int]:
        """Per node 1 when its GPUs are in service without a warning, else 0 (the health
        score term); cached until a node changes."""
        cached = self._clean_cache
        if cached is None or cached[0] != self._nodes_version:
            flags = array("b", (1 if h == 1 else 0 for h in self.healthy))
            cached = self._clean_cache = (self._nodes_version, flags)
        return cached[1]

    def eligible_rows(self, constraints: eligibility.NodeConstraints) -> tuple[int, ...] | None:
        """Rows of the nodes that ``constraints`` allow (node selector, required affinity,
        taints); None when that is every row. Cached until a node comes or goes or its
        labels or taints change (status updates keep the cache), so a pod template's
        constraints cost one pass over the nodes per such change; constraints of
        tolerations alone look at the tainted nodes only."""
        if self._eligible_version != self._selection_version or len(self._eligible) > 256:
            self._eligible.clear()
            self._tainted = None
            self._eligible_version = self._selection_version
        try:
            return self._eligible[constraints]
        except KeyError:
            pass
        allows, nodes = constraints.allows, self.nodes
        if constraints.selects_by_labels:
            rows = tuple(i for i, n in enumerate(nodes) if allows(n.name, n.labels, n.taints))
        else:
            # Only taints can exclude a node: test the tainted ones alone.
            if self._tainted is None:
                self._tainted = tuple(i for i, n in enumerate(nodes) if n.taints)
            tainted = self._tainted
            barred = {i for i in tainted if not allows(nodes[i].name, {}, nodes[i].taints)}
            if not barred:
                self._eligible[constraints] = None
                return None
            rows = tuple(i for i in range(len(nodes)) if i not in barred)
        out = None if len(rows) == len(nodes) else rows
        self._eligible[constraints] = out
        return out

    # -- pods ----------------------------------------------------------------

    def node_free(self, i: int) -> list[float]:
        r = self.n_res
        return list(self.free[i * r : (i + 1) * r])

    def mig_free(self, i: int, profile: str) -> int:
        """Free MIG slices of ``profile`` on node row ``i`` (0 when it has none)."""
        info = self.nodes[i]
        total = info.mig.get(profile, (0, 0.0))[0]
        return total - self.mig_used.get(info.name, {}).get(profile, 0)

    def node_devices(self, i: int) -> list[float]:
        d = self.max_dev
        return list(self.dev_free[i * d : (i + 1) * d])

    def bind(
        self,
        *,
        uid: str,
        node: str,
        row: Sequence[float],
        devices: Iterable[tuple[int, float]] = (),
        tenant: str | None = None,
        name: str = "",
        allow_overcommit: bool = False,
        mig: tuple[str, int] | None = None,
        group: str = "",
    ) -> BoundPod:
        """Account a pod on ``node``: subtract its row and its device shares, or the
        MIG slices ``mig`` = (profile, count) it holds instead of devices.

        ``group``: the shared GPU the pod's one device share belongs to; it is created
        on the share's slot, or joined (then the share must be on the group's slot).
        """
        if uid in self.pods:
            raise StateError(f"pod {uid} is already bound to {self.pods[uid].node}")
        if node not in self.node_index:
            raise StateError(f"unknown node {node!r}")
        i, r, d = self.node_index[node], self.n_res, self.max_dev
        # One entry per device; shares are kept exactly (``_moved``), so any mix of binds
        # and unbinds restores a device, and seven 1/7 partitions fill one.
        merged: dict[int, float] = {}
        for dev, milli in devices:
            if milli < 0:
                raise StateError(f"device {dev} on {node}: negative share {milli:g}")
            merged[int(dev)] = float(
                exact_amount(merged.get(int(dev), 0.0)) + exact_amount(float(milli))
            )
        devs = tuple(sorted(merged.items()))
        if group:
            self._check_group(group, node, devs)
        if not allow_overcommit:
            for dev, milli in devs:
                if not 0 <= dev < d or self.dev_free[i * d + dev] < milli:
                    raise StateError(f"device {dev} on {node} cannot hold {milli:g} milli-GPU")
            if mig is not None and self.mig_free(i, mig[0]) < mig[1]:
                raise StateError(f"{node} has not {mig[1]} free MIG slice(s) of {mig[0]}")
        if mig is not None:
            held_mig = self.mig_used.setdefault(node, {})
            held_mig[mig[0]] = held_mig.get(mig[0], 0) + mig[1]
        g = self.gpu_col
        for k in range(r):
            if k != g:
                self.free[i * r + k] -= row[k]
                self._used[k] += row[k]
        gpu = row[g]
        if gpu:
            self.free[i * r + g] = self._moved(("free", node), self.free[i * r + g], -gpu)
            self._used[g] = self._moved(_USED, self._used[g], gpu)
        for dev, milli in devs:
            at = i * d + dev
            self.dev_free[at] = self._moved(("dev", node, str(dev)), self.dev_free[at], -milli)
        pod = BoundPod(uid, tenant, node, tuple(row), devs, name, mig=mig, group=group)
        self.pods[uid] = pod
        if group:
            shared = self.groups.get(group)
            if shared is None:
                shared = self.groups[group] = SharedGpu(group, node, devs[0][0])
                self.slot_group[(node, shared.slot)] = group
            shared.members.add(uid)
        self._pod_changes += 1
        if tenant is not None:
            usage = self.tenant_usage.setdefault(tenant, [0.0] * r)
            for k in range(r):
                if k != g:
                    usage[k] += row[k]
            usage[g] = self._moved(("usage", tenant), usage[g], gpu)
            held = self.node_tenant_gpu.setdefault(node, {})
            held[tenant] = self._moved(("spread", node, tenant), held.get(tenant, 0.0), gpu)
        return pod

    def unbind(self, uid: str) -> BoundPod | None:
        """Give back what ``bind`` took; unknown uids are ignored (returns None)."""
        pod = self.pods.pop(uid, None)
        if pod is None:
            return None
        self._pod_changes += 1
        self._releases += 1
        if pod.group:
            self._leave_group(pod.group, uid)
        i = self.node_index.get(pod.node)
        r, d, g = self.n_res, self.max_dev, self.gpu_col
        gpu = pod.row[g]
        if i is not None:
            for k in range(r):
                if k != g:
                    self.free[i * r + k] += pod.row[k]
                    self._used[k] -= pod.row[k]
            if gpu:
                at = i * r + g
                self.free[at] = self._moved(("free", pod.node), self.free[at], gpu)
                self._used[g] = self._moved(_USED, self._used[g], -gpu)
            for dev, milli in pod.devices:
                # A slot removed while held (the node shrank) stays absent (-1).
                if dev < d and self.dev_free[i * d + dev] >= 0:
                    at = i * d + dev
                    self.dev_free[at] = self._moved(
                        ("dev", pod.node, str(dev)), self.dev_free[at], milli
                    )
        if pod.mig is not None:
            held_mig = self.mig_used.get(pod.node, {})
            left = held_mig.get(pod.mig[0], 0) - pod.mig[1]
            if left > 0:
                held_mig[pod.mig[0]] = left
            else:
                held_mig.pop(pod.mig[0], None)
            if not held_mig:
                self.mig_used.pop(pod.node, None)
        if pod.tenant is not None:
            usage = self.tenant_usage[pod.tenant]
            for k in range(r):
                if k != g:
                    usage[k] += -pod.row[k]
            usage[g] = self._moved(("usage", pod.tenant), usage[g], -gpu)
            held = self.node_tenant_gpu.get(pod.node, {})
            held[pod.tenant] = self._moved(
                ("spread", pod.node, pod.tenant), held.get(pod.tenant, 0.0), -gpu
            )
        return pod

    def _check_group(self, group: str, node: str, devs: Sequence[tuple[int, float]]) -> None:
        if len(devs) != 1:
            raise StateError(f"shared GPU {group}: a share is one device, got {len(devs)}")
        shared = self.groups.get(group)
        slot = devs[0][0]
        if shared is not None and (shared.node, shared.slot) != (node, slot):
            raise StateError(
                f"shared GPU {group} is slot {shared.slot} of {shared.node}, not {slot} of {node}"
            )
        other = self.slot_group.get((node, slot))
        if other is not None and other != group:
            raise StateError(f"slot {slot} of {node} holds shared GPU {other}, not {group}")

    def _leave_group(self, group: str, uid: str) -> None:
        shared = self.groups.get(group)
        if shared is None:
            return
        shared.members.discard(uid)
        if not shared.members:
            del self.groups[group]
            if self.slot_group.get((shared.node, shared.slot)) == group:
                del self.slot_group[(shared.node, shared.slot)]
            self._reopen(shared)

    def close_group(self, group: str) -> None:
        """No new share joins shared GPU ``group`` (its GPU is no longer held): the room
        left on its slot is held back until the group ends."""
        shared = self.groups.get(group)
        i = self.node_index.get(shared.node) if shared is not None else None
        if shared is None or i is None or shared.closed or shared.slot >= self.max_dev:
            return
        at = i * self.max_dev + shared.slot
        if self.dev_free[at] > 0:
            key = ("dev", shared.node, str(shared.slot))
            self._set_exact(("closed", group), self._exact_of(key, self.dev_free[at]))
            shared.closed = self.dev_free[at]
            self.dev_free[at] = self._set_exact(key, Fraction(0))
            self._pod_changes += 1

    def _reopen(self, shared: SharedGpu) -> None:
        self._releases += 1
        i = self.node_index.get(shared.node)
        closed = self._exact_of(("closed", shared.id), shared.closed)
        self._exact.pop(("closed", shared.id), None)
        if shared.closed and i is not None and shared.slot < self.max_dev:
            at = i * self.max_dev + shared.slot
            if self.dev_free[at] >= 0:
                key = ("dev", shared.node, str(shared.slot))
                self.dev_free[at] = self._set_exact(
                    key, self._exact_of(key, self.dev_free[at]) + closed
                )
        shared.closed = 0.0

    def group_at(self, node: str, slot: int) -> str | None:
        """The shared GPU on ``slot`` of ``node``, if any."""
        return self.slot_group.get((node, slot))

    # -- totals --------------------------------------------------------------

    def total_capacity(self, *, include_failed: bool = False) -> list[float]:
        """The cluster's capacity per column, on the healthy fleet: the GPU column leaves
        out the GPUs of nodes with a fatal signal (their CPU, memory and storage still
        serve); ``include_failed``: every node's GPUs. Fair shares, the gate, usage
        history and the metrics divide this. A column no node reports takes the
        config's declared capacity."""
        cache = self._cap_cache
        if cache is None or cache[0] != self._nodes_version:
            cache = self._cap_cache = (self._nodes_version, *self._sum_capacity())
        return list(cache[2] if include_failed else cache[1])

    def failed_gpus(self) -> float:
        """Milli-GPU of the nodes whose GPUs failed (a fatal signal)."""
        g = self.gpu_col
        return sum(
            self.capacity[i * self.n_res + g] for i in range(self.n_nodes) if not self.healthy[i]
        )

    def _sum_capacity(self) -> tuple[list[float], list[float]]:
        r, g = self.n_res, self.gpu_col
        tot = [0.0] * r
        failed = 0.0
        for i in range(self.n_nodes):
            for k in range(r):
                tot[k] += self.capacity[i * r + k]
            if not self.healthy[i]:
                failed += self.capacity[i * r + g]
        for k, amount in self.declared_capacity.items():
            if 0 <= k < r and tot[k] <= 0:
                tot[k] = amount
        service = list(tot)
        if failed:
            service[g] = max(0.0, tot[g] - failed)
        return service, tot

    def total_free(self) -> list[float]:
        """Capacity minus what bound pods hold (kept incrementally, exact), on the healthy
        fleet: the free GPUs of nodes whose GPUs failed are not free."""
        cap = self.total_capacity(include_failed=True)
        free = [c - u for c, u in zip(cap, self._used, strict=True)]
        cache = self._cap_cache
        if cache is not None and cache[1] != cache[2]:
            r, g = self.n_res, self.gpu_col
            free[g] -= sum(self.free[i * r + g] for i in range(self.n_nodes) if not self.healthy[i])
        return free

    def usage_of(self, tenant: str) -> list[float]:
        return list(self.tenant_usage.get(tenant, [0.0] * self.n_res))


def allocatable_from_node(node: Mapping[str, object]) -> dict[str, Fraction]:
    """A Node object's ``status.allocatable`` as exact amounts."""
    status = node.get("status") or {}
    assert isinstance(status, Mapping)
    alloc = status.get("allocatable") or status.get("capacity") or {}
    assert isinstance(alloc, Mapping)
    return resources.pod_resource_requests({"containers": [{"resources": {"requests": alloc}}]})
