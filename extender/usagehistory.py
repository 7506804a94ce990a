"""The extender's leader keeps the tenants' usage history (``usageHistory``, opt-in).

An adapter around ``fairshare.history``; without the block, ``UsageHistoryFeed.config``
hands out the config in force itself. With it, while this replica leads, every ``PERIOD``
seconds the history folds in what the bound pods hold and makes the config with adjusted
weights that the verbs and the requeuer read; every ``PERSIST_EVERY`` seconds it is
written to the ConfigMap ``fairshare-usage-history`` (key ``history.json``); at the start
of a term it is read back and decayed over the time since the write, with no usage added.
It also sets the ``fairshare_tenant_history_*`` gauges while leading. ``RecordedHistory``
reads what the leader wrote, for the reclaimer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final

import serving
from extender.leader import call_raw, json_configmap, write_configmap
from extender.snapshot import Snapshot
from fairshare import cluster_shares, history
from fairshare import metrics as metrics_mod
from fairshare.config.schema import FairShareConfig
from fairshare.errors import FairshareError
from fairshare.placement import PodRequest
from fairshare.recovery import LostPod
from fairshare.state.cluster import ClusterState

log = logging.getLogger("fairshare.extender.usagehistory")

CONFIGMAP: Final = history.HISTORY_CONFIGMAP
DATA_KEY: Final = history.HISTORY_KEY
PERIOD: Final = 5.0
"""Seconds between two looks at the cache."""
PERSIST_EVERY: Final = 30.0
"""Seconds between two writes of the ConfigMap."""
ANN_RECORDED: Final = "fairshare.io/recorded-at"
FORGIVEN_KEEP: Final = 24 * 3600.0
"""Seconds the history remembers a forgiven pod (longer than the tracker remembers it)."""


class UsageHistoryFeed:
    """The history and the config it makes (pure over a snapshot; no I/O)."""

    def __init__(self, config: Callable[[], FairShareConfig]) -> None:
        self.raw = config
        self.history: history.History | None = None
        self.assessed: dict[str, history.TenantHistory] = {}
        self._made: tuple[FairShareConfig, dict[str, float], FairShareConfig] | None = None
        self.lost: Callable[[], Mapping[str, LostPod]] = dict
        """The pods lost to hardware whose run is forgiven (``recovery.LossTracker
        .forgivable``: none unless ``health.forgiveFaults``)."""
        self.on_forgiven: Callable[[str, float], None] | None = None
        """Told (tenant, pod-seconds) of each lost run taken back out."""

    def config(self) -> FairShareConfig:
        """The config the decisions read: the one in force, with the weights the history
        adjusted while it is on and this replica keeps it."""
        raw = self.raw()
        made = self._made
        if raw.usage_history is None or made is None or made[0] is not raw:
            return raw
        return made[2]

    def forget(self) -> None:
        """Drop the history (no longer leading: the next term reads the ConfigMap)."""
        self.history, self.assessed, self._made = None, {}, None

    def load(self, data: Mapping[str, Any] | None, now: float) -> None:
        """Start from a persisted history (None: from nothing), decayed up to ``now``."""
        raw = self.raw()
        policy = raw.usage_history
        if policy is None:
            return
        names = raw.resource_names()
        half = policy.half_life_seconds()
        h = (
            history.History.from_dict(data, half_life=half, resources=names)
            if data
            else history.History(half, names)
        )
        if h.at is not None and now > h.at:
            h.advance(now, {}, [0.0] * len(names))  # decay only: usage then is unknown
        self.history = h

    def step(self, now: float, state: ClusterState, queue: Sequence[PodRequest]) -> None:
        """Fold in the usage since the last step and make the adjusted config."""
        raw = self.raw()
        policy = raw.usage_history
        if policy is None:
            self.forget()
            return
        names = raw.resource_names()
        h = self.history
        if h is None:
            self.load(None, now)
            h = self.history
        elif h.resources != names or h.half_life != policy.half_life_seconds():
            self.load(h.to_dict(), now)  # new columns or half-life from now on
            h = self.history
        assert h is not None
        used = {t: list(u) for t, u in state.tenant_usage.items()}
        lost = self.lost()
        # A pod lost to hardware but not gone yet holds nothing its tenant is charged for.
        for uid in lost:
            bound = state.pods.get(uid)
            if bound is not None and bound.tenant in used:
                row = used[bound.tenant]
                for k, v in enumerate(bound.row[: len(row)]):
                    row[k] = max(0.0, row[k] - v)
        h.advance(now, used, state.total_capacity())
        self._forgive(h, lost)
        demand = cluster_shares.demand_rows(state, queue)
        self.assessed = history.assess(h, raw, demand, policy=policy)
        factors = history.rounded_factors(self.assessed, policy.min_weight_factor)
        made = self._made
        if made is None or made[0] is not raw or made[1] != factors:
            self._made = (raw, factors, history.adjusted_config(raw, factors))

    def _forgive(self, h: history.History, lost: Mapping[str, LostPod]) -> None:
        """Take the lost runs' run time (bind to loss) back out, once per pod."""
        for uid, pod in sorted(lost.items()):
            if pod.tenant is None or uid in h.forgiven or len(pod.row) != len(h.resources):
                continue
            h.forgive(uid, pod.tenant, pod.row, pod.bound_at, pod.lost_at)
            if self.on_forgiven is not None:
                self.on_forgiven(pod.tenant, pod.run_seconds)
        h.prune_forgiven(FORGIVEN_KEEP)

    def status(self) -> dict[str, Any]:
        """What ``/status.json`` shows: per tenant U, W and the factor on its weight."""
        if self.history is None:
            return {}
        return {
            "halfLifeSeconds": self.history.half_life,
            "at": self.history.at,
            "tenants": {
                n: {
                    "usageShare": round(a.usage_share, 4),
                    "weightedShare": round(a.weighted_share, 4),
                    "weightFactor": round(a.factor, 4),
                }
                for n, a in sorted(self.assessed.items())
            },
        }


