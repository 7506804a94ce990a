"""Table tests for fairshare.config (schema + loading): defaults, field paths, consistency."""

from __future__ import annotations

import json
import pickle
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from fairshare.config import loading, schema
from fairshare.config.loading import config_from_mapping, dump_default_config, parse_config
from fairshare.config.schema import FairShareConfig, Tenant
from fairshare.errors import ConfigError, FieldError

F = Fraction
HEAD = {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig"}


def doc(**fields: Any) -> dict[str, Any]:
    """A document: the required header plus ``fields`` (camelCase keys)."""
    return {**HEAD, **fields}


def errors_of(document: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(document)  # type: ignore[arg-type]
    return [str(error) for error in info.value.errors]


# --- defaults ---------------------------------------------------------------------------------


def test_defaults_filled() -> None:
    config = config_from_mapping(doc())
    assert config == FairShareConfig()
    assert config.resource_names() == (
        "nvidia.com/gpu",
        "cpu",
        "memory",
        "ephemeral-storage",
        "storage",
    )
    assert config.resource_weights() == (1.0, 1.0, 1.0, 1.0, 1.0)
    assert config.tenants == ()
    assert config.default_tenant.mode == "tenant"
    assert config.default_tenant.name == "default"
    assert config.scoring.weights() == {
        "fragmentation": 1.0,
        "packing": 0.02,
        "fit": 0.0,
        "stranding": 0.0,
        "fairness": 0.0,
        "spread": 0.0,
        "health": 1.0,
    }
    assert config.gpu_sharing.fraction_step_amount() == F(1, 20)
    assert config.gpu_sharing.min_fraction_amount() == F(1, 20)
    assert config.gpu_sharing.max_pods_per_gpu == 8
    assert config.gpu_sharing.memory_unit_bytes() == 2**20
    assert "GpuUnhealthy" in config.health.unhealthy_conditions
    # Every reporter's names: NVSentinel, AKS's NPD plugin, EKS, fairshare's earlier ones.
    assert {"SysLogsGPUFallenOff", "GpuMemWatch", "GPUXIDErrors", "GpuUnhealthy"} <= set(
        config.health.unhealthy_conditions
    )
    assert config.health.not_ready_conditions == ("AcceleratedHardwareReady",)
    assert {"nvidia.com/gpu-error", "nvidia.com/gpu.unhealthy"} <= set(
        config.health.unhealthy_taints
    )
    assert config.health.recover_gangs and config.health.forgive_faults
    assert not config.health.quarantine.enabled
    assert config.pricing is None
    assert config.capacity is None
    assert config.capacity_amounts() is None
    assert config.scheduler_name is None


def test_implicit_default_tenant() -> None:
    config = FairShareConfig(tenants=(Tenant(name="a", namespaces=("ml",)),))
    assert [t.name for t in config.all_tenants()] == ["a", "default"]
    default = config.tenant("default")
    assert default is not None
    assert default.weight == 1.0
    assert default.guaranteed_amounts() == {}
    assert default.limit_amounts() is None
    assert config.tenant("nobody") is None


@pytest.mark.parametrize(
    ("policy", "tenants", "expected"),
    [
        # mode "tenant" adds the named tenant unless it is declared
        ({}, ["a"], ["a", "default"]),
        ({"name": "misc"}, ["a"], ["a", "misc"]),
        ({}, ["default", "a"], ["default", "a"]),
        # other modes never add one
        ({"mode": "deny-gpu"}, ["a"], ["a"]),
        ({"mode": "allow"}, [], []),
    ],
    ids=["default", "renamed", "declared", "deny-gpu", "allow"],
)
def test_all_tenants(policy: dict[str, str], tenants: list[str], expected: list[str]) -> None:
    config = config_from_mapping(
        doc(defaultTenant=policy, tenants=[{"name": name} for name in tenants])
    )
    assert [t.name for t in config.all_tenants()] == expected


# --- accessors --------------------------------------------------------------------------------


def test_tenant_amounts_are_exact() -> None:
    config = parse_config(
        """
apiVersion: fairshare.io/v1alpha1
kind: FairShareConfig
tenants:
  - name: team-a
    namespaces: [a-dev, a-prod]
    weight: 2
    guaranteed: {nvidia.com/gpu: 0.5, cpu: 1500m, memory: 64Gi}
    limit: {nvidia.com/gpu: "4", ephemeral-storage: 0}
"""
    )
    tenant = config.tenant("team-a")
    assert tenant is not None
    assert tenant.namespaces == ("a-dev", "a-prod")
    assert tenant.weight == 2.0
    # YAML numbers are kept as their string: 0.5 -> "0.5", 0 -> "0"
    assert tenant.guaranteed == {"nvidia.com/gpu": "0.5", "cpu": "1500m", "memory": "64Gi"}
    assert tenant.guaranteed_amounts() == {
        "nvidia.com/gpu": F(1, 2),
        "cpu": F(3, 2),  # 1500m
        "memory": F(64 * 2**30),
    }
    assert tenant.limit_amounts() == {"nvidia.com/gpu": F(4), "ephemeral-storage": F(0)}
    assert tenant.limit_for("ephemeral-storage") == 0  # explicit zero is not "unlimited"
    assert tenant.limit_for("memory") is None  # missing from limit: unlimited


def test_no_limit_is_none() -> None:
    tenant = Tenant(name="a")
    assert tenant.limit is None
    assert tenant.limit_amounts() is None
    assert tenant.limit_for("nvidia.com/gpu") is None


def test_resources_in_declared_order() -> None:
    config = config_from_mapping(
        doc(
            resources={
                "cpu": {"weight": 0.5},
                "nvidia.com/gpu": {"weight": 3},
                "example.com/fpga": {},
                "nvidia.com/mig-1g.10gb": {"weight": 0},
            }
        )
    )
    assert config.resource_names() == (
        "cpu",
        "nvidia.com/gpu",
        "example.com/fpga",
        "nvidia.com/mig-1g.10gb",
    )
    assert config.resource_weights() == (0.5, 3.0, 1.0, 0.0)


def test_capacity_amounts() -> None:
    config = config_from_mapping(doc(capacity={"nvidia.com/gpu": 64, "memory": "2Ti"}))
    assert config.capacity_amounts() == {"nvidia.com/gpu": F(64), "memory": F(2 * 2**40)}


# --- MIG --------------------------------------------------------------------------------------

DEFAULT_MIG = [
    ("1g.10gb", F(1, 7)),
    ("2g.20gb", F(2, 7)),
    ("3g.40gb", F(3, 7)),
    ("4g.40gb", F(4, 7)),
    ("7g.80gb", F(1)),
    ("1g.5gb", F(1, 7)),
    ("2g.10gb", F(2, 7)),
    ("3g.20gb", F(3, 7)),
]


@pytest.mark.parametrize(("profile", "fraction"), DEFAULT_MIG, ids=[p for p, _ in DEFAULT_MIG])
def test_default_mig_fractions(profile: str, fraction: Fraction) -> None:
    config = FairShareConfig()
    assert config.mig_fractions()[profile] == fraction
    assert config.mig_resource_fraction(f"nvidia.com/mig-{profile}") == fraction


def test_mig_table_replaces_default() -> None:
    # Values may be "p/q", decimals or numbers.
    config = config_from_mapping(
        doc(mig={"1g.12gb": "1/7", "2g.24gb": 0.25, "7g.96gb": 1, "3g.48gb": "0.5"})
    )
    assert config.mig_fractions() == {
        "1g.12gb": F(1, 7),
        "2g.24gb": F(1, 4),
        "7g.96gb": F(1),
        "3g.48gb": F(1, 2),
    }
    assert config.mig_resource_fraction("nvidia.com/mig-1g.10gb") is None  # not in the table
    assert config.mig_resource_fraction("nvidia.com/gpu") is None  # not MIG at all


# --- errors: exact strings and paths ----------------------------------------------------------


def test_weight_zero_exact_message() -> None:
    document = doc(tenants=[{"name": "a"}, {"name": "b"}, {"name": "c", "weight": 0}])
    with pytest.raises(ConfigError) as info:
        config_from_mapping(document)
    assert str(info.value) == "tenants[2].weight: must be > 0"
    assert info.value.errors == [FieldError("tenants[2].weight", "must be > 0")]


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        (0, "must be > 0"),
        (0.0, "must be > 0"),
        (-1, "must be > 0"),
        ("0", "must be > 0"),  # lax: numeric strings are numbers
        (float("inf"), "must be a finite number"),
        (True, "must be a number, not a boolean"),  # YAML "yes"
        ("heavy", "must be a valid number, unable to parse string as a number"),
    ],
    ids=["zero", "zero-float", "negative", "zero-string", "inf", "bool", "text"],
)
def test_tenant_weight_errors(weight: object, message: str) -> None:
    assert errors_of(doc(tenants=[{"name": "a", "weight": weight}])) == [
        f"tenants[0].weight: {message}"
    ]


