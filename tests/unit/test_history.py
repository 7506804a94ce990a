"""Fairness with memory (``usageHistory``): decay, the weight factor, the config field,
and the day-long simulator scenario (pure, no network, no matplotlib)."""

from __future__ import annotations

import itertools
import json
import math
import textwrap

import pytest
from pydantic import ValidationError

from fairshare import history
from fairshare.config.schema import FairShareConfig, UsageHistory, parse_duration
from fairshare.simulator import day, runner, scenario

HOUR = 3600.0
RES = ("nvidia.com/gpu", "cpu", "memory")


def _config(**extra: object) -> FairShareConfig:
    doc: dict[str, object] = {
        "resources": {r: {} for r in RES},
        "tenants": [
            {"name": "a", "namespaces": ["a"], "weight": 1},
            {"name": "b", "namespaces": ["b"], "weight": 1},
        ],
    }
    doc.update(extra)
    return FairShareConfig.model_validate(doc)


def _run(h: history.History, start: float, stop: float, step: float, used, cap) -> None:
    t = start
    while t < stop - 1e-9:
        t = min(stop, t + step)
        h.advance(t, used, cap)


# --- decay ---------------------------------------------------------------------------


def test_constant_use_tends_to_its_share_and_halves_after_a_half_life():
    h = history.History(HOUR, RES)
    cap = [32.0, 512.0, 4096.0]
    h.advance(0.0, {}, cap)
    _run(h, 0.0, 24 * HOUR, 600.0, {"a": [8.0, 16.0, 0.0]}, cap)
    # Dominant decayed share: 8 of 32 GPUs (cpu 16/512 is less).
    assert h.usage_share(h.usage["a"], (1, 1, 1)) == pytest.approx(0.25, rel=1e-6)
    before = h.usage["a"][0]
    _run(h, 24 * HOUR, 25 * HOUR, 60.0, {}, cap)
    assert h.usage["a"][0] == pytest.approx(before / 2, rel=1e-9)
    # The capacity history decays alike but is fed: the share falls to about half too.
    assert h.usage_share(h.usage["a"], (1, 1, 1)) == pytest.approx(0.125, rel=1e-6)


def test_advance_is_exact_whatever_the_step():
    cap = [10.0, 10.0, 10.0]
    one = history.History(HOUR, RES)
    many = history.History(HOUR, RES)
    for h in (one, many):
        h.advance(0.0, {}, cap)
    one.advance(2 * HOUR, {"a": [3.0, 1.0, 0.0]}, cap)
    _run(many, 0.0, 2 * HOUR, 7.0, {"a": [3.0, 1.0, 0.0]}, cap)
    assert many.usage["a"] == pytest.approx(one.usage["a"], rel=1e-9)
    # ∫0^2h 3·2^(-(2h-s)/h) ds = 3·h/ln2·(1 - 1/4)
    assert one.usage["a"][0] == pytest.approx(3 * HOUR / math.log(2) * 0.75, rel=1e-12)


def test_a_clock_going_back_changes_nothing_and_roundtrip_keeps_the_history():
    h = history.History(HOUR, RES)
    h.advance(100.0, {}, [1.0, 1.0, 1.0])
    h.advance(200.0, {"a": [1.0, 0.0, 0.0]}, [1.0, 1.0, 1.0])
    snap = json.loads(json.dumps(h.to_dict()))
    h.advance(150.0, {"a": [5.0, 0.0, 0.0]}, [1.0, 1.0, 1.0])
    assert h.at == 200.0 and h.to_dict() == snap
    # Read back into other columns: a dropped resource goes, a new one starts at 0.
    back = history.History.from_dict(snap, half_life=HOUR, resources=("cpu", "nvidia.com/gpu", "x"))
    assert back.at == 200.0
    assert back.usage["a"] == [0.0, h.usage["a"][0], 0.0]


# --- the factor on the weight ----------------------------------------------------------


def _hist_with(shares: dict[str, float]) -> history.History:
    h = history.History(HOUR, RES)
    h.capacity = [100.0, 100.0, 100.0]
    h.usage = {t: [100.0 * s, 0.0, 0.0] for t, s in shares.items()}
    return h


