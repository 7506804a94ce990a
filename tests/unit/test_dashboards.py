"""The monitoring manifests (manifests/monitoring/) against the metrics fairshare exports.

Every PromQL expression in the Grafana dashboard and the PrometheusRule may only name
metrics that `fairshare.metrics.Metrics` registers, with the series suffixes Prometheus
exposes (counters `_total`, histograms `_bucket`/`_sum`/`_count`, info metrics `_info`),
and label matchers may only use those metrics' labels. The dashboard must parse, every
panel has a title, a description and queries, and the panels the operator needs are there.

The PromQL check is a small tokenizer, not a full parser: strings, label matchers, label
lists (`by (...)`, `on (...)`...) and range selectors are removed, and every identifier
left that is not a keyword or a function call must be an exported series name.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from fairshare.metrics import Metrics
from tests.gotools import e2e_kubectl

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
DASHBOARD = MONITORING / "fairshare-dashboard.json"
RULES = MONITORING / "prometheusrule.yaml"

# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2",
}  # fmt: skip
FUNCTIONS = {
    # aggregations
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group",
    # functions
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "delta", "deriv", "exp", "floor", "histogram_quantile", "idelta", "increase", "irate",
    "label_replace", "label_join", "ln", "log2", "log10", "predict_linear", "rate", "resets",
    "round", "scalar", "sort", "sort_desc", "sqrt", "time", "timestamp", "vector",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "quantile_over_time", "last_over_time", "present_over_time", "day_of_month",
    "day_of_week", "days_in_month", "hour", "minute", "month", "year",
}  # fmt: skip

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_IDENT = re.compile(r"(?<![\w.$])[A-Za-z_:][\w:]*")
_LABEL_NAME = re.compile(r"\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)")


# --------------------------------------------------------------------------------------------
# What fairshare/metrics.py exports


@cache
def exported() -> dict[str, frozenset[str]]:
    """Series name -> its label names, for every metric `Metrics` registers."""
    metrics = Metrics(CollectorRegistry())
    series: dict[str, frozenset[str]] = {}
    for family in metrics.registry.collect():
        labels = _labels_of(metrics, family.name)
        if family.type == "counter":
            names = {f"{family.name}_total": labels, f"{family.name}_created": labels}
        elif family.type == "histogram":
            names = {f"{family.name}_{s}": labels for s in ("sum", "count", "created")}
            names[f"{family.name}_bucket"] = labels | {"le"}
        elif family.type == "info":
            names = {f"{family.name}_info": labels | {"impl", "version"}}
        else:
            names = {family.name: labels}
        series.update(names)
    return series


def _labels_of(metrics: Metrics, family: str) -> frozenset[str]:
    for value in vars(metrics).values():
        name = getattr(value, "_name", None)
        if name is not None and name.removesuffix("_total") == family:
            return frozenset(value._labelnames)
    raise AssertionError(f"no collector attribute for family {family}")


def test_exported_names_look_like_the_module_says() -> None:
    names = exported()
    assert "fairshare_tenant_cost_total" in names
    assert names["fairshare_tenant_cost_total"] == {"tenant"}
    assert "fairshare_admission_duration_seconds_bucket" in names
    assert names["fairshare_extender_request_duration_seconds_bucket"] == {"verb", "le"}
    assert "fairshare_tenant_dominant_share" in names
    assert "fairshare_admission_requests" not in names  # counters only expose _total


# --------------------------------------------------------------------------------------------
# A PromQL tokenizer


def metric_references(expr: str) -> tuple[set[str], list[tuple[str, set[str]]]]:
    """(series names referenced, [(series name, label names in its matcher)])."""
    text = re.sub(r"\$\{\w+(?::\w+)?\}|\$\w+", "VAR", expr)  # Grafana variables
    text = _STRING.sub('""', text)
    matchers: list[tuple[str, set[str]]] = []
    for match in _MATCHERS.finditer(text):
        if match.group(1):
            labels = {m.group(1) for m in _LABEL_NAME.finditer(match.group(2))}
            matchers.append((match.group(1), labels))
        elif match.group(2).strip():
            raise AssertionError(f"selector without a metric name in {expr!r}")
    text = _MATCHERS.sub(lambda m: m.group(1) or "", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _RANGE.sub(" ", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        after = text[match.end() :].lstrip()
        if word in KEYWORDS or word == "VAR":
            continue
        if after.startswith("("):
            assert word in FUNCTIONS, f"unknown PromQL function {word!r} in {expr!r}"
            continue
        names.add(word)
    return names, matchers


def check_expression(expr: str, where: str) -> set[str]:
    assert expr.count("(") == expr.count(")"), f"{where}: unbalanced parentheses: {expr}"
    names, matchers = metric_references(expr)
    unknown = sorted(names - exported().keys())
    assert not unknown, f"{where}: {unknown} are not exported by fairshare/metrics.py: {expr}"
    for name, labels in matchers:
        bad = sorted(labels - exported()[name] - TARGET_LABELS)
        assert not bad, f"{where}: {name} has no label(s) {bad}: {expr}"
    assert names, f"{where}: references no fairshare metric: {expr}"
    return names


def test_tokenizer_finds_metrics_and_ignores_the_rest() -> None:
    names, matchers = metric_references(
        'histogram_quantile(0.99, sum by (le, verb) (rate(foo_bucket{verb=~"a|b"}[5m])))'
        " > 2 * on (verb) group_left bar and baz offset 5m - time() / 86400"
    )
    assert names == {"foo_bucket", "bar", "baz"}
    assert matchers == [("foo_bucket", {"verb"})]
    assert metric_references('x{tenant=~"$tenant"}[$__range]')[0] == {"x"}
    with pytest.raises(AssertionError, match="unknown PromQL function"):
        metric_references("frobnicate(x)")


def test_tokenizer_rejects_what_metrics_py_does_not_export() -> None:
    with pytest.raises(AssertionError, match="not exported"):
        check_expression("rate(fairshare_admission_requests[5m])", "t")
    with pytest.raises(AssertionError, match="has no label"):
        check_expression('fairshare_tenant_gated_pods{resource="cpu"}', "t")
    with pytest.raises(AssertionError, match="not exported"):
        check_expression("fairshare_tenant_cost", "t")


# --------------------------------------------------------------------------------------------
# The dashboard


@cache
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_expressions() -> Iterator[tuple[str, str]]:
    for panel in panels():
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target.get('refId')}", target["expr"]


def test_dashboard_is_valid_json_with_a_stable_uid() -> None:
    data = dashboard()
    assert data["uid"] == "fairshare-overview"
    assert data["title"]
    assert isinstance(data["schemaVersion"], int)
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


def test_every_panel_has_a_title_description_and_queries() -> None:
    ids: list[int] = []
    for panel in panels():
        assert panel.get("title", "").strip(), f"untitled panel: {panel}"
        ids.append(panel["id"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel.get("description", "").strip(), f"{panel['title']}: no description"
        assert panel["targets"], f"{panel['title']}: no queries"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["refId"], panel["title"]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_dashboard_queries_use_only_exported_metrics() -> None:
    used: set[str] = set()
    for where, expr in dashboard_expressions():
        used |= check_expression(expr, where)
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["definition"])
        assert match, variable["definition"]
        assert match.group(2) in exported()[match.group(1)]
    # What the operator needs to see (issue 6).
    required = {
        "fairshare_tenant_dominant_share",
        "fairshare_tenant_fair_share",
        "fairshare_tenant_usage",
        "fairshare_tenant_limit",
        "fairshare_tenant_reserved",
        "fairshare_tenant_gated_pods",
        "fairshare_cluster_gpu_allocation_ratio",
        "fairshare_cluster_gpu_fragmentation_ratio",
        "fairshare_admission_duration_seconds_bucket",
        "fairshare_extender_request_duration_seconds_bucket",
        "fairshare_admission_requests_total",
        "fairshare_tenant_cost_total",
        "fairshare_config_reload_errors_total",
    }
    assert required <= used, f"not on the dashboard: {sorted(required - used)}"


def test_latency_panels_show_p50_and_p99() -> None:
    for metric in ("admission_duration_seconds", "extender_request_duration_seconds"):
        exprs = [e for _, e in dashboard_expressions() if f"fairshare_{metric}_bucket" in e]
        quantiles = {q for e in exprs for q in re.findall(r"histogram_quantile\(([\d.]+)", e)}
        assert quantiles == {"0.5", "0.99"}, metric


def test_admission_decisions_are_broken_down_by_reason() -> None:
    exprs = [e for _, e in dashboard_expressions() if "fairshare_admission_requests_total" in e]
    assert any(re.search(r"by \([^)]*\breason\b", e) for e in exprs)


# --------------------------------------------------------------------------------------------
# The alerts


@cache
def rule_document() -> dict[str, Any]:
    data = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def alerts() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for group in rule_document()["spec"]["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] not in found, f"duplicate alert {rule['alert']}"
            found[rule["alert"]] = rule
    return found


def test_prometheus_rule_shape() -> None:
    doc = rule_document()
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == "PrometheusRule"
    for name, rule in alerts().items():
        assert re.fullmatch(r"Fairshare[A-Z]\w+", name), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        assert rule["annotations"]["summary"].strip(), name
        assert rule["annotations"]["description"].strip(), name


def test_alert_expressions_use_only_exported_metrics() -> None:
    for name, rule in alerts().items():
        check_expression(rule["expr"], f"alert {name}")


def test_required_alerts_exist() -> None:
    rules = alerts()
    expected = {
        "FairshareWebhookUnexpectedErrors": "fairshare_unexpected_errors_total",
        "FairshareAdmissionDenialsSpike": "fairshare_admission_requests_total",
        "FairshareExtenderLatencyHigh": "fairshare_extender_request_duration_seconds_bucket",
        "FairshareConfigReloadErrors": "fairshare_config_reload_errors_total",
        "FairshareTenantStarved": "fairshare_tenant_gated_pods",
        "FairshareTLSCertExpiringSoon": "fairshare_tls_cert_expiry_timestamp_seconds",
        "FairshareExtenderNoSingleLeader": "fairshare_extender_leader",
        "FairshareGpuHandoffProblems": "fairshare_gpu_handoff_problems_total",
        "FairshareQuarantineBreakerOpen": "fairshare_quarantine_breaker_open",
    }
    for alert, metric in expected.items():
        assert alert in rules, f"missing alert {alert}"
        assert metric in metric_references(rules[alert]["expr"])[0], alert
    starved = rules["FairshareTenantStarved"]
    assert starved["for"] == "15m"
    assert {"fairshare_tenant_dominant_share", "fairshare_tenant_fair_share"} <= (
        metric_references(starved["expr"])[0]
    )
    assert "histogram_quantile(0.99" in rules["FairshareExtenderLatencyHigh"]["expr"]


# --------------------------------------------------------------------------------------------
# The kustomization


def test_kustomization_ships_everything_in_the_folder() -> None:
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    named = set(kustomization["resources"])
    for generator in kustomization.get("configMapGenerator", []):
        named |= {entry.split("=")[-1] for entry in generator["files"]}
    present = {p.name for p in MONITORING.iterdir() if p.name != "kustomization.yaml"}
    assert named == present


def test_kustomize_renders_the_dashboard_config_map() -> None:
    proc = subprocess.run(
        [str(e2e_kubectl()), "kustomize", str(MONITORING)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    # The extender as pods: its Service selects the leader's pod only.
    # Two rule sets: the alerts and the chargeback recording rules.
    assert kinds == [
        "ConfigMap",
        "PodMonitor",
        "PrometheusRule",
        "PrometheusRule",
        "ServiceMonitor",
    ]
    rules = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "PrometheusRule")
    assert len(set(rules)) == 2, rules
    (pods,) = (d for d in docs if d["kind"] == "PodMonitor")
    assert pods["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "extender"
    assert "fairshare.io/extender-leader" not in pods["spec"]["selector"]["matchLabels"]
    (config_map,) = (d for d in docs if d["kind"] == "ConfigMap")
    assert config_map["metadata"]["namespace"] == "fairshare-system"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["fairshare-dashboard.json"]) == dashboard()
