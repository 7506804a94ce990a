"""Differential test: the compiled kernels and their pure-Python twins, on the same
generated clusters, must agree exactly — integer outputs equal, floats bit-equal
(NaN matches NaN; ``-inf`` and the sign of zero must match too).

Clusters come from hypothesis; the known edge cases are pinned with ``@example``. The
module skips (with the reason) only when the compiled modules do not import *and*
``FAIRSHARE_NO_EXTENSIONS`` is set; otherwise a missing build fails here.
"""

from __future__ import annotations

import array
import inspect
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

pytest.importorskip("hypothesis")

from hypothesis import example, given, settings
from hypothesis import strategies as st

from .conftest import (
    NO_EXTENSIONS_ENV,
    KernelImplementation,
    c_import_error,
    extensions_disabled,
    load_implementation,
)

_C_ERROR = c_import_error()
if _C_ERROR is not None and extensions_disabled():
    pytest.skip(
        f"compiled kernels do not import ({_C_ERROR}) and {NO_EXTENSIONS_ENV} is set: "
        "nothing to compare the twins with",
        allow_module_level=True,
    )

pytestmark = pytest.mark.native

F = TypeVar("F", bound=Callable[..., None])


@pytest.fixture(scope="module")
def pair() -> tuple[KernelImplementation, KernelImplementation]:
    """(py, c); fails when the compiled modules do not import."""
    if _C_ERROR is not None:
        pytest.fail(
            f"compiled kernels do not import ({_C_ERROR}); build them with "
            f"`python setup.py build_ext --inplace`, or set {NO_EXTENSIONS_ENV}=1",
            pytrace=False,
        )
    return load_implementation("py"), load_implementation("c")


# --- generated clusters --------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """Every kernel input at once; each test takes the part it needs."""

    n_nodes: int
    n_res: int
    max_dev: int
    free: list[float]  # N×R
    capacity: list[float]  # N×R (per node)
    cluster_capacity: list[float]  # R
    demand: list[float]  # R
    norm: list[float]  # R
    weights: list[float]  # R (resource weights, also DRF's)
    mask: list[int]  # N
    gpu_col: int
    dev_free: list[float]  # N×max_dev
    node_cpu: list[float]  # N
    node_model: list[int]  # N
    used: list[float]  # T×R
    tenant_weights: list[float]  # T
    pod: tuple[float, float, int]  # (cpu, milli per gpu, gpu count)
    cls_cpu: list[float]
    cls_milli: list[float]
    cls_count: list[int]
    cls_models: list[int]
    cls_pop: list[float]

    @property
    def n_tenants(self) -> int:
        return len(self.tenant_weights)

    @property
    def n_classes(self) -> int:
        return len(self.cls_pop)


# Per-resource scales: integral amounts in canonical units, with zeros and huge values
# well represented, plus arbitrary finite floats. Every amount of a resource is its
# scale times a fraction, so scores land inside (0, 1) often instead of clamping, and
# the twins must agree on rounding, not just on integers.
scales = st.one_of(
    st.sampled_from([0.0, 1.0, 1000.0, 4000.0, 96000.0, 2.0**40, 2.0**52]),
    st.integers(1, 10**7).map(float),
    st.floats(0.0, 1e12, allow_nan=False, allow_infinity=False),
)
fractions = st.one_of(
    st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.0]),
    st.floats(0.0, 1.0),
    st.sampled_from([-0.25, 1.5]),  # overcommitted, or a pod that does not fit
)
weights = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 100.0))
dev_values = st.sampled_from([-1.0, 0.0, 100.0, 250.0, 300.0, 500.0, 700.0, 1000.0])
milli_values = st.sampled_from([0.0, 100.0, 250.0, 500.0, 700.0, 999.0, 1000.0, 1500.0])
model_ids = st.sampled_from([-1, 0, 1, 3, 7, 62, 63, 100])
model_masks = st.one_of(st.just(0), st.integers(-(2**63), 2**63 - 1), st.sampled_from([8, 130]))


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    n = draw(st.integers(0, 10))
    r = draw(st.integers(1, 6))
    max_dev = draw(st.integers(0, 8))
    n_t = draw(st.integers(0, 5))
    n_c = draw(st.integers(0, 8))
    scale = draw(st.lists(scales, min_size=r, max_size=r))
    cpu_scale = draw(scales)

    def many(strategy: st.SearchStrategy[Any], size: int) -> list[Any]:
        return draw(st.lists(strategy, min_size=size, max_size=size))

    def scaled(rows: int, sizes: list[float]) -> list[float]:
        """rows × len(sizes) amounts, column j a fraction of sizes[j]."""
        return [
            sizes[j] * f for _ in range(rows) for j, f in enumerate(many(fractions, len(sizes)))
        ]

    capacity = scaled(n, scale)
    demand = scaled(1, scale)
    gpu_col = draw(st.integers(0, r - 1))
    if draw(st.booleans()):
        demand[gpu_col] = 0.0  # a GPU-less pod: the branch where stranding_scores works
    return Cluster(
        n_nodes=n,
        n_res=r,
        max_dev=max_dev,
        free=[c * f for c, f in zip(capacity, many(fractions, n * r), strict=True)],
        capacity=capacity,
        cluster_capacity=[s * n for s in scale],
        demand=demand,
        norm=draw(st.one_of(st.just(scale), st.lists(scales, min_size=r, max_size=r))),
        weights=many(weights, r),
        mask=many(st.sampled_from([0, 1, 1, 1, -3]), n),
        gpu_col=gpu_col,
        dev_free=many(dev_values, n * max_dev),
        node_cpu=scaled(n, [cpu_scale]),
        node_model=many(model_ids, n),
        used=scaled(n_t, scale),
        tenant_weights=many(weights, n_t),
        pod=(cpu_scale * draw(fractions), draw(milli_values), draw(st.integers(0, 4))),
        cls_cpu=scaled(n_c, [cpu_scale]),
        cls_milli=many(milli_values, n_c),
        cls_count=many(st.integers(0, 8), n_c),
        cls_models=many(model_masks, n_c),
        cls_pop=many(st.floats(0.0, 1.0), n_c),
    )


