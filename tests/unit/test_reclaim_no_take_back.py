"""No take-back: reclaim toward fair share never undoes an earlier reclaim.

A pod that got room by reclaim carries the tenants whose pods were evicted for it
(``holds.ANN_RECLAIMED_FROM``); while it is there, reclaim toward fair share takes
nothing from its tenant for them. Guarantees are not subject to the rule.
"""

from __future__ import annotations

from typing import Any

import pytest

from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.errors import ConfigError
from fairshare.preemption import holds
from tests.unit.test_reclaim import World, victims


def _config(**extra: Any) -> FairShareConfig:
    tenants: list[dict[str, Any]] = [{"name": n, "namespaces": [n]} for n in ("u", "t", "w")]
    for t in tenants:
        t.update(extra.pop(t["name"], {}))
    return config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "reclaimToFairShare": True,
            "yieldBand": 0.0,
            "tenants": tenants,
            **extra,
        }
    )


def _t_over_u_under(cfg: FairShareConfig) -> tuple[World, str]:
    """One node of 4 GPUs: t runs 3 pods (its fair share is 2), u runs 1 and wants 1."""
    w = World(cfg, ("n1", 4))
    w.run("u", "u0", "n1")
    given = [w.run("t", f"t{i}", "n1") for i in range(3)]
    w.want("u", "u1")
    return w, given[0]


def test_without_a_record_reclaim_brings_u_to_its_fair_share():
    w, _ = _t_over_u_under(_config())
    plan = w.plan()
    assert plan.decisions == (("t", "u"),)
    assert victims(plan) == ["uid-t2"]  # t's youngest


def test_a_pod_of_t_that_got_room_from_u_keeps_t_from_being_u_s_victim():
    w, first = _t_over_u_under(_config())
    plan = w.plan(given={first: frozenset({"u"})})
    assert plan.evictions == ()
    # The rule is about that pair: a record naming another tenant blocks nothing here.
    assert victims(w.plan(given={first: frozenset({"w"})})) == ["uid-t2"]


def test_the_record_ends_with_the_pod():
    w, first = _t_over_u_under(_config())
    w.state.unbind(first)  # t's pod that got room from u ended: t holds 2, its fair share
    w.run("t", "t3", "n1")  # a new pod of t: no record
    assert victims(w.plan(given={first: frozenset({"u"})})) == ["uid-t3"]


def test_a_pending_pod_that_got_room_also_counts():
    w, _ = _t_over_u_under(_config())
    w.want("t", "t9")
    assert w.plan(given={"uid-t9": frozenset({"u"})}).evictions == ()


def test_u_still_gets_room_from_a_third_tenant_above_its_fair_share():
    cfg = _config()
    w = World(cfg, ("n1", 3), ("n2", 3))
    w.run("u", "u0", "n1")
    first = w.run("t", "t0", "n1")
    w.run("t", "t1", "n1")
    for i in range(3):
        w.run("w", f"w{i}", "n2")
    w.want("u", "u1")
    w.want("t", "t9")
    w.want("w", "w9")
    # Fair shares 2 each: t holds 2 (not a victim anyway), w holds 3.
    assert victims(w.plan(given={first: frozenset({"u"})})) == ["uid-w2"]


def test_guarantees_are_not_subject_to_the_rule():
    w, first = _t_over_u_under(_config(u={"guaranteed": {"nvidia.com/gpu": "2"}}))
    plan = w.plan(given={first: frozenset({"u"})})
    assert [(e.victim_uid, e.toward) for e in plan.evictions] == [("uid-t2", "guarantee")]


def test_the_plan_names_who_gave_room_to_each_pod():
    w, _ = _t_over_u_under(_config())
    plan = w.plan()
    given = plan.givers()
    assert given == {"uid-u1": frozenset({"t"})}
    ann = holds.given_annotation(frozenset(), given["uid-u1"], at=100.0)
    assert ann == {holds.ANN_RECLAIMED_FROM: "t", holds.ANN_RECLAIMED_AT: "100.000"}


def test_the_annotation_is_read_leniently_and_merged():
    assert holds.given_of(None) == frozenset()
    assert holds.given_of({holds.ANN_RECLAIMED_FROM: 3}) == frozenset()
    assert holds.given_of({holds.ANN_RECLAIMED_FROM: " a, b,,"}) == {"a", "b"}
    assert holds.given_annotation(frozenset({"a"}), frozenset({"a"}), at=5.0) == {}
    merged = holds.given_annotation(frozenset({"b"}), frozenset({"a"}), at=5.0)
    assert merged == {holds.ANN_RECLAIMED_FROM: "a,b", holds.ANN_RECLAIMED_AT: "5.000"}


def test_a_record_counts_for_the_take_back_time_from_when_room_was_given():
    ann = {holds.ANN_RECLAIMED_FROM: "a,b", holds.ANN_RECLAIMED_AT: "1000.000"}
    assert holds.given_in_force(ann, now=1000.0 + 3599.0, keep=3600.0) == {"a", "b"}
    assert holds.given_in_force(ann, now=1000.0 + 3600.0, keep=3600.0) == frozenset()
    assert holds.given_in_force(ann, now=1001.0, keep=0.0) == frozenset()  # rule off
    for at in (None, "soon", "nan", "inf"):
        bad = {holds.ANN_RECLAIMED_FROM: "a"} | ({holds.ANN_RECLAIMED_AT: at} if at else {})
        assert holds.given_in_force(bad, now=1001.0, keep=3600.0) == frozenset(), at


def test_the_take_back_time_is_configured_and_validated():
    assert _config().take_back_after_seconds() == 3600.0  # the default, 1h
    off = _config(reclaimTakeBackAfter="0s")
    assert off.take_back_after_seconds() == 0.0
    # Off: the same world takes room back at once, even within one plan.
    w, first = _t_over_u_under(off)
    assert victims(w.plan(given={first: frozenset({"u"})})) == ["uid-t2"]
    with pytest.raises(ConfigError, match=r"reclaimTakeBackAfter.*not a duration"):
        _config(reclaimTakeBackAfter="an hour")
    with pytest.raises(ConfigError, match=r"reclaimTakeBackAfter.*bare number has no unit"):
        _config(reclaimTakeBackAfter=3600)


def test_explain_names_the_tenant_reclaim_takes_nothing_back_from():
    from fairshare import report, report_render
    from fairshare.usageview import StaticView

    w, _ = _t_over_u_under(_config())
    ann = {holds.ANN_RECLAIMED_FROM: "u", holds.ANN_RECLAIMED_AT: "1000.000"}
    given = holds.given_rooms(
        [("t/t0", "t", ann), ("t/t1", "t", {}), ("u/u0", "u", ann)], now=1010.0, keep=3600.0
    )
    assert [(g.pod, g.tenant, g.until) for g in given] == [
        ("t/t0", "t", 4600.0),
        ("u/u0", "u", 4600.0),
    ]
    args: dict[str, Any] = {
        "config": w.cfg,
        "state": w.state,
        "pending": w.pending,
        "req": w.pending[0],
        "namespace": "u",
        "name": "u1",
        "quota": StaticView(),
        "admission": report.AdmissionVerdict(True),
    }
    out = report.explain_pod(**args, given=given)
    # t holds 3 GPUs, above its fair share of 2; u's own record does not count.
    assert out["extender"]["noTakeBack"] == [
        {"tenant": "t", "pods": ["t/t0"], "until": "1970-01-01T01:16:40Z"}
    ]
    text = report_render.render_explain_text(out)
    assert "no take-back: tenant t is above its fair share" in text
    assert "noTakeBack" not in report.explain_pod(**args)["extender"]  # no record
