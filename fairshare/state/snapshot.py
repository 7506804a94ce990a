"""One list of the cluster for ``status`` and ``explain``: the fairshare ConfigMap and
every kind the servers watch, listed once with their reflectors' list calls and handed to
the servers' own trackers (``on_resync``), so the numbers are the servers'. Errors a user
can cause (no kubeconfig, an unreachable API, no ConfigMap, an invalid config) become one
``FairshareError`` line.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from fairshare.config import loading
from fairshare.config.schema import FairShareConfig
from fairshare.errors import ConfigError, FairshareError
from fairshare.state import sources

KINDS: Final = (
    "Namespace",
    # DRA classes and slices before nodes: a node's DRA GPUs are its capacity when fed.
    sources.DEVICE_CLASS,
    sources.DEVICE_TAINT_RULE,
    sources.RESOURCE_SLICE,
    "Node",
    "Pod",
    "PersistentVolumeClaim",
    sources.RESOURCE_CLAIM,
)
DRA_KINDS: Final = (
    sources.RESOURCE_CLAIM,
    sources.RESOURCE_SLICE,
    sources.DEVICE_CLASS,
    sources.DEVICE_TAINT_RULE,
)
DEFAULT_CONFIG_NAMESPACE: Final = "fairshare-system"
DEFAULT_CONFIG_NAME: Final = "fairshare-config"
DEFAULT_TIMEOUT: Final = 20.0


@dataclass
class Snapshot:
    """The config and the listed objects of each kind (API JSON dicts)."""

    config: FairShareConfig
    objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    server: str = ""
    usage_history: dict[str, Any] | None = None
    """The extender's recorded usage history (``history.HISTORY_CONFIGMAP``), when the
    config turns it on and the leader has written one."""
    warnings: list[str] = field(default_factory=list)
    """What the reader should know about the view (e.g. the config shown is the last good
    one because the ConfigMap holds an invalid config)."""

    def feed(self, sink: sources.Sink, kinds: Sequence[str] = KINDS) -> None:
        """Hand each kind's list to ``sink.on_resync`` (namespaces and nodes first)."""
        for kind in kinds:
            sink.on_resync(kind, list(self.objects.get(kind, [])))


ExtraList = Callable[[Any, Snapshot], Awaitable[None]]
"""One more list for a snapshot, given the API client: it adds its objects (and any
warnings) to the ``Snapshot``."""


def default_kubeconfig() -> str:
    """``$KUBECONFIG`` (its first file) or ``~/.kube/config``, as kubectl picks."""
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), "")
    return first or str(Path.home() / ".kube" / "config")


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