def test_all_field_errors_reported_together() -> None:
    document = doc(
        tenantz=[],  # typo of a top-level key
        tenants=[
            {"name": "a", "weight": 0},
            {"name": "b", "guaranteed": {"cpu": "1 Ki"}, "wieght": 2},
        ],
        scoring={"fit": -1},
        gpuSharing={"maxPodsPerGpu": 0},
    )
    assert errors_of(document) == [
        "tenants[0].weight: must be > 0",
        'tenants[1].guaranteed.cpu: invalid quantity "1 Ki": whitespace is not allowed',
        "tenants[1].wieght: unknown field",
        "gpuSharing.maxPodsPerGpu: must be >= 1",
        "scoring.fit: must be >= 0",
        "tenantz: unknown field",
    ]


def test_all_consistency_errors_reported_together() -> None:
    document = doc(
        tenants=[
            {"name": "a", "namespaces": ["ml"], "guaranteed": {"cpu": "8"}, "limit": {"cpu": 4}},
            {"name": "a", "namespaces": ["ml"], "guaranteed": {"gpu": 1}},
        ],
        pricing={"example.com/fpga": 1},
    )
    assert errors_of(document) == [
        "tenants[0].guaranteed.cpu: guaranteed 8 is above limit 4",
        'tenants[1].name: duplicate tenant "a" (tenants[0])',
        'tenants[1].namespaces[0]: namespace "ml" is already in tenant "a"',
        'tenants[1].guaranteed.gpu: unknown resource "gpu" (did you mean "nvidia.com/gpu"?); '
        "use nvidia.com/gpu, cpu, memory, ephemeral-storage, storage, "
        "nvidia.com/mig-<profile> or an extended resource <domain>/<name>",
        'pricing.resources.example.com/fpga: unknown resource "example.com/fpga" '
        "(not in resources: "
        "nvidia.com/gpu, cpu, memory, ephemeral-storage, storage)",
    ]


