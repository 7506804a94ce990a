"""The extender's side of the watches as the app wires it, for tests: the cache and
kube-scheduler's feedback fed the same events, and the snapshot the verbs read."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from extender.cache import Cache, PodGroupFacts
from extender.feedback import Feedback
from extender.snapshot import Snapshot
from fairshare import fairness
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest, WorkloadMix
from fairshare.preemption.holds import RoomHold
from fairshare.state.cluster import ClusterState


class Side:
    """``Cache`` + ``Feedback`` behind one sink (``extender.app.sinks``)."""

    def __init__(
        self,
        config: Callable[[], FairShareConfig],
        *,
        mix_every: int = 100,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache = Cache(config, mix_every=mix_every, clock=clock)
        self.feedback = Feedback()
        self.podgroups: PodGroupFacts | None = None
        self.gangs: Any = None
        """A ``GangCoordinator`` whose PodGroups the snapshots' gate rule reads."""
        self.take: Callable[[FairShareConfig | None], Snapshot] | None = None

    @classmethod
    def of(cls, deps: Any) -> Side:
        """The side of an app's ``ExtenderDeps`` (its cache, feedback and snapshots)."""
        side = cls.__new__(cls)
        side.cache, side.feedback, side.podgroups = deps.cache, deps.feedback, None
        side.gangs = deps.gangs
        side.take = deps.snapshot
        return side

    # -- the sink ------------------------------------------------------------------------

    def on_resync(self, kind: str, objects_: list[dict[str, Any]]) -> None:
        self.cache.on_resync(kind, objects_)
        self.feedback.on_resync(kind, objects_)

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        self.cache.on_event(kind, event_type, obj)
        self.feedback.on_event(kind, event_type, obj)

    def remember(self, pod: dict[str, Any]) -> None:
        self.cache.remember(pod)
        self.feedback.remember(pod)

    # -- what the verbs read ------------------------------------------------------------

    def snapshot(self, config: FairShareConfig | None = None, now: float | None = None) -> Snapshot:
        if self.take is not None and now is None:
            return self.take(config)
        facts = self.gangs.podgroup_facts() if self.gangs is not None else self.podgroups
        return self.cache.snapshot(
            config or self.cache.config(), feedback=self.feedback, podgroups=facts, now=now
        )

    @contextmanager
    def reading(self, config: FairShareConfig | None = None) -> Iterator[Snapshot]:
        """``snapshot`` for a ``with`` block, given back to the cache at its end."""
        snap = self.snapshot(config)
        try:
            yield snap
        finally:
            self.cache.give_back(snap)

    @property
    def state(self) -> ClusterState:
        return self.cache.state

    @property
    def pods(self) -> dict[str, dict[str, Any]]:
        return self.cache.pods

    @property
    def pending(self) -> Mapping[str, PodRequest]:
        """The queue as the verbs see it (kube-scheduler's verdicts applied)."""
        return self.snapshot().pending

    def pending_queue(self) -> list[PodRequest]:
        return list(self.snapshot().queue)

    def fair_shares(self, config: FairShareConfig) -> Mapping[str, fairness.FairShare]:
        """The allocation the snapshot's ``fair`` reads (the cache's memo of it)."""
        return self.cache.fair_shares(config, self.snapshot(config).queue)

    def mix(self) -> WorkloadMix | None:
        return self.cache.mix()

    def request(self, pod: Mapping[str, Any], config: FairShareConfig) -> PodRequest:
        return self.cache.request(pod, config)

    def gated_by_tenant(self) -> dict[str, int]:
        return self.feedback.gated_by_tenant(self.snapshot().pending)

    def room_holds(self) -> list[RoomHold]:
        return list(self.snapshot().holds)

    # -- what the tests look at --------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """The cache's, its ledgers' and the feedback's own figures by name
        (``unreadable``, ``carried``, ``gated``, ...)."""
        for part in (self.cache, self.cache.claims, self.cache.volumes, self.feedback):
            if name in getattr(type(part), "__dataclass_fields__", {}) or hasattr(type(part), name):
                return getattr(part, name)
        raise AttributeError(name)
