"""What both servers need at startup: the config holder and the cluster-state source.

``build_runtime`` takes the server's command-line choices: the config from ``--config
FILE`` (then polled) or ``--configmap NS/NAME`` (read once now, then watched; an invalid
config at startup is an error naming every field path), the state from ``--state FILE``
or the API (list + watch). ``Fanout`` routes one source's events to several sinks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairshare.config import loading
from fairshare.config.reloading import ConfigHolder, ConfigMapSink, FileWatcher
from fairshare.config.schema import FairShareConfig
from fairshare.errors import ConfigError, FairshareError, FieldError
from fairshare.state import sources

log = logging.getLogger("fairshare.runtime")


class Fanout:
    """A sink that forwards every call to each of ``sinks`` in order."""

    def __init__(self, sinks: Sequence[sources.Sink]) -> None:
        self.sinks = list(sinks)

    def on_resync(self, kind: str, objects: list[dict[str, Any]]) -> None:
        for s in self.sinks:
            s.on_resync(kind, objects)

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        for s in self.sinks:
            s.on_event(kind, event_type, obj)


@dataclass
class Runtime:
    """The config holder, the state source, and the config reloaders feeding the holder."""

    holder: ConfigHolder
    source: sources.Source
    configmap_sink: ConfigMapSink | None = None
    file_watcher: FileWatcher | None = None
    extra_sinks: list[sources.Sink] = field(default_factory=list)

    def sink_for(self, *sinks: sources.Sink) -> Fanout:
        """The sink to start the source with: ``sinks`` in order, then the config
        reloader."""
        return Fanout([*sinks, *([self.configmap_sink] if self.configmap_sink else [])])


def parse_ref(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` → (namespace, name), with a clear error otherwise."""
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise FairshareError(f"--configmap wants NAMESPACE/NAME, got {text!r}")
    return ns, name


async def read_configmap_config(kubeconfig: str | None, ns: str, name: str) -> FairShareConfig:
    """Read ``ns/name`` once through the API and parse its ``config.yaml``."""
    from fairshare.state import informers

    api_client = await informers.make_api_client(kubeconfig)
    async with api_client:
        from kubernetes_asyncio import client

        v1: Any = client.CoreV1Api(api_client)
        try:
            resp = await v1.read_namespaced_config_map(name, ns, _preload_content=False)
            body = await resp.read()
        except Exception as exc:
            raise FairshareError(f"cannot read ConfigMap {ns}/{name}: {exc}") from exc
        # With _preload_content=False error statuses come back unraised.
        if resp.status >= 300:
            raise FairshareError(f"cannot read ConfigMap {ns}/{name}: HTTP {resp.status}")
        obj = json.loads(body)
    text = (obj.get("data") or {}).get("config.yaml")
    if text is None:
        raise ConfigError([FieldError(f"ConfigMap {ns}/{name}", "has no key config.yaml")])
    return loading.parse_config(text)


async def build_runtime(
    *,
    config_file: str | None,
    configmap: str | None,
    kubeconfig: str | None,
    state_file: str | None,
    kinds: Sequence[str],
    on_reload: Callable[[], None] | None = None,
    on_error: Callable[[], None] | None = None,
    stale_after: float = 10.0,
    transform: Mapping[str, sources.ItemTransform] | None = None,
) -> Runtime:
    """Load the initial config and build the state source (not started yet).

    ``stale_after``: seconds of failing to reach the API after which the source reports
    not ready (``ApiSource.is_ready``). ``transform``: per kind, applied to listed
    objects as they are parsed (the extender slims pods this way)."""
    if (config_file is None) == (configmap is None):
        raise FairshareError("give exactly one of --config FILE or --configmap NAMESPACE/NAME")
    if state_file is not None and configmap is not None:
        raise FairshareError("--configmap needs the API; with --state use --config FILE")
    ref = parse_ref(configmap) if configmap is not None else None
    if config_file is not None:
        config = loading.load_config_file(config_file)
    else:
        assert ref is not None
        config = await read_configmap_config(kubeconfig, *ref)
    holder = ConfigHolder(config)
    source: sources.Source
    if state_file is not None:
        source = sources.FileSource(state_file, kinds=tuple(kinds), transform=transform)
    else:

        async def factory() -> Any:
            from fairshare.state import informers

            return await informers.make_api_client(kubeconfig)

        source = sources.ApiSource(
            factory,
            kinds=tuple(kinds),
            configmap=ref,
            stale_after=stale_after,
            transform=transform,
        )
    rt = Runtime(holder, source)
    if ref is not None:
        rt.configmap_sink = ConfigMapSink(
            holder, namespace=ref[0], name=ref[1], on_error=on_error, on_reload=on_reload
        )
    if config_file is not None:
        rt.file_watcher = FileWatcher(config_file, holder, on_error=on_error, on_reload=on_reload)
    log.info(
        "config: %s tenant(s); state from %s",
        len(config.tenants),
        state_file or (kubeconfig or "in-cluster API"),
    )
    return rt


def background(
    rt: Runtime,
    sink: sources.Sink,
    *,
    tls_reloader: Any = None,
    periodic: Callable[[], None] | None = None,
    period: float = 15.0,
) -> Callable[[Any], AsyncIterator[None]]:
    """A ``cleanup_ctx``-style generator: start the source, the config file watcher,
    the certificate reloader and a periodic hook; stop them all on shutdown."""

    async def ctx(_app: Any) -> AsyncIterator[None]:
        tasks: list[asyncio.Task[None]] = []
        await rt.source.start(sink)
        if rt.file_watcher is not None:
            rt.file_watcher.start()
        if tls_reloader is not None:
            tasks.append(asyncio.create_task(tls_reloader.run(), name="tls-reload"))
        if periodic is not None:

            async def tick() -> None:
                while True:
                    await asyncio.sleep(period)
                    try:
                        periodic()
                    except Exception:
                        log.exception("periodic task failed")

            tasks.append(asyncio.create_task(tick(), name="periodic"))
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if rt.file_watcher is not None:
                await rt.file_watcher.stop()
            await rt.source.stop()

    return ctx


async def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