def tenant(**fields: Any) -> dict[str, Any]:
    return {"name": "a", **fields}


# (id, document fields, expected path, expected message or a unique part of it)
INVALID = [
    # consistency between fields
    (
        "guaranteed-above-limit",
        {"tenants": [tenant(guaranteed={"nvidia.com/gpu": 4}, limit={"nvidia.com/gpu": 2})]},
        "tenants[0].guaranteed.nvidia.com/gpu",
        "guaranteed 4 is above limit 2",
    ),
    (
        "guaranteed-above-limit-bytes",
        {"tenants": [tenant(guaranteed={"memory": "2Gi"}, limit={"memory": "1.5Gi"})]},
        "tenants[0].guaranteed.memory",
        "guaranteed 2Gi is above limit 1536Mi",
    ),
    (
        "guaranteed-above-zero-limit",
        {"tenants": [tenant(guaranteed={"nvidia.com/gpu": "0.5"}, limit={"nvidia.com/gpu": 0})]},
        "tenants[0].guaranteed.nvidia.com/gpu",
        "guaranteed 0.5 is above limit 0",
    ),
    (
        "unknown-resource-in-guaranteed",
        {"tenants": [tenant(guaranteed={"gpu": 1})]},
        "tenants[0].guaranteed.gpu",
        'unknown resource "gpu" (did you mean "nvidia.com/gpu"?)',
    ),
    (
        "undeclared-resource-in-limit",
        {"tenants": [tenant(limit={"example.com/fpga": 1})]},
        "tenants[0].limit.example.com/fpga",
        'unknown resource "example.com/fpga" (not in resources:',
    ),
    (
        "unknown-resource-name",
        {"resources": {"nvidia.com/gpu": {}, "cpux": {}}},
        "resources.cpux",
        'unknown resource "cpux" (did you mean "cpu"?)',
    ),
    (
        "duplicate-tenant",
        {"tenants": [tenant(), {"name": "b"}, tenant()]},
        "tenants[2].name",
        'duplicate tenant "a" (tenants[0])',
    ),
    (
        "namespace-in-two-tenants",
        {"tenants": [tenant(namespaces=["x", "ml"]), {"name": "b", "namespaces": ["ml"]}]},
        "tenants[1].namespaces[0]",
        'namespace "ml" is already in tenant "a"',
    ),
    (
        "namespace-twice-in-one-tenant",
        {"tenants": [tenant(namespaces=["ml", "ml"])]},
        "tenants[0].namespaces[1]",
        'namespace "ml" is listed twice',
    ),
    (
        "guarantees-above-capacity",
        {
            "capacity": {"nvidia.com/gpu": 8},
            "tenants": [
                tenant(guaranteed={"nvidia.com/gpu": 6}),
                {"name": "b", "guaranteed": {"nvidia.com/gpu": 6}},  # 6 + 6 = 12 > 8
            ],
        },
        "tenants",
        "guaranteed nvidia.com/gpu adds up to 12, above capacity 8",
    ),
    (
        "unknown-capacity-resource",
        {"capacity": {"gpus": 8}},
        "capacity.gpus",
        'unknown resource "gpus"',
    ),
    (
        "unknown-pricing-resource",
        {"pricing": {"example.com/fpga": 1.0}},
        "pricing.resources.example.com/fpga",
        'unknown resource "example.com/fpga"',
    ),
    (
        "mig-resource-without-profile",
        {"resources": {"nvidia.com/gpu": {}, "cpu": {}, "nvidia.com/mig-9g.90gb": {}}},
        "resources.nvidia.com/mig-9g.90gb",
        'unknown MIG profile "9g.90gb"; add it to mig',
    ),
    (
        "resources-without-gpu",
        {"resources": {"cpu": {}}},
        "resources",
        'must include "nvidia.com/gpu"',
    ),
    (
        "resources-without-cpu",
        {"resources": {"nvidia.com/gpu": {}, "memory": {}}},
        "resources",
        'must include "cpu"',
    ),
    (
        "all-weights-zero",
        {"resources": {"nvidia.com/gpu": {"weight": 0}, "cpu": {"weight": 0}}},
        "resources",
        "at least one resource weight must be > 0",
    ),
    # unknown keys
    ("extra-top-level-key", {"tenantz": []}, "tenantz", "unknown field"),
    ("extra-tenant-key", {"tenants": [tenant(wieght=2)]}, "tenants[0].wieght", "unknown field"),
    (
        "extra-nested-key",
        {"gpuSharing": {"maxPodsPerGPU": 4}},
        "gpuSharing.maxPodsPerGPU",
        "unknown field",
    ),
    (
        "extra-resource-key",
        {"resources": {"nvidia.com/gpu": {"w": 1}}},
        "resources.nvidia.com/gpu.w",
        "unknown field",
    ),
    # header
    ("wrong-api-version", {"apiVersion": "v1"}, "apiVersion", "must be 'fairshare.io/v1alpha1'"),
    ("wrong-kind", {"kind": "ConfigMap"}, "kind", "must be 'FairShareConfig'"),
    # field values
    (
        "bad-quantity",
        {"tenants": [tenant(guaranteed={"cpu": "1Kib"})]},
        "tenants[0].guaranteed.cpu",
        'invalid quantity "1Kib"',
    ),
    (
        "negative-quantity",
        {"tenants": [tenant(limit={"cpu": "-1"})]},
        "tenants[0].limit.cpu",
        'must be >= 0, got "-1"',
    ),
    ("bad-tenant-name", {"tenants": [{"name": "Team_A"}]}, "tenants[0].name", "DNS-1123 label"),
    ("missing-tenant-name", {"tenants": [{}]}, "tenants[0].name", "required field is missing"),
    (
        "bad-namespace",
        {"tenants": [tenant(namespaces=["ok", "Not OK"])]},
        "tenants[0].namespaces[1]",
        '"Not OK" must be a DNS-1123 label',
    ),
    (
        "empty-selector",
        {"tenants": [tenant(namespaceSelector={})]},
        "tenants[0].namespaceSelector",
        "must not be empty",
    ),
    (
        "bad-selector-key",
        {"tenants": [tenant(namespaceSelector={"bad key": "x"})]},
        "tenants[0].namespaceSelector.bad key",
        "is not a valid label key",
    ),
    (
        "bad-selector-value",
        {"tenants": [tenant(namespaceSelector={"team": "-x"})]},
        "tenants[0].namespaceSelector.team",
        "is not a valid label value",
    ),
    ("tenants-not-a-list", {"tenants": {"a": 1}}, "tenants", "must be a list"),
    (
        "resources-not-a-mapping",
        {"resources": ["cpu"]},
        "resources",
        "must be a mapping, got a list",
    ),
    (
        "resource-weight-negative",
        {"resources": {"nvidia.com/gpu": {"weight": -1}}},
        "resources.nvidia.com/gpu.weight",
        "must be >= 0",
    ),
    (
        "bad-default-mode",
        {"defaultTenant": {"mode": "deny"}},
        "defaultTenant.mode",
        "must be 'tenant', 'deny-gpu' or 'allow'",
    ),
    ("mig-zero", {"mig": {"1g.10gb": 0}}, "mig.1g.10gb", 'must be > 0 and <= 1, got "0"'),
    ("mig-above-one", {"mig": {"1g.10gb": "8/7"}}, "mig.1g.10gb", "must be > 0 and <= 1"),
    ("mig-bad-fraction", {"mig": {"1g.10gb": "1/0"}}, "mig.1g.10gb", "zero denominator"),
    (
        "mig-key-with-prefix",
        {"mig": {"nvidia.com/mig-1g.10gb": "1/7"}},
        "mig.nvidia.com/mig-1g.10gb",
        "must be a MIG profile",
    ),
    (
        "fraction-step-zero",
        {"gpuSharing": {"fractionStep": "0"}},
        "gpuSharing.fractionStep",
        "must be > 0 and <= 1",
    ),
    ("memory-unit-zero", {"gpuSharing": {"memoryUnit": 0}}, "gpuSharing.memoryUnit", "must be > 0"),
    (
        "max-pods-bool",
        {"gpuSharing": {"maxPodsPerGpu": True}},
        "gpuSharing.maxPodsPerGpu",
        "not a boolean",
    ),
    ("scheduler-name", {"schedulerName": "My Scheduler"}, "schedulerName", "DNS-1123 subdomain"),
    (
        "bad-taint",
        {"health": {"unhealthyTaints": ["a b"]}},
        "health.unhealthyTaints[0]",
        "is not a valid taint key",
    ),
    ("pricing-negative", {"pricing": {"cpu": -0.1}}, "pricing.resources.cpu", "must be >= 0"),
]


