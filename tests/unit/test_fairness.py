"""Weighted DRF: dominant shares, progressive filling and the gate."""

from __future__ import annotations

import math

import pytest

from fairshare import fairness, gate
from fairshare.fairness import CurrentShare, ShareAfter, TenantDemand
from fairshare.gate import Contender

CAP = (9.0, 18.0)  # the DRF paper's cluster: 9 CPU, 18 GB
RW = (1.0, 1.0)


def test_dominant_shares_weighted():
    # A uses <3 CPU, 12 GB>: max(3/9, 12/18) = 2/3; B <6, 2>: max(6/9, 2/18) = 2/3, weight 2
    got = fairness.dominant_shares(
        used={"A": [3.0, 12.0], "B": [6.0, 2.0]},
        capacity=CAP,
        res_weights=RW,
        tenant_weights={"A": 1.0, "B": 2.0},
    )
    assert got["A"] == pytest.approx(2 / 3)
    assert got["B"] == pytest.approx(1 / 3)


def test_drf_paper_allocation():
    # Ghodsi et al.: A's tasks <1, 4>, B's <3, 1>; DRF gives A 3 tasks, B 2 (both 2/3).
    res = fairness.fair_allocation(
        [
            TenantDemand("A", 1.0, (10.0, 40.0), {}, {}),
            TenantDemand("B", 1.0, (30.0, 10.0), {}, {}),
        ],
        capacity=CAP,
        res_weights=RW,
    )
    assert res["A"].allocation == pytest.approx((3.0, 12.0))
    assert res["B"].allocation == pytest.approx((6.0, 2.0))
    assert res["A"].share == pytest.approx(2 / 3)
    assert res["B"].share == pytest.approx(2 / 3)


def test_weights_tilt_the_allocation():
    # one resource, capacity 9, both want 9; weight 2 gets twice as much: 6 vs 3
    res = fairness.fair_allocation(
        [TenantDemand("a", 2.0, (9.0,), {}, {}), TenantDemand("b", 1.0, (9.0,), {}, {})],
        capacity=(9.0,),
        res_weights=(1.0,),
    )
    assert res["a"].allocation[0] == pytest.approx(6.0)
    assert res["b"].allocation[0] == pytest.approx(3.0)


def test_work_conserving_when_one_tenant_wants_little():
    # a wants only 2 of 10; b may borrow the rest: 8
    res = fairness.fair_allocation(
        [TenantDemand("a", 1.0, (2.0,), {}, {}), TenantDemand("b", 1.0, (20.0,), {}, {})],
        capacity=(10.0,),
        res_weights=(1.0,),
    )
    assert res["a"].allocation[0] == pytest.approx(2.0)
    assert res["b"].allocation[0] == pytest.approx(8.0)


def test_limit_caps_and_others_take_the_rest():
    # a limited to 3 (of 10); b gets 7
    res = fairness.fair_allocation(
        [TenantDemand("a", 1.0, (10.0,), {}, {0: 3.0}), TenantDemand("b", 1.0, (10.0,), {}, {})],
        capacity=(10.0,),
        res_weights=(1.0,),
    )
    assert res["a"].allocation[0] == pytest.approx(3.0)
    assert res["b"].allocation[0] == pytest.approx(7.0)


def test_guaranteed_is_honoured_first():
    # a guaranteed 8 of 10 with weight 1; equal filling alone would give 5/5
    res = fairness.fair_allocation(
        [TenantDemand("a", 1.0, (10.0,), {0: 8.0}, {}), TenantDemand("b", 1.0, (10.0,), {}, {})],
        capacity=(10.0,),
        res_weights=(1.0,),
    )
    assert res["a"].allocation[0] == pytest.approx(8.0)
    assert res["b"].allocation[0] == pytest.approx(2.0)


def test_guarantees_above_capacity_scale_down_together():
    res = fairness.fair_allocation(
        [
            TenantDemand("a", 1.0, (10.0,), {0: 8.0}, {}),
            TenantDemand("b", 1.0, (10.0,), {0: 8.0}, {}),
        ],
        capacity=(10.0,),
        res_weights=(1.0,),
    )
    total = res["a"].allocation[0] + res["b"].allocation[0]
    assert total == pytest.approx(10.0)
    assert res["a"].allocation[0] == pytest.approx(5.0)


def test_a_zero_capacity_resource_is_ignored_even_when_used():
    # GPUs offered only through DRA (or storage with no capacity): the arrays have none
    # of it, so the share is measured on the other resources, never +inf.
    got = fairness.dominant_shares(
        used={"a": [1.0, 2.0], "b": [0.0, 0.0]},
        capacity=(0.0, 4.0),
        res_weights=(1.0, 1.0),
        tenant_weights={},
    )
    assert got == {"a": 0.5, "b": 0.0}


def test_fair_allocation_grows_past_a_zero_capacity_resource():
    tenants = [
        fairness.TenantDemand("a", 1.0, (1000.0, 6.0), {}, {}),
        fairness.TenantDemand("b", 1.0, (0.0, 6.0), {}, {}),
    ]
    res = fairness.fair_allocation(tenants, capacity=(0.0, 8.0), res_weights=(1.0, 1.0))
    assert [res[t].allocation[1] for t in "ab"] == pytest.approx([4.0, 4.0])
    assert all(math.isfinite(res[t].share) for t in "ab")


@pytest.mark.parametrize(
    ("after", "contenders", "allowed", "waiting_for"),
    [
        # within its fair share: always allowed
        (0.30, [Contender("b", CurrentShare(0.0), True)], True, None),
        # above fair share, but the lower-share tenant has nothing that fits: allowed
        (0.50, [Contender("b", CurrentShare(0.1), False)], True, None),
        # above fair share and b (lower share) has a fitting pod: wait for b
        (0.50, [Contender("b", CurrentShare(0.1), True)], False, "b"),
        # contenders with a higher share do not hold the pod back
        (0.50, [Contender("b", CurrentShare(0.5), True)], True, None),
        # equal share: the smaller name goes first ("a" < "m")
        (0.50, [Contender("a", CurrentShare(0.3), True)], False, "a"),
        (0.50, [Contender("z", CurrentShare(0.3), True)], True, None),
    ],
    ids=[
        "under-fair",
        "no-fitting-contender",
        "waits",
        "higher-contender",
        "tie-smaller",
        "tie-larger",
    ],
)
def test_gate(after, contenders, allowed, waiting_for):
    d = gate.check_gate(
        tenant="m",
        current_share=CurrentShare(0.3),
        share_after=ShareAfter(after),
        fair_share=0.33,
        contenders=contenders,
    )
    assert d.allowed is allowed
    assert d.waiting_for == waiting_for
    if not allowed:
        assert (
            d.reason
            == f"tenant m above its fair share ({after:.2f} > 0.33) while {waiting_for} waits"
        )


def test_jain_index():
    assert fairness.jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    # (1 + 0)^2 / (2 * 1) = 0.5
    assert fairness.jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert fairness.jain_index([]) == 1.0
