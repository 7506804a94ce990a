"""Scenario files (``kind: Scenario``): a config, nodes and a workload to replay.

Pure: parsing and expansion only. Must not import aiohttp, kubernetes_asyncio or
prometheus_client. Errors are ``ConfigError`` with field paths, the same channel as
the config itself (``workload[3].requests.cpu: ...``).

Shape::

    apiVersion: fairshare.io/v1alpha1
    kind: Scenario
    config: {FairShareConfig}
    namespaces: {name: {labels}}           # optional namespace labels
    nodes: [{name, count, allocatable, labels, unhealthy}]
    workload: [{namespace, count, name, requests, annotations, arrival, duration}]
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fairshare import quantities
from fairshare.config import loading
from fairshare.config.schema import FairShareConfig
from fairshare.errors import ConfigError, FieldError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _check_quantities(v: dict[str, str]) -> dict[str, str]:
    for k, q in v.items():
        try:
            quantities.parse_quantity(q)
        except quantities.QuantityError as exc:
            raise ValueError(f"{k}: {exc}") from exc
    return v


class NodeGroup(_Strict):
    name: str
    """Node name; with ``count`` > 1 the nodes are ``name-0`` … ``name-(count-1)``."""
    count: int = Field(default=1, ge=1)
    allocatable: dict[str, str]
    """Kubernetes quantities, e.g. ``{cpu: "64", memory: 512Gi, nvidia.com/gpu: "8"}``."""
    labels: dict[str, str] = Field(default_factory=dict)
    unhealthy: str | None = None
    """If set, the nodes' GPUs are unhealthy for this reason (no GPU pods land there)."""

    _q = field_validator("allocatable")(_check_quantities)


class WorkloadGroup(_Strict):
    namespace: str
    count: int = Field(default=1, ge=1)
    name: str | None = None
    """Pod name prefix; default ``<namespace>-<entry index>``."""
    requests: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    arrival: float = Field(default=0.0, ge=0)
    """Seconds from the start when the pods are created."""
    duration: float | None = Field(default=None, gt=0)
    """Seconds a pod runs once placed; None = runs forever."""

    _q = field_validator("requests")(_check_quantities)


class Scenario(_Strict):
    api_version: Literal["fairshare.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["Scenario"]
    config: dict[str, Any]
    namespaces: dict[str, dict[str, str]] = Field(default_factory=dict)
    nodes: list[NodeGroup] = Field(min_length=1)
    workload: list[WorkloadGroup] = Field(default_factory=list)


class LoadedScenario:
    """A validated scenario with its parsed FairShareConfig."""

    def __init__(self, scenario: Scenario, config: FairShareConfig) -> None:
        self.scenario = scenario
        self.config = config

    def node_specs(self) -> list[tuple[str, dict[str, Fraction], dict[str, str], str | None]]:
        out: list[tuple[str, dict[str, Fraction], dict[str, str], str | None]] = []
        for g in self.scenario.nodes:
            alloc = {k: quantities.parse_quantity(v) for k, v in g.allocatable.items()}
            names = [g.name] if g.count == 1 else [f"{g.name}-{i}" for i in range(g.count)]
            out.extend((n, alloc, dict(g.labels), g.unhealthy) for n in names)
        return out

    def pod_specs(self) -> list[tuple[str, WorkloadGroup]]:
        out: list[tuple[str, WorkloadGroup]] = []
        for idx, w in enumerate(self.scenario.workload):
            prefix = w.name or f"{w.namespace}-{idx}"
            out.extend((f"{prefix}-{i}", w) for i in range(w.count))
        return out


def _paths(exc: ValidationError, *, prefix: str = "") -> list[FieldError]:
    errs = []
    for e in exc.errors():
        path = prefix
        for part in e["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        msg = str(e["msg"]).removeprefix("Value error, ")
        errs.append(FieldError(path or "(root)", msg))
    return errs


def parse_scenario(text: str) -> LoadedScenario:
    """Parse and validate scenario YAML; every problem is a field-path ConfigError."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([FieldError("(yaml)", str(exc).replace("\n", " "))]) from None
    if not isinstance(raw, Mapping):
        raise ConfigError([FieldError("(root)", "a scenario must be a YAML mapping")])
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_paths(exc)) from None
    try:
        config = loading.config_from_mapping(scenario.config)
    except ConfigError as exc:
        raise ConfigError([FieldError(f"config.{e.path}", e.message) for e in exc.errors]) from None
    return LoadedScenario(scenario, config)


def load_scenario(path: str | Path) -> LoadedScenario:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([FieldError(str(p), f"cannot read: {exc.strerror}")]) from None
    return parse_scenario(text)
