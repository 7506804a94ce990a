"""What the verbs read: one frozen value per version of the cache, like kube-scheduler's
per-cycle snapshot. Its ``ClusterState`` is the cache's until the cache's next write,
which copies the state first; the queue, its index and the namespace labels are copies;
the fair allocation, workload mix, score context, gang rule and reclaim holds in force
at ``taken_at`` are computed once. The verbs, the gang planner and preemption never
write it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fairshare import cluster_shares, fairness
from fairshare.config.schema import FairShareConfig
from fairshare.gate import GroupFits
from fairshare.placement import PodRequest, ScoreContext, WorkloadMix
from fairshare.preemption.holds import RoomHold
from fairshare.state import objects
from fairshare.state.cluster import ClusterState

NamespaceLabels = Mapping[str, Mapping[str, str]]


class FairMemo:
    """The last fair allocation a cache's snapshots computed and what from: equal demand
    rows on the same nodes, columns and config give the same allocation (a bind moves a
    pod's demand from pending to bound, which mostly leaves every tenant's as it was)."""

    def __init__(self) -> None:
        self._held: tuple[Any, ...] | None = None

    def allocation(
        self, state: ClusterState, config: FairShareConfig, queue: Sequence[PodRequest]
    ) -> Mapping[str, fairness.FairShare]:
        rows = cluster_shares.demand_rows(state, queue)
        held = self._held
        if (
            held is not None
            and held[0] == state._nodes_version
            and held[1] is state.index
            and held[2] is config
            and held[3] == rows
        ):
            kept: Mapping[str, fairness.FairShare] = held[4]
            return kept
        fair = MappingProxyType(cluster_shares.fair_shares_for(state, config, rows))
        self._held = (state._nodes_version, state.index, config, rows, fair)
        return fair


class LazyFair(Mapping[str, "fairness.FairShare"]):
    """A snapshot's fair allocation, computed at its first read and kept (a bind of a pod
    group's member, and prioritize, never read it)."""

    __slots__ = ("_args", "_value")

    def __init__(
        self,
        memo: FairMemo,
        state: ClusterState,
        config: FairShareConfig,
        queue: tuple[PodRequest, ...],
    ) -> None:
        self._args: tuple[Any, ...] | None = (memo, state, config, queue)
        self._value: Mapping[str, fairness.FairShare] = {}

    def _get(self) -> Mapping[str, fairness.FairShare]:
        if self._args is not None:
            memo, state, config, queue = self._args
            self._value = memo.allocation(state, config, queue)
            self._args = None
        return self._value

    def __getitem__(self, key: str) -> fairness.FairShare:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def _empty() -> Mapping[Any, Any]:
    return _EMPTY


def request_for(
    pod: Mapping[str, Any],
    *,
    state: ClusterState,
    config: FairShareConfig,
    namespace_labels: NamespaceLabels,
) -> PodRequest:
    """The pod in a scheduler call as a ``PodRequest``; raises ``resources.DemandError``."""
    tenant = objects.pod_tenant(pod, config=config, namespace_labels=namespace_labels)
    return objects.pod_request(
        pod,
        config=config,
        tenant=tenant,
        index=state.index,
        device_memory=lambda: objects.largest_device_memory(state),
    )


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """The cluster as the verbs see it (module docstring)."""

    state: ClusterState
    queue: tuple[PodRequest, ...] = ()
    """The pending pods, in the order they came, with kube-scheduler's verdicts applied."""
    pending: Mapping[str, PodRequest] = field(default_factory=_empty)
    """The same pods by uid."""
    namespace_labels: NamespaceLabels = field(default_factory=_empty)
    fair: Mapping[str, fairness.FairShare] | None = None
    """The fair allocation over bound + pending demand (None: the verb computes one)."""
    mix: WorkloadMix | None = None
    context: ScoreContext | None = None
    """Score normalisers and mix (None: the verb builds one over the state)."""
    groups: GroupFits | None = None
    """How other tenants' waiting pod groups count at the gate: a rule over this
    snapshot's pods and PodGroup sizes (None: every pod judged alone)."""
    holds: tuple[RoomHold, ...] = ()
    """The reclaim holds in force at ``taken_at``."""
    gang_pods: Mapping[str, Mapping[str, Any]] = field(default_factory=_empty)
    """The known pods that belong to a pod group (the gang planner's members)."""
    group_members: Mapping[str, tuple[Any, tuple[str, ...]]] = field(default_factory=_empty)
    """Each pod of a group -> (its group, the uids of the group's known pods)."""
    taken_at: float = 0.0
    version: tuple[Any, ...] = ()
    """What the cache made it from (versions and identities): equal versions, equal
    snapshots."""

    @classmethod
    def of(
        cls,
        state: ClusterState,
        *,
        pending: Sequence[PodRequest] = (),
        namespace_labels: NamespaceLabels | None = None,
        fair: Mapping[str, fairness.FairShare] | None = None,
        mix: WorkloadMix | None = None,
        context: ScoreContext | None = None,
        groups: GroupFits | None = None,
        holds: Sequence[RoomHold] = (),
    ) -> Snapshot:
        """A snapshot of fixed parts (a state file, a test): ``pending`` as a queue (the
        first of a uid listed twice counts)."""
        by_uid: dict[str, PodRequest] = {}
        for p in pending:
            by_uid.setdefault(p.uid, p)
        return cls(
            state,
            tuple(by_uid.values()),
            MappingProxyType(by_uid),
            MappingProxyType({k: dict(v) for k, v in (namespace_labels or {}).items()}),
            fair,
            mix,
            context,
            groups,
            tuple(holds),
        )

    def request(self, pod: Mapping[str, Any], config: FairShareConfig) -> PodRequest:
        """The pod in a scheduler call as a ``PodRequest``, read now (the app passes the
        verbs the cache's reading instead). Raises ``resources.DemandError``."""
        return request_for(
            pod, state=self.state, config=config, namespace_labels=self.namespace_labels
        )