def uniform(n: int, r: int, max_dev: int, **over: Any) -> Cluster:
    """A hand-made cluster: every node alike (all-equal ties), overridable per field."""
    fields: dict[str, Any] = {
        "n_nodes": n,
        "n_res": r,
        "max_dev": max_dev,
        "free": [500.0] * (n * r),
        "capacity": [1000.0] * (n * r),
        "cluster_capacity": [1000.0 * n] * r,
        "demand": [100.0] * r,
        "norm": [1000.0] * r,
        "weights": [1.0] * r,
        "mask": [1] * n,
        "gpu_col": r - 1,
        "dev_free": [1000.0, 500.0, -1.0, -1.0][:max_dev] * n,
        "node_cpu": [8000.0] * n,
        "node_model": [3] * n,
        "used": [100.0] * (2 * r),
        "tenant_weights": [1.0, 1.0],
        "pod": (1000.0, 500.0, 1),
        "cls_cpu": [2000.0, 4000.0, 1000.0],
        "cls_milli": [500.0, 1000.0, 0.0],
        "cls_count": [1, 1, 0],
        "cls_models": [0, 1 << 3, 0],
        "cls_pop": [0.4, 0.4, 0.2],
    }
    fields.update(over)
    return Cluster(**fields)


EDGE_CASES = [
    # zero capacity everywhere (cluster and nodes), with usage: +inf shares, 0.5 DRFH
    uniform(3, 3, 4, capacity=[0.0] * 9, cluster_capacity=[0.0] * 3),
    # zero weights: resource weights, tenant weights, norm
    uniform(3, 3, 4, weights=[0.0] * 3, tenant_weights=[0.0, 0.0], norm=[0.0] * 3),
    # all-equal nodes and tenants (the defaults)
    uniform(4, 2, 4),
    # a single node, a single resource, a single device
    uniform(1, 1, 1, dev_free=[1000.0], gpu_col=0),
    # huge quantities (bytes)
    uniform(
        2,
        2,
        4,
        free=[2.0**52, 2.0**40] * 2,
        capacity=[2.0**53, 2.0**41] * 2,
        cluster_capacity=[2.0**54, 2.0**42],
        demand=[2.0**50, 2.0**39],
        used=[2.0**52, 1.0] * 2,
    ),
    # absent devices only, masked nodes, a whole-GPU pod that cannot fit
    uniform(3, 2, 4, dev_free=[-1.0] * 12, mask=[0, 1, 0], pod=(0.0, 1000.0, 2)),
    # no nodes, no classes, no tenants
    uniform(
        0,
        2,
        4,
        used=[],
        tenant_weights=[],
        cls_cpu=[],
        cls_milli=[],
        cls_count=[],
        cls_models=[],
        cls_pop=[],
    ),
    # CPU-only pod that strands GPUs, node models outside 0..62
    uniform(2, 2, 4, pod=(7500.0, 0.0, 0), node_model=[-1, 63]),
]


def with_edge_cases(test: F) -> F:
    for case in EDGE_CASES:
        test = example(case)(test)
    return test


equivalence = settings(max_examples=150, deadline=None)


# --- comparison helpers --------------------------------------------------------------


def bits(x: float) -> bytes:
    return b"nan" if math.isnan(x) else struct.pack("<d", x)


def assert_same_floats(py: array.array[float], c: array.array[float]) -> None:
    assert len(py) == len(c)
    for i, (x, y) in enumerate(zip(py, c, strict=True)):
        assert x == y or (math.isnan(x) and math.isnan(y)), f"index {i}: py {x!r} != c {y!r}"
        assert bits(x) == bits(y), f"index {i}: py {x!r} and c {y!r} differ in bits"


def fd(xs: list[float]) -> array.array[float]:
    return array.array("d", xs)


def fq(xs: list[int]) -> array.array[int]:
    return array.array("q", xs)


def fb(xs: list[int]) -> array.array[int]:
    return array.array("b", xs)