def test_over_use_lowers_the_weight_bounded_and_under_use_keeps_it():
    cfg = _config()
    demand = {"a": [1.0, 0.0, 0.0], "b": [1.0, 0.0, 0.0]}
    policy = UsageHistory(half_life="1h")
    got = history.assess(_hist_with({"a": 1.0}), cfg, demand, policy=policy)
    assert got["a"] == history.TenantHistory(1.0, 0.5, pytest.approx(0.5))
    assert got["b"].factor == 1.0 and got["b"].weighted_share == 0.5
    strong = UsageHistory(half_life="1h", strength=100, min_weight_factor=0.2)
    assert history.assess(_hist_with({"a": 1.0}), cfg, demand, policy=strong)["a"].factor == 0.2
    # Alone, a tenant's weighted share is the whole cluster: no over-use, no change.
    alone = history.assess(_hist_with({"a": 1.0}), cfg, {"a": [1.0, 0, 0]}, policy=policy)
    assert alone["a"].factor == 1.0
    # strength 0: kept, shown, changes nothing.
    zero = UsageHistory(half_life="1h", strength=0)
    assert (
        history.weight_factors(history.assess(_hist_with({"a": 1.0}), cfg, demand, policy=zero))
        == {}
    )


def test_each_level_of_a_tree_is_judged_among_its_siblings():
    cfg = FairShareConfig.model_validate(
        {
            "resources": {r: {} for r in RES},
            "tenants": [
                {"name": "org1"},
                {"name": "org2"},
                {"name": "t1", "parent": "org1", "namespaces": ["t1"]},
                {"name": "t2", "parent": "org1", "namespaces": ["t2"]},
                {"name": "t3", "parent": "org2", "namespaces": ["t3"]},
            ],
        }
    )
    demand = {n: [1.0, 0.0, 0.0] for n in ("t1", "t2", "t3")}
    policy = UsageHistory(half_life="1h")
    got = history.assess(_hist_with({"t1": 0.6, "t3": 0.2}), cfg, demand, policy=policy)
    # org1 held 0.6 of the cluster for a weighted share of 0.5: 0.5/(0.5+0.1).
    assert got["org1"].factor == pytest.approx(0.5 / 0.6)
    assert got["org2"].factor == 1.0
    # t1 held 0.6 for a share of 0.25 (half of org1's half): lowered among its siblings.
    assert got["t1"].weighted_share == pytest.approx(0.25)
    assert got["t1"].factor == pytest.approx(0.25 / (0.25 + 0.35))
    assert got["t2"].factor == 1.0 and got["t3"].factor == 1.0
    adjusted = history.adjusted_config(cfg, history.weight_factors(got))
    assert adjusted.tenant("org1").weight == pytest.approx(0.5 / 0.6)  # type: ignore[union-attr]
    assert adjusted.tenant("t2").weight == 1.0  # type: ignore[union-attr]


def test_adjusted_config_is_the_same_object_when_nothing_changes():
    cfg = _config()
    assert history.adjusted_config(cfg, {}) is cfg
    assert history.adjusted_config(cfg, {"a": 1.0, "nobody": 0.5}) is cfg
    low = history.adjusted_config(cfg, {"a": 0.25})
    assert [t.weight for t in low.tenants] == [0.25, 1.0]
    assert [t.weight for t in cfg.tenants] == [1.0, 1.0]


# --- the config field -----------------------------------------------------------------


def test_off_by_default_and_half_life_parsed():
    assert _config().usage_history is None
    on = _config(usageHistory={"halfLife": "1h30m"})
    assert on.usage_history is not None and on.usage_history.half_life_seconds() == 5400.0
    assert parse_duration("90s") == 90.0 and parse_duration("1.5h") == 5400.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0s", "must be at least 1m"),
        ("30s", "must be at least 1m"),
        ("1d", "is not a duration; write it as 1h, 30m, 90s or 1h30m"),
        ("-1h", "is not a duration"),
        (3600, "a bare number has no unit"),
    ],
)
def test_a_wrong_half_life_is_refused_with_a_clear_message(value, message):
    with pytest.raises(ValidationError) as err:
        _config(usageHistory={"halfLife": value})
    text = str(err.value)
    assert "usageHistory.halfLife" in text and message in text


def test_half_life_is_required_and_the_floor_bounded():
    with pytest.raises(ValidationError, match="halfLife"):
        _config(usageHistory={})
    for bad in (0, 1.5):
        with pytest.raises(ValidationError, match="minWeightFactor"):
            _config(usageHistory={"halfLife": "1h", "minWeightFactor": bad})


# --- the day-long scenario -------------------------------------------------------------


@pytest.fixture(scope="module")
def runs() -> tuple[day.DayScenario, day.DayRun, day.DayRun]:
    scn = day.DayScenario()
    return scn, day.run_day(scn, None), day.run_day(scn, "1h")


