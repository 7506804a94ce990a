"""bench-quality's --runs-dir: finished runs kept one file each, reused by a later run."""

from __future__ import annotations

from pathlib import Path

from tests.bench import bench_quality as bq


def test_runs_are_kept_and_found_by_what_they_depend_on(tmp_path: Path) -> None:
    alloc = ("allocation", "/trace", "default", 42, "fgd")
    fair = ("fairness", "/trace", "default", 42, "ours", (1.0, 1.0, 2.0, 4.0), 2.0)
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
    assert bq.run_file(tmp_path, fair).name == "fairness-default-ours-42-w1_1_2_4-l2.json"
    heavier = (*fair[:6], 1.5)
    assert bq.run_file(tmp_path, heavier) != bq.run_file(tmp_path, fair)
    # holdForBlockedTenants on is another run; off keeps the old name.
    assert bq.run_file(tmp_path, (*fair, False)) == bq.run_file(tmp_path, fair)
    held = bq.run_file(tmp_path, (*fair, True))
    assert held.name == "fairness-default-ours-42-w1_1_2_4-l2-hold.json"


def test_an_unreadable_run_file_is_run_again(tmp_path: Path) -> None:
    job = ("allocation", "/trace", "gpuspec20", 44, "ours")
    bq.run_file(tmp_path, job).write_text("{cut off")
    assert bq.load_saved_run(tmp_path, job) is None
    bq.run_file(tmp_path, job).write_text('["not a run"]')
    assert bq.load_saved_run(tmp_path, job) is None
