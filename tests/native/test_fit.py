"""Behaviour of ``fit.fit_nodes``, run once per implementation through ``impl``.

Columns are (cpu milli, memory bytes, gpu milli) unless said otherwise; ``dev`` is the
per-device free milli-GPU (``-1`` = no device in that slot). ``want`` is ``out`` per node:
-1 fits, ``r`` = first short column, 3 (= n_res) = no room on the devices.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from .conftest import KernelImplementation, d, zeros_i

GiB = 2**30


@dataclass(frozen=True)
class Case:
    free: list[list[float]]
    dev: list[list[float]]
    demand: list[float]
    want: list[int]
    gpu_milli: float = 0.0
    gpu_count: int = 0


CASES = {
    "fits, cpu only": Case(
        free=[[4000, 8 * GiB, 0]],
        dev=[[-1, -1]],
        demand=[2000, 4 * GiB, 0],
        want=[-1],
    ),
    "exact fit": Case(
        # demand == free in every column: fits (the test is demand > free)
        free=[[2000, 4 * GiB, 1000]],
        dev=[[1000, -1]],
        demand=[2000, 4 * GiB, 1000],
        gpu_milli=1000,
        gpu_count=1,
        want=[-1],
    ),
    "cpu short": Case(
        free=[[1000, 8 * GiB, 0]],
        dev=[[-1, -1]],
        demand=[2000, 4 * GiB, 0],
        want=[0],
    ),
    "memory short": Case(
        free=[[4000, 2 * GiB, 0]],
        dev=[[-1, -1]],
        demand=[2000, 4 * GiB, 0],
        want=[1],
    ),
    "cpu and memory short: first column reported": Case(
        free=[[1000, 2 * GiB, 0]],
        dev=[[-1, -1]],
        demand=[2000, 4 * GiB, 0],
        want=[0],
    ),
    "gpu column short before the device check": Case(
        # free gpu 400 < 500 -> column 2, not n_res
        free=[[4000, 8 * GiB, 400]],
        dev=[[400, -1]],
        demand=[2000, 4 * GiB, 500],
        gpu_milli=500,
        gpu_count=1,
        want=[2],
    ),
    "enough gpu in total but on no single device": Case(
        # 400 + 400 = 800 >= 500 in the column, but no device has 500 -> n_res = 3
        free=[[4000, 8 * GiB, 800]],
        dev=[[400, 400]],
        demand=[2000, 4 * GiB, 500],
        gpu_milli=500,
        gpu_count=1,
        want=[3],
    ),
    "fractional fits on the second device": Case(
        free=[[4000, 8 * GiB, 900]],
        dev=[[400, 500]],
        demand=[2000, 4 * GiB, 500],
        gpu_milli=500,
        gpu_count=1,
        want=[-1],
    ),
    "two whole gpus out of four slots": Case(
        # devices 0 and 3 are fully free
        free=[[4000, 8 * GiB, 2500]],
        dev=[[1000, 500, 0, 1000]],
        demand=[2000, 4 * GiB, 2000],
        gpu_milli=1000,
        gpu_count=2,
        want=[-1],
    ),
    "two whole gpus, only one free device": Case(
        free=[[4000, 8 * GiB, 2000]],
        dev=[[1000, 500, 500, -1]],
        demand=[2000, 4 * GiB, 2000],
        gpu_milli=1000,
        gpu_count=2,
        want=[3],
    ),
    "absent devices never count, even for a zero-milli request": Case(
        # gpu_milli 0 count 1: -1 >= 0 is false by construction; a 0-free device counts
        free=[[4000, 8 * GiB, 0], [4000, 8 * GiB, 0]],
        dev=[[-1, -1], [0, -1]],
        demand=[0, 0, 0],
        gpu_milli=0,
        gpu_count=1,
        want=[3, -1],
    ),
    "gpu_count 0 skips the device check": Case(
        free=[[4000, 8 * GiB, 0]],
        dev=[[-1, -1]],
        demand=[2000, 4 * GiB, 0],
        gpu_milli=1000,
        gpu_count=0,
        want=[-1],
    ),
    "huge quantities (4 PiB of memory)": Case(
        free=[[4000, 2.0**52, 0], [4000, 2.0**52 - 1, 0]],
        dev=[[-1], [-1]],
        demand=[0, 2.0**52, 0],
        want=[-1, 1],
    ),
    "all-equal nodes": Case(
        free=[[4000, 8 * GiB, 1000]] * 3,
        dev=[[1000, -1]] * 3,
        demand=[1000, GiB, 1000],
        gpu_milli=1000,
        gpu_count=1,
        want=[-1, -1, -1],
    ),
    "mixed cluster": Case(
        # node 0 fits, node 1 cpu short, node 2 no device with 1000, node 3 fits
        free=[
            [8000, 8 * GiB, 1000],
            [500, 8 * GiB, 1000],
            [8000, 8 * GiB, 1000],
            [8000, 8 * GiB, 3000],
        ],
        dev=[[1000, -1, -1], [1000, -1, -1], [500, 500, -1], [1000, 1000, 1000]],
        demand=[1000, GiB, 1000],
        gpu_milli=1000,
        gpu_count=1,
        want=[-1, 0, 3, -1],
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_fit_nodes(impl: KernelImplementation, case: Case) -> None:
    n, r, max_dev = len(case.free), len(case.demand), len(case.dev[0])
    out = zeros_i(n)
    n_fit = impl.fit.fit_nodes(
        d(*[x for row in case.free for x in row]),
        d(*[x for row in case.dev for x in row]),
        d(*case.demand),
        n,
        r,
        max_dev,
        case.gpu_milli,
        case.gpu_count,
        out,
    )
    assert list(out) == case.want
    assert n_fit == case.want.count(-1)


def test_no_nodes(impl: KernelImplementation) -> None:
    out = zeros_i(1)
    assert impl.fit.fit_nodes(d(), d(), d(1, 1), 0, 2, 4, 500.0, 1, out) == 0
    assert list(out) == [12345]


def test_no_device_slots(impl: KernelImplementation) -> None:
    # max_dev 0: a GPU pod never fits, a CPU pod is unaffected
    out = zeros_i(1)
    assert impl.fit.fit_nodes(d(4, 4), d(), d(1, 1), 1, 2, 0, 500.0, 1, out) == 0
    assert list(out) == [2]
    assert impl.fit.fit_nodes(d(4, 4), d(), d(1, 1), 1, 2, 0, 0.0, 0, out) == 1
    assert list(out) == [-1]


def test_keywords(impl: KernelImplementation) -> None:
    out = zeros_i(2)
    n_fit = impl.fit.fit_nodes(
        out=out,
        gpu_count=1,
        gpu_milli=500.0,
        max_dev=1,
        n_res=1,
        n_nodes=2,
        demand=d(500),
        dev_free=d(500, 200),
        free=d(500, 500),
    )
    assert (n_fit, list(out)) == (1, [-1, 1])
