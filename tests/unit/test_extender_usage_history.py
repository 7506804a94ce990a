"""The extender's usage history (``extender.usagehistory``): the leader folds the
tracker's usage in, adjusts the weights the verbs read, persists the history in a
ConfigMap and reads it back after a restart. No network: a fake CoreV1Api."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from extender import usagehistory
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from tests.extender_side import Side
from tests.unit.test_state_objects import node, pod

HOUR = 3600.0


def _config(history: bool) -> FairShareConfig:
    doc: dict[str, Any] = {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
    if history:
        doc["usageHistory"] = {"halfLife": "1h"}
    return config_from_mapping(doc)


def _tracker(config: FairShareConfig) -> tuple[Side, usagehistory.UsageHistoryFeed]:
    feed = usagehistory.UsageHistoryFeed(lambda: config)
    tr = Side(feed.config)
    tr.on_resync("Node", [node("n1", gpus=4)])
    bound = [pod(f"a{i}", ns="a", gpu="1", node_name="n1") for i in range(4)]
    waiting = [pod(f"b{i}", ns="b", gpu="1", phase="Pending") for i in range(4)]
    tr.on_resync("Pod", bound + waiting)
    return tr, feed


def test_without_the_block_the_config_in_force_is_read_as_it_is():
    config = _config(history=False)
    tr, feed = _tracker(config)
    feed.step(0.0, tr.state, tr.pending_queue())
    feed.step(HOUR, tr.state, tr.pending_queue())
    assert feed.config() is config and feed.history is None and feed.status() == {}


def test_a_tenant_that_held_the_cluster_yields_more_to_the_newcomer():
    config = _config(history=True)
    tr, feed = _tracker(config)
    before = tr.fair_shares(feed.config())
    feed.step(0.0, tr.state, tr.pending_queue())
    feed.step(HOUR, tr.state, tr.pending_queue())  # a held all 4 GPUs for an hour, b waited
    adjusted = feed.config()
    assert adjusted is not config
    assert adjusted.tenant("a").weight == pytest.approx(0.5)  # type: ignore[union-attr]
    after = tr.fair_shares(adjusted)
    gpu = tr.state.gpu_col
    assert before["b"].allocation[gpu] == pytest.approx(2000.0)  # 2 GPUs of 4
    assert after["b"].allocation[gpu] > 2600.0  # 2/3 of them
    shown = feed.status()["tenants"]
    assert shown["a"]["weightFactor"] == pytest.approx(0.5)
    assert shown["a"]["usageShare"] == pytest.approx(1.0)
    assert shown["b"]["weightFactor"] == 1.0
    # Another config object in force (a reload): read as it is until the next step.
    other = _config(history=True)
    feed.raw = lambda: other
    assert feed.config() is other


class _Resp:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self._body = status, json.dumps(body).encode()

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


class _FakeCore:
    """ConfigMaps in memory, as the API's raw calls return them."""

    def __init__(self) -> None:
        self.store: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0

    async def read_namespaced_config_map(self, name: str, ns: str, **_: Any) -> _Resp:
        got = self.store.get((ns, name))
        if got is None:
            return _Resp(404, {"message": "not found"})
        return _Resp(200, copy.deepcopy(got))

    async def create_namespaced_config_map(self, ns: str, body: dict[str, Any], **_: Any) -> _Resp:
        self.writes += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self.writes)
        self.store[(ns, body["metadata"]["name"])] = body
        return _Resp(201, body)

    async def replace_namespaced_config_map(
        self, name: str, ns: str, body: dict[str, Any], **_: Any
    ) -> _Resp:
        assert (
            body["metadata"]["resourceVersion"]
            == self.store[(ns, name)]["metadata"]["resourceVersion"]
        )
        return await self.create_namespaced_config_map(ns, body)


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _keeper(
    tr: Side,
    feed: usagehistory.UsageHistoryFeed,
    core: _FakeCore,
    clock: _Clock,
    leader: list[bool],
) -> usagehistory.UsageHistoryKeeper:
    keeper = usagehistory.UsageHistoryKeeper(
        api_client=object(),
        namespace="fairshare-system",
        feed=feed,
        snapshot=tr.reading,
        synced=asyncio.Event(),
        is_leader=lambda: leader[0],
        clock=clock,
    )
    keeper.core = core
    return keeper