@pytest.mark.parametrize(
    ("fields", "path", "message"), [case[1:] for case in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_config(fields: dict[str, Any], path: str, message: str) -> None:
    errors = errors_of(doc(**fields))
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{path}: "), errors
    assert message in errors[0].removeprefix(f"{path}: ")


@pytest.mark.parametrize("missing", ["apiVersion", "kind"])
def test_document_must_name_its_schema(missing: str) -> None:
    document = {key: value for key, value in HEAD.items() if key != missing}
    assert errors_of(document) == [f'{missing}: required field is missing (use "{HEAD[missing]}")']


def test_code_may_omit_the_header() -> None:
    assert FairShareConfig().api_version == "fairshare.io/v1alpha1"
    assert FairShareConfig().kind == "FairShareConfig"


# --- resource names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "nvidia.com/gpu",
        "cpu",
        "memory",
        "ephemeral-storage",
        "storage",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.10gb+me",
        "hugepages-2Mi",
        "example.com/fpga",
        "amd.com/gpu",
    ],
)
def test_valid_resource_names(name: str) -> None:
    assert schema.validate_resource_name(name) is None


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("gpu", 'unknown resource "gpu" (did you mean "nvidia.com/gpu"?)'),
        ("cpux", 'unknown resource "cpux" (did you mean "cpu"?)'),
        ("", 'unknown resource ""'),
        ("nvidia.com/mig-", 'invalid MIG resource "nvidia.com/mig-"'),
        ("hugepages-x", 'invalid hugepages resource "hugepages-x"'),
        ("Example.com/fpga", 'invalid extended resource "Example.com/fpga"'),
        ("example.com/", 'invalid extended resource "example.com/"'),
    ],
)
def test_invalid_resource_names(name: str, problem: str) -> None:
    message = schema.validate_resource_name(name)
    assert message is not None
    assert message.startswith(problem)


