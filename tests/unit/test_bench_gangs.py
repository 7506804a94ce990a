"""The gang verbs benchmark runs end to end on a small cluster (figures not asserted)."""

from __future__ import annotations

from tests.bench import bench_gangs


def test_a_small_run_plans_binds_and_reports_every_call():
    data = bench_gangs.run_bench(nodes=40, size=8, rounds=2)
    assert data["members"] == 8 and data["rounds"] == 2
    assert data["pods"] == 40 * 4  # the members were deleted after each round
    for part in ("plan_filter", "later_filter", "completing_bind", "lookup", "plan_gang"):
        assert set(data[part]) == {"p50", "p99", "max"}
        assert 0 < data[part]["p50"] <= data[part]["max"]
    table = bench_gangs.markdown(data)
    assert "| filter of the first member (plans the group) |" in table
    assert "40 nodes × 8 GPUs" in table
