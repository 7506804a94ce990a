"""Runs lost to a hardware fault: which pods count as lost, which pod-group members go
with them, the run time forgiven and the queue place kept (``health.recover_gangs``,
``health.forgive_faults``; docs/recovery.md). Pure: times are arguments, no I/O.

A bound pod is **lost to hardware** when it ends (deleted, being deleted, or failed)
while its node is marked fatal (``hardware.read_node_health``: a fatal condition, a
taint of ``health.unhealthyTaints`` of any effect, a remediator's cordon) or gone, or
while a DRA device its claims hold carries a ``NoExecute`` taint its claim does not
tolerate (in the device's ResourceSlice or by a DeviceTaintRule: kube-controller-manager
deletes such pods), or when it failed while the device plugin counted some of its
node's GPUs unhealthy. A member of a pod group is lost as soon as its node turns
fatal, even while it still runs: its group cannot finish on broken hardware.

A **lost run** is what one loss takes: for a pod group, every member bound before the
loss (the lost ones and the others, evicted so that the group restarts whole); for a
lone pod, the pod. Its **run time** is, for each of its pods, the time from its bind to
the loss, at the pod's request; ``forgiven`` gives what that run time weighs in a
usage history decayed with a half-life, which is taken back out of the tenant's history.
Its **queue time** is the creation time of its oldest pod: the pods created to replace
it (same pod group, created after the loss) keep it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fairshare.hardware import NodeHealth

__all__ = [
    "DeviceKey",
    "LostPod",
    "LostRun",
    "allocated_devices",
    "device_loss",
    "forgiven",
    "gang_rest",
    "inherited_queue_time",
    "loss_reason",
    "no_execute_taints",
    "prune_runs",
    "rule_taint",
    "run_of",
    "runs_from_dict",
    "runs_to_dict",
    "tolerates",
    "waits_behind",
]

LN2: Final = math.log(2.0)
RUN_TTL: Final = 3600.0
"""Seconds a lost run is remembered after its loss (explain, the queue place)."""
QUEUE_HOLD: Final = 120.0
"""Seconds after a loss during which the tenant's newer pods let the replacing group go
first (``waits_behind``): time for its controller to recreate it (the Job controller
backs off 10 s and more) and for kube-scheduler to place it."""
MAX_RUNS: Final = 500
"""Lost runs remembered at most (the oldest go first)."""


@dataclass(frozen=True, slots=True)
class LostPod:
    """A pod whose run a hardware fault took."""

    uid: str
    name: str
    namespace: str
    tenant: str | None
    node: str
    row: tuple[float, ...]
    """What it held, in the kernel's columns (the usage history's units)."""
    bound_at: float
    lost_at: float
    created: float | None
    group: str
    """``namespace/name`` of its pod group, ``""`` for a lone pod."""
    reason: str
    evicted: bool = False
    """Evicted by fairshare so that its group restarts whole (its own node was fine)."""

    @property
    def run_seconds(self) -> float:
        return max(0.0, self.lost_at - self.bound_at)


def loss_reason(
    node: str,
    health: NodeHealth | None,
    *,
    node_gone: bool,
    failed: bool,
) -> str | None:
    """Why a pod bound on ``node`` that ends now was lost to hardware, or None when its
    end is not a hardware loss. ``health``: the node's reading (None: not known);
    ``node_gone``: the node object was deleted; ``failed``: the pod's phase is Failed."""
    if node_gone:
        return f"node {node} was deleted"
    if health is None:
        return None
    if not health.healthy:
        return f"node {node}: {health.reason}"
    if failed and health.unhealthy_devices > 0:
        n = health.unhealthy_devices
        return f"failed on node {node} while {n} of its GPUs were unhealthy"
    return None


