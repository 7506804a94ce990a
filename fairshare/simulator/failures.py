"""GPUs that fail: the failure model, the fault process and the fleet state that loses
capacity while a GPU (or its node) is out of service.

A fault hits one GPU. Every GPU of the fleet fails as a Poisson process of ``rate``
faults per GPU-hour, independently of the others and of what runs on it; a fault is
*fatal* with probability ``fatal``. A non-fatal fault kills the pods using the GPU and
nothing else (an application-level XID: the pod restarts, the GPU stays in service). A
fatal fault takes the GPU out of service for ``repair_hours``; with ``scope="node"`` (what
NVSentinel's quarantine and the cloud node-problem signals do: cordon and drain) it takes
the whole node, and every pod on the node is lost. Out of service, the GPUs leave the
capacity the fair shares divide.

The defaults come from published fleet figures (docs/simulator/failures.md has the
sources and the arithmetic): ``DEFAULT_RATE`` is the Llama 3 405B training run's
GPU-related unexpected interruptions per GPU-hour, ``DEFAULT_FATAL`` the share of host
replacements among the host-replacement and recoverable-GPU failures of a published H200
fleet summary (unverified), ``DEFAULT_REPAIR_HOURS`` an assumption (no source gives one).

The process is drawn lazily from its own generator, seeded from ``seed`` alone: the same
seed gives the same faults whatever the scheduler does with them, so variants of a replay
meet the same faults (a fault on a GPU already out of service is dropped, which leaves
every GPU in service failing at ``rate``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from fairshare.state.cluster import BoundPod, ClusterState

HOUR = 3600.0

# Llama 3 405B (Meta, "The Llama 3 Herd of Models", 2024): 16,384 H100 GPUs, 54 days,
# 419 unexpected interruptions, 58.7 % of them GPU-related.
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54
LLAMA3_UNEXPECTED = 419
LLAMA3_GPU_RELATED = 0.587
DEFAULT_RATE = LLAMA3_UNEXPECTED * LLAMA3_GPU_RELATED / (LLAMA3_GPUS * LLAMA3_DAYS * 24)
"""Faults per GPU-hour: 419 × 0.587 ÷ (16,384 × 54 × 24) ≈ 1.16e-5 (one per GPU every
~9.9 years; one an hour on a fleet of ~86,000 GPUs)."""
# Crusoe H200 fleet (GTC 2025, as summarised): host replacement 41.5 %, GPU recoverable
# 19.5 % of ~205 failures in four months. Unverified: a secondary summary.
DEFAULT_FATAL = 41.5 / (41.5 + 19.5)
"""Fraction of faults that take the GPU out of service: 41.5 ÷ (41.5 + 19.5) ≈ 0.68."""
DEFAULT_REPAIR_HOURS = 24.0
"""Hours out of service after a fatal fault: an assumption (reboot, reset or swap)."""

Scope = Literal["node", "gpu"]
SCOPES: tuple[Scope, ...] = ("node", "gpu")
Recovery = Literal["gang", "member"]
RECOVERIES: tuple[Recovery, ...] = ("gang", "member")
OUT_OF_SERVICE = "out-of-service/"
"""Prefix of the uids of the placeholders that hold a failed GPU or node."""


class FailureModelError(ValueError):
    """A failure model parameter out of range; the message names it and its range."""


@dataclass(frozen=True)
class FailureModel:
    """Per-GPU fault rate (faults per GPU-hour), fraction fatal, repair time (hours),
    what a fatal fault takes out of service (``scope``) and the seed of the faults."""

    rate: float = DEFAULT_RATE
    fatal: float = DEFAULT_FATAL
    repair_hours: float = DEFAULT_REPAIR_HOURS
    scope: Scope = "node"
    seed: int = 0

    def __post_init__(self) -> None:
        check_model(self.rate, self.fatal, self.repair_hours, self.scope)

    @property
    def repair_seconds(self) -> float:
        return self.repair_hours * HOUR

    def describe(self) -> str:
        return (
            f"{self.rate:.3g} faults per GPU-hour, {100 * self.fatal:.0f} % fatal, "
            f"repair {self.repair_hours:g} h, a fatal fault takes the {self.scope} out, "
            f"fault seed {self.seed}"
        )


def check_model(rate: float, fatal: float, repair_hours: float, scope: str) -> None:
    """FailureModelError naming the first parameter out of its range."""
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate >= 0):
        raise FailureModelError(
            f"failure rate must be a finite number ≥ 0 per GPU-hour, got {rate}"
        )
    if not (isinstance(fatal, int | float) and 0 <= fatal <= 1):
        raise FailureModelError(f"fraction fatal must be between 0 and 1, got {fatal}")
    if not (isinstance(repair_hours, int | float) and math.isfinite(repair_hours)):
        raise FailureModelError(f"repair time must be a finite number of hours, got {repair_hours}")
    if repair_hours < 0:
        raise FailureModelError(f"repair time must be ≥ 0 hours, got {repair_hours}")
    if scope not in SCOPES:
        raise FailureModelError(f"unknown failure scope {scope!r}; choose from {', '.join(SCOPES)}")


@dataclass(frozen=True)
class Fault:
    time: float  # seconds
    node: str
    slot: int  # the GPU's device slot on the node
    fatal: bool


class FaultProcess:
    """The faults of a fleet of GPUs (``(node, slot)``), in time order from ``start``:
    the superposition of one Poisson process per GPU, so exponential gaps of mean
    1 ÷ (rate × GPUs) hours, the GPU drawn uniformly, fatal with probability ``fatal``."""

    def __init__(
        self, model: FailureModel, gpus: Sequence[tuple[str, int]], *, start: float = 0.0
    ) -> None:
        self.model = model
        self.gpus = list(gpus)
        self.rng = random.Random(f"fairshare-faults-{model.seed}")
        self.per_second = model.rate * len(self.gpus) / HOUR
        self.now = start

    def __iter__(self) -> FaultProcess:
        return self

    def __next__(self) -> Fault:
        f = self.next()
        if f is None:
            raise StopIteration
        return f

    def next(self) -> Fault | None:
        """The next fault; None when the fleet never fails (rate 0 or no GPU)."""
        if self.per_second <= 0:
            return None
        rng = self.rng
        self.now += rng.expovariate(self.per_second)
        node, slot = self.gpus[rng.randrange(len(self.gpus))]
        return Fault(self.now, node, slot, rng.random() < self.model.fatal)

    def until(self, horizon: float) -> list[Fault]:
        """Every fault before ``horizon`` seconds."""
        out: list[Fault] = []
        while True:
            f = self.next()
            if f is None or f.time >= horizon:
                return out
            out.append(f)


def fleet_gpus(state: ClusterState) -> list[tuple[str, int]]:
    """Every GPU of the state as (node, device slot)."""
    g = state.gpu_col
    r = state.n_res
    out: list[tuple[str, int]] = []
    for i, info in enumerate(state.nodes):
        n = round(state.capacity[i * r + g] / 1000.0)
        out.extend((info.name, s) for s in range(min(n, state.max_dev)))
    return out


@dataclass
class FleetState(ClusterState):
    """The cluster state of the simulator, where GPUs fail.

    A node taken out of service is marked GPU-failed (``set_health``), as a fatal health
    signal marks it: ``ClusterState`` then leaves its GPUs out of the capacity the shares
    divide and out of the free room, and no GPU pod is placed there (its CPU and memory
    still serve, as they do in the product). A single GPU taken out of service is held
    by a placeholder pod (no tenant) on its device, so nothing is placed on it, and
    leaves the capacity here (``total_capacity``) while ``total_free`` counts it taken."""

    out_row: list[float] = field(default_factory=list)
    """What the single-GPU placeholders hold (kernel units by column)."""

    def total_capacity(self, *, include_failed: bool = False) -> list[float]:
        cap = super().total_capacity(include_failed=include_failed)
        if self.out_row and not include_failed:
            for k, v in enumerate(self.out_row):
                cap[k] -= v
        return cap

    # -- failures ------------------------------------------------------------------

    def out_of_service(self, node: str, slot: int) -> bool:
        """Whether GPU ``slot`` of ``node`` (or the whole node) is out of service."""
        return (
            not self.healthy[self.node_index[node]] or f"{OUT_OF_SERVICE}{node}/{slot}" in self.pods
        )

    def pods_hit(self, node: str, slot: int | None) -> list[BoundPod]:
        """The pods a fault loses: those using GPU ``slot`` of ``node`` (every pod on the
        node when ``slot`` is None: the node is drained)."""
        return [
            p
            for p in self.pods.values()
            if p.node == node
            and not p.uid.startswith(OUT_OF_SERVICE)
            and (slot is None or any(d == slot and milli > 0 for d, milli in p.devices))
        ]

    def take_out(self, node: str, slot: int | None) -> str:
        """Take GPU ``slot`` of ``node`` out of service (its pods must be gone): a
        placeholder holds it. With ``slot`` None, the whole node's GPUs: the node is
        marked GPU-failed (``set_health``), as a fatal health signal marks it. Returns
        the uid ``bring_back`` takes."""
        if slot is None:
            self.set_health(node, False, "fatal GPU fault (simulated)")
            return OUT_OF_SERVICE + node
        uid = f"{OUT_OF_SERVICE}{node}/{slot}"
        row = [0.0] * self.n_res
        row[self.gpu_col] = 1000.0
        self.bind(uid=uid, node=node, row=row, devices=[(slot, 1000.0)], name=uid)
        self._add_out(row, 1.0)
        return uid

    def bring_back(self, uid: str) -> None:
        """A repaired GPU or node returns to service."""
        node = uid.removeprefix(OUT_OF_SERVICE)
        if "/" not in node:
            self.set_health(node, True)
            return
        pod = self.unbind(uid)
        if pod is not None:
            self._add_out(pod.row, -1.0)

    def _add_out(self, row: Sequence[float], sign: float) -> None:
        if not self.out_row:
            self.out_row = [0.0] * self.n_res
        for k, v in enumerate(row):
            self.out_row[k] += sign * v
            if abs(self.out_row[k]) < 1e-6:
                self.out_row[k] = 0.0
        self._nodes_version += 1  # shares and fair allocations depend on capacity

    def out_gpus(self) -> float:
        """GPUs out of service now (failed nodes' and single GPUs')."""
        held = self.out_row[self.gpu_col] if self.out_row else 0.0
        return (held + self.failed_gpus()) / 1000.0