def test_without_history_a_keeps_its_lead_while_its_jobs_last(runs):
    scn, plain, _ = runs
    first = int(scn.b_arrives // HOUR)
    assert all(v == 0.0 for v in plain.b_share[:first])
    assert plain.b_share[first] < 0.47  # a's pods end one by one
    assert all(v <= 0.5 + 1e-9 for v in plain.b_share)  # never above 1/2
    assert all(v == pytest.approx(0.5) for v in plain.b_fair[first + 1 :])


def test_with_history_b_rises_above_its_fair_share_and_converges(runs):
    scn, plain, kept = runs
    first = int(scn.b_arrives // HOUR)
    # a held the cluster all night: its weight is lowered when b arrives.
    assert kept.a_factor[first] < 0.7
    assert kept.b_fair[first] > 0.6
    # b's share of the next hours rises above 1/2 ...
    assert kept.b_share[first + 1] > 0.53
    assert kept.b_share[first] > plain.b_share[first] + 0.03
    assert sum(kept.b_share) > sum(plain.b_share) + 0.1
    # ... and converges as the history decays: a's factor back to 1, b at 1/2.
    factors = kept.a_factor[first:]
    assert all(x <= y + 1e-9 for x, y in itertools.pairwise(factors))
    assert all(f == pytest.approx(1.0) for f in kept.a_factor[first + 5 :])
    assert all(v == pytest.approx(0.5, abs=0.01) for v in kept.b_share[first + 4 :])


def test_history_with_no_strength_decides_as_without(runs):
    scn, plain, _ = runs
    zero = day.run_day(scn, "1h", strength=0.0)
    assert zero.b_share == plain.b_share


def test_the_command_prints_the_figures(capsys):
    assert day.main(["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["halfLife"] == "1h" and len(got["bShareWithHistory"]) == 20
    assert max(got["bShareWithHistory"]) > max(got["bShareNoHistory"])
    with pytest.raises(SystemExit):
        day.main(["--half-life", "soon"])


# --- ``fairshare simulate`` honours the block ------------------------------------------

NIGHT = textwrap.dedent(
    """
    apiVersion: fairshare.io/v1alpha1
    kind: Scenario
    config:
      apiVersion: fairshare.io/v1alpha1
      kind: FairShareConfig
      resources: {nvidia.com/gpu: {}, cpu: {}, memory: {}}
      tenants:
      - {name: a, namespaces: [a]}
      - {name: b, namespaces: [b]}
    nodes:
    - name: n
      count: 2
      allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "4"}
      labels: {nvidia.com/gpu.count: "4"}
    workload:
    - {namespace: a, name: night, count: 8, requests: {nvidia.com/gpu: "1"}, duration: 28800}
    - {namespace: a, name: day-a, count: 8, requests: {nvidia.com/gpu: "1"}, arrival: 27000}
    - {namespace: b, name: day-b, count: 8, requests: {nvidia.com/gpu: "1"}, arrival: 27000}
    """
)


@pytest.mark.parametrize(("block", "a_runs", "b_runs"), [("", 4, 4), ("{halfLife: 1h}", 3, 5)])
def test_a_scenario_with_usage_history_gives_the_newcomer_more(block, a_runs, b_runs):
    # a held all 8 GPUs for 8 h; its pods end as both tenants wait with 8 pods each.
    text = NIGHT.replace("\nnodes:", f"\n  usageHistory: {block}\nnodes:") if block else NIGHT
    sim = runner.run_scenario(scenario.parse_scenario(text))
    report = runner.build_report(sim)
    got = (report["tenants"]["a"]["running"], report["tenants"]["b"]["running"])
    assert got == (a_runs, b_runs)
    assert sim.config.tenants[0].weight == 1.0  # the report reads the weights as written


def test_the_implicit_default_tenant_is_declared_only_when_its_weight_changes():
    cfg = _config(defaultTenant={"mode": "tenant", "name": "default"})
    assert [t.name for t in history.adjusted_config(cfg, {"a": 0.5}).tenants] == ["a", "b"]
    low = history.adjusted_config(cfg, {"default": 0.5})
    assert low.tenant("default").weight == 0.5  # type: ignore[union-attr]
    assert [t.name for t in low.tenants] == ["a", "b", "default"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--half-life", "0s"], 'usageHistory.halfLife: must be at least 1m, got "0s"'),
        (["--half-life", "soon"], "invalid duration 'soon'"),
        (["--strength", "-1"], "usageHistory.strength: must be >= 0"),
        (["--png", "/no/such/dir/day.png"], "--png: directory /no/such/dir does not exist"),
    ],
)
def test_the_day_scenario_refuses_bad_arguments_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fairshare.simulator import day

    with pytest.raises(SystemExit) as exc:
        day.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
