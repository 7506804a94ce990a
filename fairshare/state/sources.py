"""Cluster state sources: the one interface the webhook and the extender read the cluster
through. A source pushes objects into a sink (``start(sink)``, ``stop()``, ``ready``):

* ``FileSource``: a Kubernetes ``List`` file (YAML or JSON), ready at once;
* ``ApiSource``: one ``informers.Reflector`` per kind, ready once every kind is listed.

A sink gets ``on_resync(kind, objects)``, the complete list of a kind after a (re)list
(the consumer replaces what it had), and ``on_event(kind, type, obj)``; objects are plain
API JSON dicts. ``Store`` is a ready-made sink. kubernetes_asyncio is imported only
inside ``ApiSource.start``, so ``--state FILE`` runs never load it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from fairshare.errors import FairshareError
from fairshare.state.feed import (
    ALL_KINDS,
    CONFIGMAP,
    DEFAULT_BACKOFF,
    DEFAULT_KINDS,
    DEVICE_CLASS,
    DEVICE_TAINT_RULE,
    EVENT_TYPES,
    OPTIONAL_KINDS,
    RESOURCE_CLAIM,
    RESOURCE_SLICE,
    BackoffPolicy,
    Sink,
)

if TYPE_CHECKING:
    from fairshare.state import informers

__all__ = [
    "ALL_KINDS",
    "CONFIGMAP",
    "DEFAULT_BACKOFF",
    "DEFAULT_KINDS",
    "DEVICE_CLASS",
    "DEVICE_TAINT_RULE",
    "EVENT_TYPES",
    "OPTIONAL_KINDS",
    "RESOURCE_CLAIM",
    "RESOURCE_SLICE",
    "ApiSource",
    "BackoffPolicy",
    "FileSource",
    "Sink",
    "Source",
    "StateFileError",
    "Store",
    "object_key",
]

log = logging.getLogger(__name__)

ItemTransform = Callable[[dict[str, Any]], dict[str, Any]]
"""Applied to each listed object of a kind before anyone keeps it (e.g. ``slim_pod``);
must be idempotent and keep ``kind``/``metadata``."""


class Source(Protocol):
    """What both apps hold: start feeding a sink, stop, and a ready flag for ``/readyz``."""

    ready: asyncio.Event

    def is_ready(self) -> bool:
        """Synced and current: what ``/readyz`` answers."""

    async def start(self, sink: Sink) -> None:
        """Begin delivering to ``sink``; returns once the deliveries are under way."""

    async def stop(self) -> None:
        """Stop delivering and release every resource (tasks, HTTP sessions)."""

    async def relist(self, kinds: Sequence[str]) -> None:
        """List ``kinds`` afresh; returns once the sink has a list begun after the call."""


class StateFileError(FairshareError):
    """A ``--state`` file cannot be used: unreadable, not a ``List``, or a bad item."""


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


class Store:
    """A sink that keeps the latest object of each kind by ``object_key``.

    ``on_resync`` replaces one kind wholesale (so a relist drops objects deleted while the
    watch was down); ``on_event`` adds, replaces or removes one object. ``version``
    counts every change, which lets tests and pollers wait for "something happened".
    """

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.version = 0

    def on_resync(self, kind: str, objects: list[dict[str, Any]]) -> None:
        """Replace everything held for ``kind`` with ``objects``."""
        self.objects[kind] = {object_key(obj): obj for obj in objects}
        self.version += 1

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """Apply one ADDED / MODIFIED / DELETED event."""
        held = self.objects.setdefault(kind, {})
        if event_type == "DELETED":
            held.pop(object_key(obj), None)
        else:
            held[object_key(obj)] = obj
        self.version += 1

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        """The object of ``kind`` with ``key`` (``ns/name`` or ``name``), if held."""
        return self.objects.get(kind, {}).get(key)

    def keys(self, kind: str) -> list[str]:
        """Keys held for ``kind``, sorted (a deterministic order)."""
        return sorted(self.objects.get(kind, {}))


# -- the List file -----------------------------------------------------------------------


def _read_document(
    path: Path, transform: Mapping[str, ItemTransform] | None = None
) -> tuple[object, bool]:
    """The parsed file, and whether its items that name their kind are transformed
    already. With ``transform`` (kind -> function), a JSON file is read in chunks and
    those items are transformed one by one as they are parsed, so a large List never
    holds its whole text and every whole object at once (the peak memory of a
    100,000-pod file)."""
    try:
        with path.open(encoding="utf-8") as fh:
            head = fh.read(4096)
            if transform and head.lstrip().startswith("{"):
                return _stream_json(fh, head, transform), True
            text = head + fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise StateFileError(f"{path}: cannot read state file: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise StateFileError(f"{path}: not valid JSON: {exc}") from exc
    try:
        if text.lstrip().startswith("{"):
            return json.loads(text), False
        return yaml.safe_load(text), False
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise StateFileError(f"{path}: not valid JSON or YAML: {exc}") from exc


_WS = " \t\n\r"


def _stream_json(
    fh: Any, head: str, transform: Mapping[str, ItemTransform], chunk: int = 1 << 22
) -> dict[str, Any]:
    """One top-level JSON object from ``fh`` (``head`` already read), decoding the
    elements of its ``items`` array one at a time and transforming each that names a
    kind of ``transform``; other members whole. Raises ``json.JSONDecodeError`` for
    invalid or truncated JSON."""

    def item(obj: Any) -> Any:
        kind = obj.get("kind") if isinstance(obj, dict) else None
        fn = transform.get(kind) if isinstance(kind, str) else None
        return fn(obj) if fn is not None else obj

    decoder = json.JSONDecoder()
    buf, pos, eof = head, 0, False

    def fill() -> bool:
        nonlocal buf, pos, eof
        more = "" if eof else fh.read(chunk)
        eof = eof or not more
        buf, pos = buf[pos:] + more, 0
        return bool(more)

    def skip_ws() -> str:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            if pos < len(buf) or not fill():
                return buf[pos] if pos < len(buf) else ""

    def expect(char: str) -> None:
        nonlocal pos
        if skip_ws() != char:
            raise json.JSONDecodeError(f"expected {char!r}", buf, pos)
        pos += 1

    def value() -> Any:
        nonlocal pos
        skip_ws()
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if fill():  # perhaps only cut off by the chunk: read on and retry
                    continue
                raise
            if end == len(buf) and not eof and isinstance(obj, int | float):
                fill()  # a number at the chunk's end may go on in the next chunk
                continue
            pos = end
            return obj

    out: dict[str, Any] = {}
    expect("{")
    if skip_ws() == "}":
        pos += 1
    else:
        while True:
            key = value()
            expect(":")
            if key == "items" and skip_ws() == "[":
                pos += 1
                items: list[Any] = []
                if skip_ws() == "]":
                    pos += 1
                else:
                    while True:
                        items.append(item(value()))
                        if skip_ws() == "]":
                            pos += 1
                            break
                        expect(",")
                out[key] = items
            else:
                out[key] = value()
            if skip_ws() == "}":
                pos += 1
                break
            expect(",")
    if skip_ws():
        raise json.JSONDecodeError("extra data after the document", buf, pos)
    return out


def _list_items(path: Path, document: object) -> list[dict[str, Any]]:
    """Items of a ``List`` / ``<Kind>List`` document, each with its ``kind`` filled in."""
    if not isinstance(document, Mapping):
        got = "an empty document" if document is None else type(document).__name__
        raise StateFileError(f"{path}: expected a Kubernetes List object, got {got}")
    list_kind = str(document.get("kind", ""))
    if not list_kind.endswith("List"):
        shown = repr(list_kind) if list_kind else "no kind"
        raise StateFileError(
            f"{path}: expected kind: List (as `kubectl get ... -o yaml` writes), got {shown}"
        )
    items = document.get("items")
    if items is None:
        items = []  # `kubectl get` on an empty cluster writes `items: []`; null means the same
    if not isinstance(items, list):
        raise StateFileError(f"{path}: items must be a list, got {type(items).__name__}")
    # A typed list straight from the API (kind: NodeList) omits kind on its items.
    implied = list_kind.removesuffix("List") or None
    result: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise StateFileError(f"{path}: items[{i}] must be a mapping")
        kind = item.get("kind") or implied
        if not kind:
            raise StateFileError(f"{path}: items[{i}] has no kind (needed in a generic List)")
        result.append({**item, "kind": kind})
    return result


class FileSource:
    """Cluster state from a Kubernetes ``List`` file; ready as soon as it has been read.

    ``start`` reads the file and calls ``on_resync`` once for each of ``kinds`` (an empty
    list for a kind the file lacks, so the consumer knows it is complete). Items of other
    kinds (a ``kubectl get all`` dump has Services too) are skipped. Raises
    ``StateFileError`` for an unreadable file, a document that is not a ``List``, or an
    item without ``kind``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        kinds: Sequence[str] = ALL_KINDS,
        transform: Mapping[str, ItemTransform] | None = None,
    ) -> None:
        self.path = Path(path)
        self.kinds = tuple(kinds)
        self.transform = dict(transform or {})
        self.ready = asyncio.Event()

    def load(self) -> dict[str, list[dict[str, Any]]]:
        """Read and check the file: the items of each of ``kinds``, in file order."""
        by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in self.kinds}
        skipped: set[str] = set()
        document, streamed = _read_document(self.path, self.transform)
        # Streamed items that named their kind are transformed; those of a typed list
        # (kind: PodList, items without kind) and of a YAML file are transformed here.
        done = streamed and isinstance(document, Mapping) and document.get("kind") == "List"
        for item in _list_items(self.path, document):
            kind = item["kind"]
            if kind in by_kind:
                fn = None if done else self.transform.get(kind)
                by_kind[kind].append(fn(item) if fn is not None else item)
            else:
                skipped.add(str(item["kind"]))
        if skipped:
            log.info("%s: ignoring items of kinds %s", self.path, ", ".join(sorted(skipped)))
        return by_kind

    async def start(self, sink: Sink) -> None:
        """Deliver the file's contents to ``sink`` (one resync per kind) and set ``ready``."""
        for kind, objects in self.load().items():
            sink.on_resync(kind, objects)
        self.ready.set()

    def is_ready(self) -> bool:
        """A file does not go stale: ready once read."""
        return self.ready.is_set()

    async def stop(self) -> None:
        """Nothing runs in the background; present so both sources stop the same way."""

    async def relist(self, kinds: Sequence[str]) -> None:
        """The file is the whole truth and never changes under us: nothing to catch up."""


