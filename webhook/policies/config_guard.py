"""Refuse a ConfigMap update that carries an invalid FairShareConfig.

Pure: no network, no clock. Must not import aiohttp, kubernetes_asyncio or
prometheus_client.

When the validating webhook is registered for the fairshare ConfigMap, a bad edit is
refused at admission with every field-path error (``tenants[2].weight: must be > 0``),
so it never reaches the scheduler; the hot-reload path still keeps the last good config
for edits that bypass the webhook. Only the ConfigMap named by ``ConfigMapRef`` is
judged: other ConfigMaps may well have a ``config.yaml`` key of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from fairshare.config.loading import parse_config
from fairshare.errors import ConfigError, FieldError

__all__ = ["CONFIG_KEY", "ConfigMapRef", "InvalidConfig", "check_config_map", "render_invalid"]

CONFIG_KEY: Final = "config.yaml"


@dataclass(frozen=True)
class ConfigMapRef:
    """Where the fairshare config lives: ``namespace/name``, data key ``key``."""

    namespace: str
    name: str
    key: str = CONFIG_KEY

    def matches(self, namespace: str, name: str) -> bool:
        return (namespace, name) == (self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class InvalidConfig:
    """The ConfigMap ``ref`` does not hold a valid config; ``errors`` lists every problem."""

    ref: ConfigMapRef
    errors: tuple[FieldError, ...]


def check_config_map(obj: Mapping[str, Any], *, ref: ConfigMapRef) -> InvalidConfig | None:
    """None when ``obj`` (a ConfigMap) holds a valid FairShareConfig under ``ref.key``."""
    data = obj.get("data") or {}
    text = data.get(ref.key) if isinstance(data, Mapping) else None
    if not isinstance(text, str):
        problem = "is missing" if text is None else "must be a string"
        return InvalidConfig(ref, (FieldError(f"data.{ref.key}", problem),))
    try:
        parse_config(text)
    except ConfigError as exc:
        return InvalidConfig(ref, tuple(exc.errors))
    return None


def render_invalid(invalid: InvalidConfig) -> str:
    """``ConfigMap fairshare-system/fairshare-config key config.yaml is not a valid
    FairShareConfig: tenants[2].weight: must be > 0; ...``."""
    problems = "; ".join(str(error) for error in invalid.errors)
    return (
        f"ConfigMap {invalid.ref} key {invalid.ref.key} is not a valid FairShareConfig: {problems}"
    )
