"""Config hot reload: ConfigHolder, apply_configmap, ConfigMapSink and FileWatcher.

The rule under test everywhere: a valid update is swapped in whole (version + 1,
listeners told), an invalid one keeps the last good config and is reported with field
paths, counted through the ``on_error`` hook, and logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from fairshare.config.loading import parse_config
from fairshare.config.reloading import (
    ConfigHolder,
    ConfigMapSink,
    FileWatcher,
    apply_configmap,
)
from fairshare.config.schema import FairShareConfig

HEAD = "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n"


def config_text(weight: float) -> str:
    return HEAD + f"tenants:\n- name: team-a\n  namespaces: [a]\n  weight: {weight}\n"


GOOD = config_text(2)
OTHER = config_text(3)
BAD = config_text(0)  # tenants[0].weight: must be > 0


def configmap(text: str | None, *, name: str = "fairshare-config") -> dict[str, Any]:
    data = {} if text is None else {"config.yaml": text}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "fairshare-system", "resourceVersion": "7"},
        "data": data,
    }


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def weight(holder: ConfigHolder) -> float:
    return holder.current.tenants[0].weight


# -- ConfigHolder -------------------------------------------------------------------------------


def test_swap_replaces_whole_bumps_version_and_tells_listeners():
    holder = ConfigHolder(FairShareConfig())
    seen: list[FairShareConfig] = []
    unsubscribe = holder.add_listener(seen.append)
    new = parse_config(GOOD)
    assert holder.version == 1
    assert holder.swap(new) == 2
    assert holder.current is new and holder.get() is new
    assert seen == [new]
    unsubscribe()
    holder.swap(FairShareConfig())
    assert seen == [new] and holder.version == 3


def test_a_failing_listener_neither_undoes_the_swap_nor_starves_others(
    caplog: pytest.LogCaptureFixture,
):
    holder = ConfigHolder(FairShareConfig())
    seen: list[int] = []

    def broken(_: FairShareConfig) -> None:
        raise RuntimeError("listener bug")

    holder.add_listener(broken)
    holder.add_listener(lambda _: seen.append(holder.version))
    new = parse_config(GOOD)
    with caplog.at_level(logging.ERROR):
        holder.swap(new)
    assert holder.current is new and seen == [2]
    assert "listener bug" in caplog.text


# -- apply_configmap ------------------------------------------------------------------------------


def test_valid_configmap_is_swapped_in_and_counted_as_a_reload():
    holder = ConfigHolder(parse_config(GOOD))
    errors, reloads = Counter(), Counter()
    assert apply_configmap(holder, configmap(OTHER), on_error=errors, on_reload=reloads) is None
    assert weight(holder) == 3 and holder.version == 2
    assert (errors.n, reloads.n) == (0, 1)


def test_an_unchanged_configmap_does_not_swap():
    holder = ConfigHolder(parse_config(GOOD))
    reloads = Counter()
    assert apply_configmap(holder, configmap(GOOD), on_reload=reloads) is None
    assert holder.version == 1 and reloads.n == 0


def test_invalid_configmap_keeps_the_last_good_and_reports_field_paths(
    caplog: pytest.LogCaptureFixture,
):
    holder = ConfigHolder(parse_config(GOOD))
    good = holder.current
    errors, reloads = Counter(), Counter()
    with caplog.at_level(logging.ERROR, logger="fairshare.config.reloading"):
        text = apply_configmap(holder, configmap(BAD), on_error=errors, on_reload=reloads)
    assert text is not None
    assert "tenants[0].weight: must be > 0" in text
    assert "ConfigMap fairshare-system/fairshare-config" in text
    assert holder.current is good and holder.version == 1
    assert (errors.n, reloads.n) == (1, 0)
    assert "tenants[0].weight: must be > 0" in caplog.text
    # ... and a later valid update still goes through.
    assert apply_configmap(holder, configmap(OTHER), on_error=errors) is None
    assert weight(holder) == 3


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (configmap(None), "(root): the ConfigMap has no data key 'config.yaml'"),
        ({"metadata": {"name": "x", "namespace": "y"}}, "no data key"),
        (configmap("tenants: [\n"), "(root): invalid YAML"),
        (configmap(HEAD + "surprise: 1\n"), "surprise: unknown field"),
    ],
    ids=["no-key", "no-data", "bad-yaml", "unknown-field"],
)
def test_unusable_configmaps_keep_the_last_good(obj: dict[str, Any], message: str):
    holder = ConfigHolder(parse_config(GOOD))
    errors = Counter()
    text = apply_configmap(holder, obj, on_error=errors)
    assert text is not None and message in text
    assert weight(holder) == 2 and errors.n == 1


# -- ConfigMapSink --------------------------------------------------------------------------------


def test_configmap_sink_follows_resyncs_and_events_of_its_own_configmap_only():
    holder = ConfigHolder(parse_config(GOOD))
    errors = Counter()
    sink = ConfigMapSink(
        holder, namespace="fairshare-system", name="fairshare-config", on_error=errors
    )

    sink.on_resync("ConfigMap", [configmap(BAD, name="someone-else"), configmap(OTHER)])
    assert weight(holder) == 3 and sink.last_error is None

    sink.on_event("ConfigMap", "MODIFIED", configmap(BAD))
    assert weight(holder) == 3 and errors.n == 1
    assert sink.last_error is not None and "tenants[0].weight" in sink.last_error

    sink.on_event("ConfigMap", "MODIFIED", configmap(BAD, name="someone-else"))
    sink.on_event("Pod", "ADDED", {"metadata": {"name": "p"}})
    assert errors.n == 1

    sink.on_event("ConfigMap", "MODIFIED", configmap(GOOD))
    assert weight(holder) == 2 and sink.last_error is None


def test_configmap_sink_keeps_the_config_when_the_configmap_is_missing_or_deleted(
    caplog: pytest.LogCaptureFixture,
):
    holder = ConfigHolder(parse_config(GOOD))
    sink = ConfigMapSink(holder, namespace="fairshare-system", name="fairshare-config")
    with caplog.at_level(logging.WARNING):
        sink.on_resync("ConfigMap", [])
        sink.on_event("ConfigMap", "DELETED", configmap(OTHER))
    assert weight(holder) == 2 and holder.version == 1
    assert "not found" in caplog.text and "deleted" in caplog.text


# -- FileWatcher ----------------------------------------------------------------------------------


def rewrite(path: Path, text: str) -> None:
    """Replace the file the way a ConfigMap volume does: a new inode, renamed over."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_file_watcher_reloads_on_change_and_keeps_last_good_on_invalid(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    holder = ConfigHolder(parse_config(GOOD))
    errors, reloads = Counter(), Counter()
    watcher = FileWatcher(path, holder, 1.0, on_error=errors, on_reload=reloads)

    assert watcher.check() is None and holder.version == 1  # unchanged since startup

    rewrite(path, OTHER)
    assert watcher.check() is None
    assert weight(holder) == 3 and reloads.n == 1

    rewrite(path, BAD)
    error = watcher.check()
    assert error is not None and "tenants[0].weight: must be > 0" in error
    assert weight(holder) == 3 and errors.n == 1
    assert watcher.check() is None and errors.n == 1  # reported once, not every poll

    path.unlink()
    missing = watcher.check()
    assert missing is not None and "cannot read" in missing
    assert weight(holder) == 3 and errors.n == 2

    rewrite(path, GOOD)
    assert watcher.check() is None
    assert weight(holder) == 2 and reloads.n == 2


async def test_file_watcher_polls_at_its_interval_until_stopped(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    holder = ConfigHolder(parse_config(GOOD))
    slept: list[float] = []
    third_poll = asyncio.Event()

    async def sleep(delay: float) -> None:
        slept.append(delay)
        if len(slept) == 2:
            rewrite(path, OTHER)  # the file changes during the second interval
        if len(slept) == 3:
            third_poll.set()
            await asyncio.Event().wait()  # park here until stop() cancels

    watcher = FileWatcher(path, holder, 2.5, sleep=sleep)
    watcher.start()
    watcher.start()  # idempotent
    await asyncio.wait_for(third_poll.wait(), timeout=2)
    assert slept == [2.5, 2.5, 2.5]
    assert weight(holder) == 3 and holder.version == 2
    await watcher.stop()
    await watcher.stop()