async def test_the_history_survives_a_restart_decayed_over_the_gap():
    config = _config(history=True)
    core, clock, leader = _FakeCore(), _Clock(), [True]
    tr, feed = _tracker(config)
    keeper = _keeper(tr, feed, core, clock, leader)
    await keeper.once()  # reads nothing, starts the clock, writes
    assert core.writes == 1
    clock.now += HOUR
    await keeper.once()  # within PERSIST_EVERY of the last write: no write
    assert core.writes == 1
    keeper._written_at = -float("inf")
    await keeper.once()
    assert core.writes == 2
    cm = core.store[("fairshare-system", usagehistory.CONFIGMAP)]
    saved = json.loads(cm["data"][usagehistory.DATA_KEY])
    assert saved["at"] == clock.now
    held = saved["tenants"]["a"]["nvidia.com/gpu"]
    assert held > 0 and "b" not in saved["tenants"]

    # A restart half an hour later: a new replica reads the ConfigMap first.
    clock.now += HOUR / 2
    tr2, feed2 = _tracker(config)
    assert feed2.config() is config
    keeper2 = _keeper(tr2, feed2, core, clock, leader)
    await keeper2.once()
    assert feed2.history is not None
    # decayed over the gap with no usage added, then nothing more (same instant)
    assert feed2.history.usage["a"][tr2.state.gpu_col] == pytest.approx(held * 0.5**0.5)
    assert feed2.config().tenant("a").weight < 1.0  # type: ignore[union-attr]
    # Losing the lease forgets it: the next leader reads what was written.
    leader[0] = False
    await keeper2.once()
    assert feed2.config() is config and feed2.history is None


async def test_an_unreadable_record_starts_afresh():
    config = _config(history=True)
    core, clock = _FakeCore(), _Clock()
    core.store[("fairshare-system", usagehistory.CONFIGMAP)] = {
        "metadata": {"name": usagehistory.CONFIGMAP, "resourceVersion": "7"},
        "data": {usagehistory.DATA_KEY: "{not json"},
    }
    core.writes = 6
    tr, feed = _tracker(config)
    await _keeper(tr, feed, core, clock, [True]).once()
    assert feed.history is not None and feed.history.at == clock.now
    assert core.writes == 7  # replaced with a readable one


async def test_the_leader_exports_the_history_per_tenant_and_drops_it_when_it_stops():
    from prometheus_client import CollectorRegistry

    from fairshare import metrics as metrics_mod

    config = _config(history=True)
    core, clock, leader = _FakeCore(), _Clock(), [True]
    tr, feed = _tracker(config)
    keeper = _keeper(tr, feed, core, clock, leader)
    keeper.metrics = metrics_mod.Metrics(CollectorRegistry())

    def sample(name: str, tenant: str) -> float | None:
        value = keeper.metrics.registry.get_sample_value(  # type: ignore[union-attr]
            f"fairshare_tenant_history_{name}", {"tenant": tenant}
        )
        return None if value is None else float(value)

    await keeper.once()
    clock.now += HOUR  # a held all 4 GPUs for an hour while b waited
    await keeper.once()
    assert sample("usage_share", "a") == pytest.approx(1.0)
    assert sample("weighted_share", "a") == pytest.approx(0.5)
    assert sample("weight_factor", "a") == pytest.approx(0.5)
    assert sample("usage_share", "b") == 0.0
    assert sample("weighted_share", "b") == pytest.approx(0.5)
    assert sample("weight_factor", "b") == 1.0
    # The same figures as /status.json (rounded there to 4 places).
    shown = feed.status()["tenants"]["a"]
    assert shown["weightFactor"] == pytest.approx(sample("weight_factor", "a"), abs=1e-4)
    leader[0] = False
    await keeper.once()
    assert sample("usage_share", "a") is None and sample("weight_factor", "b") is None
