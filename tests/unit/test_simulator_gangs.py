"""Gangs in the simulator (``fairshare.simulator.gangsim``) and the Philly replay
(``fairshare.simulator.philly``) on small traces written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairshare.simulator import gangsim, philly

TYPE = "ResNet-50 (batch size 64)"


def write_trace(folder: Path, vcs: dict[str, list[tuple[int, float, int]]]) -> Path:
    """``<vc>.trace`` files of (total steps, arrival, scale factor) rows and a throughput
    table: 1 step/s on one worker, 1.5 on two (scaling efficiency 0.75)."""
    folder.mkdir(parents=True, exist_ok=True)
    for vc, rows in vcs.items():
        lines = [
            f"{TYPE}\tcd %s && python3 main.py\t--num_steps\t1\t{steps}\t{arrival:f}\t{scale}"
            for steps, arrival, scale in rows
        ]
        (folder / f"{vc}.trace").write_text("\n".join(lines) + "\n")
    table = {"v100": {f"('{TYPE}', 1)": {"null": 1.0}, f"('{TYPE}', 2)": {"null": 1.5}}}
    (folder / philly.THROUGHPUTS).write_text(json.dumps(table))
    return folder


def interleaved(tmp_path: Path) -> Path:
    """Two tenants each submit a 6-worker job at the same moment on 8 GPUs (and again
    an hour later): whole, only one fits at a time."""
    rows = [(3600, 0.0, 6), (3600, 3600.0, 6)]
    return write_trace(tmp_path / "trace", {"aa": rows, "bb": rows})


def run(folder: Path, **kw: object) -> dict[str, dict[str, object]]:
    figures, _ = philly.run(folder, nodes=2, gpus_per_node=4, limit=None, quiet=True, **kw)  # type: ignore[arg-type]
    return figures


def test_interleaved_gangs_hold_gpus_only_when_placed_pod_by_pod(tmp_path):
    figures = run(interleaved(tmp_path))
    assert figures["ours"]["incompleteGangGpuHours"] == 0
    assert figures["gang-fifo"]["incompleteGangGpuHours"] == 0
    assert figures["ours"]["notStarted"] == 0
    # Pod by pod, the fair-share gate lets each tenant place 4 of its 6 pods: every GPU
    # is held, neither job ever runs, and the GPUs stay held to the trace's end.
    per_pod = figures["per-pod"]
    assert per_pod["incompleteGangGpuHours"] > 0  # type: ignore[operator]
    assert per_pod["notStarted"] == 4
    assert per_pod["gpusHeldForEver"] == 8


def test_gang_replay_runs_jobs_whole_one_after_the_other(tmp_path):
    folder = interleaved(tmp_path)
    jobs, tput, derived = philly.load_jobs(folder)
    assert tput.efficiency == pytest.approx(0.75)
    assert derived == 4  # no entry for 6 workers: 1 × 6 × 0.75 steps/s
    assert [j.duration for j in jobs] == pytest.approx([3600 / 4.5] * 4)
    config = philly.make_config(sorted({j.namespace for j in jobs}))
    replay = gangsim.Replay(config, philly.make_nodes(2, 4), jobs, "ours")
    result = replay.run()
    starts = sorted((r.start, r.job.namespace) for r in replay.records)
    # aa's job first (arrival order, both at share 0: the smaller name), bb's when it ends
    assert starts[0] == (0.0, "vc-aa")
    assert starts[1] == (pytest.approx(800.0), "vc-bb")
    assert result.not_started == 0 and result.incomplete_gpu_seconds == 0
    assert replay.sim.state.pods == {}  # every member released at its job's end


def test_the_gate_holds_a_gang_of_a_tenant_above_its_share(tmp_path):
    """aa runs a 4-worker job; aa's next job and bb's arrive together with 4 GPUs free:
    ours serves bb (below its fair share), gang-fifo the first in arrival order."""
    folder = write_trace(
        tmp_path / "t",
        {"aa": [(36000, 0.0, 4), (3600, 10.0, 4)], "bb": [(3600, 10.0, 4), (3600, 10.0, 4)]},
    )
    jobs, _, _ = philly.load_jobs(folder)
    config = philly.make_config(["vc-aa", "vc-bb"])
    first: dict[str, str] = {}
    for policy in ("ours", "gang-fifo"):
        replay = gangsim.Replay(config, philly.make_nodes(2, 4), jobs, policy)  # type: ignore[arg-type]
        replay.run()
        at_10 = [r.job.namespace for r in replay.records if r.start == 10.0]
        first[policy] = ",".join(at_10)
    assert first["ours"] == "vc-bb"
    assert first["gang-fifo"] == "vc-aa"


def test_a_malformed_trace_line_is_one_clear_error(tmp_path, capsys):
    folder = interleaved(tmp_path)
    with (folder / "aa.trace").open("a") as f:
        f.write(f"{TYPE}\tcmd\t--num_steps\t100\t0.0\t2\n")  # 6 columns
    with pytest.raises(philly.TraceError) as err:
        philly.load_jobs(folder)
    assert str(err.value) == (
        f"{folder / 'aa.trace'}:3: expected 7 tab-separated columns (job type, command, "
        "steps argument, needs a data dir, total steps, arrival seconds, scale factor), got 6"
    )
    assert philly.main(["--trace", str(folder), "--quick"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.strip() == f"philly: {err.value}"
    assert "\n" not in out.err.strip()


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (f"{TYPE}\tcmd\t-n\t1\tmany\t0.0\t2", "'many'"),
        (f"{TYPE}\tcmd\t-n\t1\t100\t0.0\t0", "scale factor (0) must be positive"),
        ("Unknown model\tcmd\t-n\t1\t100\t0.0\t1", "'Unknown model' has no throughput"),
    ],
)
def test_bad_values_name_the_line(tmp_path, line, needle):
    folder = write_trace(tmp_path / "t", {"aa": [(100, 0.0, 1)]})
    (folder / "bb.trace").write_text(line + "\n")
    with pytest.raises(philly.TraceError, match=r"bb\.trace:1") as err:
        philly.load_jobs(folder)
    assert needle in str(err.value)


def test_a_missing_trace_folder_or_table_is_one_line(tmp_path, capsys):
    assert philly.main(["--trace", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"philly: no trace folder {tmp_path / 'nowhere'}; expected")
    assert "\n" not in err
    folder = interleaved(tmp_path)
    (folder / philly.THROUGHPUTS).unlink()
    assert philly.main(["--trace", str(folder)]) == 2
    assert capsys.readouterr().err.startswith(f"philly: no {philly.THROUGHPUTS} in {folder}")


def test_the_report_prints_every_policy(tmp_path, capsys):
    folder = interleaved(tmp_path)
    assert philly.main(["--trace", str(folder), "--nodes", "2", "--gpus-per-node", "4",
                        "--workers", "1"]) == 0  # fmt: skip
    out = capsys.readouterr()
    for policy in gangsim.GANG_POLICIES:
        assert f"| {policy} |" in out.out
    assert "| vc-aa | 2 |" in out.out
    assert "philly: per-pod: done in" in out.err


def test_the_yield_band_option_sets_the_config(tmp_path, monkeypatch):
    """``--yield-band B`` replays with ``yieldBand: B``; without it the config's default."""
    assert philly.make_config(["a"]).yield_band == 0.0
    assert philly.make_config(["a"], 0.1).yield_band == 0.1
    seen: list[float | None] = []
    real = philly.make_config

    def spy(tenants, yield_band=None):  # type: ignore[no-untyped-def]
        seen.append(yield_band)
        return real(tenants, yield_band)

    monkeypatch.setattr(philly, "make_config", spy)
    folder = interleaved(tmp_path)
    common = ["--trace", str(folder), "--nodes", "2", "--gpus-per-node", "4", "--workers", "1"]
    assert philly.main([*common, "--policies", "per-pod", "--yield-band", "0.1"]) == 0
    assert philly.main([*common, "--policies", "per-pod"]) == 0
    assert seen == [0.1, None]
    with pytest.raises(SystemExit):
        philly.main([*common, "--yield-band", "1.5"])
