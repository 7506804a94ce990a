"""Config hot reload: one ``ConfigHolder``, swapped whole, fed by the ConfigMap
(``ConfigMapSink``) or the mounted file (``FileWatcher``). aiohttp app state cannot be
reassigned after start, so readers call ``holder.get()`` each time. An invalid update
keeps the last good config and is reported through ``on_error``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Final

from fairshare.config.loading import ROOT_PATH, load_config_file, parse_config
from fairshare.config.schema import FairShareConfig
from fairshare.errors import ConfigError, FieldError

__all__ = [
    "CONFIG_KEY",
    "ConfigHolder",
    "ConfigMapSink",
    "FileWatcher",
    "Listener",
    "apply_configmap",
]

log = logging.getLogger(__name__)

CONFIG_KEY: Final = "config.yaml"
"""The ConfigMap data key holding the config document."""

Listener = Callable[[FairShareConfig], None]
Hook = Callable[[], None]


class ConfigHolder:
    """The config in force. ``swap`` replaces it whole and bumps ``version``."""

    def __init__(self, config: FairShareConfig) -> None:
        self._config = config
        self._version = 1
        self._listeners: list[Listener] = []

    @property
    def current(self) -> FairShareConfig:
        """The config in force now."""
        return self._config

    def get(self) -> FairShareConfig:
        """The config in force now (a bound method to hand to ``config=`` callables)."""
        return self._config

    @property
    def version(self) -> int:
        """1 for the startup config, then +1 per swap."""
        return self._version

    def swap(self, new: FairShareConfig) -> int:
        """Put ``new`` in force, notify every listener, and return the new version.

        Listeners run in order, synchronously; one that raises is logged, and neither
        undoes the swap nor stops the others.
        """
        self._config = new
        self._version += 1
        for listener in list(self._listeners):
            try:
                listener(new)
            except Exception:
                log.exception("config listener %r failed on version %d", listener, self._version)
        return self._version

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(new)`` after every swap; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove


def _reload(
    holder: ConfigHolder,
    load: Callable[[], FairShareConfig],
    *,
    origin: str,
    on_error: Hook | None,
    on_reload: Hook | None,
) -> str | None:
    """Shared by both feeds: validate, swap if changed, or keep the last good and report.

    A config equal to the one in force is not swapped, so a resync or a touched file
    wakes no listener.
    """
    try:
        new = load()
    except ConfigError as exc:
        text = f"{origin}: invalid config, keeping version {holder.version}:\n{exc}"
        log.error("%s", text, extra={"config_errors": [str(e) for e in exc.errors]})
        if on_error is not None:
            on_error()
        return text
    if new == holder.current:
        log.debug("%s: config unchanged", origin)
        return None
    version = holder.swap(new)
    log.info("%s: config reloaded (version %d)", origin, version)
    if on_reload is not None:
        on_reload()
    return None


def _name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"ConfigMap {meta.get('namespace', '')}/{meta.get('name', '')}"


def apply_configmap(
    holder: ConfigHolder,
    obj: Mapping[str, Any],
    *,
    key: str = CONFIG_KEY,
    on_error: Hook | None = None,
    on_reload: Hook | None = None,
) -> str | None:
    """Load ``obj.data[key]`` (a ConfigMap as API JSON) into ``holder``.

    Returns ``None`` when the config was swapped in or was already in force, else the
    error text (field paths, one per line): the last good config stays, the error is
    logged and ``on_error()`` is called (``fairshare_config_reload_errors_total``).
    ``on_reload()`` is called after a successful swap.
    """
    origin = _name_of(obj)

    def load() -> FairShareConfig:
        data = obj.get("data") or {}
        text = data.get(key) if isinstance(data, Mapping) else None
        if not isinstance(text, str):
            raise ConfigError([FieldError(ROOT_PATH, f"the ConfigMap has no data key {key!r}")])
        return parse_config(text)

    return _reload(holder, load, origin=origin, on_error=on_error, on_reload=on_reload)


class ConfigMapSink:
    """A state-source ``Sink`` that applies one ConfigMap to a ``ConfigHolder``.

    Kinds other than ``ConfigMap`` and ConfigMaps other than ``namespace/name`` are
    ignored, so it can sit behind a router or receive a whole namespace's ConfigMaps.
    A missing (never created, or deleted) ConfigMap keeps the config in force, with a
    warning: deleting it must not drop every tenant's quota. ``last_error`` holds the
    error text of the latest invalid update (``None`` once a valid one arrives).
    """

    def __init__(
        self,
        holder: ConfigHolder,
        *,
        namespace: str,
        name: str,
        key: str = CONFIG_KEY,
        on_error: Hook | None = None,
        on_reload: Hook | None = None,
    ) -> None:
        self.holder = holder
        self.namespace = namespace
        self.name = name
        self.key = key
        self.last_error: str | None = None
        self._on_error = on_error
        self._on_reload = on_reload

    def _ours(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return bool(meta.get("namespace") == self.namespace and meta.get("name") == self.name)

    def _apply(self, obj: Mapping[str, Any]) -> None:
        self.last_error = apply_configmap(
            self.holder, obj, key=self.key, on_error=self._on_error, on_reload=self._on_reload
        )

    def on_resync(self, kind: str, objects: list[dict[str, Any]]) -> None:
        """Apply our ConfigMap from a (re)list; warn and keep the config if it is absent."""
        if kind != "ConfigMap":
            return
        ours = [obj for obj in objects if self._ours(obj)]
        if ours:
            self._apply(ours[-1])
        else:
            log.warning(
                "ConfigMap %s/%s not found; keeping config version %d",
                self.namespace,
                self.name,
                self.holder.version,
            )

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """Apply ADDED / MODIFIED; on DELETED keep the config in force and warn."""
        if kind != "ConfigMap" or not self._ours(obj):
            return
        if event_type == "DELETED":
            log.warning(
                "ConfigMap %s/%s deleted; keeping config version %d",
                self.namespace,
                self.name,
                self.holder.version,
            )
            return
        self._apply(obj)


Signature = tuple[int, int, int, int] | None


def _signature(path: Path) -> Signature:
    try:
        st = os.stat(path)  # follows the ..data symlink of a ConfigMap volume
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class FileWatcher:
    """Polls a mounted config file every ``interval`` seconds and reloads it on change.

    A change is a different (device, inode, mtime, size); a ConfigMap volume update
    replaces a symlink, so the inode changes even when mtime does not. The signature at
    construction is the baseline (the holder was loaded from that file at startup).
    ``check()`` is one poll (tests call it directly); ``start()``/``stop()`` run the loop.
    """

    def __init__(
        self,
        path: str | Path,
        holder: ConfigHolder,
        interval: float = 5.0,
        *,
        on_error: Hook | None = None,
        on_reload: Hook | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.path = Path(path)
        self.holder = holder
        self.interval = interval
        self.last_error: str | None = None
        self._on_error = on_error
        self._on_reload = on_reload
        self._sleep = sleep
        self._seen = _signature(self.path)
        self._task: asyncio.Task[None] | None = None

    def check(self) -> str | None:
        """Reload if the file changed since the last poll; return the error text, if any.

        A file that disappears keeps the config in force and is reported once (as an
        error); it is reloaded when it comes back.
        """
        signature = _signature(self.path)
        if signature == self._seen:
            return None
        self._seen = signature
        self.last_error = _reload(
            self.holder,
            lambda: load_config_file(self.path),
            origin=str(self.path),
            on_error=self._on_error,
            on_reload=self._on_reload,
        )
        return self.last_error

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self._sleep(self.interval)
            self.check()

    def start(self) -> None:
        """Start polling in a background task (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"config-file-watch {self.path}")

    async def stop(self) -> None:
        """Stop polling and wait for the task to end."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
