"""The config ConfigMap guard: every problem reported with its field path."""

from __future__ import annotations

from typing import Any

import pytest

from fairshare.errors import FieldError
from webhook.policies import config_guard
from webhook.policies.config_guard import ConfigMapRef, InvalidConfig

REF = ConfigMapRef("fairshare-system", "fairshare-config")
HEAD = "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n"


def cm(data: Any) -> dict[str, Any]:
    return {"metadata": {"name": "fairshare-config", "namespace": "fairshare-system"}, "data": data}


@pytest.mark.parametrize(
    ("obj", "errors"),
    [
        (cm({"config.yaml": HEAD}), None),
        (
            cm({"config.yaml": HEAD + "tenants:\n- name: a\n  weight: 0\n"}),
            [("tenants[0].weight", "must be > 0")],
        ),
        (
            cm({"config.yaml": HEAD + "tenants:\n- name: a\n  weight: -1\n- name: B\n"}),
            [
                ("tenants[0].weight", "must be > 0"),
                ("tenants[1].name", '"B" must be a DNS-1123 label (a-z 0-9 -)'),
            ],
        ),
        (cm({"config.yaml": "tenants: [\n"}), [("(root)", None)]),
        (cm({"config.yaml": "kind: FairShareConfig\n"}), [("apiVersion", None)]),
        (cm({"other.yaml": HEAD}), [("data.config.yaml", "is missing")]),
        (cm(None), [("data.config.yaml", "is missing")]),
        (cm({"config.yaml": 7}), [("data.config.yaml", "must be a string")]),
        (cm([]), [("data.config.yaml", "is missing")]),
    ],
    ids=[
        "valid", "bad-weight", "two-problems", "bad-yaml", "no-api-version", "key-missing",
        "no-data", "not-a-string", "data-not-a-map",
    ],
)  # fmt: skip
def test_check_config_map(obj: dict[str, Any], errors: list[tuple[str, str | None]] | None) -> None:
    got = config_guard.check_config_map(obj, ref=REF)
    if errors is None:
        assert got is None
        return
    assert got is not None and got.ref == REF
    assert [e.path for e in got.errors] == [path for path, _ in errors]
    for error, (_, message) in zip(got.errors, errors, strict=True):
        if message is not None:
            assert error.message == message


def test_render_invalid_lists_every_path() -> None:
    invalid = InvalidConfig(
        REF, (FieldError("tenants[0].weight", "must be > 0"), FieldError("resources", "x"))
    )
    assert config_guard.render_invalid(invalid) == (
        "ConfigMap fairshare-system/fairshare-config key config.yaml is not a valid "
        "FairShareConfig: tenants[0].weight: must be > 0; resources: x"
    )


def test_ref_matches_namespace_and_name() -> None:
    assert REF.matches("fairshare-system", "fairshare-config")
    assert not REF.matches("default", "fairshare-config")
    assert str(REF) == "fairshare-system/fairshare-config"