# --- loading ----------------------------------------------------------------------------------


def test_yaml_syntax_error_has_line_number() -> None:
    text = "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n"
    text += "tenants:\n  - name: a\n weight: 2\n"  # line 5 is indented wrongly
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    [error] = info.value.errors
    assert error.path == "(root)"
    assert error.message.startswith("invalid YAML at line 5, column 2: ")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "(root): must be a mapping, got empty document"),
        ("- a\n- b\n", "(root): must be a mapping, got list"),
        ("just text", "(root): must be a mapping, got str"),
        ("42", "(root): must be a mapping, got int"),
        ("a: 1\n---\nb: 2\n", "(root): invalid YAML at line 2, column 1: expected a single"),
        ("kind: x\nkind: y\n", "(root): invalid YAML at line 2, column 1: duplicate key 'kind'"),
        ('{"kind": "x", "kind": "y"}', "(root): invalid JSON: duplicate key 'kind'"),
    ],
    ids=["empty", "list", "scalar", "number", "two-documents", "duplicate-key", "json-dup"],
)
def test_document_level_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert str(info.value).startswith(message)


def test_alias_bomb_refused() -> None:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]  # 10**7
    with pytest.raises(ConfigError, match="document too large"):
        parse_config("\n".join(lines))


def test_yaml_merge_keys_are_not_duplicates() -> None:
    text = "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n"
    text += "gpuSharing: {<<: {maxPodsPerGpu: 2, minFraction: '0.1'}, maxPodsPerGpu: 4}\n"
    config = parse_config(text)
    assert config.gpu_sharing.max_pods_per_gpu == 4
    assert config.gpu_sharing.min_fraction_amount() == F(1, 10)


