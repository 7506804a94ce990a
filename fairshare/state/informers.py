"""List + watch of one kind (``Reflector``), and the kubernetes_asyncio calls that feed it.

A ``Reflector`` runs as client-go's does: list, hand the whole list to ``sink.on_resync``,
then watch from its resourceVersion, every event (bookmarks too) moving it on; when a
watch ends, watch again from the latest resourceVersion; on 410 Gone list again (a second
410 in a row backs off first); on any other error, a watch that ends at once without an
event included, back off with jitter and retry the same step. A sink that raises is
logged and skipped.

The list and watch calls are injected (``ListFn``, ``WatchFn``); ``api_calls`` builds the
real ones, which return the API's JSON as plain camelCase dicts and split the watch body
themselves (aiohttp's ``readline`` refuses lines over 128 KiB). One module because the
loop and the real calls share one watch protocol (``WATCH_ANSWERED``, 410 as
``GoneError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

from kubernetes_asyncio import client as _k8s_client
from kubernetes_asyncio import config as _k8s_config

from fairshare.errors import FairshareError
from fairshare.state.feed import (
    CONFIGMAP,
    DEFAULT_BACKOFF,
    EVENT_TYPES,
    BackoffPolicy,
    Sink,
)

__all__ = [
    "Backoff",
    "GoneError",
    "ListFn",
    "Reflector",
    "WatchError",
    "WatchFn",
    "api_calls",
    "is_gone",
    "make_api_client",
]

log = logging.getLogger(__name__)

# kubernetes_asyncio ships py.typed but is only partly annotated (``load_incluster_config``
# is not): its objects stay ``Any`` here rather than scattering ignores.
client: Any = _k8s_client
config: Any = _k8s_config

ListFn = Callable[[], Awaitable[Mapping[str, Any]]]
"""``await list_fn()`` -> ``{"metadata": {"resourceVersion": ...}, "items": [...]}``."""
WatchFn = Callable[[str, int], AsyncIterator[Mapping[str, Any]]]
"""``watch_fn(resource_version, timeout_seconds)`` -> watch events ``{"type", "object"}``."""

MIN_WATCH_SECONDS: Final = 1.0
"""A watch that ends sooner than this without any event counts as a failure (backs off),
so a proxy that closes streams at once cannot make the reflector spin."""
WATCH_ANSWERED: Final = {"type": "ANSWERED"}
"""What a ``WatchFn`` may yield first, once the API answered the watch with 200: the
reflector is no longer failing then, even if the kind stays quiet (else a server watching
a quiet kind through an API outage would stay unready until the kind's next event)."""
_PAGE_SIZE: Final = 500
_LIST_TIMEOUT_SECONDS: Final = 60.0
_CONNECT_TIMEOUT_SECONDS: Final = 10.0
_READ_SLACK_SECONDS: Final = 30  # the server ends the watch at timeoutSeconds; allow for it


class WatchError(FairshareError):
    """A list or watch failed; ``status`` is the HTTP / Status code when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GoneError(WatchError):
    """410 Gone: the resourceVersion is too old to watch from; relist."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=410)


def is_gone(exc: BaseException) -> bool:
    """True for ``GoneError`` and for any exception carrying ``status == 410``."""
    return isinstance(exc, GoneError) or getattr(exc, "status", None) == 410


class Backoff:
    """Consecutive-failure counter turning a ``BackoffPolicy`` into delays (see there)."""

    def __init__(self, policy: BackoffPolicy, rng: random.Random) -> None:
        self.policy = policy
        self.failures = 0
        self._rng = rng

    def next_delay(self) -> float:
        """The delay before the next retry, in seconds; counts one more failure."""
        p = self.policy
        base = min(p.maximum, p.initial * p.factor ** min(self.failures, 64))
        self.failures += 1
        return min(p.maximum, base * (1.0 + p.jitter * self._rng.random()))

    def reset(self) -> None:
        """Forget past failures (after a success)."""
        self.failures = 0


class Reflector:
    """Keeps ``sink`` in step with one kind of object. ``run()`` loops until cancelled.

    ``synced`` is set (and ``on_synced(kind)`` called) after the first successful list.
    ``resource_version`` is the latest seen. ``lists`` and ``failures`` count lists and
    failed attempts, for metrics. ``failing_since`` is the ``now()`` of the first failure
    since the API last answered (a list, a watch event, a watch that ran its course), or
    None while it answers: what readiness checks for staleness.
    """

    def __init__(
        self,
        kind: str,
        *,
        list_fn: ListFn,
        watch_fn: WatchFn,
        sink: Sink,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        watch_timeout_seconds: int = 300,
        on_synced: Callable[[str], None] | None = None,
        on_recovered: Callable[[str], None] | None = None,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        api_version: str = "v1",
    ) -> None:
        self.kind = kind
        self.api_version = api_version
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0
        self.failures = 0
        self.watch_timeout_seconds = watch_timeout_seconds
        self._list_fn = list_fn
        self._watch_fn = watch_fn
        self._sink = sink
        self._backoff = Backoff(backoff, rng or random.Random())
        self._on_synced = on_synced
        self._on_recovered = on_recovered
        self._wake = asyncio.Event()
        self._now = now
        self._sleep = sleep
        self._gone_streak = 0
        self.failing_since: float | None = None
        self._relist = asyncio.Event()
        self._lists_begun = 0
        self._relist_waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def run(self) -> None:
        """List, then watch forever; relist on 410, back off on other errors."""
        need_list = True
        while True:
            step = "list"
            try:
                if self._relist.is_set():
                    self._relist.clear()
                    need_list = True
                if need_list:
                    await self._list()
                    need_list = False
                step = "watch"
                if await self._watch_unless_relist():
                    self._answered()  # the watch ran its course
            except Exception as exc:
                self.failures += 1
                if self.failing_since is None:
                    self.failing_since = self._now()
                if is_gone(exc):
                    need_list = True
                    self._gone_streak += 1
                    log.info("%s %s: %s (410 Gone); relisting", self.kind, step, exc)
                    if self._gone_streak < 2:
                        continue  # the normal case: relist at once
                delay = self._backoff.next_delay()
                log.warning("%s %s failed: %r; retrying in %.2fs", self.kind, step, exc, delay)
                await self._pause(delay)

    async def relist(self) -> None:
        """List again now (a watch in progress is dropped) and return once a list begun
        after this call has reached the sink: the sink is then at least as current as the
        API was at this call (a list without a resourceVersion is a consistent read)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._relist_waiters.append((self._lists_begun + 1, done))
        self._relist.set()
        self.wake()
        await done

    async def _watch_unless_relist(self) -> bool:
        """Watch until the stream ends (True) or a relist is asked for (False)."""
        watch = asyncio.ensure_future(self._watch())
        asked = asyncio.ensure_future(self._relist.wait())
        try:
            await asyncio.wait({watch, asked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            asked.cancel()
            if not watch.done():
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        if watch.cancelled():
            return False
        watch.result()  # raises what the watch raised
        return True

    def wake(self) -> None:
        """Cut a backoff pause short: the API answered another reflector again."""
        self._wake.set()

    async def _pause(self, delay: float) -> None:
        self._wake.clear()
        sleeper = asyncio.ensure_future(self._sleep(delay))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, waker):
                task.cancel()

    def _answered(self) -> None:
        """The API answered: no longer failing; tell the owner if it was."""
        if self.failing_since is not None:
            self.failing_since = None
            if self._on_recovered is not None:
                self._on_recovered(self.kind)

    async def _list(self) -> None:
        self._lists_begun += 1
        begun = self._lists_begun
        data = await self._list_fn()
        rv = (data.get("metadata") or {}).get("resourceVersion")
        if not rv:
            raise WatchError(f"{self.kind} list has no metadata.resourceVersion")
        # Items of a typed list carry no kind/apiVersion; add them so every object a sink
        # sees looks the same whether it came from a list, a watch or a file.
        items = [
            {"apiVersion": self.api_version, "kind": self.kind, **item}
            for item in data.get("items") or []
        ]
        self._call_sink(self._sink.on_resync, self.kind, items)
        self.resource_version = str(rv)
        self.lists += 1
        self._answered()
        self._backoff.reset()
        log.debug("%s listed: %d objects at resourceVersion %s", self.kind, len(items), rv)
        waiting = []
        for want, done in self._relist_waiters:
            if want <= begun:
                if not done.done():
                    done.set_result(None)
            else:
                waiting.append((want, done))
        self._relist_waiters = waiting
        if not self.synced.is_set():
            self.synced.set()
            if self._on_synced is not None:
                self._on_synced(self.kind)

    async def _watch(self) -> None:
        started = self._now()
        received = False
        stream = self._watch_fn(self.resource_version, self.watch_timeout_seconds)
        handled = 0
        try:
            async for event in stream:
                if event is WATCH_ANSWERED:
                    self._answered()
                    continue
                self._handle(event)
                received = True
                handled += 1
                if handled % EVENTS_PER_YIELD == 0:
                    # A chunk of events already read is parsed without a pause otherwise:
                    # let the admission and extender handlers waiting on the loop go first.
                    await asyncio.sleep(0)
                self._answered()
                self._gone_streak = 0
                self._backoff.reset()
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        if not received and self._now() - started < MIN_WATCH_SECONDS:
            raise WatchError(f"{self.kind} watch closed at once without any event")

    def _handle(self, event: Mapping[str, Any]) -> None:
        event_type = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise WatchError(f"{self.kind} watch event {event_type!r} without an object")
        if event_type == "ERROR":
            raise _status_error(obj, f"{self.kind} watch")
        if event_type in EVENT_TYPES:
            self._call_sink(self._sink.on_event, self.kind, str(event_type), obj)
        elif event_type != "BOOKMARK":
            log.warning("%s watch: ignoring event of type %r", self.kind, event_type)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)

    def _call_sink(self, method: Callable[..., None], *args: Any) -> None:
        try:
            method(*args)
        except Exception:
            log.exception("%s: the sink failed on %s; skipped", self.kind, method.__name__)


def _status_error(status: Mapping[str, Any], what: str) -> WatchError:
    """A ``metav1.Status`` (ERROR event or error body) as ``GoneError`` / ``WatchError``."""
    code = status.get("code")
    message = f"{what}: {status.get('reason') or 'error'}: {status.get('message') or status}"
    if code == 410:
        return GoneError(message)
    return WatchError(message, status=code if isinstance(code, int) else None)


# -- the real calls (kubernetes_asyncio) --------------------------------------------------


async def make_api_client(kubeconfig: str | None) -> Any:
    """A kubernetes_asyncio ``ApiClient``: from ``kubeconfig``, or the in-cluster service
    account when it is ``None``. The caller closes it (``ApiSource.stop`` does)."""
    configuration = client.Configuration()
    try:
        if kubeconfig:
            await config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "in-cluster service account (pass --kubeconfig outside a pod)"
        raise FairshareError(f"cannot load Kubernetes credentials from {where}: {exc}") from exc
    api = client.ApiClient(configuration=configuration)
    if not env_proxies():
        distrust_env(api)
    return api


EVENTS_PER_YIELD: Final = 32
"""A watch hands the event loop back after this many events in a row (a burst of pod
events, ~0.3 ms each in the trackers, otherwise holds up every request that waits)."""

PROXY_VARIABLES: Final = ("https_proxy", "http_proxy", "all_proxy", "no_proxy")


def env_proxies(environ: Mapping[str, str] | None = None) -> bool:
    """Is a proxy set in the environment (``HTTPS_PROXY`` and its kin, either case)?"""
    env = os.environ if environ is None else environ
    return any(env.get(v) or env.get(v.upper()) for v in PROXY_VARIABLES)


def distrust_env(api: Any) -> None:
    """Stop ``api``'s HTTP session from consulting the environment on every request.

    kubernetes_asyncio opens its aiohttp session with ``trust_env=True``; aiohttp then
    looks for a ``.netrc`` entry in a worker thread before every request that carries no
    ``Authorization`` of its own (a thread hop per API call: ~10 % of the extender's CPU
    under a scheduling burst). Only for clients with no proxy in the environment: those
    would lose it. A kubeconfig's ``proxy-url`` is passed per request and still applies.
    """
    session = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    if session is not None and hasattr(session, "_trust_env"):
        session._trust_env = False


# kind -> (CoreV1Api method for all namespaces, method for one namespace)
_LIST_METHODS: Final = {
    "Node": ("list_node", None),
    "Namespace": ("list_namespace", None),
    "Pod": ("list_pod_for_all_namespaces", "list_namespaced_pod"),
    "PersistentVolumeClaim": (
        "list_persistent_volume_claim_for_all_namespaces",
        "list_namespaced_persistent_volume_claim",
    ),
    CONFIGMAP: ("list_config_map_for_all_namespaces", "list_namespaced_config_map"),
}

# resource.k8s.io/v1 kinds (DRA), served by ResourceV1Api.
_RESOURCE_V1_METHODS: Final = {
    "ResourceClaim": (
        "list_resource_claim_for_all_namespaces",
        "list_namespaced_resource_claim",
    ),
    "ResourceSlice": ("list_resource_slice", None),
    "DeviceClass": ("list_device_class", None),
}


# resource.k8s.io/v1beta2 kinds: DeviceTaintRule (v1.36 serves it only when the cluster
# enables the beta API and the DRADeviceTaintRules gate; an unserved API lists as empty).
_RESOURCE_V1BETA2_METHODS: Final = {"DeviceTaintRule": ("list_device_taint_rule", None)}
_UNSERVED_RECHECK_SECONDS: Final = 300


def api_calls(
    api_client: Any,
    kind: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[ListFn, WatchFn]:
    """The list and watch functions of ``kind`` over a kubernetes_asyncio ``ApiClient``.

    ``namespace`` restricts to one namespace, ``name`` to one object (a field selector),
    as for the config ConfigMap. Lists are paged (500 per page); both return raw API JSON.
    ``transform`` is applied to each listed item page by page, so a large list never
    holds every whole object at once.
    """
    all_ns: str
    one_ns: str | None
    optional = kind in _RESOURCE_V1BETA2_METHODS
    if kind in _RESOURCE_V1_METHODS:
        all_ns, one_ns = _RESOURCE_V1_METHODS[kind]
        core = client.ResourceV1Api(api_client)
    elif optional:
        all_ns, one_ns = _RESOURCE_V1BETA2_METHODS[kind]
        core = client.ResourceV1beta2Api(api_client)
    else:
        all_ns, one_ns = _LIST_METHODS[kind]
        core = client.CoreV1Api(api_client)
    scope: dict[str, Any] = {}
    if namespace is not None:
        if one_ns is None:
            raise ValueError(f"{kind} is not namespaced")
        method = getattr(core, one_ns)
        scope["namespace"] = namespace
    else:
        method = getattr(core, all_ns)
    if name is not None:
        scope["field_selector"] = f"metadata.name={name}"

    unserved = [False]

    async def list_fn() -> Mapping[str, Any]:
        if optional:
            try:
                listed = await list_pages()
                unserved[0] = False
                return listed
            except WatchError as exc:
                if exc.status not in (403, 404):
                    raise
                # Not served by this cluster (or not readable: RBAC): nothing to count;
                # looked for again after the watch's pause, so enabling it later is noticed.
                if exc.status == 403 and not unserved[0]:
                    log.warning("%s not readable (%s): counted as none", kind, exc)
                unserved[0] = True
                return {"metadata": {"resourceVersion": ""}, "items": []}
        return await list_pages()

    async def list_pages() -> Mapping[str, Any]:
        items: list[Any] = []
        page: dict[str, Any] = {}
        while True:
            response = await method(
                **scope,
                **page,
                limit=_PAGE_SIZE,
                _preload_content=False,
                _request_timeout=_LIST_TIMEOUT_SECONDS,
            )
            body = await _read_json(response, f"{kind} list")
            page_items = body.get("items") or []
            if transform is not None:
                page_items = [transform(i) if isinstance(i, dict) else i for i in page_items]
            items.extend(page_items)
            meta = body.get("metadata") or {}
            if not meta.get("continue"):
                return {
                    "metadata": {"resourceVersion": meta.get("resourceVersion")},
                    "items": items,
                }
            page = {"_continue": meta["continue"]}

    async def watch_fn(
        resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[dict[str, Any]]:
        if unserved[0]:
            await asyncio.sleep(min(timeout_seconds, _UNSERVED_RECHECK_SECONDS))
            try:
                await list_pages()
            except WatchError as exc:
                if exc.status in (403, 404):
                    return  # still not served: an empty watch
                raise
            raise GoneError(f"{kind}: now served; listing again")
        response = await method(
            **scope,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            _request_timeout=(_CONNECT_TIMEOUT_SECONDS, timeout_seconds + _READ_SLACK_SECONDS),
        )
        try:
            if response.status != 200:
                raise _http_error(response.status, await response.read(), f"{kind} watch")
            yield WATCH_ANSWERED
            async for event in _json_lines(response.content):
                yield event
        finally:
            response.close()

    return list_fn, watch_fn


async def _read_json(response: Any, what: str) -> dict[str, Any]:
    try:
        body = await response.read()
    finally:
        response.release()
    if response.status != 200:
        raise _http_error(response.status, body, what)
    data = json.loads(body)
    if not isinstance(data, dict):
        raise WatchError(f"{what}: expected a JSON object")
    return data


def _http_error(status: int, body: bytes, what: str) -> WatchError:
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        return _status_error({"code": status, **decoded}, what)
    text = body[:200].decode("utf-8", "replace")
    return (
        GoneError(f"{what}: {text}")
        if status == 410
        else WatchError(f"{what}: HTTP {status}: {text}", status)
    )


async def _json_lines(content: Any) -> AsyncIterator[dict[str, Any]]:
    """Newline-delimited JSON objects from an aiohttp ``StreamReader``, any line length."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer.extend(chunk)
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            line = bytes(buffer[start:end]).strip()
            start = end + 1
            if line:
                yield json.loads(line)
        del buffer[:start]
    if bytes(buffer).strip():
        yield json.loads(bytes(buffer))


def podgroup_fetcher(api_client: Any) -> Callable[[Any], Awaitable[Mapping[str, Any] | None]]:
    """Read a gang's PodGroup (``fairshare.gangs.GroupKey``) through the API: the
    coscheduling ``scheduling.x-k8s.io/v1alpha1`` object, or the native
    ``scheduling.k8s.io/v1alpha2`` one for a native group. 404 (also from a cluster
    without the CRD or the API): None."""
    from kubernetes_asyncio.client.exceptions import ApiException

    api = client.CustomObjectsApi(api_client)

    async def fetch(key: Any) -> Mapping[str, Any] | None:
        group, version, plural = key.api
        try:
            obj = await api.get_namespaced_custom_object(
                group, version, key.namespace, plural, key.name, _request_timeout=2
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj if isinstance(obj, Mapping) else None

    return fetch


def custom_object_lister(
    api_client: Any,
) -> Callable[[str, str, str], Awaitable[Mapping[str, Any]]]:
    """List every custom object of (group, version, plural) in the cluster through the
    API: the list's JSON (``{}`` when the answer is not an object). Raises the client's
    ``ApiException`` (``status`` 404: no such API in the cluster)."""
    api = client.CustomObjectsApi(api_client)

    async def list_all(group: str, version: str, plural: str) -> Mapping[str, Any]:
        listed = await api.list_cluster_custom_object(group, version, plural)
        return listed if isinstance(listed, Mapping) else {}

    return list_all
