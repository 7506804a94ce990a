"""The healthy fleet: what failed GPUs take out of service, whom they cost, and whether
the GPUs left still cover the tenants' guarantees.

``fleet_health(state, config)`` is one read of a ``ClusterState``; status, the live
page, the metrics and ``fairshare status`` show it.

Guarantees on a shrunken fleet: fair shares divide the in-service capacity
(``ClusterState.total_capacity``). Each tenant starts from its guaranteed level of its
demand (``fairness.hierarchy.start_from_guarantees``); when those starts add up to more
than the in-service capacity they are all scaled down by one factor, the tightest
column's, so every tenant loses the same fraction of what its guarantee would have
given it (pro rata). ``coverage`` reports the ratio of in-service capacity to the sum
of the top-level guarantees per column: below 1 the guarantees cannot all be honoured
at once, whatever the demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from fairshare.config.schema import FairShareConfig
from fairshare.resources import GPU
from fairshare.state.cluster import ClusterState

__all__ = ["Coverage", "FailedNode", "FleetHealth", "fleet_health"]

MILLI: float = 1000.0


@dataclass(frozen=True, slots=True)
class FailedNode:
    """A node whose GPUs are out of service or reduced, with the tenants it holds."""

    name: str
    failed: bool
    """A fatal signal: every GPU of the node is out of service."""
    reason: str
    gpus: float
    """GPUs out of service on it (all of its GPUs when ``failed``, else its unhealthy
    devices)."""
    warning: str = ""
    holders: dict[str, float] = field(default_factory=dict)
    """Tenant -> GPUs its bound pods hold on a failed node (0 for a node that only lost
    some devices: those hold no pod)."""


@dataclass(frozen=True, slots=True)
class Coverage:
    """In-service capacity against the sum of the top-level guarantees of one column."""

    resource: str
    guaranteed: float
    in_service: float

    @property
    def ratio(self) -> float:
        return self.in_service / self.guaranteed if self.guaranteed > 0 else 1.0

    @property
    def covered(self) -> bool:
        return self.in_service >= self.guaranteed


@dataclass(frozen=True, slots=True)
class FleetHealth:
    """``fleet_health``'s reading (GPU amounts in GPUs, other columns in kernel units)."""

    gpus: float
    """Every GPU the nodes report, failed ones included."""
    gpus_in_service: float
    gpus_failed: float
    """GPUs of nodes with a fatal signal."""
    unhealthy_devices: int
    """GPUs that left service one by one (device plugin, DRA taints) on healthy nodes."""
    nodes: tuple[FailedNode, ...]
    """Nodes failed, with unhealthy devices, or with a warning; by name."""
    warned_nodes: int
    tenants_on_failed: dict[str, float]
    """Tenant -> GPUs its pods hold on failed nodes (the tenants the faults cost)."""
    coverage: tuple[Coverage, ...]

    @property
    def uncovered(self) -> tuple[Coverage, ...]:
        return tuple(c for c in self.coverage if not c.covered)


def fleet_health(state: ClusterState, config: FairShareConfig) -> FleetHealth:
    """The healthy fleet of ``state`` (module docstring)."""
    g = state.gpu_col
    everything = state.total_capacity(include_failed=True)
    service = state.total_capacity()
    nodes: list[FailedNode] = []
    on_failed: dict[str, float] = {}
    devices = 0
    warned = 0
    for i, info in enumerate(state.nodes):
        failed = not state.healthy[i]
        warned += 1 if info.health_warning else 0
        if not failed and not info.unhealthy_gpus and not info.health_warning:
            continue
        holders: dict[str, float] = {}
        if failed:
            for tenant, milli in state.node_tenant_gpu.get(info.name, {}).items():
                if milli > 0:
                    holders[tenant] = milli / MILLI
                    on_failed[tenant] = on_failed.get(tenant, 0.0) + milli / MILLI
        else:
            devices += info.unhealthy_gpus
        reason = info.health_reason
        if not failed and info.unhealthy_gpus:
            reason = (
                f"{info.unhealthy_gpus} GPU(s) out of service one by one (device plugin "
                "unhealthy devices or DRA device taints)"
            )
        nodes.append(
            FailedNode(
                info.name,
                failed,
                reason,
                state.capacity[i * state.n_res + g] / MILLI if failed else info.unhealthy_gpus,
                info.health_warning,
                holders,
            )
        )
    return FleetHealth(
        gpus=everything[g] / MILLI,
        gpus_in_service=service[g] / MILLI,
        gpus_failed=(everything[g] - service[g]) / MILLI,
        unhealthy_devices=devices,
        nodes=tuple(sorted(nodes, key=lambda n: n.name)),
        warned_nodes=warned,
        tenants_on_failed=dict(sorted(on_failed.items())),
        coverage=_coverage(state, config, service),
    )


def _coverage(
    state: ClusterState, config: FairShareConfig, service: list[float]
) -> tuple[Coverage, ...]:
    totals: dict[str, Fraction] = {}
    for tenant in config.tenants:
        if tenant.parent is not None:
            continue  # children's guarantees lie inside their parent's
        for name, amount in tenant.guaranteed_amounts().items():
            totals[name] = totals.get(name, Fraction(0)) + amount
    out = []
    for name, total in sorted(totals.items(), key=lambda kv: (kv[0] != GPU, kv[0])):
        if name not in state.index.names or total <= 0:
            continue
        k = state.index.column(name)
        unit = state.index.kernel_vector({name: Fraction(1)})[k]
        if unit <= 0:
            continue
        out.append(Coverage(name, float(total), service[k] / unit))
    return tuple(out)
