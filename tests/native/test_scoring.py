"""Behaviour of the ``scoring`` kernels, run once per implementation through ``impl``.

Expected values are worked out in the comments. FGD follows §3 of
``shared/data/openb/ANCHORS.md`` (Weng et al., ATC'23); besides the hand-worked cases,
seeded random clusters are checked against a naive recomputation of that formula.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from .conftest import KernelImplementation, b, d, q, zeros_d, zeros_i

INF = math.inf


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


# --- bestfit ---------------------------------------------------------------------------
# Columns (cpu milli, gpu milli); norm 128 cores and 8 GPUs, weights 0.5 each (the
# paper's BestFit), unless said otherwise.


@dataclass(frozen=True)
class BestFitCase:
    free: list[list[float]]
    demand: list[float]
    want: list[float]
    norm: list[float] = field(default_factory=lambda: [128000.0, 8000.0])
    weights: list[float] = field(default_factory=lambda: [0.5, 0.5])
    mask: list[int] | None = None


BESTFIT = {
    "quarter left": BestFitCase(
        # leftover (32000, 2000): 0.5*32000/128000 + 0.5*2000/8000 = 0.25, / Σw 1 -> 0.75
        free=[[64000, 4000]],
        demand=[32000, 2000],
        want=[0.75],
    ),
    "exact fit scores 1": BestFitCase(
        free=[[32000, 2000]],
        demand=[32000, 2000],
        want=[1.0],
    ),
    "empty max node scores 0": BestFitCase(
        # leftover (128000, 8000) -> 0.5 + 0.5 = 1 -> 0
        free=[[128000, 8000]],
        demand=[0, 0],
        want=[0.0],
    ),
    "leftover beyond norm clamps to 0": BestFitCase(
        # 0.5*256000/128000 + 0.5 = 1.5 -> -0.5 -> 0
        free=[[256000, 8000]],
        demand=[0, 0],
        want=[0.0],
    ),
    "negative leftover clamps to 1": BestFitCase(
        # pod does not fit: 0.5*(-1000)/128000 < 0 -> 1.0..., clamped to 1
        free=[[1000, 0]],
        demand=[2000, 0],
        want=[1.0],
    ),
    "zero norm drops a resource": BestFitCase(
        # only gpu: 0.5*2000/8000 = 0.125, / Σw 0.5 = 0.25 -> 0.75
        free=[[64000, 4000]],
        demand=[0, 2000],
        norm=[0, 8000],
        want=[0.75],
    ),
    "zero weight drops a resource": BestFitCase(
        # only cpu: 1*32000/128000 = 0.25, / 1 -> 0.75
        free=[[64000, 4000]],
        demand=[32000, 0],
        weights=[1, 0],
        want=[0.75],
    ),
    "all weights zero scores 0": BestFitCase(
        free=[[64000, 4000]],
        demand=[32000, 2000],
        weights=[0, 0],
        want=[0.0],
    ),
    "masked nodes get -1": BestFitCase(
        free=[[64000, 4000], [64000, 4000], [64000, 4000]],
        demand=[32000, 2000],
        mask=[0, 1, 0],
        want=[-1.0, 0.75, -1.0],
    ),
    "all-equal nodes tie": BestFitCase(
        free=[[64000, 4000]] * 4,
        demand=[32000, 2000],
        want=[0.75] * 4,
    ),
    "tighter node wins": BestFitCase(
        # node 0 leftover (0, 1000): 0.5*1000/8000 = 0.0625 -> 0.9375
        # node 1 leftover (64000, 6000): 0.25 + 0.375 = 0.625 -> 0.375
        free=[[8000, 2000], [72000, 7000]],
        demand=[8000, 1000],
        want=[0.9375, 0.375],
    ),
    "huge quantities (memory bytes)": BestFitCase(
        # one column, norm 2^50 bytes, leftover 2^48 -> 1 - 0.25 = 0.75
        free=[[2.0**49]],
        demand=[2.0**48],
        norm=[2.0**50],
        weights=[1.0],
        want=[0.75],
    ),
}


@pytest.mark.parametrize("case", list(BESTFIT.values()), ids=list(BESTFIT))
def test_bestfit_scores(impl: KernelImplementation, case: BestFitCase) -> None:
    n, r = len(case.free), len(case.demand)
    out = zeros_d(n)
    mask = case.mask or [1] * n
    impl.scoring.bestfit_scores(
        d(*flat(case.free)), d(*case.demand), d(*case.norm), d(*case.weights), b(*mask), n, r, out
    )
    assert list(out) == pytest.approx(case.want, rel=1e-12)


# --- drfh ------------------------------------------------------------------------------
# Columns (cpu, gpu); capacity per node.


@dataclass(frozen=True)
class DrfhCase:
    free: list[list[float]]
    capacity: list[list[float]]
    demand: list[float]
    want: list[float]
    mask: list[int] | None = None


DRFH = {
    "same shape scores 1": DrfhCase(
        # a = (0.25, 0.25)/0.25 = (1, 1); b = (0.5, 0.5)/0.5 = (1, 1) -> 1 - 0 = 1
        free=[[4, 4]],
        capacity=[[8, 8]],
        demand=[2, 2],
        want=[1.0],
    ),
    "crossed shapes": DrfhCase(
        # a = (0.2, 0.4)/0.4 = (0.5, 1); b = (1, 0.5)/1 -> |0.5-1| + |1-0.5| = 1 -> 1 - 1/2
        free=[[10, 5]],
        capacity=[[10, 10]],
        demand=[2, 4],
        want=[0.5],
    ),
    "cpu pod on a gpu-rich node": DrfhCase(
        # a = (0.1, 0)/0.1 = (1, 0); b = (0.1, 1)/1 -> 0.9 + 1 = 1.9 -> 1 - 0.95 = 0.05
        free=[[1, 10]],
        capacity=[[10, 10]],
        demand=[1, 0],
        want=[0.05],
    ),
    "zero demand: no preference": DrfhCase(
        free=[[5, 5]],
        capacity=[[10, 10]],
        demand=[0, 0],
        want=[0.5],
    ),
    "nothing free: no preference": DrfhCase(
        free=[[0, 0]],
        capacity=[[10, 10]],
        demand=[1, 1],
        want=[0.5],
    ),
    "zero-capacity resource ignored": DrfhCase(
        # gpu capacity 0 -> only cpu, n = 1: a = (0.2)/0.2 = 1, b = (0.5)/0.5 = 1 -> 1
        free=[[5, 0]],
        capacity=[[10, 0]],
        demand=[2, 1],
        want=[1.0],
    ),
    "no capacity at all: no preference": DrfhCase(
        free=[[0, 0]],
        capacity=[[0, 0]],
        demand=[1, 1],
        want=[0.5],
    ),
    "overcommitted node clamps to 0": DrfhCase(
        # a = (0, 1); b = (1, -1) -> 1 + 2 = 3 -> 1 - 1.5 = -0.5 -> 0
        free=[[10, -10]],
        capacity=[[10, 10]],
        demand=[0, 10],
        want=[0.0],
    ),
    "per-node capacity and mask": DrfhCase(
        # node 0 masked; node 1: a = (4/8, 2/4) = (0.5, 0.5)/0.5 = (1, 1),
        # b = (4/8, 1/4)/0.5 = (1, 0.5) -> 0.5 -> 1 - 0.25 = 0.75
        free=[[1, 1], [4, 1]],
        capacity=[[4, 4], [8, 4]],
        demand=[4, 2],
        mask=[0, 1],
        want=[-1.0, 0.75],
    ),
    "huge quantities": DrfhCase(
        # a = (2^40/2^42, 2^41/2^42) = (0.25, 0.5)/0.5 = (0.5, 1); b = (1, 1) -> 0.5 -> 0.75
        free=[[2.0**42, 2.0**42]],
        capacity=[[2.0**42, 2.0**42]],
        demand=[2.0**40, 2.0**41],
        want=[0.75],
    ),
}


@pytest.mark.parametrize("case", list(DRFH.values()), ids=list(DRFH))
def test_drfh_scores(impl: KernelImplementation, case: DrfhCase) -> None:
    n, r = len(case.free), len(case.demand)
    out = zeros_d(n)
    mask = case.mask or [1] * n
    impl.scoring.drfh_scores(
        d(*flat(case.free)), d(*flat(case.capacity)), d(*case.demand), b(*mask), n, r, out
    )
    assert list(out) == pytest.approx(case.want, rel=1e-12, abs=1e-15)


# --- stranding -------------------------------------------------------------------------
# Columns (cpu cores, memory GiB, gpus), gpu_col 2 unless said otherwise.


@dataclass(frozen=True)
class StrandingCase:
    free: list[list[float]]
    capacity: list[list[float]]
    demand: list[float]
    want: list[float]
    gpu_col: int = 2
    mask: list[int] | None = None


STRANDING = {
    "gpu pod is never penalised": StrandingCase(
        free=[[1, 1, 8]],
        capacity=[[64, 256, 8]],
        demand=[60, 250, 1],
        want=[1.0],
    ),
    "node without free gpu": StrandingCase(
        free=[[32, 128, 0]],
        capacity=[[64, 256, 8]],
        demand=[30, 120, 0],
        want=[1.0],
    ),
    "node without gpu capacity": StrandingCase(
        free=[[32, 128, 0]],
        capacity=[[64, 256, 0]],
        demand=[30, 120, 0],
        want=[1.0],
    ),
    "cpu pod halves what the free gpus need": StrandingCase(
        # g = 8/8 = 1; m = min((32-16)/64, (128-64)/256) = 0.25 -> 1 - 0.75 = 0.25
        free=[[32, 128, 8]],
        capacity=[[64, 256, 8]],
        demand=[16, 64, 0],
        want=[0.25],
    ),
    "plenty left for the free gpus": StrandingCase(
        # g = 2/8 = 0.25; m = min(56/64, 224/256) = 0.875 -> g - m < 0 -> 1
        free=[[64, 256, 2]],
        capacity=[[64, 256, 8]],
        demand=[8, 32, 0],
        want=[1.0],
    ),
    "pod that does not fit clamps to 0": StrandingCase(
        # g = 1; m = min(-4/64, 256/256) = -0.0625 -> 1 - 1.0625 < 0 -> 0
        free=[[4, 256, 8]],
        capacity=[[64, 256, 8]],
        demand=[8, 0, 0],
        want=[0.0],
    ),
    "zero-capacity resource skipped": StrandingCase(
        # cpu capacity 0 -> m = (128-64)/256 = 0.25; g = 1 -> 0.25
        free=[[0, 128, 8]],
        capacity=[[0, 256, 8]],
        demand=[0, 64, 0],
        want=[0.25],
    ),
    "no other resource with capacity": StrandingCase(
        # m = +inf -> g - m = -inf -> 1
        free=[[0, 0, 8]],
        capacity=[[0, 0, 8]],
        demand=[0, 0, 0],
        want=[1.0],
    ),
    "gpu in column 0": StrandingCase(
        # g = 4/8 = 0.5; m = min((32-8)/64, (128-0)/256) = 0.375 -> 1 - 0.125 = 0.875
        free=[[4, 32, 128]],
        capacity=[[8, 64, 256]],
        demand=[0, 8, 0],
        gpu_col=0,
        want=[0.875],
    ),
    "masked and tied nodes": StrandingCase(
        free=[[32, 128, 8]] * 3,
        capacity=[[64, 256, 8]] * 3,
        demand=[16, 64, 0],
        mask=[1, 0, 1],
        want=[0.25, -1.0, 0.25],
    ),
}


@pytest.mark.parametrize("case", list(STRANDING.values()), ids=list(STRANDING))
def test_stranding_scores(impl: KernelImplementation, case: StrandingCase) -> None:
    n, r = len(case.free), len(case.demand)
    out = zeros_d(n)
    mask = case.mask or [1] * n
    impl.scoring.stranding_scores(
        d(*flat(case.free)),
        d(*flat(case.capacity)),
        d(*case.demand),
        case.gpu_col,
        b(*mask),
        n,
        r,
        out,
    )
    assert list(out) == pytest.approx(case.want, rel=1e-12)


# --- FGD -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskClass:
    """One class m of the target workload: (c_m, d_m, k_m, S_m) and popularity p_m."""

    cpu: float
    milli: float
    count: int
    pop: float
    models: tuple[int, ...] = ()  # allowed GPU model ids; () = any


@dataclass(frozen=True)
class Node:
    dev: list[float]  # free milli per device slot, -1 = absent
    cpu: float
    model: int = 3


def class_buffers(classes: list[TaskClass]) -> tuple[object, ...]:
    """(cls_cpu, cls_gpu_milli, cls_gpu_count, cls_models, cls_pop, n_classes)."""
    return (
        d(*[c.cpu for c in classes]),
        d(*[c.milli for c in classes]),
        q(*[c.count for c in classes]),
        q(*[sum(1 << m for m in c.models) for c in classes]),
        d(*[c.pop for c in classes]),
        len(classes),
    )


def node_buffers(nodes: list[Node]) -> tuple[object, ...]:
    """(dev_free, max_dev, node_cpu_free, node_model)."""
    max_dev = max(len(n.dev) for n in nodes)
    dev = [x for n in nodes for x in n.dev + [-1.0] * (max_dev - len(n.dev))]
    return (
        d(*dev),
        max_dev,
        d(*[n.cpu for n in nodes]),
        q(*[n.model for n in nodes]),
    )


def node_frag(
    impl: KernelImplementation, nodes: list[Node], classes: list[TaskClass]
) -> list[float]:
    dev, max_dev, cpu, model = node_buffers(nodes)
    out = zeros_d(len(nodes))
    total = impl.scoring.fgd_node_frag(
        dev, max_dev, cpu, model, len(nodes), *class_buffers(classes), out
    )
    assert total == pytest.approx(sum(out), rel=1e-12)
    return list(out)


def fgd(
    impl: KernelImplementation,
    nodes: list[Node],
    classes: list[TaskClass],
    pod: tuple[float, float, int],
    mask: list[int] | None = None,
) -> tuple[list[float], list[int]]:
    dev, max_dev, cpu, model = node_buffers(nodes)
    out_delta, out_device = zeros_d(len(nodes)), zeros_i(len(nodes))
    impl.scoring.fgd_scores(
        dev,
        max_dev,
        cpu,
        model,
        b(*(mask or [1] * len(nodes))),
        len(nodes),
        *pod,
        *class_buffers(classes),
        out_delta,
        out_device,
    )
    return list(out_delta), list(out_device)


# The small node of the hand-worked cases: two GPUs, 1000 and 500 milli free
# (Rtot = 1500), 8 cores free, GPU model 3.
NODE = Node(dev=[1000, 500], cpu=8000, model=3)

FRAG_ONE_CLASS = {
    # F_n(m) for a single class with p = 1, one case per branch of ANCHORS §3
    "cpu-only class: all idle gpu": (NODE, TaskClass(2000, 0, 0, 1.0), 1500.0),
    "model excluded": (NODE, TaskClass(2000, 500, 1, 1.0, models=(5,)), 1500.0),
    "model allowed among several": (NODE, TaskClass(2000, 500, 1, 1.0, models=(1, 3)), 0.0),
    "unknown node model vs constrained class": (
        Node([1000, 500], 8000, model=-1),
        TaskClass(2000, 500, 1, 1.0, models=(3,)),
        1500.0,
    ),
    "unknown node model vs any-model class": (
        Node([1000, 500], 8000, model=-1),
        TaskClass(2000, 500, 1, 1.0),
        0.0,
    ),
    # fits: only devices below d_m are fragments
    "fits, no device too small": (NODE, TaskClass(2000, 500, 1, 1.0), 0.0),
    "fits, 500 below 700": (NODE, TaskClass(2000, 700, 1, 1.0), 500.0),
    "fits, whole gpu, 500 below 1000": (NODE, TaskClass(2000, 1000, 1, 1.0), 500.0),
    "fits, exact cpu": (NODE, TaskClass(8000, 700, 1, 1.0), 500.0),
    # does not fit: everything idle is fragment
    "lacks gpu count": (NODE, TaskClass(2000, 1000, 2, 1.0), 1500.0),
    "lacks gpu size": (NODE, TaskClass(2000, 1500, 1, 1.0), 1500.0),
    "lacks cpu": (NODE, TaskClass(16000, 500, 1, 1.0), 1500.0),
    "absent slot not counted": (Node([1000, -1], 8000), TaskClass(2000, 0, 0, 1.0), 1000.0),
    "no devices at all": (Node([-1, -1], 8000), TaskClass(2000, 500, 1, 1.0), 0.0),
    "huge cpu numbers": (Node([1000, 250], 2.0**60), TaskClass(2.0**59, 500, 1, 1.0), 250.0),
}


@pytest.mark.parametrize(
    ("node", "cls", "want"), list(FRAG_ONE_CLASS.values()), ids=list(FRAG_ONE_CLASS)
)
def test_fgd_node_frag_branches(
    impl: KernelImplementation, node: Node, cls: TaskClass, want: float
) -> None:
    assert node_frag(impl, [node], [cls]) == [want]


# Two-class workload for the node above:
#   A: 2 cores, 500 milli x1, any model, p 0.5
#   B: 4 cores, 1000 milli x1, model 3 only, p 0.5
TWO = [TaskClass(2000, 500, 1, 0.5), TaskClass(4000, 1000, 1, 0.5, models=(3,))]


def test_fgd_node_frag_two_classes(impl: KernelImplementation) -> None:
    # F(A) = 0 (both devices >= 500); F(B) = 500 (fits on device 0, device 1 < 1000)
    # node 0: 0.5*0 + 0.5*500 = 250; node 1 (model 7, B excluded): 0.5*0 + 0.5*1500 = 750;
    # node 2 (no GPUs) 0; total 1000
    nodes = [NODE, Node([1000, 500], 8000, model=7), Node([-1, -1], 64000)]
    assert node_frag(impl, nodes, TWO) == [250.0, 750.0, 0.0]


def test_fgd_node_frag_no_classes(impl: KernelImplementation) -> None:
    assert node_frag(impl, [NODE], []) == [0.0]


@dataclass(frozen=True)
class FgdCase:
    nodes: list[Node]
    classes: list[TaskClass]
    pod: tuple[float, float, int]  # (cpu milli, milli per gpu, gpu count)
    want_delta: list[float]
    want_device: list[int]
    mask: list[int] | None = None


FGD_CASES = {
    "fractional: picks the device that keeps a whole gpu": FgdCase(
        # before: F = 250 (above). Device 0 -> [500, 500]: A 0, B lacks 1000 -> 1000;
        # F' = 500, Δ = -250. Device 1 -> [1000, 0]: A 0 (1000 >= 500, 0 < 500 adds 0),
        # B 0; F' = 0, Δ = 250. Best: device 1, Δ = 250.
        nodes=[NODE],
        classes=TWO,
        pod=(1000.0, 500.0, 1),
        want_delta=[250.0],
        want_device=[1],
    ),
    "fractional: same free value, lowest index": FgdCase(
        # [1000, 1000]: both candidates equal -> device 0. Before: A 0, B 0 -> 0.
        # After [500, 1000]: A 0, B 500 -> F' = 250, Δ = -250
        nodes=[Node([1000, 1000], 8000)],
        classes=TWO,
        pod=(1000.0, 500.0, 1),
        want_delta=[-250.0],
        want_device=[0],
    ),
    "fractional: equal deltas, lowest index": FgdCase(
        # CPU-only class only: F = Rtot; taking 500 anywhere gives Δ = 500 -> device 0
        nodes=[Node([1000, 700], 8000)],
        classes=[TaskClass(1000, 0, 0, 1.0)],
        pod=(0.0, 500.0, 1),
        want_delta=[500.0],
        want_device=[0],
    ),
    "fractional: skips too-small and absent devices": FgdCase(
        # only device 2 (600) can take 500 -> [200, -, 100]; class 500x1: before
        # cnt 1, Σ<500 = 200 -> 200; after cnt 0 -> Rtot 300; Δ = 200 - 300 = -100
        nodes=[Node([200, -1, 600], 8000)],
        classes=[TaskClass(0, 500, 1, 1.0)],
        pod=(0.0, 500.0, 1),
        want_delta=[-100.0],
        want_device=[2],
    ),
    "fractional: no device with room": FgdCase(
        nodes=[Node([400, -1], 8000)],
        classes=TWO,
        pod=(0.0, 500.0, 1),
        want_delta=[-INF],
        want_device=[-1],
    ),
    "whole gpu: first fully free device": FgdCase(
        # [500, 1000] -> takes device 1 -> [500, 0]. A: before 0, after 0 (500 >= 500).
        # B: before 500, after lacks 1000 -> Rtot 500. Δ = 0
        nodes=[Node([500, 1000], 8000)],
        classes=TWO,
        pod=(1000.0, 1000.0, 1),
        want_delta=[0.0],
        want_device=[1],
    ),
    "two whole gpus": FgdCase(
        # [1000, 1000, 500, -] -> takes 0 and 1 -> [0, 0, 500].
        # A: before 0, after 0. B: before 500 (cnt 2), after cnt 0 -> Rtot 500.
        # CPU-only C: before Rtot 2500, after 500 -> 2000.
        # Δ = 0.25*0 + 0.25*0 + 0.5*2000 = 1000
        nodes=[Node([1000, 1000, 500, -1], 8000)],
        classes=[
            TaskClass(2000, 500, 1, 0.25),
            TaskClass(4000, 1000, 1, 0.25, models=(3,)),
            TaskClass(1000, 0, 0, 0.5),
        ],
        pod=(1000.0, 1000.0, 2),
        want_delta=[1000.0],
        want_device=[0],
    ),
    "two whole gpus, only one free": FgdCase(
        nodes=[NODE],
        classes=TWO,
        pod=(1000.0, 1000.0, 2),
        want_delta=[-INF],
        want_device=[-1],
    ),
    "cpu-only pod, classes still fit": FgdCase(
        # 8000 - 4000 = 4000 >= B's 4000: nothing changes -> Δ = 0
        nodes=[NODE],
        classes=TWO,
        pod=(4000.0, 0.0, 0),
        want_delta=[0.0],
        want_device=[-1],
    ),
    "cpu-only pod strands gpus": FgdCase(
        # 8000 - 5000 = 3000 < B's 4000: F(B) 500 -> Rtot 1500; Δ = 0.5*(500-1500) = -500
        nodes=[NODE],
        classes=TWO,
        pod=(5000.0, 0.0, 0),
        want_delta=[-500.0],
        want_device=[-1],
    ),
    "gpu count without milli is a cpu-only pod": FgdCase(
        # milli 0 -> no device taken, as above
        nodes=[NODE],
        classes=TWO,
        pod=(5000.0, 0.0, 1),
        want_delta=[-500.0],
        want_device=[-1],
    ),
    "cpu-only pod on a gpu-less node": FgdCase(
        nodes=[Node([-1, -1], 8000)],
        classes=TWO,
        pod=(5000.0, 0.0, 0),
        want_delta=[0.0],
        want_device=[-1],
    ),
    "masked nodes": FgdCase(
        nodes=[NODE, NODE, NODE],
        classes=TWO,
        pod=(1000.0, 500.0, 1),
        mask=[0, 1, 0],
        want_delta=[-INF, 250.0, -INF],
        want_device=[-1, 1, -1],
    ),
    "model-excluded class sees the whole take": FgdCase(
        # node model 7 excludes B: F(B) = Rtot, so taking 500 anywhere gives
        # Δ(B) = 1500 - 1000 = 500; A stays 0 on either device -> Δ = 0.5*500 = 250.
        # Both devices tie -> device 0
        nodes=[Node([1000, 500], 8000, model=7)],
        classes=TWO,
        pod=(1000.0, 500.0, 1),
        want_delta=[250.0],
        want_device=[0],
    ),
    "no classes: nothing to fragment": FgdCase(
        nodes=[NODE],
        classes=[],
        pod=(1000.0, 500.0, 1),
        want_delta=[0.0],
        want_device=[0],
    ),
}


@pytest.mark.parametrize("case", list(FGD_CASES.values()), ids=list(FGD_CASES))
def test_fgd_scores(impl: KernelImplementation, case: FgdCase) -> None:
    got = fgd(impl, case.nodes, case.classes, case.pod, case.mask)
    assert got == (case.want_delta, case.want_device)


def test_fgd_scores_no_nodes(impl: KernelImplementation) -> None:
    out_delta, out_device = zeros_d(1), zeros_i(1)
    impl.scoring.fgd_scores(
        d(), 8, d(), q(), b(), 0, 0.0, 500.0, 1, *class_buffers(TWO), out_delta, out_device
    )
    assert (list(out_delta), list(out_device)) == ([12345.0], [12345])


# --- FGD against a naive recomputation of ANCHORS §3 ---------------------------------


def naive_frag(node: Node, classes: list[TaskClass]) -> float:
    devs = [r for r in node.dev if r >= 0]
    rtot = sum(devs)
    total = 0.0
    for c in classes:
        if c.milli == 0 or (c.models and node.model not in c.models):
            f = rtot
        elif sum(r >= c.milli for r in devs) >= c.count and node.cpu >= c.cpu:
            f = sum(r for r in devs if r < c.milli)
        else:
            f = rtot
        total += c.pop * f
    return total


def naive_gradient(
    node: Node, classes: list[TaskClass], pod: tuple[float, float, int]
) -> dict[int, float]:
    """Δ per placement option: device index -> Δ (-1 for a CPU-only pod)."""
    cpu, milli, count = pod
    before = naive_frag(node, classes)
    after_cpu = node.cpu - cpu
    if count == 0 or milli == 0:
        return {-1: before - naive_frag(Node(node.dev, after_cpu, node.model), classes)}
    room = [g for g, r in enumerate(node.dev) if r >= 0 and r >= milli]
    options = [[g] for g in room] if count == 1 and milli < 1000 else [room[:count]]
    result = {}
    for taken in options:
        if len(taken) < count:
            continue
        dev = [r - milli if g in taken else r for g, r in enumerate(node.dev)]
        result[taken[0]] = before - naive_frag(Node(dev, after_cpu, node.model), classes)
    return result


def random_workload(rng: random.Random, n_classes: int) -> list[TaskClass]:
    classes = [
        TaskClass(
            cpu=float(rng.choice([0, 1000, 2000, 4000, 8000, 16000])),
            milli=float(rng.choice([0, 0, 100, 250, 500, 700, 1000, 1000])),
            count=rng.choice([1, 1, 1, 2, 4, 8]),
            pop=rng.random(),
            models=tuple(rng.sample(range(8), rng.choice([0, 0, 1, 2]))),
        )
        for _ in range(n_classes)
    ]
    total = sum(c.pop for c in classes)
    return [TaskClass(c.cpu, c.milli, c.count, c.pop / total, c.models) for c in classes]


def random_node(rng: random.Random, max_dev: int) -> Node:
    n_dev = rng.choice([0, 1, 2, 4, max_dev])
    dev = [float(rng.choice([0, 100, 250, 300, 500, 750, 1000, 1000])) for _ in range(n_dev)]
    return Node(
        dev + [-1.0] * (max_dev - n_dev), float(rng.randrange(0, 64001, 500)), rng.randrange(-1, 8)
    )


@pytest.mark.parametrize("seed", range(6))
def test_fgd_matches_naive_formula(impl: KernelImplementation, seed: int) -> None:
    rng = random.Random(seed)
    classes = random_workload(rng, rng.randrange(1, 12))
    nodes = [random_node(rng, 8) for _ in range(30)]
    assert node_frag(impl, nodes, classes) == pytest.approx(
        [naive_frag(n, classes) for n in nodes], rel=1e-9, abs=1e-9
    )
    for pod in [(1000.0, 300.0, 1), (4000.0, 500.0, 1), (8000.0, 1000.0, 2), (2000.0, 0.0, 0)]:
        deltas, devices = fgd(impl, nodes, classes, pod)
        for node, delta, device in zip(nodes, deltas, devices, strict=True):
            options = naive_gradient(node, classes, pod)
            if not options:
                assert (delta, device) == (-INF, -1)
                continue
            best = max(options.values())
            assert delta == pytest.approx(best, rel=1e-9, abs=1e-9)
            # the chosen device is optimal, and the lowest index among the optimal ones
            optimal = [g for g, v in options.items() if math.isclose(v, best, abs_tol=1e-9)]
            assert device == min(optimal)
