"""Refuse a ConfigMap update that carries an invalid FairShareConfig (only the ConfigMap
named by ``ConfigMapRef``), with every field-path error. A valid config that sets a limit
below what the tenant (a parent: its subtree) uses now is admitted with a warning per
such limit: running pods are never evicted for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from fairshare import quantities
from fairshare.config.loading import parse_config
from fairshare.config.schema import FairShareConfig
from fairshare.errors import ConfigError, FieldError

__all__ = [
    "CONFIG_KEY",
    "ConfigMapRef",
    "InvalidConfig",
    "LimitBelowUsage",
    "check_config_map",
    "check_limits_below_usage",
    "parse_config_map",
    "render_invalid",
    "render_limit_below_usage",
]

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


@dataclass(frozen=True)
class LimitBelowUsage:
    """``tenant``'s new ``limit`` of ``resource`` is below what it (its subtree) uses."""

    tenant: str
    resource: str
    used: Fraction
    limit: Fraction


def parse_config_map(
    obj: Mapping[str, Any], *, ref: ConfigMapRef
) -> FairShareConfig | InvalidConfig:
    """The FairShareConfig ``obj`` (a ConfigMap) holds under ``ref.key``, or every problem."""
    data = obj.get("data") or {}
    text = data.get(ref.key) if isinstance(data, Mapping) else None
    if not isinstance(text, str):
        problem = "is missing" if text is None else "must be a string"
        return InvalidConfig(ref, (FieldError(f"data.{ref.key}", problem),))
    try:
        return parse_config(text)
    except ConfigError as exc:
        return InvalidConfig(ref, tuple(exc.errors))


def check_config_map(obj: Mapping[str, Any], *, ref: ConfigMapRef) -> InvalidConfig | None:
    """None when ``obj`` (a ConfigMap) holds a valid FairShareConfig under ``ref.key``."""
    parsed = parse_config_map(obj, ref=ref)
    return parsed if isinstance(parsed, InvalidConfig) else None


def check_limits_below_usage(
    config: FairShareConfig, usage: Callable[[str], Mapping[str, Fraction]]
) -> tuple[LimitBelowUsage, ...]:
    """Every limit of ``config`` below current usage (``usage(tenant)``, summed over the
    tenant's subtree), in config order then by resource name."""
    found: list[LimitBelowUsage] = []
    for tenant in config.all_tenants():
        limits = tenant.limit_amounts()
        if not limits:
            continue
        used: dict[str, Fraction] = {}
        for member in config.subtree(tenant.name):
            for resource, amount in usage(member).items():
                used[resource] = used.get(resource, Fraction(0)) + amount
        for resource in sorted(limits):
            amount = used.get(resource, Fraction(0))
            if amount > limits[resource]:
                found.append(LimitBelowUsage(tenant.name, resource, amount, limits[resource]))
    return tuple(found)


def render_limit_below_usage(item: LimitBelowUsage) -> str:
    """``tenant nlp: nvidia.com/gpu limit 2 is below current usage 4; new pods are refused
    until usage is under it`` (running pods stay)."""
    r = item.resource
    return (
        f"tenant {item.tenant}: {r} limit {_show(r, item.limit)} is below current usage "
        f"{_show(r, item.used)}; new pods are refused until usage is under it"
    )


def _show(resource: str, amount: Fraction) -> str:
    return quantities.format_quantity(amount, quantities.quantity_kind(resource))


def render_invalid(invalid: InvalidConfig) -> str:
    """``ConfigMap fairshare-system/fairshare-config key config.yaml is not a valid
    FairShareConfig: tenants[2].weight: must be > 0; ...``."""
    problems = "; ".join(str(error) for error in invalid.errors)
    return (
        f"ConfigMap {invalid.ref} key {invalid.ref.key} is not a valid FairShareConfig: {problems}"
    )
