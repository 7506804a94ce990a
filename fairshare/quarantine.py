"""Quarantine of failed GPU nodes (``health.quarantine``, opt-in): the pure decision.

``plan_quarantine`` reads the Nodes under ``HealthPolicy`` and says, for one moment
``now`` (Unix seconds, an argument), which nodes fairshare cordons, which it uncordons,
which it drains, and what its circuit breaker holds back. The extender's leader carries
the plan out (``extender.quarantine``); this module does no I/O and reads no clock.

The rules:

* fairshare marks every node it cordons with the label ``LABEL`` (``"cordoned"``) and the
  annotations ``ANN_AT`` (when, RFC 3339 UTC) and ``ANN_REASON``. It uncordons a node only
  while that label is on it and the node's fatal signals are gone. A node cordoned by
  anyone else, or before fairshare looked, carries no label and is never uncordoned.
* A node a remediator works on (a ``remediator_labels`` key, e.g. NVSentinel's) is left to
  the remediator: not cordoned, not drained, not uncordoned.
* A node fairshare cordoned and someone uncordoned by hand while its signal persists is
  not cordoned again: fairshare drops its label and sets ``ANN_OVERRIDDEN`` until the signal
  clears.
* The circuit breaker: a node counts against it when fairshare quarantined it within the
  last ``window`` (``ANN_AT`` stays on the node after it is uncordoned, so a failover or
  restart keeps the count). At most ``breaker_limit`` nodes count at once: the smaller of
  ``max_nodes`` and ``floor(max_fraction x GPU nodes)``, but at least one node while
  ``max_fraction`` is above 0 (a small cluster can still quarantine its first failed
  node). A failed node past that limit is
  held back and the breaker is open until the window frees room.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from fairshare import resources
from fairshare.config.fields import parse_duration
from fairshare.config.schema import HealthPolicy
from fairshare.hardware import NodeHealth, read_node_health

__all__ = [
    "ANN_AT",
    "ANN_OVERRIDDEN",
    "ANN_REASON",
    "LABEL",
    "LABEL_VALUE",
    "Breaker",
    "NodeView",
    "QuarantinePlan",
    "breaker_limit",
    "format_time",
    "is_gpu_node",
    "parse_time",
    "plan_quarantine",
    "read_node",
    "recent",
]

LABEL: Final = "fairshare.io/quarantine"
"""On a node fairshare cordoned, while it holds the cordon (value ``LABEL_VALUE``)."""
LABEL_VALUE: Final = "cordoned"
ANN_AT: Final = "fairshare.io/quarantined-at"
"""When fairshare last cordoned the node (RFC 3339 UTC); kept after the node is
uncordoned: the circuit breaker's memory."""
ANN_REASON: Final = "fairshare.io/quarantine-reason"
"""The fatal signals that made fairshare cordon the node."""
ANN_OVERRIDDEN: Final = "fairshare.io/quarantine-overridden"
"""Someone uncordoned a node fairshare had cordoned while its signal persisted (the time
fairshare saw it): fairshare does not cordon it again until the signal clears."""
GPU_PRESENT_LABEL: Final = "nvidia.com/gpu.present"


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def format_time(at: float) -> str:
    """Unix seconds as RFC 3339 UTC, to the second (``2026-01-02T03:04:05Z``)."""
    return dt.datetime.fromtimestamp(int(at), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: object) -> float | None:
    """An RFC 3339 time as Unix seconds; None when it is not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    """Does the node have GPUs: ``nvidia.com/gpu`` in its capacity, or the label NVIDIA's
    feature discovery sets (a node whose device plugin stopped reports no capacity)?"""
    cap = _map(_map(node.get("status")).get("capacity")).get(resources.GPU)
    try:
        if cap is not None and int(str(cap)) > 0:
            return True
    except ValueError:
        pass
    return _map(_map(node.get("metadata")).get("labels")).get(GPU_PRESENT_LABEL) == "true"


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the quarantine reads of one GPU node."""

    name: str
    health: NodeHealth
    unschedulable: bool
    ours: bool
    """``LABEL`` is on it: fairshare holds its cordon."""
    quarantined_at: float | None
    """``ANN_AT``, when readable."""
    overridden: bool
    """``ANN_OVERRIDDEN`` is on it."""


