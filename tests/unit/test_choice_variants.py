"""The node-choice variants bench: paired report and the variant patch itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import choice_variants as cv


def _write(runs: Path, variant: str, pods: str, seed: int, value: float) -> None:
    path = cv._path(runs, variant, pods, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"allocationAt100": value}))


def test_report_pairs_each_variant_with_the_shipped_run_of_the_same_seed(tmp_path: Path) -> None:
    for seed, shipped, variant in ((42, 95.0, 95.3), (43, 96.0, 95.9), (44, 97.0, 97.2)):
        _write(tmp_path, cv.SHIPPED, "default", seed, shipped)
        _write(tmp_path, "frac_exact", "default", seed, variant)
    _write(tmp_path, "frac_exact", "multigpu40", 42, 90.0)  # no shipped run: not paired
    text = cv.report(tmp_path, ["frac_exact"], ["default", "multigpu40"], [42, 43, 44])
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    assert "96.00" in rows[cv.SHIPPED]
    # mean of +0.3, -0.1, +0.2 = +0.133; two of three seeds gain; multigpu40 has no pair
    assert "+0.133 ± " in rows["frac_exact"] and "(2/3)" in rows["frac_exact"]
    assert rows["frac_exact"].rstrip(" |").endswith("–")


def test_a_variant_changes_only_the_pods_it_names() -> None:
    import fairshare.pipeline as pipeline
    import fairshare.simulator.engine as engine

    shipped_score, shipped_levels = engine.Simulation._score, pipeline.choice_levels
    try:
        cv._install("big_levels")
        assert pipeline.choice_levels is not shipped_levels
        assert engine.Simulation._score is shipped_score
        pipeline.choice_levels = shipped_levels
        cv._install("frac_exact")
        assert engine.Simulation._score is not shipped_score
    finally:
        engine.Simulation._score = shipped_score  # type: ignore[method-assign]
        pipeline.choice_levels = shipped_levels


def test_unknown_variant_and_missing_pod_list_fail_with_the_choices(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit):
        cv.main(["--variants", "nope", "--runs-dir", str(tmp_path)])
    assert "choose from shipped" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cv.main(["--trace", str(tmp_path / "missing"), "--runs-dir", str(tmp_path)])
    assert "is not a folder" in capsys.readouterr().err