def test_json_text() -> None:
    document = doc(tenants=[{"name": "a", "guaranteed": {"nvidia.com/gpu": 1e3}}])
    config = parse_config(json.dumps(document))
    assert config.tenants[0].guaranteed_amounts() == {"nvidia.com/gpu": F(1000)}


def test_load_config_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc(tenants=[{"name": "a"}])), encoding="utf-8")
    assert loading.load_config_file(path).tenant("a") is not None
    with pytest.raises(ConfigError, match=r"^\(root\): cannot read .*missing\.yaml"):
        loading.load_config_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("tenants", 2, "weight"), "tenants[2].weight"),
        (("tenants", 0, "guaranteed", "nvidia.com/gpu"), "tenants[0].guaranteed.nvidia.com/gpu"),
        (("resources", "gpu", "[key]"), "resources.gpu"),
        (("health", "unhealthyTaints", 1), "health.unhealthyTaints[1]"),
        ((), "(root)"),
    ],
)
def test_format_path(loc: tuple[int | str, ...], path: str) -> None:
    assert loading.format_path(loc) == path


# --- round trips ------------------------------------------------------------------------------


def test_default_config_round_trip() -> None:
    text = dump_default_config()
    assert text.startswith("# fairshare configuration")
    assert "\napiVersion: fairshare.io/v1alpha1\n" in text
    assert parse_config(text) == FairShareConfig()