def history_body(namespace: str, data: Mapping[str, Any]) -> dict[str, Any]:
    return json_configmap(CONFIGMAP, namespace, DATA_KEY, data, stamp_annotation=ANN_RECORDED)


class UsageHistoryKeeper:
    """Runs the feed while leading and persists it (module docstring)."""

    def __init__(
        self,
        *,
        api_client: Any,
        namespace: str,
        feed: UsageHistoryFeed,
        snapshot: Callable[[], AbstractContextManager[Snapshot]],
        synced: asyncio.Event,
        is_leader: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        metrics: metrics_mod.Metrics | None = None,
    ) -> None:

        from kubernetes_asyncio import client  # the keeper alone needs the API

        self.core: Any = client.CoreV1Api(api_client)
        self.namespace, self.feed, self.snapshot = namespace, feed, snapshot
        self.synced, self.is_leader, self.clock = synced, is_leader, clock
        self.metrics = metrics
        self._loaded = False
        self._written_at = -float("inf")

    def background(self) -> Callable[[Any], AsyncIterator[None]]:

        return serving.background_task(self.run, "usage-history")

    async def run(self) -> None:
        await self.synced.wait()
        while True:
            try:
                await self.once()
            except Exception as exc:  # logged, retried next period
                log.warning("usage history: %s", exc)
            await asyncio.sleep(PERIOD)

    async def once(self) -> None:
        """One look: load at the start of a term, step, persist when due."""
        if not self.is_leader() or self.feed.raw().usage_history is None:
            self._loaded = False
            self.feed.forget()
            self._publish()
            return
        if not self._loaded:
            self.feed.load(await self.read(), self.clock())
            self._loaded = True
            self._written_at = -float("inf")
        with self.snapshot() as snap:
            self.feed.step(self.clock(), snap.state, snap.queue)
        self._publish()
        if time.monotonic() - self._written_at >= PERSIST_EVERY:
            await self.write()
            self._written_at = time.monotonic()

    def _publish(self) -> None:
        """The gauges: the tenants the feed judged (none once it forgot its history)."""
        if self.metrics is not None:
            self.metrics.set_usage_history(
                {
                    n: (a.usage_share, a.weighted_share, a.factor)
                    for n, a in self.feed.assessed.items()
                }
            )

    async def read(self) -> dict[str, Any] | None:
        return await read_recorded(self.core, self.namespace)

    async def write(self) -> None:
        h = self.feed.history
        if h is None:
            return
        body = history_body(self.namespace, h.to_dict())
        await write_configmap(self.core, body, key=DATA_KEY)


async def read_recorded(core: Any, namespace: str) -> dict[str, Any] | None:
    """The history recorded in ``namespace``'s ConfigMap (``History.to_dict``'s form), None
    when there is none or it cannot be parsed (a new leader then starts afresh); an error
    for any other answer of the API. ``core``: a CoreV1Api."""
    status, current = await call_raw(
        core.read_namespaced_config_map(CONFIGMAP, namespace, _preload_content=False)
    )
    if status == 404:
        return None
    if not 200 <= status < 300:
        raise FairshareError(f"reading ConfigMap {namespace}/{CONFIGMAP}: HTTP {status}")
    text = (current.get("data") or {}).get(DATA_KEY)
    if not text:
        return None
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        if isinstance(data, dict):
            return data
    log.warning("ConfigMap %s/%s: unreadable, starting afresh", namespace, CONFIGMAP)
    return None


class RecordedHistory:
    """The history the extender's leader last recorded, for a process that must decide
    with the weights the extender's gate decides with (the reclaimer).

    ``refresh`` reads the ConfigMap again (``read``: ``read_recorded`` in ``serve``, a fake
    in tests); a failed read keeps the last one read, with a warning. ``config`` is the
    config in force with the weights adjusted by ``history.judge_recorded``: the recorded
    history decayed to ``now`` with no usage added, the tenants' demand (bound + pending)
    from the cache, factors rounded to 1 % as the extender rounds them. Without the
    ``usageHistory`` block, or before anything was recorded, the config in force itself.
    """

    def __init__(self, read: Callable[[], Awaitable[dict[str, Any] | None]]) -> None:
        self.read = read
        self.data: dict[str, Any] | None = None

    async def refresh(self) -> None:
        try:
            self.data = await self.read()
        except Exception as exc:  # the next round reads again
            log.warning("usage history: %s (kept the last one read)", exc)

    def config(
        self,
        config: FairShareConfig,
        state: ClusterState,
        queue: Sequence[PodRequest],
        now: float,
    ) -> FairShareConfig:
        if config.usage_history is None or self.data is None:
            return config
        demand = cluster_shares.demand_rows(state, queue)
        adjusted, _ = history.judge_recorded(config, self.data, now=now, demand=demand)
        return adjusted