DeviceKey = tuple[str, str, str]
"""(driver, pool, device) of a DRA device."""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Does a DRA toleration (a claim request's, as Kubernetes matches a pod's) tolerate
    ``taint``: same effect (or none given), and the key with ``Exists`` (no key: any
    key) or the key and value with ``Equal`` (the default operator)."""
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key, op = toleration.get("key"), toleration.get("operator") or "Equal"
    if op == "Exists":
        return not key or key == taint.get("key")
    return bool(
        key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")
    )


def no_execute_taints(slice_: Mapping[str, Any]) -> dict[DeviceKey, list[Mapping[str, Any]]]:
    """A ResourceSlice's devices with a ``NoExecute`` taint, and those taints."""
    spec = _map(slice_.get("spec"))
    driver, pool = str(spec.get("driver", "")), str(_map(spec.get("pool")).get("name", ""))
    out: dict[DeviceKey, list[Mapping[str, Any]]] = {}
    for device in map(_map, _list(spec.get("devices"))):
        taints = [
            t for t in map(_map, _list(device.get("taints"))) if t.get("effect") == "NoExecute"
        ]
        if taints:
            out[(driver, pool, str(device.get("name", "")))] = taints
    return out


def rule_taint(
    rule: Mapping[str, Any],
) -> tuple[tuple[str | None, str | None, str | None], Mapping[str, Any]] | None:
    """A DeviceTaintRule's selector (driver, pool, device; None: any) and its taint, when
    the taint's effect is ``NoExecute`` (None otherwise)."""
    spec = _map(rule.get("spec"))
    taint = _map(spec.get("taint"))
    if taint.get("effect") != "NoExecute":
        return None
    sel = _map(spec.get("deviceSelector"))

    def part(key: str) -> str | None:
        v = sel.get(key)
        return str(v) if isinstance(v, str) and v else None

    return (part("driver"), part("pool"), part("device")), taint


