"""Tests of fairshare.metrics: isolation per registry, tenant series, chargeback arithmetic."""

from __future__ import annotations

import math

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from fairshare import metrics

ALL_NAMES = [
    "fairshare_admission_requests_total",
    "fairshare_admission_duration_seconds_bucket",
    "fairshare_extender_requests_total",
    "fairshare_extender_request_duration_seconds_bucket",
    "fairshare_unexpected_errors_total",
    "fairshare_config_reloads_total",
    "fairshare_config_reload_errors_total",
    "fairshare_tls_reloads_total",
    "fairshare_tls_reload_errors_total",
    "fairshare_tls_handshakes_total",
    "fairshare_tls_cert_expiry_timestamp_seconds",
    "fairshare_tenant_usage",
    "fairshare_tenant_limit",
    "fairshare_tenant_reserved",
    "fairshare_tenant_dominant_share",
    "fairshare_tenant_fair_share",
    "fairshare_tenant_gated_pods",
    "fairshare_cluster_gpu_allocation_ratio",
    "fairshare_cluster_gpu_fragmentation_ratio",
    "fairshare_tenant_resource_seconds_total",
    "fairshare_tenant_cost_total",
    "fairshare_native_info",
    "fairshare_build_info",
]


@pytest.fixture
def m() -> metrics.Metrics:
    return metrics.Metrics(CollectorRegistry())