def test_example_tenants_round_trip() -> None:
    config = parse_config(dump_default_config(example_tenants=True))
    assert [t.name for t in config.tenants] == ["team-a", "research"]
    team_a = config.tenant("team-a")
    assert team_a is not None
    assert team_a.limit_for("nvidia.com/gpu") == 16


def test_commented_example_matches_example_tenants() -> None:
    # The commented-out block in the default document is the example config, so uncommenting
    # it gives the same tenants (the docs cannot drift from what parses).
    lines = dump_default_config().splitlines()
    start = lines.index("# Example:", lines.index("tenants: []"))
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith("#"):
            break
        block.append(line.removeprefix("# "))
    tenants = yaml.safe_load("\n".join(block))["tenants"]
    assert config_from_mapping(doc(tenants=tenants)) == parse_config(
        dump_default_config(example_tenants=True)
    )


def test_model_dump_round_trip() -> None:
    config = config_from_mapping(
        doc(
            tenants=[
                {"name": "a", "namespaces": ["x"], "weight": 3, "limit": {"cpu": "10"}},
                {"name": "b", "namespaceSelector": {"team": "b"}, "guaranteed": {"memory": 1024}},
            ],
            defaultTenant={"mode": "deny-gpu"},
            pricing={"nvidia.com/gpu": 2.5},
            schedulerName="fairshare-scheduler",
            capacity={"cpu": "100"},
        )
    )
    dumped = config.model_dump(mode="json")
    assert dumped["defaultTenant"] == {"mode": "deny-gpu", "name": "default"}  # camelCase out
    assert config_from_mapping(dumped) == config
    assert parse_config(yaml.safe_dump(dumped)) == config


# --- the error type and immutability ----------------------------------------------------------


def test_config_error_renders_one_line_per_error() -> None:
    error = ConfigError([FieldError("a", "x"), FieldError("b[0].c", "y")])
    assert str(error) == "a: x\nb[0].c: y"
    copy = pickle.loads(pickle.dumps(error))
    assert copy.errors == error.errors
    assert str(copy) == str(error)


def test_models_are_frozen() -> None:
    config = FairShareConfig()
    with pytest.raises(ValidationError):
        config.tenants = ()  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Tenant(name="a", colour="blue")  # type: ignore[call-arg]


def test_snake_case_names_work_in_code() -> None:
    tenant = Tenant(name="a", namespace_selector={"team": "a"})
    assert tenant.namespace_selector == {"team": "a"}
    assert tenant.model_dump()["namespaceSelector"] == {"team": "a"}


def test_mig_fractions_are_each_configs_own_table_and_a_copy() -> None:
    default = FairShareConfig()
    own = config_from_mapping(doc(mig={"1g.12gb": "1/7"}))
    assert default.mig_fractions()["1g.10gb"] == F(1, 7)
    assert own.mig_fractions() == {"1g.12gb": F(1, 7)}
    swapped = own.model_copy(update={"mig": {"1g.12gb": "1/2"}})
    assert swapped.mig_fractions() == {"1g.12gb": F(1, 2)}
    own.mig_fractions().clear()  # the caller's copy
    assert own.mig_fractions() == {"1g.12gb": F(1, 7)}
