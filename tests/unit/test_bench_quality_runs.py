"""bench-quality's --runs-dir: finished runs kept one file each, reused by a later run."""

from __future__ import annotations

from pathlib import Path

from tests.bench import bench_quality as bq


def test_runs_are_kept_and_found_by_what_they_depend_on(tmp_path: Path) -> None:
    alloc = ("allocation", "/trace", "default", 42, "fgd")
    fair = ("fairness", "/trace", "default", 42, "ours", (1.0, 1.0, 2.0, 4.0), 2.0)
    fair = (*fair, False, 0.0, "equal", "fifo")
    assert bq.load_saved_run(tmp_path, alloc) is None
    assert bq.load_saved_run(None, alloc) is None
    run = {"kind": "allocation", "pods": "default", "policy": "fgd", "seed": 42, "curve": {}}
    bq.save_run(tmp_path / "runs", alloc, run)
    assert bq.load_saved_run(tmp_path / "runs", alloc) == run
    # Another seed, policy, or saturation setting is another run.
    assert (
        bq.load_saved_run(tmp_path / "runs", ("allocation", "/trace", "default", 43, "fgd")) is None
    )
    assert bq.load_saved_run(tmp_path / "runs", fair) is None
    assert bq.run_file(tmp_path, fair).name == "fairness-default-ours-42-w1_1_2_4-l2-equal.json"
    heavier = (*fair[:6], 1.5, *fair[7:])
    assert bq.run_file(tmp_path, heavier) != bq.run_file(tmp_path, fair)
    # The gate options and the demand split are part of the name.
    held = bq.run_file(tmp_path, (*fair[:7], True, 0.1, "weighted", "fifo"))
    assert held.name == "fairness-default-ours-42-w1_1_2_4-l2-weighted-hold-band0.1.json"
    banded = bq.run_file(tmp_path, (*fair[:7], False, 0.25, "equal", "fifo"))
    assert banded.name == "fairness-default-ours-42-w1_1_2_4-l2-equal-band0.25.json"
    # So is a queue order other than creation order.
    largest = bq.run_file(tmp_path, (*fair[:7], True, 0.1, "equal", "largest"))
    assert largest.name == "fairness-default-ours-42-w1_1_2_4-l2-equal-hold-band0.1-qlargest.json"


def test_rows_are_labelled_by_gate_options_and_ordered() -> None:
    assert bq.label("ours", False, 0.0) == "ours"
    assert bq.label("ours", True, 0.1) == "ours+hold+band"
    assert bq.label("ours", False, 0.1) == "ours+band"
    rows = ["fgd", "ours+hold+band", "bestfit", "ours", "ours+band"]
    assert bq.row_order(rows) == ["ours", "ours+band", "ours+hold+band", "bestfit", "fgd"]


def _fair_run(pods: str, label: str, max_rel: float, bound: float) -> dict[str, object]:
    dev = {"maxRel": max_rel, "meanRel": max_rel / 2, "maxAbs": 1.0, "jain": 0.99}
    return {
        "kind": "fairness",
        "pods": pods,
        "policy": label.split("+")[0],
        "label": label,
        "demand": "equal",
        "seed": 42,
        "allocation": 95.0,
        "divisible": dev,
        "constrained": dev,
        "bound": {"divisible": bound, "constrained": bound},
        "tenants": [
            {
                "tenant": "tenant-0",
                "weight": 1.0,
                "demand": 0.5,
                "share": 0.12,
                "fair": 0.125,
                "fairConstrained": 0.125,
                "usableGpu": 0.5,
                "gpuShare": 0.12,
            }
        ],
    }


def test_fairness_verdicts_separate_idle_capacity_from_an_unfair_split() -> None:
    runs = [
        _fair_run("default", "ours", 0.20, 0.01),
        _fair_run("default", "ours+hold+band", 0.04, 0.01),
        _fair_run("gpushare100", "ours+hold+band", 0.16, 0.08),
        _fair_run("cpu050", "ours+hold+band", 0.06, 0.02),
        _fair_run("default", "fgd", 0.9, 0.01),
    ]
    summary = bq.summarize(runs, ["default", "cpu050", "gpushare100"])
    fair = summary["fairness"]["equal"]
    assert list(fair["default"]) == ["ours", "ours+hold+band", "fgd"]
    v = bq.fairness_verdicts(fair, "divisible")
    assert set(v) == {"ours", "ours+hold+band"}  # the controls get no verdict
    assert v["ours+hold+band"] == {
        "of": ["default", "cpu050", "gpushare100"],
        "miss": ["cpu050", "gpushare100"],
        "bound": ["gpushare100"],
    }
    meta = {"weights": [1.0], "load": 2.0, "yieldBand": 0.1}
    text = "\n".join(bq.render_fairness("equal", fair, meta))
    assert "ours+hold+band, divisible target: every tenant within 5 % on 1 of 3 traces" in text
    assert "(the bound alone exceeds 5 % on gpushare100)" in text
    assert "| gpushare100 | ours+hold+band | 95.00 | 8.0 % | 16.0 % (16.0 %)" in text
    assert "`yieldBand: 0.1`" in text
    assert "queue `largest`" not in text
    largest = "\n".join(bq.render_fairness("equal", fair, {**meta, "queue": "largest"}))
    assert "tries each tenant's pending pods largest GPU demand first (queue `largest`" in largest


def test_an_unreadable_run_file_is_run_again(tmp_path: Path) -> None:
    job = ("allocation", "/trace", "gpuspec20", 44, "ours")
    bq.run_file(tmp_path, job).write_text("{cut off")
    assert bq.load_saved_run(tmp_path, job) is None
    bq.run_file(tmp_path, job).write_text('["not a run"]')
    assert bq.load_saved_run(tmp_path, job) is None
