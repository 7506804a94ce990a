"""Behaviour of ``drf.dominant_shares`` (DRF, Ghodsi et al. NSDI'11), run once per
implementation through the ``impl`` fixture. Expected values are worked out in the
comments; ``used`` is tenants × resources, row-major.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from .conftest import KernelImplementation, d, zeros_d

INF = math.inf


@dataclass(frozen=True)
class Case:
    used: list[list[float]]
    capacity: list[float]
    want: list[float]
    res_weights: list[float] | None = None  # default: 1 per resource
    tenant_weights: list[float] | None = None  # default: 1 per tenant


CASES = {
    "one tenant, memory dominates": Case(
        # cpu 2/10 = 0.2, mem 4/8 = 0.5 -> 0.5
        used=[[2, 4]],
        capacity=[10, 8],
        want=[0.5],
    ),
    "two tenants, one weighted 2": Case(
        # t0: max(0.2, 0.5) = 0.5; t1: max(6/10, 2/8) = 0.6, / weight 2 = 0.3
        used=[[2, 4], [6, 2]],
        capacity=[10, 8],
        tenant_weights=[1, 2],
        want=[0.5, 0.3],
    ),
    "resource weight makes cpu dominant": Case(
        # cpu 3 * 2/10 = 0.6, mem 1 * 4/8 = 0.5 -> 0.6
        used=[[2, 4]],
        capacity=[10, 8],
        res_weights=[3, 1],
        want=[0.6],
    ),
    "tenant weight below one raises the share": Case(
        # 4/8 = 0.5, / 0.25 = 2.0 (a share may exceed 1 after weighting)
        used=[[0, 4]],
        capacity=[10, 8],
        tenant_weights=[0.25],
        want=[2.0],
    ),
    "zero capacity, unused: ignored": Case(
        # gpu column has capacity 0 and usage 0 -> only cpu counts: 5/10 = 0.5
        used=[[5, 0]],
        capacity=[10, 0],
        want=[0.5],
    ),
    "zero capacity, used: +inf": Case(
        # usage of a resource the cluster does not have -> +inf, whatever else
        used=[[5, 1], [5, 0]],
        capacity=[10, 0],
        want=[INF, 0.5],
    ),
    "zero capacity, used, zero resource weight: ignored": Case(
        # the resource does not count at all -> cpu 5/10 = 0.5
        used=[[5, 1]],
        capacity=[10, 0],
        res_weights=[1, 0],
        want=[0.5],
    ),
    "zero resource weight hides the dominant resource": Case(
        # cpu 9/10 has weight 0 -> mem 2/8 = 0.25
        used=[[9, 2]],
        capacity=[10, 8],
        res_weights=[0, 1],
        want=[0.25],
    ),
    "no usage: share 0": Case(
        used=[[0, 0]],
        capacity=[10, 8],
        want=[0.0],
    ),
    "zero tenant weight with usage: +inf": Case(
        # share 0.5 > 0, weight 0 -> +inf (kueue: zero weight while borrowing)
        used=[[5, 0]],
        capacity=[10, 8],
        tenant_weights=[0],
        want=[INF],
    ),
    "zero tenant weight without usage: 0": Case(
        used=[[0, 0]],
        capacity=[10, 8],
        tenant_weights=[0],
        want=[0.0],
    ),
    "all-equal tenants tie": Case(
        # each 3/12 = 0.25
        used=[[3, 1], [3, 1], [3, 1]],
        capacity=[12, 8],
        want=[0.25, 0.25, 0.25],
    ),
    "whole cluster": Case(
        used=[[10, 8]],
        capacity=[10, 8],
        want=[1.0],
    ),
    "huge quantities (bytes)": Case(
        # 2^60 / 2^62 = 0.25 and 2^40 / 2^41 = 0.5: exact in float64
        used=[[2.0**60, 2.0**40]],
        capacity=[2.0**62, 2.0**41],
        want=[0.5],
    ),
    "six resources, last dominates": Case(
        # 1/10, 1/10, 1/10, 1/10, 1/10, 7/8 = 0.875
        used=[[1, 1, 1, 1, 1, 7]],
        capacity=[10, 10, 10, 10, 10, 8],
        want=[0.875],
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_dominant_shares(impl: KernelImplementation, case: Case) -> None:
    n_t, n_r = len(case.used), len(case.capacity)
    out = zeros_d(n_t)
    res_w = case.res_weights or [1.0] * n_r
    ten_w = case.tenant_weights or [1.0] * n_t
    flat = [x for row in case.used for x in row]
    result = impl.drf.dominant_shares(
        d(*flat), d(*case.capacity), d(*res_w), d(*ten_w), n_t, n_r, out
    )
    assert result is None
    assert list(out) == pytest.approx(case.want, rel=1e-12)


def test_no_tenants_writes_nothing(impl: KernelImplementation) -> None:
    out = zeros_d(1)
    impl.drf.dominant_shares(d(), d(1, 1), d(1, 1), d(), 0, 2, out)
    assert list(out) == [12345.0]


def test_keywords(impl: KernelImplementation) -> None:
    out = zeros_d(1)
    impl.drf.dominant_shares(
        out=out,
        n_res=2,
        n_tenants=1,
        tenant_weights=d(2),
        res_weights=d(1, 1),
        capacity=d(10, 8),
        used=d(2, 4),
    )
    assert list(out) == [0.25]  # max(0.2, 0.5) / 2


def test_accepts_memoryview(impl: KernelImplementation) -> None:
    out = zeros_d(1)
    impl.drf.dominant_shares(
        memoryview(d(2, 4)), memoryview(d(10, 8)), d(1, 1), d(1), 1, 2, memoryview(out)
    )
    assert list(out) == [0.5]
