"""State sources: FileSource, the Reflector (list + watch, 410 relist, backoff) and ApiSource.

No network: the Reflector gets fake ``list_fn``/``watch_fn`` that play a script, a fake
clock and a ``sleep`` that records its delays instead of waiting (kopf looptime style).
When the script runs out they raise ``ScriptDone`` (a BaseException the Reflector does
not catch), which ends ``run()`` deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from fairshare.errors import FairshareError
from fairshare.state import informers, sources
from fairshare.state.informers import Backoff, GoneError, Reflector
from fairshare.state.sources import (
    ALL_KINDS,
    ApiSource,
    BackoffPolicy,
    FileSource,
    StateFileError,
    Store,
)

# -- helpers ----------------------------------------------------------------------------------


class ScriptDone(BaseException):
    """The fake API has played its whole script."""


class FakeApiException(Exception):
    """Shaped like kubernetes_asyncio's ApiException: only ``status`` matters."""

    def __init__(self, status: int) -> None:
        super().__init__(f"({status})")
        self.status = status


def pod(name: str, rv: int, ns: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv)}}


def listing(rv: int, *items: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": str(rv)}, "items": list(items)}


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": {"kind": "Pod", "apiVersion": "v1", **obj}}


def bookmark(rv: int) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": str(rv)}}}


def error_event(code: int) -> dict[str, Any]:
    status = {"kind": "Status", "status": "Failure", "code": code, "message": f"code {code}"}
    return {"type": "ERROR", "object": {**status, "reason": "Expired" if code == 410 else "X"}}


Step = Any  # a list response / watch stream (list of events, maybe ending in an exception)


class FakeApi:
    """Plays ``lists`` and ``watches`` in order; records how it was called."""

    def __init__(self, lists: list[Step], watches: list[Step]) -> None:
        self.lists = list(lists)
        self.watches = list(watches)
        self.list_calls = 0
        self.watch_calls: list[str] = []
        self.timeouts: list[int] = []

    async def list_fn(self) -> Mapping[str, Any]:
        self.list_calls += 1
        if not self.lists:
            raise ScriptDone
        step = self.lists.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step  # type: ignore[no-any-return]

    async def watch_fn(self, rv: str, timeout: int) -> AsyncIterator[Mapping[str, Any]]:
        self.watch_calls.append(rv)
        self.timeouts.append(timeout)
        if not self.watches:
            raise ScriptDone
        step = self.watches.pop(0)
        if isinstance(step, BaseException):
            raise step
        for item in step:
            if isinstance(item, BaseException):
                raise item
            yield item


class Recorder(Store):
    """A Store that also records every call, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []

    def on_resync(self, kind: str, objects: list[dict[str, Any]]) -> None:
        self.calls.append(("resync", kind, sorted(sources.object_key(o) for o in objects)))
        super().on_resync(kind, objects)

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        self.calls.append((event_type, kind, sources.object_key(obj)))
        super().on_event(kind, event_type, obj)


class Clock:
    """Fake monotonic clock: every reading advances ``step`` seconds."""

    def __init__(self, step: float = 10.0) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


POLICY = BackoffPolicy(initial=1.0, maximum=10.0, factor=2.0, jitter=0.5)


def reflector(
    api: FakeApi, sink: Store, *, clock: Clock | None = None
) -> tuple[Reflector, list[float]]:
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)

    r = Reflector(
        "Pod",
        list_fn=api.list_fn,
        watch_fn=api.watch_fn,
        sink=sink,
        backoff=POLICY,
        watch_timeout_seconds=123,
        now=clock or Clock(),
        sleep=sleep,
        rng=random.Random(7),
    )
    return r, delays


async def play(r: Reflector) -> None:
    with pytest.raises(ScriptDone):
        await r.run()


# -- Reflector: list, watch, re-watch ---------------------------------------------------------


async def test_list_then_events_reach_the_sink_in_order():
    api = FakeApi(
        lists=[listing(10, pod("a", 5), pod("b", 9))],
        watches=[
            [
                event("ADDED", pod("c", 11)),
                event("MODIFIED", pod("a", 12)),
                event("DELETED", pod("b", 13)),
            ]
        ],
    )
    sink = Recorder()
    r, delays = reflector(api, sink)
    await play(r)

    assert sink.calls == [
        ("resync", "Pod", ["ns/a", "ns/b"]),
        ("ADDED", "Pod", "ns/c"),
        ("MODIFIED", "Pod", "ns/a"),
        ("DELETED", "Pod", "ns/b"),
    ]
    assert sink.keys("Pod") == ["ns/a", "ns/c"]
    assert sink.get("Pod", "ns/a")["metadata"]["resourceVersion"] == "12"
    # The watch starts at the list's resourceVersion; the stream then ended normally and
    # the next watch resumes from the last event (the script ends there).
    assert api.watch_calls == ["10", "13"]
    assert api.timeouts == [123, 123]
    assert api.list_calls == 1 and r.lists == 1
    assert r.synced.is_set() and delays == []


async def test_a_burst_of_watch_events_hands_the_loop_back():
    """Events read in one chunk are not all handled before anything else runs: the
    watch yields every EVENTS_PER_YIELD events (admission calls wait on the same loop)."""
    n = 5 * informers.EVENTS_PER_YIELD
    api = FakeApi(
        lists=[listing(1)],
        watches=[[event("ADDED", pod(f"p{i}", 2 + i)) for i in range(n)]],
    )
    sink = Recorder()
    r, _ = reflector(api, sink)
    seen: list[int] = []

    async def other_request() -> None:
        seen.append(sum(1 for c in sink.calls if c[0] == "ADDED"))

    asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(other_request()))
    await play(r)
    assert len(sink.calls) == n + 1  # nothing lost
    assert seen and seen[0] <= informers.EVENTS_PER_YIELD + 1


async def test_listed_items_get_kind_and_api_version():
    api = FakeApi(lists=[listing(3, pod("a", 1))], watches=[])
    sink = Store()
    await play(reflector(api, sink)[0])
    assert sink.get("Pod", "ns/a") == {"apiVersion": "v1", "kind": "Pod", **pod("a", 1)}


async def test_server_closing_the_stream_rewatches_from_the_latest_rv_without_relisting():
    api = FakeApi(
        lists=[listing(10)],
        watches=[[event("ADDED", pod("a", 11))], [], [event("ADDED", pod("b", 12))]],
    )
    sink = Recorder()
    r, delays = reflector(api, sink)
    await play(r)
    assert api.watch_calls == ["10", "11", "11", "12"]
    assert api.list_calls == 1
    assert sink.keys("Pod") == ["ns/a", "ns/b"]
    assert delays == []  # a normal close (the clock moved) is not an error


async def test_bookmark_updates_the_resource_version_and_reaches_no_sink():
    api = FakeApi(lists=[listing(10)], watches=[[bookmark(50)], [bookmark(60)]])
    sink = Recorder()
    r, _ = reflector(api, sink)
    await play(r)
    assert api.watch_calls == ["10", "50", "60"]
    assert r.resource_version == "60"
    assert sink.calls == [("resync", "Pod", [])]


# -- Reflector: 410 Gone ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "gone",
    [
        pytest.param(error_event(410), id="error-event-410"),
        pytest.param(FakeApiException(410), id="api-exception-410"),
        pytest.param(GoneError("too old resource version"), id="gone-error"),
    ],
)
async def test_410_relists_with_a_fresh_resync_and_no_duplicate_or_lost_objects(gone: Any):
    # While the watch was down, b was deleted and d created; a and c survived.
    api = FakeApi(
        lists=[
            listing(10, pod("a", 1), pod("b", 2)),
            listing(20, pod("a", 1), pod("c", 11), pod("d", 15)),
        ],
        watches=[[event("ADDED", pod("c", 11)), gone], [event("MODIFIED", pod("a", 21))]],
    )
    sink = Recorder()
    r, delays = reflector(api, sink)
    await play(r)

    assert sink.calls == [
        ("resync", "Pod", ["ns/a", "ns/b"]),
        ("ADDED", "Pod", "ns/c"),
        ("resync", "Pod", ["ns/a", "ns/c", "ns/d"]),
        ("MODIFIED", "Pod", "ns/a"),
    ]
    assert sink.keys("Pod") == ["ns/a", "ns/c", "ns/d"]  # b gone, d found, nothing twice
    assert api.list_calls == 2 and r.lists == 2
    assert api.watch_calls == ["10", "20", "21"]  # the second watch starts at the relist's rv
    assert delays == []  # one 410 relists at once


async def test_410_at_watch_start_relists_and_a_second_410_in_a_row_backs_off():
    api = FakeApi(
        lists=[listing(10), listing(20), listing(30)],
        watches=[GoneError("gone"), GoneError("gone"), [event("ADDED", pod("a", 31))]],
    )
    r, delays = reflector(api, Store())
    await play(r)
    assert api.list_calls == 3
    assert api.watch_calls == ["10", "20", "30", "31"]
    assert len(delays) == 1 and 1.0 <= delays[0] <= 1.5


# -- Reflector: other errors back off ---------------------------------------------------------


async def test_errors_back_off_exponentially_with_jitter_capped_and_reset_on_success():
    api = FakeApi(
        lists=[*(ConnectionRefusedError("refused") for _ in range(7)), listing(10)],
        watches=[ConnectionResetError("reset")],
    )
    r, delays = reflector(api, Store())
    await play(r)

    assert len(delays) == 8
    # Failure n waits min(10, 1 * 2**n) stretched by up to 50 %, then capped at 10:
    # bases 1, 2, 4, 8, 10, 10, 10 -> [1, 1.5], [2, 3], [4, 6], [8, 10], 10, 10, 10.
    for n, delay in enumerate(delays[:7]):
        base = min(10.0, 2.0**n)
        assert base <= delay <= min(10.0, base * 1.5), (n, delay)
    assert delays[4:7] == [10.0, 10.0, 10.0]
    assert len(set(delays[:3])) == 3
    # The list succeeded, so the watch failure starts again from the initial delay.
    assert 1.0 <= delays[7] <= 1.5
    assert api.watch_calls == ["10", "10"]  # a failed watch re-watches, it does not relist
    assert r.failures == 8


async def test_non_410_error_event_backs_off_and_rewatches_from_the_same_rv():
    api = FakeApi(
        lists=[listing(10)],
        watches=[[event("ADDED", pod("a", 11)), error_event(500)], [bookmark(12)]],
    )
    sink = Recorder()
    r, delays = reflector(api, sink)
    await play(r)
    assert api.list_calls == 1
    assert api.watch_calls == ["10", "11", "12"]
    assert len(delays) == 1 and 1.0 <= delays[0] <= 1.5
    assert sink.keys("Pod") == ["ns/a"]


async def test_a_stream_that_closes_at_once_without_events_backs_off():
    api = FakeApi(lists=[listing(10)], watches=[[], []])
    r, delays = reflector(api, Store(), clock=Clock(step=0.0))
    await play(r)
    assert api.watch_calls == ["10", "10", "10"]
    assert len(delays) == 2
    assert 1.0 <= delays[0] <= 1.5 and 2.0 <= delays[1] <= 3.0


async def test_a_failing_sink_is_logged_and_the_watch_goes_on(caplog: pytest.LogCaptureFixture):
    class Picky(Store):
        def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
            if obj["metadata"]["name"] == "bad":
                raise ValueError("cannot digest")
            super().on_event(kind, event_type, obj)

    api = FakeApi(
        lists=[listing(10)],
        watches=[[event("ADDED", pod("bad", 11)), event("ADDED", pod("good", 12))]],
    )
    sink = Picky()
    r, delays = reflector(api, sink)
    with caplog.at_level(logging.ERROR, logger="fairshare.state.informers"):
        await play(r)
    assert sink.keys("Pod") == ["ns/good"]
    assert r.resource_version == "12" and delays == []
    assert "the sink failed on on_event" in caplog.text


def test_backoff_delays_are_capped_and_reset():
    backoff = Backoff(
        BackoffPolicy(initial=0.5, maximum=4.0, factor=3.0, jitter=1.0), random.Random(1)
    )
    delays = [backoff.next_delay() for _ in range(100)]
    assert all(0.5 <= d <= 4.0 for d in delays)
    assert delays[-1] == 4.0
    backoff.reset()
    assert 0.5 <= backoff.next_delay() <= 1.0


def test_is_gone_accepts_status_410_from_any_exception():
    assert informers.is_gone(GoneError("x"))
    assert informers.is_gone(FakeApiException(410))
    assert not informers.is_gone(FakeApiException(500))
    assert not informers.is_gone(ValueError("410"))


# -- ApiSource --------------------------------------------------------------------------------


class FakeClient:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_api_source_is_ready_once_every_kind_is_listed_and_stop_cleans_up():
    gates = {kind: asyncio.Event() for kind in ("Node", "Pod", "ConfigMap")}
    scopes: dict[str, dict[str, str]] = {}
    client = FakeClient()

    def api_calls(api_client: Any, kind: str, **scope: str) -> tuple[Any, Any]:
        assert api_client is client
        scopes[kind] = scope

        async def list_fn() -> Mapping[str, Any]:
            await gates[kind].wait()
            return listing(1)

        async def watch_fn(rv: str, timeout: int) -> AsyncIterator[Mapping[str, Any]]:
            await asyncio.Event().wait()  # a quiet watch: only stop() ends it
            yield {}

        return list_fn, watch_fn

    async def factory() -> Any:
        return client

    source = ApiSource(
        factory, kinds=("Node", "Pod"), configmap=("fairshare-system", "cfg"), api_calls=api_calls
    )
    sink = Recorder()
    await source.start(sink)
    assert scopes == {
        "Node": {},
        "Pod": {},
        "ConfigMap": {"namespace": "fairshare-system", "name": "cfg"},
    }
    for kind in ("Node", "Pod"):
        gates[kind].set()
        await asyncio.sleep(0.01)
    assert not source.ready.is_set()  # the ConfigMap is still being listed
    gates["ConfigMap"].set()
    await asyncio.wait_for(source.ready.wait(), timeout=2)
    assert sorted(c[1] for c in sink.calls) == ["ConfigMap", "Node", "Pod"]

    tasks = list(source._tasks)
    await source.stop()
    assert client.closed
    assert all(t.done() for t in tasks)
    await source.stop()  # idempotent


async def test_api_source_is_not_ready_while_the_api_stays_unreachable_and_recovers():
    """apiserver down: a blip (shorter than stale_after) keeps /readyz up, a longer outage
    drops it, and the first answer from the API brings it back."""
    now = [0.0]
    api_up = asyncio.Event()
    api_up.set()
    failures = 0
    client = FakeClient()

    def api_calls(api_client: Any, kind: str, **scope: str) -> tuple[Any, Any]:
        async def list_fn() -> Mapping[str, Any]:
            nonlocal failures
            if not api_up.is_set():
                failures += 1
                raise ConnectionRefusedError("connection refused")
            return listing(1)

        async def watch_fn(rv: str, timeout: int) -> AsyncIterator[Mapping[str, Any]]:
            nonlocal failures
            if not api_up.is_set():
                failures += 1
                raise ConnectionRefusedError("connection refused")
            yield event("ADDED", pod("a", int(rv) + 1))
            while api_up.is_set():  # an open, quiet watch until the apiserver goes away
                await asyncio.sleep(0.001)
            raise ConnectionResetError("connection reset")

        return list_fn, watch_fn

    async def factory() -> Any:
        return client

    async def no_wait(_delay: float) -> None:
        await asyncio.sleep(0.001)

    source = ApiSource(
        factory,
        kinds=("Pod",),
        stale_after=10.0,
        now=lambda: now[0],
        sleep=no_wait,
        api_calls=api_calls,
    )
    assert not source.is_ready()
    await source.start(Store())
    await asyncio.wait_for(source.ready.wait(), timeout=2)
    await asyncio.sleep(0.01)
    assert source.is_ready()

    api_up.clear()
    for _ in range(200):
        if failures >= 2:
            break
        await asyncio.sleep(0.005)
    assert failures >= 2, "the reflector did not retry"
    now[0] = 9.0
    assert source.is_ready(), "a 9 s outage is under stale_after"
    now[0] = 10.5
    assert not source.is_ready(), "unreachable for 10.5 s: /readyz must fail"
    api_up.set()
    for _ in range(400):
        if source.is_ready():
            break
        await asyncio.sleep(0.005)
    assert source.is_ready(), "the API answered again: ready again"
    await source.stop()


def test_api_source_rejects_a_non_positive_stale_after():
    async def factory() -> Any:
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="stale_after"):
        ApiSource(factory, kinds=("Pod",), stale_after=0)


@pytest.mark.parametrize(
    ("kinds", "message"),
    [(("Node", "Deployment"), "unknown kinds"), (("ConfigMap",), "configmap=")],
    ids=["unknown-kind", "configmap-as-kind"],
)
def test_api_source_rejects_bad_kinds(kinds: tuple[str, ...], message: str):
    async def factory() -> Any:
        raise AssertionError("not called")

    with pytest.raises(ValueError, match=message):
        ApiSource(factory, kinds=kinds)


# -- Store ------------------------------------------------------------------------------------


def test_store_resync_replaces_only_that_kind():
    store = Store()
    store.on_resync("Pod", [pod("a", 1), pod("b", 2)])
    store.on_resync("Node", [{"metadata": {"name": "n1"}}])
    store.on_resync("Pod", [pod("c", 3)])
    assert store.keys("Pod") == ["ns/c"]
    assert store.keys("Node") == ["n1"]
    store.on_event("Node", "DELETED", {"metadata": {"name": "n1"}})
    store.on_event("Node", "DELETED", {"metadata": {"name": "never-seen"}})
    assert store.keys("Node") == []


# -- FileSource -------------------------------------------------------------------------------

KUBECTL_LIST: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "List",
    "metadata": {"resourceVersion": ""},
    "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "namespace": "a"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p2", "namespace": "b"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "a"},
            "spec": {"resources": {"requests": {"storage": "10Gi"}}},
        },
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc", "namespace": "a"}},
    ],
}


@pytest.mark.parametrize("fmt", ["yaml", "json"])
async def test_file_source_resyncs_every_kind_once_and_is_ready(tmp_path: Path, fmt: str):
    path = tmp_path / f"state.{fmt}"
    text = yaml.safe_dump(KUBECTL_LIST) if fmt == "yaml" else json.dumps(KUBECTL_LIST)
    path.write_text(text)
    source = FileSource(path)
    sink = Recorder()
    assert not source.ready.is_set()
    await source.start(sink)
    assert source.ready.is_set()
    assert sink.calls == [
        ("resync", "Node", ["gpu-1"]),
        ("resync", "Pod", ["a/p1", "b/p2"]),
        ("resync", "Namespace", ["a"]),
        ("resync", "PersistentVolumeClaim", ["a/data"]),
        ("resync", "ConfigMap", []),  # none in the file: an empty, complete list
    ]
    assert [c[1] for c in sink.calls] == list(ALL_KINDS)
    pvc = sink.get("PersistentVolumeClaim", "a/data")
    assert pvc is not None and pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
    await source.stop()


async def test_file_source_typed_list_gives_its_items_their_kind(tmp_path: Path):
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"kind": "NodeList", "items": [{"metadata": {"name": "n"}}]}))
    sink = Store()
    await FileSource(path, kinds=("Node",)).start(sink)
    assert sink.get("Node", "n") == {"kind": "Node", "metadata": {"name": "n"}}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read state file"),
        ("kind: List\nitems: [\n", "not valid JSON or YAML"),
        ('{"kind": "List", "items": [}', "not valid JSON or YAML"),
        ("", "got an empty document"),
        ("- a\n- b\n", "expected a Kubernetes List object, got list"),
        ("kind: Pod\nmetadata: {name: p}\n", "expected kind: List .* got 'Pod'"),
        ("items: []\n", "got no kind"),
        ("kind: List\nitems: {a: 1}\n", "items must be a list, got dict"),
        ("kind: List\nitems:\n- kind: Node\n- metadata: {name: x}\n", r"items\[1\] has no kind"),
        ("kind: List\nitems:\n- just a string\n", r"items\[0\] must be a mapping"),
    ],
    ids=[
        "missing-file",
        "bad-yaml",
        "bad-json",
        "empty",
        "not-a-mapping",
        "not-a-list-kind",
        "no-kind",
        "items-not-a-list",
        "item-without-kind",
        "item-not-a-mapping",
    ],
)
async def test_file_source_errors(tmp_path: Path, content: str | None, message: str):
    path = tmp_path / "state.yaml"
    if content is not None:
        path.write_text(content)
    source = FileSource(path)
    with pytest.raises(StateFileError, match=message) as info:
        await source.start(Store())
    assert isinstance(info.value, FairshareError)
    assert str(path) in str(info.value)
    assert not source.ready.is_set()


# -- api_calls / make_api_client: the kubernetes_asyncio adapter, without a network --------------


class FakeResponse:
    """The aiohttp ClientResponse surface that ``api_calls`` uses."""

    def __init__(self, status: int, body: bytes = b"", chunks: tuple[bytes, ...] = ()) -> None:
        self.status = status
        self.body = body
        self.chunks = chunks
        self.released = self.closed = False
        self.content = self

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


class FakeCoreV1Api:
    """Stands in for ``client.CoreV1Api``: answers ``list_*`` calls from a queue."""

    responses: ClassVar[list[FakeResponse]] = []
    calls: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def __getattr__(self, method: str) -> Any:
        async def call(**kwargs: Any) -> FakeResponse:
            FakeCoreV1Api.calls.append((method, kwargs))
            return FakeCoreV1Api.responses.pop(0)

        return call


@pytest.fixture
def fake_core(monkeypatch: pytest.MonkeyPatch) -> type[FakeCoreV1Api]:
    class FakeClientModule:
        CoreV1Api = FakeCoreV1Api

    FakeCoreV1Api.responses = []
    FakeCoreV1Api.calls = []
    monkeypatch.setattr(informers, "client", FakeClientModule)
    return FakeCoreV1Api


def body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


async def test_api_calls_list_pages_through_continue_tokens(fake_core: type[FakeCoreV1Api]):
    first = FakeResponse(200, body({"metadata": {"continue": "t1"}, "items": [pod("a", 1)]}))
    last = FakeResponse(200, body({"metadata": {"resourceVersion": "9"}, "items": [pod("b", 2)]}))
    fake_core.responses = [first, last]
    list_fn, _ = informers.api_calls(object(), "Pod", namespace="ns")
    result = await list_fn()
    assert result == {"metadata": {"resourceVersion": "9"}, "items": [pod("a", 1), pod("b", 2)]}
    assert [m for m, _ in fake_core.calls] == ["list_namespaced_pod"] * 2
    assert fake_core.calls[0][1]["namespace"] == "ns"
    assert fake_core.calls[0][1]["_preload_content"] is False
    assert "_continue" not in fake_core.calls[0][1]
    assert fake_core.calls[1][1]["_continue"] == "t1"
    assert first.released and last.released


async def test_api_calls_watch_asks_for_bookmarks_and_splits_any_chunking(
    fake_core: type[FakeCoreV1Api],
):
    big = {"type": "ADDED", "object": {**pod("big", 5), "data": "x" * 300_000}}
    stream = b"\n".join([body(event("ADDED", pod("a", 3))), body(big), body(bookmark(7))])
    # Chunks that cut lines (and the 300 kB one) anywhere, and no final newline.
    chunks = tuple(stream[i : i + 4096] for i in range(0, len(stream), 4096))
    response = FakeResponse(200, chunks=chunks)
    fake_core.responses = [response]
    _, watch_fn = informers.api_calls(object(), "ConfigMap", namespace="fs", name="cfg")
    events = [e async for e in watch_fn("3", 60)]
    assert [e["type"] for e in events] == ["ANSWERED", "ADDED", "ADDED", "BOOKMARK"]
    assert events[0] is informers.WATCH_ANSWERED  # the 200 came before any event
    assert events[2] == big
    method, kwargs = fake_core.calls[0]
    assert method == "list_namespaced_config_map"
    assert kwargs["field_selector"] == "metadata.name=cfg"
    assert kwargs["watch"] is True and kwargs["allow_watch_bookmarks"] is True
    assert (kwargs["resource_version"], kwargs["timeout_seconds"]) == ("3", 60)
    assert response.closed


@pytest.mark.parametrize(
    ("status", "payload", "error", "message"),
    [
        (
            410,
            {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
            GoneError,
            "too old",
        ),
        (410, None, GoneError, "Pod list"),
        (
            500,
            {"kind": "Status", "code": 500, "message": "etcd down"},
            informers.WatchError,
            "etcd down",
        ),
        (403, None, informers.WatchError, "HTTP 403"),
    ],
    ids=["410-status", "410-plain", "500-status", "403-plain"],
)
async def test_api_calls_map_http_errors(
    fake_core: type[FakeCoreV1Api], status: int, payload: Any, error: type[Exception], message: str
):
    raw = body(payload) if payload is not None else b"<html>nope</html>"
    fake_core.responses = [FakeResponse(status, raw), FakeResponse(status, raw)]
    list_fn, watch_fn = informers.api_calls(object(), "Pod")
    with pytest.raises(error, match=message) as info:
        await list_fn()
    assert getattr(info.value, "status", None) == status
    with pytest.raises(error):
        async for _ in watch_fn("1", 5):
            pass
    assert [m for m, _ in fake_core.calls] == ["list_pod_for_all_namespaces"] * 2


def test_api_calls_refuses_a_namespace_for_cluster_scoped_kinds():
    with pytest.raises(ValueError, match="not namespaced"):
        informers.api_calls(object(), "Node", namespace="ns")


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


async def test_make_api_client_from_a_kubeconfig(tmp_path: Path):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    api_client = await informers.make_api_client(str(path))
    try:
        assert api_client.configuration.host == "https://127.0.0.1:6443"
    finally:
        await api_client.close()


@pytest.mark.parametrize("proxy", [None, "HTTPS_PROXY", "http_proxy"])
async def test_api_client_trusts_the_environment_only_for_a_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proxy: str | None
):
    """Without a proxy in the environment the client's session does not trust it: aiohttp
    would otherwise look up ``.netrc`` in a worker thread before every API request."""
    for var in informers.PROXY_VARIABLES:
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.upper(), raising=False)
    if proxy:
        monkeypatch.setenv(proxy, "http://proxy.example:3128")
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    api_client = await informers.make_api_client(str(path))
    try:
        assert api_client.rest_client.pool_manager.trust_env is (proxy is not None)
    finally:
        await api_client.close()


@pytest.mark.parametrize("where", ["missing-file", "not-in-cluster"])
async def test_make_api_client_without_credentials_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = str(tmp_path / "nope") if where == "missing-file" else None
    with pytest.raises(FairshareError, match="cannot load Kubernetes credentials"):
        await informers.make_api_client(path)


# -- streaming a large JSON List --------------------------------------------------------------


STREAM_DOC = {
    "apiVersion": "v1",
    "items": [
        {
            "kind": "Pod",
            "metadata": {"name": "p,1]", "namespace": "a", "annotations": {"x": '}{"['}},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {}}]},
            "status": {"phase": "Running"},
        },
        {"kind": "Node", "metadata": {"name": "n\u00e9"}, "spec": {}, "n": 12345678901234},
        {"kind": "Pod", "metadata": {"name": "p2"}, "spec": {}, "x": [1.5e3, True, None]},
    ],
    "kind": "List",
    "metadata": {"resourceVersion": ""},
}


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_streamed_json_list_equals_json_loads_at_any_chunk_size(chunk: int):
    import io

    text = json.dumps(STREAM_DOC, indent=1)
    seen: list[str] = []

    def mark(obj: dict[str, Any]) -> dict[str, Any]:
        seen.append(obj["metadata"]["name"])
        return {**obj, "slim": True}

    fh = io.StringIO(text)
    head = fh.read(5)
    out = sources._stream_json(fh, head, {"Pod": mark}, chunk=chunk)
    want = json.loads(text)
    want["items"][0]["slim"] = want["items"][2]["slim"] = True
    assert out == want
    assert seen == ["p,1]", "p2"]  # each pod transformed once, as it was parsed


@pytest.mark.parametrize(
    "text",
    ['{"items": [{"kind": "Pod"', '{"items": [1, 2', '{"a": 1} x', '{"a" 1}', '{"items": [1,]}'],
)
def test_streamed_json_list_refuses_broken_documents(text: str, tmp_path: Path):
    path = tmp_path / "state.json"
    path.write_text(text)
    source = FileSource(path, kinds=("Pod",), transform={"Pod": lambda o: o})
    with pytest.raises(StateFileError, match="not valid JSON"):
        source.load()


def test_file_source_transform_applies_to_json_and_yaml(tmp_path: Path):
    def slim(obj: dict[str, Any]) -> dict[str, Any]:
        return {"kind": obj.get("kind", "Pod"), "metadata": obj["metadata"], "spec": {}}

    for name, text in (
        ("s.json", json.dumps(KUBECTL_LIST)),
        ("s.yaml", yaml.safe_dump(KUBECTL_LIST)),
    ):
        path = tmp_path / name
        path.write_text(text)
        loaded = FileSource(path, kinds=("Pod", "Node"), transform={"Pod": slim}).load()
        assert [p["spec"] for p in loaded["Pod"]] == [{}, {}], name
        assert [p["metadata"]["name"] for p in loaded["Pod"]] == ["p1", "p2"]
        assert loaded["Node"][0]["metadata"]["name"] == "gpu-1"


async def test_api_source_hands_the_transform_to_the_list_of_that_kind_only():
    got: dict[str, Any] = {}

    def api_calls(api_client: Any, kind: str, **kw: Any) -> tuple[Any, Any]:
        got[kind] = kw.get("transform")

        async def list_fn() -> Mapping[str, Any]:
            return listing(1)

        async def watch_fn(rv: str, timeout: int) -> AsyncIterator[Mapping[str, Any]]:
            await asyncio.Event().wait()
            yield {}

        return list_fn, watch_fn

    async def factory() -> Any:
        return FakeClient()

    def slim(obj: dict[str, Any]) -> dict[str, Any]:
        return obj

    source = ApiSource(factory, kinds=("Pod", "Node"), transform={"Pod": slim}, api_calls=api_calls)
    await source.start(Store())
    await source.stop()
    assert got == {"Pod": slim, "Node": None}


async def test_a_reflector_in_backoff_retries_at_once_when_woken_and_source_wakes_the_others():
    calls = 0

    async def list_fn() -> Mapping[str, Any]:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("apiserver down")

    async def watch_fn(rv: str, timeout: int) -> AsyncIterator[Mapping[str, Any]]:
        yield {}

    async def long_sleep(_delay: float) -> None:
        await asyncio.sleep(3600)  # a backoff that would outlast the test

    r = Reflector("Pod", list_fn=list_fn, watch_fn=watch_fn, sink=Store(), sleep=long_sleep)
    task = asyncio.create_task(r.run())
    try:
        for _ in range(100):
            if calls:
                break
            await asyncio.sleep(0.01)
        assert calls == 1 and r.failing_since is not None
        await asyncio.sleep(0.05)
        assert calls == 1  # pausing
        # ApiSource._recovered: another kind answered, so this one is woken.
        other = Reflector("Node", list_fn=list_fn, watch_fn=watch_fn, sink=Store())

        async def factory() -> Any:
            return FakeClient()

        source = ApiSource(factory, kinds=("Pod", "Node"))
        source.reflectors = [r, other]
        source._recovered("Node")
        for _ in range(100):
            if calls >= 2:
                break
            await asyncio.sleep(0.01)
        assert calls == 2, "the woken reflector should have retried at once"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- Reflector.relist: a new leader's catch-up -------------------------------------------------


async def test_relist_drops_the_watch_and_returns_once_a_fresh_list_is_in_the_sink():
    hold = asyncio.Event()

    class Api(FakeApi):
        async def watch_fn(self, rv: str, timeout: int) -> AsyncIterator[Mapping[str, Any]]:
            self.watch_calls.append(rv)
            if rv == "10":
                yield event("ADDED", pod("c", 11))  # "c" is deleted by rv 20
            await hold.wait()  # a quiet watch: no event would bring "d" in

    api = Api(lists=[listing(10, pod("a", 5)), listing(20, pod("a", 5), pod("d", 19))], watches=[])
    sink = Recorder()
    r, _ = reflector(api, sink)
    task = asyncio.create_task(r.run())
    await r.synced.wait()
    while not sink.get("Pod", "ns/c"):
        await asyncio.sleep(0)
    await asyncio.wait_for(r.relist(), 5)
    assert sink.keys("Pod") == ["ns/a", "ns/d"]  # the list replaced what the watch had
    assert api.list_calls == 2 and r.lists == 2
    while api.watch_calls != ["10", "20"]:  # then it watches from the new list
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_relist_waits_for_a_list_begun_after_it_not_one_already_under_way():
    started, release = asyncio.Event(), asyncio.Event()
    calls = 0

    async def list_fn() -> Mapping[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 2:  # the list under way when relist() is asked for
            started.set()
            await release.wait()
            return listing(20, pod("old", 19))
        if calls == 1:
            raise FakeApiException(500)
        return listing(30, pod("new", 29))

    async def watch_fn(rv: str, timeout: int) -> AsyncIterator[Mapping[str, Any]]:
        await asyncio.Event().wait()
        yield {}

    sink = Recorder()
    r = Reflector("Pod", list_fn=list_fn, watch_fn=watch_fn, sink=sink, backoff=POLICY,
                  sleep=lambda _d: asyncio.sleep(0))  # fmt: skip
    task = asyncio.create_task(r.run())
    await started.wait()
    waiter = asyncio.create_task(r.relist())
    await asyncio.sleep(0)
    release.set()
    await asyncio.wait_for(waiter, 5)
    assert sink.keys("Pod") == ["ns/new"] and calls == 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_unserved_device_taint_rule_api_lists_empty_and_is_looked_for_again(
    monkeypatch: pytest.MonkeyPatch,
):
    """v1.36 serves DeviceTaintRules only with an off-by-default beta API: a 404 (or an
    RBAC 403) lists as none instead of failing the reflector (which would keep the
    extender unready); the watch then waits and lists again once the API answers."""

    class FakeClientModule:
        ResourceV1beta2Api = FakeCoreV1Api

    FakeCoreV1Api.responses = []
    FakeCoreV1Api.calls = []
    monkeypatch.setattr(informers, "client", FakeClientModule)
    slept: list[float] = []

    async def no_sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(informers.asyncio, "sleep", no_sleep)
    not_found = body({"kind": "Status", "code": 404, "message": "the server could not find"})
    FakeCoreV1Api.responses = [FakeResponse(404, not_found)]
    list_fn, watch_fn = informers.api_calls(object(), "DeviceTaintRule")
    assert await list_fn() == {"metadata": {"resourceVersion": ""}, "items": []}
    assert FakeCoreV1Api.calls[0][0] == "list_device_taint_rule"
    # Still not served: the watch ends with no event after a pause.
    FakeCoreV1Api.responses = [FakeResponse(404, not_found)]
    assert [e async for e in watch_fn("", 60)] == [] and slept == [60]
    # Served now: the watch says so with a 410, so the reflector lists again.
    FakeCoreV1Api.responses = [FakeResponse(200, body({"metadata": {}, "items": []}))]
    with pytest.raises(informers.GoneError):
        [e async for e in watch_fn("", 60)]
    # Any other error is an error.
    FakeCoreV1Api.responses = [FakeResponse(500, b"boom")]
    with pytest.raises(informers.WatchError):
        await list_fn()


async def test_a_quiet_watch_answered_after_an_outage_ends_the_failure():
    """A kind with no changes gets no event for a long time after its watch is opened
    again: the API's 200 (``WATCH_ANSWERED``) is what says it answers, or the server
    stayed unready after an API outage until that kind's next event or bookmark."""
    attempts = 0
    opened = asyncio.Event()

    async def list_fn() -> dict[str, Any]:
        return {"metadata": {"resourceVersion": "5"}, "items": []}

    async def watch_fn(rv: str, timeout: int) -> AsyncIterator[dict[str, Any]]:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise informers.WatchError("connection refused")
        yield informers.WATCH_ANSWERED
        opened.set()
        await asyncio.sleep(3600)  # quiet: no event, no bookmark
        yield {}

    async def no_sleep(_delay: float) -> None:
        await asyncio.sleep(0)

    r = Reflector("Pod", list_fn=list_fn, watch_fn=watch_fn, sink=Store(), sleep=no_sleep)
    task = asyncio.create_task(r.run())
    try:
        await asyncio.wait_for(opened.wait(), 5)
        await asyncio.sleep(0)
        assert attempts == 2 and r.failing_since is None
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