def allocated_devices(claim: Mapping[str, Any]) -> list[tuple[DeviceKey, list[Mapping[str, Any]]]]:
    """The devices a ResourceClaim was allocated, each with the tolerations of its result."""
    alloc = _map(_map(claim.get("status")).get("allocation"))
    out = []
    for r in map(_map, _list(_map(alloc.get("devices")).get("results"))):
        key = (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
        out.append((key, [t for t in map(_map, _list(r.get("tolerations")))]))
    return out


def device_loss(
    devices: Sequence[tuple[DeviceKey, Sequence[Mapping[str, Any]]]],
    taints: Mapping[DeviceKey, Sequence[Mapping[str, Any]]],
) -> str | None:
    """Why a pod holding ``devices`` (with their tolerations) lost them: the first device
    with a ``NoExecute`` taint none of its tolerations tolerates; None: no such device."""
    for key, tolerations in devices:
        for taint in taints.get(key, ()):
            if not any(tolerates(t, taint) for t in tolerations):
                value = taint.get("value")
                shown = f"{taint.get('key')}" + (f"={value}" if value else "") + ":NoExecute"
                return f"DRA device {'/'.join(key)}: taint {shown}"
    return None


@dataclass(frozen=True, slots=True)
class Member:
    """A bound member of a pod group, as ``gang_rest`` needs it."""

    uid: str
    created: float | None
    leaving: bool
    """Being deleted already (``deletionTimestamp``): nothing to evict."""


def gang_rest(members: Iterable[Member], lost: Iterable[str], lost_at: float) -> list[str]:
    """The members to evict so that the group restarts whole: bound, not lost, not already
    leaving, and created before the loss (a member created after it belongs to the run
    that replaces the lost one). Sorted by uid."""
    gone = set(lost)
    return sorted(
        m.uid
        for m in members
        if m.uid not in gone and not m.leaving and (m.created is None or m.created <= lost_at)
    )


def forgiven(
    row: Sequence[float], start: float, end: float, now: float, half_life: float
) -> list[float]:
    """What holding ``row`` constantly from ``start`` to ``end`` weighs at ``now`` in a
    history decayed with ``half_life`` (``history.History.advance``'s integral):
    ``row · T/ln 2 · (2^(-(now-end)/T) - 2^(-(now-start)/T))``. Times after ``now`` are
    taken as ``now``; an empty interval weighs nothing."""
    if not half_life > 0:
        raise ValueError("half_life must be > 0")
    end = min(end, now)
    start = min(start, end)
    if not end > start:
        return [0.0] * len(row)
    k = half_life / LN2 * (0.5 ** ((now - end) / half_life) - 0.5 ** ((now - start) / half_life))
    return [v * k for v in row]


@dataclass
class LostRun:
    """One run a hardware fault took (module docstring); what ``fairshare explain``
    shows and what the pods that replace it inherit."""

    key: str
    """``namespace/name`` of the pod group, or of the lone pod."""
    gang: bool
    tenant: str | None
    queued_at: float
    """Creation time of the run's oldest pod: the replacing pods' place in the queue."""
    lost_at: float
    reason: str
    lost: tuple[str, ...] = ()
    """Names of the pods the fault took."""
    evicted: tuple[str, ...] = ()
    """Names of the members fairshare evicted so that the group restarts whole."""
    run_seconds: float = 0.0
    """Pod-seconds of the run (bind to loss, summed over its pods), forgiven with
    ``forgiveFaults``."""
    uids: tuple[str, ...] = field(default=(), repr=False)
    """Uids of every pod of the run (the lost ones and the evicted ones)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "gang": self.gang,
            "tenant": self.tenant,
            "queuedAt": self.queued_at,
            "lostAt": self.lost_at,
            "reason": self.reason,
            "lost": list(self.lost),
            "evicted": list(self.evicted),
            "runSeconds": round(self.run_seconds, 3),
            "uids": list(self.uids),
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> LostRun:
        """Read ``to_dict``'s form; a ``ValueError`` names what is wrong."""
        key, reason = data.get("key"), data.get("reason")
        queued, lost_at = data.get("queuedAt"), data.get("lostAt")
        if not isinstance(key, str) or not key:
            raise ValueError("key: a non-empty string is required")
        if not isinstance(reason, str):
            raise ValueError(f"{key}: reason must be a string")
        for what, v in (("queuedAt", queued), ("lostAt", lost_at)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"{key}: {what} must be a finite number")
        assert isinstance(queued, int | float) and isinstance(lost_at, int | float)
        tenant = data.get("tenant")
        seconds = data.get("runSeconds", 0.0)

        def names(field_: str) -> tuple[str, ...]:
            v = data.get(field_) or []
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"{key}: {field_} must be a list of strings")
            return tuple(v)

        return LostRun(
            key=key,
            gang=bool(data.get("gang")),
            tenant=tenant if isinstance(tenant, str) else None,
            queued_at=float(queued),
            lost_at=float(lost_at),
            reason=reason,
            lost=names("lost"),
            evicted=names("evicted"),
            run_seconds=float(seconds) if isinstance(seconds, int | float) else 0.0,
            uids=names("uids"),
        )


def run_of(key: str, gang: bool, pods: Sequence[LostPod]) -> LostRun:
    """The lost run of ``pods`` (one loss: a group's members, or one lone pod)."""
    if not pods:
        raise ValueError("a lost run has at least one pod")
    lost = [p for p in pods if not p.evicted]
    first = min(lost or pods, key=lambda p: (p.lost_at, p.uid))
    created = [p.created for p in pods if p.created is not None]
    return LostRun(
        key=key,
        gang=gang,
        tenant=first.tenant,
        queued_at=min(created) if created else min(p.bound_at for p in pods),
        lost_at=first.lost_at,
        reason=first.reason,
        lost=tuple(sorted(p.name for p in lost)),
        evicted=tuple(sorted(p.name for p in pods if p.evicted)),
        run_seconds=sum(p.run_seconds for p in pods),
        uids=tuple(sorted(p.uid for p in pods)),
    )


