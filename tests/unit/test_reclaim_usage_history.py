"""The reclaimer plans with the weights the extender's usage history adjusts.

The extender's leader keeps the history and writes it to its ConfigMap; the reclaimer
(its own process) reads that record before each round and plans with the same adjusted
weights the gate decides with. The world: 8 GPUs that tenant a held alone for an hour,
then b asks for 8; reclaim toward fair share is on. Without history b's fair share is 4
GPUs, with it a's weight is halved and b's fair share is 16/3. No network: the fake
CoreV1Api of the extender's usage-history tests."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender import reclaimer as rec
from extender import usagehistory
from fairshare import metrics as metrics_mod
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from tests.extender_side import Side
from tests.unit.test_extender_usage_history import _Clock, _FakeCore, _keeper
from tests.unit.test_reclaim_controller import FakeApi, bound
from tests.unit.test_state_objects import node, pod

HOUR = 3600.0
NS = "fairshare-system"


def _config(history: bool) -> FairShareConfig:
    doc: dict[str, Any] = {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "reclaimToFairShare": True,
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
    if history:
        doc["usageHistory"] = {"halfLife": "1h"}
    return config_from_mapping(doc)


def _tracker(config: FairShareConfig, *, b_waits: bool) -> Side:
    tr = Side(lambda: config)
    tr.on_resync("Node", [node("n1", gpus=8)])
    pods = [bound(f"a{i}", "a", "n1", i) for i in range(8)]
    if b_waits:
        pods += [pod(f"b{i}", ns="b", gpu="1", phase="Pending") for i in range(8)]
    tr.on_resync("Pod", pods)
    return tr


async def _recorded(config: FairShareConfig, clock: _Clock) -> tuple[_FakeCore, Any]:
    """The extender's leader: a alone for an hour (b not there yet), then b's 8 pods
    arrive; the history is written at that moment. Returns the ConfigMaps and the feed."""
    core = _FakeCore()
    tr = _tracker(config, b_waits=False)
    feed = usagehistory.UsageHistoryFeed(lambda: config)
    keeper = _keeper(tr, feed, core, clock, [True])
    await keeper.once()  # starts the clock
    clock.now += HOUR
    for i in range(8):
        tr.on_event("Pod", "ADDED", pod(f"b{i}", ns="b", gpu="1", phase="Pending"))
    keeper._written_at = -float("inf")
    await keeper.once()  # folds the hour in, judges a and b, writes
    return core, (tr, feed)


def _reclaimer(config: FairShareConfig, core: _FakeCore | None, clock: _Clock) -> rec.Reclaimer:
    side = _tracker(config, b_waits=True)
    r = rec.Reclaimer(
        side.cache,
        lambda: config,
        FakeApi(),
        metrics_mod.Metrics(CollectorRegistry()),
        clock=lambda: 1000.0,
        wall_clock=clock,
        feedback=side.feedback,
    )
    if core is not None:
        r.history = usagehistory.RecordedHistory(lambda: usagehistory.read_recorded(core, NS))
    return r


def _seen(r: rec.Reclaimer) -> tuple[Any, Any]:
    """What the reclaimer plans over: its cache's state and queue."""
    snap = r.cache.snapshot(r.config(), feedback=r.feedback)
    return snap.state, snap.queue


async def test_reclaim_and_the_gate_agree_on_history_adjusted_fair_shares() -> None:
    config, clock = _config(history=True), _Clock()
    core, (ext_tracker, feed) = await _recorded(config, clock)
    gate_config = feed.config()
    a = gate_config.tenant("a")
    assert a is not None and a.weight == pytest.approx(0.5)  # the history halved it

    r = _reclaimer(config, core, clock)
    clock.now += 10.0  # the reclaimer's round comes a little after the write
    plan = await r.tick()
    planned_config = r.history.config(config, *_seen(r), clock.now)  # type: ignore[union-attr]
    # The same adjusted weights, so the same fair shares, as the extender's gate.
    assert {t.name: t.weight for t in planned_config.all_tenants()} == {
        t.name: t.weight for t in gate_config.all_tenants()
    }
    gpu = r.cache.state.gpu_col
    gate_fair = ext_tracker.fair_shares(gate_config)
    reclaim_fair = r.cache.snapshot(planned_config, feedback=r.feedback).fair
    for t in ("a", "b"):
        assert reclaim_fair[t].allocation[gpu] == pytest.approx(gate_fair[t].allocation[gpu])
    assert gate_fair["b"].allocation[gpu] == pytest.approx(8000.0 * 2 / 3)
    # Reclaim toward fair share frees 5 GPUs for b (5 <= 16/3 < 6), not the 4 of equal
    # weights.
    evicted = [e for e in plan.evictions if e.beneficiary_tenant == "b"]
    assert len(evicted) == 5 and {e.victim_tenant for e in evicted} == {"a"}


async def test_without_a_record_or_without_the_block_the_weights_are_as_written() -> None:
    clock = _Clock()
    # usageHistory on, nothing recorded yet: the weights as written (4 GPUs for b).
    config = _config(history=True)
    r = _reclaimer(config, _FakeCore(), clock)
    assert len((await r.tick()).evictions) == 4
    assert r.history is not None and r.history.config(config, *_seen(r), clock.now) is config
    # A record but the block off: read, and ignored.
    core, _ = await _recorded(config, clock)
    plain = _config(history=False)
    r = _reclaimer(plain, core, clock)
    assert len((await r.tick()).evictions) == 4
    assert r.history is not None and r.history.data is not None
    assert r.history.config(plain, *_seen(r), clock.now) is plain


async def test_a_failed_read_keeps_the_last_record() -> None:
    config, clock = _config(history=True), _Clock()
    core, _ = await _recorded(config, clock)
    r = _reclaimer(config, core, clock)
    await r.tick()
    assert r.history is not None and r.history.data is not None
    kept = r.history.data

    async def broken() -> dict[str, Any] | None:
        raise OSError("connection refused")

    r.history.read = broken
    await r.tick()
    assert r.history.data is kept
    a = r.history.config(config, *_seen(r), clock.now).tenant("a")
    assert a is not None and a.weight == pytest.approx(0.5)
