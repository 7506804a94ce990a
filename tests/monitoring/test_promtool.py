"""The PrometheusRule's alerts, checked and unit-tested by promtool.

`promtool check rules` parses every group (PromQL syntax, `for`, labels, templates) and
`promtool test rules` runs `alerts_test.yaml`: for each alert a synthetic series that
must fire it (with its labels and rendered annotations) and one that must leave it quiet.
The dashboard's queries are checked by promtool too, as recording rules of a throwaway
group (Grafana's variables replaced by values).

promtool is built from the Prometheus Go module by tools/promtool/build.sh (cached; `make
test` builds it first). Without Go the tests skip saying why, except under CI, where
they fail.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gotools import built_tool

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RULES = ROOT / "manifests" / "monitoring" / "prometheusrule.yaml"
DASHBOARD = ROOT / "manifests" / "monitoring" / "fairshare-dashboard.json"
BUILD = ROOT / "tools" / "promtool" / "build.sh"
ALERT_TESTS = HERE / "alerts_test.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    return built_tool("promtool")


def rule_groups() -> dict[str, Any]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {"groups": doc["spec"]["groups"]}


def run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def test_promtool_checks_the_rules(promtool: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    out = run(promtool, "check", "rules", str(rules), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = [r["alert"] for g in rule_groups()["groups"] for r in g["rules"]]
    assert f"SUCCESS: {len(alerts)} rules found" in out.stdout


def test_every_alert_fires_and_stays_quiet_in_the_unit_tests(promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    tests = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))
    tests["rule_files"] = ["rules.yaml"]
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    # Each alert has a case that fires it and one that must leave it quiet.
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"]}
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert fired == alerts, f"alerts without a firing case: {sorted(alerts - fired)}"
    assert quiet == alerts, f"alerts without a quiet case: {sorted(alerts - quiet)}"
    out = run(promtool, "test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_expectation_fails(promtool: str, tmp_path: Path) -> None:
    """The unit tests can fail: the starved tenant's alert expected quiet is an error."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    tests = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))
    tests["rule_files"] = ["rules.yaml"]
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            if check["alertname"] == "FairshareTenantStarved" and check.get("exp_alerts"):
                check["exp_alerts"] = []
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    out = run(promtool, "test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert out.returncode != 0
    assert "FairshareTenantStarved" in out.stdout + out.stderr


# Grafana's variables in the dashboard's queries, and values promtool can parse.
GRAFANA_VARIABLES = {
    r"\$__rate_interval": "5m",
    r"\$__interval": "1m",
    r"\$__range": "1h",
    r"\$\{?(\w+)\}?": ".*",
}


def dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((str(panel.get("title")), str(target["expr"])))
            walk(panel.get("panels", []))

    walk(doc.get("panels", []))
    return out


def test_promtool_parses_the_dashboard_queries(promtool: str, tmp_path: Path) -> None:
    queries = dashboard_queries()
    assert queries
    rules = []
    for i, (_title, expr) in enumerate(queries):
        for pattern, value in GRAFANA_VARIABLES.items():
            expr = re.sub(pattern, value, expr)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run(promtool, "check", "rules", str(path), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