def read_node(node: Mapping[str, Any], policy: HealthPolicy) -> NodeView | None:
    """The quarantine's view of a Node; None for a node without a name or without GPUs."""
    meta = _map(node.get("metadata"))
    name = meta.get("name")
    if not isinstance(name, str) or not name or not is_gpu_node(node):
        return None
    labels, annotations = _map(meta.get("labels")), _map(meta.get("annotations"))
    return NodeView(
        name=name,
        health=read_node_health(node, policy),
        unschedulable=_map(node.get("spec")).get("unschedulable") is True,
        ours=labels.get(LABEL) == LABEL_VALUE,
        quarantined_at=parse_time(annotations.get(ANN_AT)),
        overridden=ANN_OVERRIDDEN in annotations,
    )


def breaker_limit(max_nodes: int, max_fraction: float, gpu_nodes: int) -> int:
    """Nodes the breaker lets fairshare quarantine within one window: the smaller of
    ``max_nodes`` and ``max_fraction`` of ``gpu_nodes`` rounded down, at least 1 while
    ``max_fraction`` and ``gpu_nodes`` are above 0 (the defaults, 1 node and 10 %, then
    quarantine one node of a 4-node cluster rather than none); ``max_fraction`` 0
    allows none."""
    if max_nodes < 0 or gpu_nodes < 0 or not 0.0 <= max_fraction <= 1.0:
        raise ValueError("breaker_limit: counts must be >= 0 and the fraction in [0, 1]")
    # The product is rounded down with a small tolerance, so that 0.3 x 10 is 3 as written.
    by_fraction = math.floor(max_fraction * gpu_nodes + 1e-9)
    if max_fraction > 0 and gpu_nodes > 0:
        by_fraction = max(1, by_fraction)
    return max(0, min(max_nodes, by_fraction))


def recent(stamps: Mapping[str, float], now: float, window: float) -> tuple[str, ...]:
    """The nodes quarantined within the window ending at ``now``: ``now - at < window``
    (a stamp ahead of ``now``, a clock that went back, counts), sorted by name."""
    if window <= 0:
        return ()
    return tuple(sorted(name for name, at in stamps.items() if now - at < window))


@dataclass(frozen=True, slots=True)
class Breaker:
    """The circuit breaker at one moment."""

    limit: int
    """Nodes that may be quarantined within the window (``breaker_limit``)."""
    used: tuple[str, ...]
    """Nodes fairshare quarantined within the window."""
    held_back: tuple[str, ...]
    """Failed nodes the breaker kept fairshare from cordoning."""
    gpu_nodes: int
    window_seconds: float

    @property
    def open(self) -> bool:
        """The breaker stopped a quarantine: a failed node waits, not cordoned."""
        return bool(self.held_back)

    @property
    def room(self) -> int:
        """Nodes that could still be quarantined now."""
        return max(0, self.limit - len(self.used))

    def as_dict(self) -> dict[str, Any]:
        return {
            "open": self.open,
            "limit": self.limit,
            "used": list(self.used),
            "room": self.room,
            "heldBack": list(self.held_back),
            "gpuNodes": self.gpu_nodes,
            "windowSeconds": self.window_seconds,
        }


