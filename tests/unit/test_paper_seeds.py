"""Our runs against the FGD paper's per-seed runs: parsing, Welch's t and the table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.bench import paper_seeds as ps

HEADER = "workload,sc_policy,tune,seed,total_gpus,99,100\n"


def _artifact(path: Path, rows: list[tuple[str, str, int, float]]) -> Path:
    lines = [HEADER] + [f"openb_pod_list_{w},{p},1.3,{s},6212,0,{v}\n" for w, p, s, v in rows]
    path.write_text("".join(lines))
    return path


def test_welch_t_is_the_mean_difference_over_its_standard_error() -> None:
    # means 2 and 1; variances 1 and 1; se = sqrt(1/3 + 1/3)
    assert ps.welch_t([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]) == pytest.approx(1 / math.sqrt(2 / 3))
    assert ps.welch_t([1.0, 1.0], [1.0, 1.0]) == 0.0
    assert ps.welch_t([2.0, 2.0], [1.0, 1.0]) == math.inf
    with pytest.raises(ValueError, match="two runs"):
        ps.welch_t([1.0], [1.0, 2.0])


def test_paper_runs_keep_bestfit_and_fgd_at_100_percent_arrived(tmp_path: Path) -> None:
    csv_path = _artifact(
        tmp_path / "a.csv",
        [
            ("default", "06-FGD", 42, 95.1),
            ("default", "06-FGD", 43, 95.3),
            ("default", "05-BestFit", 42, 92.9),
            ("default", "01-Random", 42, 86.0),
        ],
    )
    runs = ps.paper_runs(csv_path)
    assert runs == {("default", "fgd"): {42: 95.1, 43: 95.3}, ("default", "bestfit"): {42: 92.9}}


def test_a_file_without_the_columns_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "b.csv"
    bad.write_text("name,value\nx,1\n")
    with pytest.raises(ValueError, match="not the artifact's allocation table"):
        ps.paper_runs(bad)
    assert ps.main(["--artifact-csv", str(bad), "--report", str(tmp_path / "none.json")]) == 2


def test_table_pairs_the_seeds_both_sides_have(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    csv_path = _artifact(
        tmp_path / "a.csv",
        [("default", "06-FGD", s, v) for s, v in ((42, 95.0), (43, 95.2), (44, 95.4))],
    )
    runs = [
        {"kind": "allocation", "pods": "default", "policy": "ours", "seed": s, "allocationAt100": v}
        for s, v in ((42, 95.5), (43, 95.7), (45, 99.0))  # 45: no paper run, left out
    ] + [{"kind": "fairness", "pods": "default", "policy": "ours", "seed": 42}]
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"runs": runs}))
    assert ps.main(["--artifact-csv", str(csv_path), "--report", str(report)]) == 0
    out = capsys.readouterr().out.splitlines()
    row = next(line for line in out if line.startswith("| default |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # ours on 42-43: 95.6 against 95.1; our fgd has no runs
    assert cells[1] == "+0.500" and cells[3] == "–" and cells[5] == "42–43 (2)"


@pytest.mark.parametrize(
    ("report", "says"),
    [
        ([1, 2], "not a bench-quality report"),
        ({"runs": {}}, "not a bench-quality report"),
        ({"runs": [{"kind": "allocation", "pods": "default"}]}, "run 0 of the report"),
        ({"runs": [{"kind": "allocation", "pods": "d", "policy": "ours", "seed": "x",
                    "allocationAt100": 1}]}, "run 0 of the report"),
    ],
    ids=["list", "runs-not-a-list", "missing-keys", "bad-seed"],
)  # fmt: skip
def test_a_malformed_report_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], report: object, says: str
) -> None:
    csv_path = _artifact(tmp_path / "a.csv", [("default", "06-FGD", 42, 95.0)])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert ps.main(["--artifact-csv", str(csv_path), "--report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paper_seeds: ") and says in err and "Traceback" not in err


def test_a_non_numeric_artifact_row_names_its_line(tmp_path: Path) -> None:
    bad = _artifact(tmp_path / "a.csv", [("default", "06-FGD", 42, 95.0)])
    bad.write_text(bad.read_text() + "openb_pod_list_default,06-FGD,1.3,43,6212,0,n/a\n")
    with pytest.raises(ValueError, match="line 3: seed '43' or allocation 'n/a'"):
        ps.paper_runs(bad)
