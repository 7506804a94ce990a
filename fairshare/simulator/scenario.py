"""Scenario files (``kind: Scenario``): a config, nodes and a workload to replay. Errors
are ``ConfigError`` with field paths (``workload[3].requests.cpu: ...``). Shape::

    apiVersion: fairshare.io/v1alpha1
    kind: Scenario
    config: {FairShareConfig}
    namespaces: {name: {labels}}           # optional namespace labels
    nodes: [{name, count, allocatable, labels, unhealthy, dra}]
    workload: [{namespace, count, name, requests, annotations, claim, nodeSelector,
                arrival, duration}]

A node group with ``dra: {gpus, partitionable, shareable}`` is a DRA pool; a workload
entry with ``claim: {gpus, mig, memory}`` uses a ResourceClaim per pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from fairshare import quantities
from fairshare.config import loading
from fairshare.config.schema import FairShareConfig
from fairshare.errors import ConfigError, FieldError
from fairshare.resources import ANN_GPU_FRACTION, ANN_GPU_MEMORY, GPU
from fairshare.simulator.drapool import MIG_PROFILES


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
    dra: DraPool | None = None
    """The nodes publish GPUs through DRA (then no ``nvidia.com/gpu`` allocatable)."""

    _q = field_validator("allocatable")(_check_quantities)


class DraPool(_Strict):
    """GPUs each node of a DRA pool publishes in its ResourceSlices."""

    gpus: int = Field(default=0, ge=0)
    """Whole GPUs (``gpu.nvidia.com``)."""
    partitionable: int = Field(default=0, ge=0)
    """GPUs that are whole GPUs or MIG partitions (``mig.nvidia.com``), as claimed."""
    shareable: int = Field(default=0, ge=0)
    """GPUs several claims share by ``memory`` (``allowMultipleAllocations``)."""

    @model_validator(mode="after")
    def _some(self) -> DraPool:
        if not (self.gpus or self.partitionable or self.shareable):
            raise ValueError(
                "a DRA pool publishes at least one GPU (gpus, partitionable, shareable)"
            )
        return self


class Claim(_Strict):
    """A ResourceClaim of each pod of a workload entry."""

    gpus: int = Field(default=1, ge=1)
    """Devices: full GPUs, or partitions of profile ``mig``."""
    mig: str | None = None
    """A MIG profile (``1g.10gb``, ``2g.20gb``, ``3g.40gb``): partitions, not full GPUs."""
    memory: str | None = None
    """GPU memory of a shareable GPU (one share; not with ``mig`` nor ``gpus`` > 1)."""

    @field_validator("mig")
    @classmethod
    def _profile(cls, v: str | None) -> str | None:
        if v is not None and v not in MIG_PROFILES:
            raise ValueError(f"unknown MIG profile {v!r} (known: {', '.join(MIG_PROFILES)})")
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                q = quantities.parse_quantity(v)
            except quantities.QuantityError as exc:
                raise ValueError(str(exc)) from exc
            if q <= 0:
                raise ValueError(f"{v!r} must be more than 0")
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> Claim:
        if self.memory is not None and (self.mig is not None or self.gpus != 1):
            raise ValueError("a share by memory is one device of a shareable GPU (no mig, gpus 1)")
        return self


class WorkloadGroup(_Strict):
    namespace: str
    count: int = Field(default=1, ge=1)
    name: str | None = None
    """Pod name prefix; default ``<namespace>-<entry index>``."""
    requests: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    claim: Claim | None = None
    """The pods' GPUs come from a ResourceClaim each (a DRA pool serves them)."""
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    """The pods' ``spec.nodeSelector`` (node labels they need)."""
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

    def dra_pools(self) -> dict[str, DraPool]:
        """Node name -> the GPUs it publishes through DRA (nodes of DRA pools only)."""
        out: dict[str, DraPool] = {}
        for g in self.scenario.nodes:
            if g.dra is not None:
                names = [g.name] if g.count == 1 else [f"{g.name}-{i}" for i in range(g.count)]
                out.update(dict.fromkeys(names, g.dra))
        return out

    def uses_dra(self) -> bool:
        return bool(self.dra_pools()) or any(w.claim for w in self.scenario.workload)

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
    _check_dra(scenario)
    try:
        config = loading.config_from_mapping(scenario.config)
    except ConfigError as exc:
        raise ConfigError([FieldError(f"config.{e.path}", e.message) for e in exc.errors]) from None
    return LoadedScenario(scenario, config)


def _check_dra(scenario: Scenario) -> None:
    """What no field alone says: a DRA pool's nodes have no ``nvidia.com/gpu``
    allocatable, claims need a DRA pool, a pod asks GPUs one way."""
    errs = []
    for i, g in enumerate(scenario.nodes):
        if g.dra is not None and g.allocatable.get(GPU, "0") not in ("0", ""):
            errs.append(
                FieldError(
                    f"nodes[{i}].dra",
                    f"a DRA pool's nodes have no {GPU} allocatable (kube-scheduler would "
                    "keep their GPUs on the device plugin)",
                )
            )
    pools = [g.dra for g in scenario.nodes if g.dra is not None]
    for i, w in enumerate(scenario.workload):
        if w.claim is None:
            continue
        if not pools:
            errs.append(
                FieldError(f"workload[{i}].claim", "no node group publishes DRA GPUs (dra)")
            )
        elif w.claim.mig and not any(p.partitionable for p in pools):
            errs.append(
                FieldError(f"workload[{i}].claim.mig", "no DRA pool has partitionable GPUs")
            )
        elif w.claim.memory and not any(p.shareable for p in pools):
            errs.append(FieldError(f"workload[{i}].claim.memory", "no DRA pool has shareable GPUs"))
        if GPU in w.requests or set(w.annotations) & {ANN_GPU_FRACTION, ANN_GPU_MEMORY}:
            errs.append(
                FieldError(
                    f"workload[{i}].claim",
                    f"a pod asks GPUs by its claim or by {GPU}/annotations, not both",
                )
            )
    if errs:
        raise ConfigError(errs)


def load_scenario(path: str | Path) -> LoadedScenario:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([FieldError(str(p), f"cannot read: {exc.strerror}")]) from None
    return parse_scenario(text)