@dataclass(frozen=True, slots=True)
class QuarantinePlan:
    """What the quarantine does at one moment (every tuple sorted by node name)."""

    cordon: tuple[tuple[str, str], ...] = ()
    """(node, reason): cordon and mark, newly quarantined."""
    drain: tuple[str, ...] = ()
    """Nodes fairshare holds cordoned whose signal persists: evict their pods."""
    uncordon: tuple[str, ...] = ()
    """Nodes fairshare cordoned whose signal cleared: uncordon and unmark."""
    released: tuple[str, ...] = ()
    """Nodes fairshare cordoned that someone uncordoned while the signal persisted: drop
    the label, set ``ANN_OVERRIDDEN``."""
    forget_override: tuple[str, ...] = ()
    """Nodes with ``ANN_OVERRIDDEN`` whose signal cleared: drop the annotation."""
    held: tuple[str, ...] = ()
    """Failed nodes fairshare cordoned earlier that hold still (drain off)."""
    others: tuple[str, ...] = ()
    """Failed nodes cordoned by someone else (or before fairshare came): left as they are."""
    by_hand: tuple[str, ...] = ()
    """Failed nodes someone uncordoned after fairshare cordoned them: left in service."""
    remediated: tuple[tuple[str, str], ...] = ()
    """(node, remediator): failed nodes a remediator works on, left to it."""
    breaker: Breaker = field(
        default_factory=lambda: Breaker(limit=0, used=(), held_back=(), gpu_nodes=0,
                                        window_seconds=0.0)
    )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able digest (the extender's ``/quarantine.json``)."""
        return {
            "cordon": [{"node": n, "reason": r} for n, r in self.cordon],
            "draining": list(self.drain) + list(self.held),
            "uncordon": list(self.uncordon),
            "releasedByHand": list(self.released) + list(self.by_hand),
            "cordonedByOthers": list(self.others),
            "leftToRemediator": [{"node": n, "remediator": r} for n, r in self.remediated],
            "breaker": self.breaker.as_dict(),
        }


def plan_quarantine(
    nodes: Iterable[Mapping[str, Any]],
    policy: HealthPolicy,
    now: float,
) -> QuarantinePlan:
    """The quarantine's decisions over ``nodes`` at ``now`` (module docstring). Nodes
    without GPUs are ignored; malformed entries are read as ``read_node_health`` reads
    them (skipped signals), never raised on."""
    q = policy.quarantine
    window = parse_duration(q.window)
    views = sorted(
        (v for v in (read_node(n, policy) for n in nodes) if v is not None), key=lambda v: v.name
    )
    cordon_wanted: list[tuple[str, str]] = []
    drain: list[str] = []
    uncordon: list[str] = []
    released: list[str] = []
    forget: list[str] = []
    held: list[str] = []
    others: list[str] = []
    by_hand: list[str] = []
    remediated: list[tuple[str, str]] = []
    stamps: dict[str, float] = {}
    for v in views:
        if v.quarantined_at is not None:
            stamps[v.name] = v.quarantined_at
        failed = not v.health.healthy
        if v.health.remediator:
            if failed:
                remediated.append((v.name, v.health.remediator))
            continue
        if v.ours:
            if not v.unschedulable:
                released.append(v.name)  # uncordoned by hand: the label goes either way
            elif failed:
                (drain if q.drain else held).append(v.name)
            else:
                uncordon.append(v.name)
            continue
        if v.overridden:
            if failed:
                by_hand.append(v.name)
            else:
                forget.append(v.name)
            continue
        if not failed:
            continue
        if v.unschedulable:
            others.append(v.name)
        else:
            cordon_wanted.append((v.name, v.health.reason))
    limit = breaker_limit(q.max_nodes, float(q.max_fraction), len(views))
    used = recent(stamps, now, window)
    room = max(0, limit - len(used))
    cordon = tuple(cordon_wanted[:room])
    held_back = tuple(n for n, _ in cordon_wanted[room:])
    return QuarantinePlan(
        cordon=cordon,
        drain=tuple(drain),
        uncordon=tuple(uncordon),
        released=tuple(released),
        forget_override=tuple(forget),
        held=tuple(held),
        others=tuple(others),
        by_hand=tuple(by_hand),
        remediated=tuple(remediated),
        breaker=Breaker(
            limit=limit,
            used=used,
            held_back=held_back,
            gpu_nodes=len(views),
            window_seconds=window,
        ),
    )
