"""``fairshare status`` with ``usageHistory`` on: the recorded history (the extender
leader's ConfigMap) judged as a new leader would, weights adjusted, figures shown."""

from __future__ import annotations

from fairshare import history, report
from fairshare.config.loading import config_from_mapping

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "usageHistory": {"halfLife": "1h"},
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
)
NAMES = CONFIG.resource_names()


def recorded(at: float) -> dict[str, object]:
    """a held all of 8 GPUs for a long while, b nothing."""
    h = history.History(half_life=3600.0, resources=NAMES)
    gpu = [8000.0 if n == "nvidia.com/gpu" else 0.0 for n in NAMES]
    h.advance(at - 8 * 3600.0, {}, gpu)
    h.advance(at, {"a": gpu}, gpu)
    return h.to_dict()


def demand() -> dict[str, list[float]]:
    row = [4000.0 if n == "nvidia.com/gpu" else 0.0 for n in NAMES]
    return {"a": list(row), "b": list(row)}


def test_a_tenant_with_past_usage_gets_a_lower_weight() -> None:
    t0 = 1_800_000_000.0
    config, assessed = history.judge_recorded(CONFIG, recorded(t0), now=t0, demand=demand())
    a = config.tenant("a")
    assert a is not None and a.weight < 1.0
    assert assessed["a"].usage_share > assessed["a"].weighted_share == 0.5
    assert assessed["b"].factor == 1.0
    # Read later, the gap adds no usage and decays usage and capacity alike (what was
    # used then is not known): the shares, and so the weights, are those recorded, as a
    # new leader starts from them.
    later, _ = history.judge_recorded(CONFIG, recorded(t0), now=t0 + 36_000, demand=demand())
    later_a = later.tenant("a")
    assert later_a is not None and later_a.weight == a.weight


def test_off_means_the_config_as_is() -> None:
    off = CONFIG.model_copy(update={"usage_history": None})
    t0 = 1_800_000_000.0
    assert history.judge_recorded(off, recorded(t0), now=t0, demand=demand()) == (off, {})


def test_status_rows_and_text() -> None:
    t0 = 1_800_000_000.0
    _, assessed = history.judge_recorded(CONFIG, recorded(t0), now=t0, demand=demand())
    rows = report.history_rows(assessed)
    assert [r["tenant"] for r in rows] == ["a", "b"]
    assert rows[0]["weightFactor"] < 1.0 == rows[1]["weightFactor"]
    status = {
        "tenants": [],
        "cluster": {
            "nodes": 0, "gpus": 0, "gpusAllocated": 0, "gpuAllocationRatio": 0.0,
            "gpuFragmentation": 0, "gpuFragmentationRatio": 0.0,
        },
        "heldPods": [],
        "pendingPods": [],
        "usageHistory": rows,
    }  # fmt: skip
    text = report.render_status_text(status)
    assert "USAGE HISTORY" in text and "WEIGHT-FACTOR" in text
    assert f"{rows[0]['weightFactor']:.2f}" in text