async def _read_configmap(api_client: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The ConfigMap as JSON, None when it does not exist."""
    from kubernetes_asyncio import client

    v1: Any = client.CoreV1Api(api_client)
    resp = await v1.read_namespaced_config_map(name, namespace, _preload_content=False)
    body = await resp.read()
    if resp.status == 404:
        return None
    if resp.status >= 300:
        raise FairshareError(f"cannot read ConfigMap {namespace}/{name}: HTTP {resp.status}")
    obj = json.loads(body)
    return obj if isinstance(obj, dict) else {}


async def _read_config(
    api_client: Any, namespace: str, name: str
) -> tuple[FairShareConfig, list[str]]:
    """The config of ConfigMap ``namespace/name``, and warnings. When it holds an invalid
    config, the last good one the servers recorded (``loading.LAST_GOOD_SUFFIX``), with a
    warning naming the problem; an error when there is none either."""
    obj = await _read_configmap(api_client, namespace, name)
    if obj is None:
        raise FairshareError(
            f"fairshare is not installed in this cluster: ConfigMap {namespace}/{name} "
            "not found (--config-namespace/--config-name pick another)"
        )
    text = (obj.get("data") or {}).get("config.yaml")
    if text is None:
        raise FairshareError(f"ConfigMap {namespace}/{name} has no key config.yaml")
    try:
        return loading.parse_config(text), []
    except ConfigError as exc:
        first = exc.errors[0] if exc.errors else None
        where = f": {first.path}: {first.message}" if first else ""
        problem = (
            f"ConfigMap {namespace}/{name} holds an invalid config ({len(exc.errors)} "
            f"problem(s)){where}"
        )
        error = exc
    last_name = name + loading.LAST_GOOD_SUFFIX
    last = await _read_configmap(api_client, namespace, last_name)
    last_text = ((last or {}).get("data") or {}).get("config.yaml")
    if not isinstance(last_text, str):
        raise FairshareError(
            f"{problem}; no last good config recorded (ConfigMap {namespace}/{last_name}, "
            "written by the extender's leader)"
        ) from error
    try:
        config = loading.parse_config(last_text)
    except ConfigError as exc:
        raise FairshareError(f"{problem}; the last good config cannot be read either") from exc
    stamp = (
        ((last or {}).get("metadata") or {})
        .get("annotations", {})
        .get("fairshare.io/recorded-at", "an unknown time")
    )
    return config, [
        f"{problem}. The servers keep running with the last good config: shown here is "
        f"the one recorded in ConfigMap {namespace}/{last_name} at {stamp}."
    ]


async def _read_history(
    api_client: Any, namespace: str, warnings: list[str]
) -> dict[str, Any] | None:
    """The recorded usage history, None (with a warning) when there is none or it cannot
    be read: the shares are then shown without it, as a new leader would start."""
    from fairshare import history

    obj = await _read_configmap(api_client, namespace, history.HISTORY_CONFIGMAP)
    text = ((obj or {}).get("data") or {}).get(history.HISTORY_KEY)
    if not isinstance(text, str):
        warnings.append(
            f"usageHistory is on but ConfigMap {namespace}/{history.HISTORY_CONFIGMAP} holds "
            "no history yet (the extender's leader writes it every 30 s): shares are shown "
            "without it"
        )
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        warnings.append(
            f"ConfigMap {namespace}/{history.HISTORY_CONFIGMAP}: {history.HISTORY_KEY} is not "
            "a JSON object: shares are shown without the usage history"
        )
        return None
    return data


async def _take(
    api_client: Any, config_ref: tuple[str, str], extra: Sequence[ExtraList]
) -> Snapshot:
    from fairshare.state import informers

    config, warnings = await _read_config(api_client, *config_ref)
    snap = Snapshot(config, server=str(api_client.configuration.host), warnings=warnings)
    if config.usage_history is not None:
        snap.usage_history = await _read_history(api_client, config_ref[0], snap.warnings)
    for kind in KINDS:
        list_fn, _watch = informers.api_calls(api_client, kind)
        try:
            listed = await list_fn()
        except informers.WatchError as exc:
            if kind in DRA_KINDS and exc.status == 404:
                listed = {"items": []}  # no DRA API in this cluster: no claims
            else:
                raise FairshareError(f"cannot list {kind} objects: {exc}") from exc
        snap.objects[kind] = [
            {**item, "kind": kind} for item in listed.get("items") or [] if isinstance(item, dict)
        ]
    for more in extra:
        await more(api_client, snap)
    return snap


async def take_snapshot(
    *,
    kubeconfig: str | None,
    config_ref: tuple[str, str] = (DEFAULT_CONFIG_NAMESPACE, DEFAULT_CONFIG_NAME),
    timeout: float = DEFAULT_TIMEOUT,
    extra: Sequence[ExtraList] = (),
) -> Snapshot:
    """The config and every kind, listed once. Raises ``FairshareError`` with one line.

    ``extra``: more lists taken after the kinds, in order, with the same API client and
    within the same ``timeout`` (the CLI adds the PodGroups of the snapshot's gangs)."""
    from fairshare.state import informers

    path = kubeconfig or default_kubeconfig()
    if not Path(path).is_file():
        raise FairshareError(f"kubeconfig {path} not found (pass --kubeconfig)")
    api_client = await informers.make_api_client(path)
    host = str(api_client.configuration.host)
    try:
        async with api_client:
            return await asyncio.wait_for(_take(api_client, config_ref, extra), timeout)
    except FairshareError:
        raise
    except TimeoutError as exc:
        raise FairshareError(
            f"the Kubernetes API at {host} did not answer in {timeout:g} s"
        ) from exc
    except OSError as exc:  # aiohttp's connection errors are OSErrors
        raise FairshareError(f"cannot reach the Kubernetes API at {host}: {exc}") from exc
    except Exception as exc:
        status = _status_of(exc)
        if status in (401, 403):
            raise FairshareError(
                f"the Kubernetes API at {host} refused the credentials of {path} (HTTP {status})"
            ) from exc
        raise FairshareError(f"cannot read the cluster at {host}: {exc}") from exc