def outs(n: int) -> tuple[array.array[float], array.array[float]]:
    return array.array("d", [7.0] * n), array.array("d", [7.0] * n)


# --- the tests -----------------------------------------------------------------------


@equivalence
@given(clusters())
@with_edge_cases
def test_dominant_shares(pair: tuple[KernelImplementation, ...], cluster: Cluster) -> None:
    py, c = pair
    k = cluster
    o_py, o_c = outs(k.n_tenants)
    for impl, out in ((py, o_py), (c, o_c)):
        impl.drf.dominant_shares(
            fd(k.used),
            fd(k.cluster_capacity),
            fd(k.weights),
            fd(k.tenant_weights),
            k.n_tenants,
            k.n_res,
            out,
        )
    assert_same_floats(o_py, o_c)


@equivalence
@given(clusters())
@with_edge_cases
def test_fit_nodes(pair: tuple[KernelImplementation, ...], cluster: Cluster) -> None:
    py, c = pair
    k = cluster
    _, milli, count = k.pod
    results = []
    for impl in (py, c):
        out = array.array("i", [7] * k.n_nodes)
        n_fit = impl.fit.fit_nodes(
            fd(k.free),
            fd(k.dev_free),
            fd(k.demand),
            k.n_nodes,
            k.n_res,
            k.max_dev,
            milli,
            count,
            out,
        )
        results.append((n_fit, list(out)))
    assert results[0] == results[1]


@equivalence
@given(clusters())
@with_edge_cases
def test_bestfit_scores(pair: tuple[KernelImplementation, ...], cluster: Cluster) -> None:
    py, c = pair
    k = cluster
    o_py, o_c = outs(k.n_nodes)
    for impl, out in ((py, o_py), (c, o_c)):
        impl.scoring.bestfit_scores(
            fd(k.free),
            fd(k.demand),
            fd(k.norm),
            fd(k.weights),
            fb(k.mask),
            k.n_nodes,
            k.n_res,
            out,
        )
    assert_same_floats(o_py, o_c)


@equivalence
@given(clusters())
@with_edge_cases
def test_drfh_scores(pair: tuple[KernelImplementation, ...], cluster: Cluster) -> None:
    py, c = pair
    k = cluster
    o_py, o_c = outs(k.n_nodes)
    for impl, out in ((py, o_py), (c, o_c)):
        impl.scoring.drfh_scores(
            fd(k.free), fd(k.capacity), fd(k.demand), fb(k.mask), k.n_nodes, k.n_res, out
        )
    assert_same_floats(o_py, o_c)


@equivalence
@given(clusters())
@with_edge_cases
def test_stranding_scores(pair: tuple[KernelImplementation, ...], cluster: Cluster) -> None:
    py, c = pair
    k = cluster
    o_py, o_c = outs(k.n_nodes)
    for impl, out in ((py, o_py), (c, o_c)):
        impl.scoring.stranding_scores(
            fd(k.free),
            fd(k.capacity),
            fd(k.demand),
            k.gpu_col,
            fb(k.mask),
            k.n_nodes,
            k.n_res,
            out,
        )
    assert_same_floats(o_py, o_c)


@equivalence
@given(clusters())
@with_edge_cases
def test_fgd(pair: tuple[KernelImplementation, ...], cluster: Cluster) -> None:
    py, c = pair
    k = cluster
    workload = (
        fd(k.cls_cpu),
        fd(k.cls_milli),
        fq(k.cls_count),
        fq(k.cls_models),
        fd(k.cls_pop),
        k.n_classes,
    )
    nodes = (fd(k.dev_free), k.max_dev, fd(k.node_cpu), fq(k.node_model))
    deltas, devices, frags, totals = [], [], [], []
    for impl in (py, c):
        out_delta = array.array("d", [7.0] * k.n_nodes)
        out_device = array.array("i", [7] * k.n_nodes)
        impl.scoring.fgd_scores(
            *nodes, fb(k.mask), k.n_nodes, *k.pod, *workload, out_delta, out_device
        )
        deltas.append(out_delta)
        devices.append(list(out_device))
        out = array.array("d", [7.0] * k.n_nodes)
        totals.append(impl.scoring.fgd_node_frag(*nodes, k.n_nodes, *workload, out))
        frags.append(out)
    assert devices[0] == devices[1]
    assert_same_floats(deltas[0], deltas[1])
    assert_same_floats(frags[0], frags[1])
    assert_same_floats(fd(totals[:1]), fd(totals[1:]))


def test_same_functions_and_signatures(pair: tuple[KernelImplementation, ...]) -> None:
    py, c = pair
    for name in ("drf", "fit", "scoring"):
        m_py, m_c = getattr(py, name), getattr(c, name)
        assert m_py.__all__ == m_c.__all__
        for fn in m_py.__all__:
            params_py = list(inspect.signature(getattr(m_py, fn)).parameters)
            params_c = list(inspect.signature(getattr(m_c, fn)).parameters)
            assert params_py == params_c, f"{name}.{fn}"
            assert getattr(m_c, fn).__doc__, f"{name}_c.{fn} has no docstring"