# -- the API -----------------------------------------------------------------------------


ApiCallsFactory = Callable[..., "tuple[informers.ListFn, informers.WatchFn]"]


class ApiSource:
    """Cluster state from the API server: list + watch per kind, through ``Reflector``s.

    ``api_client_factory`` is awaited once in ``start`` and must return a
    kubernetes_asyncio ``ApiClient`` (``informers.make_api_client``); ``stop`` closes it.
    ``configmap=(namespace, name)`` also watches that one ConfigMap (kind ``ConfigMap``).
    ``ready`` is set after the first successful list of every kind. ``is_ready()`` (what
    ``/readyz`` answers) also turns False while any kind has failed to reach the API for
    ``stale_after`` seconds (apiserver down, partition): a replica whose cache is going
    stale leaves the Service's endpoints, and returns as soon as a list or watch
    answers again. Short blips (a watch reconnect, a 410 relist) stay under the bar.
    ``now``, ``sleep`` and ``rng`` are injectable so backoff is testable without waiting;
    ``api_calls`` replaces the kubernetes_asyncio list/watch calls in tests.
    """

    def __init__(
        self,
        api_client_factory: Callable[[], Awaitable[Any]],
        *,
        kinds: Sequence[str] = DEFAULT_KINDS,
        configmap: tuple[str, str] | None = None,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        watch_timeout_seconds: int = 300,
        stale_after: float = 10.0,
        transform: Mapping[str, ItemTransform] | None = None,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        api_calls: ApiCallsFactory | None = None,
    ) -> None:
        if not stale_after > 0:
            raise ValueError(f"stale_after must be > 0 seconds, got {stale_after}")
        known = (*ALL_KINDS, *OPTIONAL_KINDS)
        unknown = sorted(set(kinds) - set(known))
        if unknown:
            raise ValueError(f"unknown kinds {unknown}; known: {', '.join(known)}")
        if CONFIGMAP in kinds:
            raise ValueError("watch the config ConfigMap with configmap=(namespace, name)")
        self.kinds = tuple(kinds)
        self.configmap = configmap
        self.backoff = backoff
        self.watch_timeout_seconds = watch_timeout_seconds
        self.stale_after = stale_after
        self.transform = dict(transform or {})
        self.ready = asyncio.Event()
        self._factory = api_client_factory
        self._now = now
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._api_calls = api_calls
        self._client: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[str] = set()
        self._started = False
        self.reflectors: list[informers.Reflector] = []

    async def start(self, sink: Sink) -> None:
        """Create the API client and one running reflector per kind (plus the ConfigMap)."""
        from fairshare.state import informers  # keeps kubernetes_asyncio out of FileSource runs

        if self._started:
            raise RuntimeError("ApiSource already started")
        self._started = True
        api_calls = self._api_calls or informers.api_calls
        self._client = await self._factory()
        plan: list[tuple[str, dict[str, str]]] = [(kind, {}) for kind in self.kinds]
        if self.configmap is not None:
            namespace, name = self.configmap
            plan.append((CONFIGMAP, {"namespace": namespace, "name": name}))
        self._pending = {kind for kind, _ in plan}
        if not plan:
            self.ready.set()  # nothing to wait for
        try:
            self._start_reflectors(plan, sink, api_calls, informers.Reflector)
        except BaseException:
            await self.stop()
            raise

    def _start_reflectors(
        self,
        plan: list[tuple[str, dict[str, str]]],
        sink: Sink,
        api_calls: ApiCallsFactory,
        reflector_class: type[informers.Reflector],
    ) -> None:
        for kind, scope in plan:
            extra: dict[str, Any] = {}
            if kind in self.transform:  # each list page is transformed as it arrives
                extra["transform"] = self.transform[kind]
            list_fn, watch_fn = api_calls(self._client, kind, **scope, **extra)
            reflector = reflector_class(
                kind,
                list_fn=list_fn,
                watch_fn=watch_fn,
                sink=sink,
                backoff=self.backoff,
                watch_timeout_seconds=self.watch_timeout_seconds,
                on_synced=self._synced,
                on_recovered=self._recovered,
                now=self._now,
                sleep=self._sleep,
                rng=self._rng,
            )
            self.reflectors.append(reflector)
            self._tasks.append(asyncio.create_task(reflector.run(), name=f"reflector-{kind}"))

    async def relist(self, kinds: Sequence[str]) -> None:
        """List ``kinds`` again now (a new leader catching up: a consistent read, so
        whatever another replica wrote before this call is in the sink afterwards)."""
        await asyncio.gather(*(r.relist() for r in self.reflectors if r.kind in kinds))

    def is_ready(self) -> bool:
        """Every kind listed, and none failing to reach the API for ``stale_after``."""
        if not self.ready.is_set():
            return False
        now = self._now()
        for r in self.reflectors:
            if r.failing_since is not None and now - r.failing_since >= self.stale_after:
                return False
        return True

    def _recovered(self, kind: str) -> None:
        # The API answers again: the other kinds retry now rather than at the end of
        # their backoff (up to its maximum), so readiness returns with the API.
        for r in self.reflectors:
            if r.kind != kind and r.failing_since is not None:
                r.wake()

    def _synced(self, kind: str) -> None:
        self._pending.discard(kind)
        if not self._pending and not self.ready.is_set():
            log.info("cluster state synced: %s", ", ".join(r.kind for r in self.reflectors))
            self.ready.set()

    async def stop(self) -> None:
        """Cancel every reflector, wait for them to finish, and close the API client."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task, result in zip(
            tasks, await asyncio.gather(*tasks, return_exceptions=True), strict=True
        ):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("%s ended with %r", task.get_name(), result)
        api_client, self._client = self._client, None
        if api_client is not None:
            await api_client.close()

    async def __aenter__(self) -> ApiSource:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