def value(m: metrics.Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def populate(m: metrics.Metrics) -> None:
    """Touch every metric once, so each has at least one sample."""
    m.observe_admission("CREATE", "denied", "over-limit", 0.002)
    m.observe_extender("filter", "ok", 0.0004)
    m.count_unexpected_error("webhook")
    m.observe_config_reload(ok=True)
    m.observe_config_reload(ok=False)
    m.observe_tls_reload(ok=True)
    m.observe_tls_reload(ok=False)
    m.set_tls_cert_expiry(1_800_000_000)
    m.set_tenant_figures(
        "prod",
        usage={"nvidia.com/gpu": 3},
        limit={"nvidia.com/gpu": 8},
        reserved={"nvidia.com/gpu": 1},
        dominant_share=0.25,
        fair_share=0.5,
    )
    m.set_gated_pods("prod", 2)
    m.set_cluster_figures(gpu_allocation_ratio=0.75, gpu_fragmentation_ratio=0.1)
    m.accrue_chargeback({"prod": {"nvidia.com/gpu": 3}}, 10, {"nvidia.com/gpu": 1.0})
    m.set_native_info("py")
    m.set_build_info("0.1.0")


# --------------------------------------------------------------------------- isolation


def test_two_registries_do_not_collide() -> None:
    first, second = metrics.Metrics(CollectorRegistry()), metrics.Metrics(CollectorRegistry())
    first.observe_admission("CREATE", "allowed", "", 0.001)
    first.observe_admission("CREATE", "allowed", "", 0.001)
    second.observe_admission("CREATE", "allowed", "", 0.001)
    labels = {"operation": "CREATE", "decision": "allowed", "reason": ""}
    assert value(first, "fairshare_admission_requests_total", **labels) == 2
    assert value(second, "fairshare_admission_requests_total", **labels) == 1


def test_default_registry_untouched() -> None:
    populate(metrics.Metrics(CollectorRegistry()))
    assert REGISTRY.get_sample_value("fairshare_config_reloads_total") is None
    assert not any(family.name.startswith("fairshare_") for family in REGISTRY.collect())


def test_one_metrics_per_registry() -> None:
    registry = CollectorRegistry()
    metrics.Metrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        metrics.Metrics(registry)


# --------------------------------------------------------------------------- requests


def test_admission_counter_and_latency_buckets(m: metrics.Metrics) -> None:
    m.observe_admission("CREATE", "denied", "over-limit", 0.0007)
    labels = {"operation": "CREATE", "decision": "denied", "reason": "over-limit"}
    assert value(m, "fairshare_admission_requests_total", **labels) == 1
    bucket = "fairshare_admission_duration_seconds_bucket"
    # 0.7 ms: above the 0.5 ms bound, inside the 1 ms one.
    assert value(m, bucket, operation="CREATE", le="0.0005") == 0
    assert value(m, bucket, operation="CREATE", le="0.001") == 1
    assert value(m, "fairshare_admission_duration_seconds_sum", operation="CREATE") == 0.0007
    assert max(metrics.ADMISSION_BUCKETS[:-2]) <= 0.1
    assert sum(1 for b in metrics.ADMISSION_BUCKETS if b <= 0.01) >= 6  # resolution below 10 ms


def test_extender_counter_and_latency(m: metrics.Metrics) -> None:
    m.observe_extender("prioritize", "ok", 0.003)
    m.observe_extender("prioritize", "error", 0.0001)
    assert value(m, "fairshare_extender_requests_total", verb="prioritize", outcome="ok") == 1
    assert value(m, "fairshare_extender_requests_total", verb="prioritize", outcome="error") == 1
    assert value(m, "fairshare_extender_request_duration_seconds_count", verb="prioritize") == 2


def test_reload_counters(m: metrics.Metrics) -> None:
    m.observe_config_reload(ok=True)
    m.observe_config_reload(ok=False)
    m.observe_config_reload(ok=False)
    m.observe_tls_reload(ok=True)
    assert value(m, "fairshare_config_reloads_total") == 1
    assert value(m, "fairshare_config_reload_errors_total") == 2
    assert value(m, "fairshare_tls_reloads_total") == 1
    assert value(m, "fairshare_tls_reload_errors_total") == 0


# --------------------------------------------------------------------------- tenants


def test_tenant_figures_set_and_replaced(m: metrics.Metrics) -> None:
    m.set_tenant_figures(
        "research",
        usage={"cpu": 12.5, "nvidia.com/gpu": 4},
        limit={"nvidia.com/gpu": 8},
        reserved={"nvidia.com/gpu": 1},
        dominant_share=0.41,
        fair_share=0.33,
    )
    assert value(m, "fairshare_tenant_usage", tenant="research", resource="cpu") == 12.5
    assert value(m, "fairshare_tenant_limit", tenant="research", resource="nvidia.com/gpu") == 8
    assert value(m, "fairshare_tenant_reserved", tenant="research", resource="nvidia.com/gpu") == 1
    assert value(m, "fairshare_tenant_dominant_share", tenant="research") == 0.41
    assert value(m, "fairshare_tenant_fair_share", tenant="research") == 0.33

    # A new usage mapping replaces the old: cpu is gone; other figures are left alone.
    m.set_tenant_figures("research", usage={"nvidia.com/gpu": 5})
    assert value(m, "fairshare_tenant_usage", tenant="research", resource="cpu") is None
    assert value(m, "fairshare_tenant_usage", tenant="research", resource="nvidia.com/gpu") == 5
    assert value(m, "fairshare_tenant_limit", tenant="research", resource="nvidia.com/gpu") == 8
    assert value(m, "fairshare_tenant_dominant_share", tenant="research") == 0.41


def test_infinite_share_is_exported(m: metrics.Metrics) -> None:
    # A zero-weight tenant that borrows has dominant share +Inf (kueue's convention).
    m.set_tenant_figures("batch", dominant_share=math.inf)
    assert value(m, "fairshare_tenant_dominant_share", tenant="batch") == math.inf
    assert b'fairshare_tenant_dominant_share{tenant="batch"} +Inf' in m.render()[0]


def test_retain_tenants_drops_removed_tenants(m: metrics.Metrics) -> None:
    for tenant in ("prod", "research"):
        m.set_tenant_figures(tenant, usage={"cpu": 1}, limit={"cpu": 2}, dominant_share=0.1)
        m.set_gated_pods(tenant, 3)
    m.accrue_chargeback({"research": {"cpu": 1}}, 60, None)
    m.retain_tenants(["prod"])
    for name in ("fairshare_tenant_dominant_share", "fairshare_tenant_gated_pods"):
        assert value(m, name, tenant="research") is None
        assert value(m, name, tenant="prod") is not None
    assert value(m, "fairshare_tenant_usage", tenant="research", resource="cpu") is None
    assert value(m, "fairshare_tenant_limit", tenant="prod", resource="cpu") == 2
    # Chargeback is cumulative and survives.
    assert value(m, "fairshare_tenant_resource_seconds_total", tenant="research", resource="cpu")


def test_cluster_figures(m: metrics.Metrics) -> None:
    m.set_cluster_figures(gpu_allocation_ratio=0.8, gpu_fragmentation_ratio=0.05)
    assert value(m, "fairshare_cluster_gpu_allocation_ratio") == 0.8
    assert value(m, "fairshare_cluster_gpu_fragmentation_ratio") == 0.05


# --------------------------------------------------------------------------- chargeback

PRICING = {"nvidia.com/gpu": 2.40, "cpu": 0.04}  # per resource-hour
USAGE = {
    "prod": {"nvidia.com/gpu": 2, "cpu": 8, "memory": 64e9},
    "research": {"nvidia.com/gpu": 0.5},  # a half-GPU pod
}


def test_chargeback_arithmetic(m: metrics.Metrics) -> None:
    m.accrue_chargeback(USAGE, 90, PRICING)
    rs = "fairshare_tenant_resource_seconds_total"
    # resource-seconds = amount × seconds
    assert value(m, rs, tenant="prod", resource="nvidia.com/gpu") == 180  # 2 × 90
    assert value(m, rs, tenant="prod", resource="cpu") == 720  # 8 × 90
    assert value(m, rs, tenant="prod", resource="memory") == 5.76e12  # 64e9 × 90
    assert value(m, rs, tenant="research", resource="nvidia.com/gpu") == 45  # 0.5 × 90
    # cost = Σ amount × price/h × seconds/3600; memory is unpriced and costs nothing.
    # prod:     (2 × 2.40 + 8 × 0.04) × 90/3600 = 5.12 × 0.025 = 0.128
    # research: 0.5 × 2.40 × 0.025 = 0.03
    cost = "fairshare_tenant_cost_total"
    assert value(m, cost, tenant="prod") == pytest.approx(0.128, rel=1e-12)
    assert value(m, cost, tenant="research") == pytest.approx(0.03, rel=1e-12)

    m.accrue_chargeback(USAGE, 30, PRICING)
    # second tick: prod GPU 180 + 2 × 30 = 240; cost 0.128 + 5.12 × 30/3600 = 0.1706666...
    assert value(m, rs, tenant="prod", resource="nvidia.com/gpu") == 240
    assert value(m, cost, tenant="prod") == pytest.approx(0.128 + 5.12 / 120, rel=1e-12)


def test_chargeback_without_pricing_has_no_cost(m: metrics.Metrics) -> None:
    m.accrue_chargeback(USAGE, 60, None)
    assert value(m, "fairshare_tenant_resource_seconds_total", tenant="prod", resource="cpu") == 480
    assert value(m, "fairshare_tenant_cost_total", tenant="prod") is None


@pytest.mark.parametrize(
    ("usage", "seconds", "pricing"),
    [
        ({"prod": {"cpu": 1}}, -1.0, None),
        ({"prod": {"cpu": 1}}, math.nan, None),
        ({"prod": {"cpu": 1, "nvidia.com/gpu": -2}}, 10.0, None),
        ({"prod": {"cpu": 1}}, 10.0, {"cpu": math.inf}),
    ],
    ids=["negative-seconds", "nan-seconds", "negative-amount", "infinite-price"],
)
def test_chargeback_rejects_bad_input_before_counting(
    m: metrics.Metrics,
    usage: dict[str, dict[str, float]],
    seconds: float,
    pricing: dict[str, float] | None,
) -> None:
    with pytest.raises(ValueError, match="finite and >= 0"):
        m.accrue_chargeback(usage, seconds, pricing)
    assert (
        value(m, "fairshare_tenant_resource_seconds_total", tenant="prod", resource="cpu") is None
    )


# --------------------------------------------------------------------------- exposition


def test_exposition_contains_every_name(m: metrics.Metrics) -> None:
    populate(m)
    body, content_type = metrics.render(m.registry)
    assert content_type.startswith("text/plain; version=")
    text = body.decode()
    for name in ALL_NAMES:
        assert f"\n{name}" in text, name
    assert 'fairshare_native_info{impl="py"} 1.0' in text
    assert 'fairshare_build_info{version="0.1.0"} 1.0' in text
    assert "# TYPE fairshare_tenant_cost_total counter" in text


def test_openmetrics_when_asked(m: metrics.Metrics) -> None:
    populate(m)
    body, content_type = m.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    assert m.render()[1] == metrics.render(m.registry)[1]
