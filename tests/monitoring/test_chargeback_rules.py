"""The chargeback recording rules (manifests/monitoring/chargeback-rules.yaml), checked and
unit-tested by promtool: shares of shared GPUs times the node's price per tenant, OpenCost's
``node_gpu_hourly_cost`` winning over the config's price, the attributed idle, DCGM use
beside allocation and cost per million vLLM tokens (chargeback_rules_test.yaml)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gotools import built_tool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests" / "monitoring" / "chargeback-rules.yaml"
TESTS = Path(__file__).resolve().parent / "chargeback_rules_test.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    return built_tool("promtool")


def groups() -> dict[str, Any]:
    return {"groups": yaml.safe_load(RULES.read_text(encoding="utf-8"))["spec"]["groups"]}


def promtool_test(promtool: str, tmp_path: Path, rules: dict[str, Any]) -> str:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (tmp_path / "t.yaml").write_text(TESTS.read_text(encoding="utf-8"))
    out = subprocess.run(
        [promtool, "test", "rules", "t.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    return ("ok " if out.returncode == 0 else "failed ") + out.stdout + out.stderr


def test_promtool_checks_the_chargeback_rules(promtool: str, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(groups(), sort_keys=False))
    out = subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    n = sum(len(g["rules"]) for g in groups()["groups"])
    assert f"SUCCESS: {n} rules found" in out.stdout


def test_chargeback_rules_give_the_expected_per_tenant_cost(promtool: str, tmp_path: Path) -> None:
    out = promtool_test(promtool, tmp_path, groups())
    assert out.startswith("ok "), out


def test_config_price_winning_over_opencost_fails_the_tests(promtool: str, tmp_path: Path) -> None:
    """The tests can fail: with the config's price first, n1 bills 2, not OpenCost's 3."""
    rules = groups()
    for g in rules["groups"]:
        for r in g["rules"]:
            if r.get("record") == "node:fairshare_gpu_hourly_price:effective":
                r["expr"] = (
                    "max by (node) (fairshare_node_gpu_hourly_price) or "
                    "max by (node) (node_gpu_hourly_cost)"
                )
    out = promtool_test(promtool, tmp_path, rules)
    assert out.startswith("failed "), out
    assert "node:fairshare_gpu_hourly_price:effective" in out