def merge_run(old: LostRun, new: LostRun) -> LostRun:
    """One group's run lost in two looks (a member lost, then another before the group
    was gone): one run, the earlier loss and queue time, every pod."""
    uids = set(old.uids) | set(new.uids)
    added = set(new.uids) - set(old.uids)
    return LostRun(
        key=old.key,
        gang=old.gang,
        tenant=old.tenant if old.tenant is not None else new.tenant,
        queued_at=min(old.queued_at, new.queued_at),
        lost_at=min(old.lost_at, new.lost_at),
        reason=old.reason if old.lost_at <= new.lost_at else new.reason,
        lost=tuple(sorted(set(old.lost) | set(new.lost))),
        evicted=tuple(sorted((set(old.evicted) | set(new.evicted)) - set(new.lost))),
        run_seconds=old.run_seconds + (new.run_seconds if added else 0.0),
        uids=tuple(sorted(uids)),
    )


def prune_runs(runs: Mapping[str, LostRun], now: float) -> dict[str, LostRun]:
    """The runs lost less than ``RUN_TTL`` ago, at most ``MAX_RUNS`` (the newest)."""
    kept = sorted(
        (r for r in runs.values() if now - r.lost_at < RUN_TTL),
        key=lambda r: (r.lost_at, r.key),
    )[-MAX_RUNS:]
    return {r.key: r for r in kept}


def runs_to_dict(runs: Mapping[str, LostRun]) -> dict[str, Any]:
    return {"runs": [runs[k].to_dict() for k in sorted(runs)]}


def runs_from_dict(data: Mapping[str, Any] | None) -> tuple[dict[str, LostRun], list[str]]:
    """The runs of ``runs_to_dict``'s form, and a problem per entry that could not be
    read (skipped). Anything but that form reads as no runs, with one problem."""
    if not data:
        return {}, []
    items = data.get("runs")
    if not isinstance(items, list):
        return {}, ["runs: a list is required"]
    out: dict[str, LostRun] = {}
    problems: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            problems.append(f"runs[{i}]: an object is required")
            continue
        try:
            run = LostRun.from_dict(item)
        except ValueError as exc:
            problems.append(f"runs[{i}]: {exc}")
            continue
        out[run.key] = run
    return out, problems


def inherited_queue_time(
    group: str | None, created: float | None, runs: Mapping[str, LostRun]
) -> LostRun | None:
    """The lost run a pod replaces: its group's run, when the pod was created after the
    loss (None: it replaces nothing; lone pods are left to their controllers)."""
    if not group:
        return None
    run = runs.get(group)
    if run is None or not run.gang:
        return None
    if created is not None and created < math.floor(run.lost_at):
        return None  # created before the loss (creation times have whole seconds)
    return run


def waits_behind(
    tenant: str | None,
    group: str | None,
    created: float | None,
    runs: Mapping[str, LostRun],
    now: float,
    *,
    replaced: Mapping[str, int],
) -> LostRun | None:
    """The lost run of ``tenant`` that a pending pod of that tenant (in ``group``, created
    at ``created``) must let go first, or None. A run holds the tenant's newer pods back
    while it is a pod group's, was lost less than ``QUEUE_HOLD`` seconds before ``now``,
    its replacement is not bound whole yet (``replaced``: group key -> members created
    after the loss and bound, against the run's pod count), and the pod is not of that
    group and was created after the run was queued (an older pod keeps its own place).
    The oldest such run is named."""
    if tenant is None:
        return None
    best: LostRun | None = None
    for run in runs.values():
        if not run.gang or run.tenant != tenant or run.key == group:
            continue
        if not 0.0 <= now - run.lost_at <= QUEUE_HOLD:
            continue
        if replaced.get(run.key, 0) >= max(1, len(run.uids)):
            continue
        # Creation times have whole seconds: a pod created in the run's own second is
        # taken as newer (held until the group is whole again, at most ``QUEUE_HOLD``).
        if created is not None and created < run.queued_at:
            continue
        if best is None or (run.queued_at, run.key) < (best.queued_at, best.key):
            best = run
    return best


def describe(run: LostRun) -> str:
    """One sentence for Events and ``fairshare explain``."""
    what = f"pod group {run.key}" if run.gang else f"pod {run.key}"
    text = f"{what} lost {', '.join(run.lost) or 'its run'} to a hardware fault ({run.reason})"
    if run.evicted:
        text += f"; evicted {', '.join(run.evicted)} so that the group restarts whole"
    return text
