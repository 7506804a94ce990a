"""The extender's fast paths answer exactly what the plain code answered.

``wire.dumps`` writes a ``HostPriorityList`` by hand: the text must be ``json.dumps``'s.
``Scorer`` sums its terms list-wise: the floats must be the per-row loop's, bit for bit.
``filter_nodes`` with explanations has a fast path for pods whose per-device share does
not depend on the node: same fits, same failures, same order.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import random
from array import array
from fractions import Fraction
from typing import Any

import pytest

from _native import fit
from extender import verbs, wire
from fairshare import pipeline, placement
from fairshare.config.loading import config_from_mapping
from fairshare.placement import (
    NodeFailure,
    PodRequest,
    WorkloadMix,
    build_scorer,
    filter_nodes,
    score_context,
)
from fairshare.placement.filtering import _failure as _node_failure
from fairshare.resources import GpuDemand, PodDemand, ResourceIndex
from fairshare.state.cluster import ClusterState


@pytest.mark.parametrize("seed", range(5))
def test_dumps_of_a_host_priority_list_is_json_dumps(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = 'ab-.0"\\\u00e9\u2603\n\t/'
    hosts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for _ in range(50)]
    scores = [rng.choice([0, 3, 10, 11, -1, 2**70]) for _ in hosts]
    encoded = wire.encode_scores(hosts, scores)
    plain = [{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)]
    assert encoded == plain
    assert wire.dumps(encoded) == json.dumps(plain)
    assert wire.dumps(wire.HostPriorityList()) == "[]"
    assert wire.dumps(plain) == json.dumps(plain)
    other: dict[str, Any] = {"NodeNames": hosts, "FailedNodes": {"x": "y"}, "Error": ""}
    assert wire.dumps(other) == json.dumps(other)


def test_encode_scores_matches_host_priority_encoding() -> None:
    hosts, scores = ["a", "b"], [0, 10]
    items = [wire.HostPriority(h, s) for h, s in zip(hosts, scores, strict=True)]
    assert wire.encode_scores(hosts, scores) == wire.encode_host_priority_list(items)


@pytest.mark.parametrize("score", [True, 1.0, "1", None])
def test_encode_scores_refuses_non_int_scores(score: Any) -> None:
    with pytest.raises(TypeError, match="Score must be an int"):
        wire.encode_scores(["n"], [score])


def test_encode_scores_refuses_bad_hosts_and_lengths() -> None:
    with pytest.raises(TypeError, match="Host must be a string"):
        wire.encode_scores([1], [1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="one score per host"):
        wire.encode_scores(["a"], [])


# -- scorer and filter -----------------------------------------------------------------------

INDEX = ResourceIndex(("nvidia.com/gpu", "cpu", "memory"))


def _state(rng: random.Random, n: int, sick: float = 0.1) -> ClusterState:
    st = ClusterState(INDEX)
    for i in range(n):
        gpus = rng.choice([0, 2, 4, 8])
        labels = {"nvidia.com/gpu.product": rng.choice(["A100", "L4"])}
        st.add_node(
            f"n{i:03d}",
            {"nvidia.com/gpu": Fraction(gpus), "cpu": Fraction(64), "memory": Fraction(2**38)},
            labels=labels,
            gpu_healthy=rng.random() >= sick,
        )
        for k in range(rng.randrange(0, 4)):
            if gpus == 0:
                break
            dev = rng.randrange(gpus)
            milli = float(rng.choice([250, 500, 1000]))
            if st.dev_free[i * st.max_dev + dev] >= milli:
                row = (milli, float(rng.choice([1000, 8000])), float(2**30))
                st.bind(uid=f"p{i}-{k}", node=f"n{i:03d}", row=row, devices=[(dev, milli)])
    return st


def _req(gpu: GpuDemand, cpu: float, *, models: frozenset[str] = frozenset()) -> PodRequest:
    amounts = {"cpu": Fraction(int(cpu), 1000)}
    if gpu.count:
        amounts["nvidia.com/gpu"] = gpu.total
    demand = PodDemand(amounts=amounts, gpu=gpu)
    row = tuple(INDEX.kernel_vector(amounts))
    return PodRequest("u", "p", "ns", "t", demand, row, models)


L4 = frozenset({"L4"})
REQS = [
    _req(GpuDemand(count=1, per_device=Fraction(1, 4), source="fraction"), 2000.0),
    _req(GpuDemand(count=2, per_device=Fraction(1), source="device"), 8000.0),
    _req(GpuDemand(), 500.0),
    _req(
        GpuDemand(count=1, per_device=Fraction(1), source="device"),
        1000.0,
        models=frozenset({"L4"}),
    ),
]
WEIGHTS = [
    {"fragmentation": 1.0, "packing": 0.02, "health": 1.0},
    {name: 0.3 + k / 7 for k, name in enumerate(placement.SCORERS)},
    dict.fromkeys(placement.SCORERS, 0.0),
]
MIX = WorkloadMix(
    cpu=array("d", [1000.0, 4000.0]),
    gpu_milli=array("d", [250.0, 1000.0]),
    gpu_count=array("q", [1, 1]),
    models=array("q", [0, 0]),
    popularity=array("d", [0.5, 0.5]),
)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("weights", WEIGHTS)
def test_scorer_sums_bit_for_bit_as_the_row_loop(seed: int, weights: dict[str, float]) -> None:
    rng = random.Random(seed)
    st = _state(rng, 60)
    scorer = build_scorer(weights)
    ctx = score_context(st, MIX)
    total = sum(w for _, w in scorer.weights)
    for req in REQS:
        fits = filter_nodes(st, req, explain=False).fits
        fast = scorer(st, req, fits, ctx)
        slow = scorer._summed_per_row(st, req, placement.candidates(st, fits), ctx, total)
        assert list(fast.scores.items()) == list(slow.scores.items())
        assert fast.devices == slow.devices


def test_scorer_counts_a_repeated_row_twice_as_before() -> None:
    st = _state(random.Random(1), 10)
    req = REQS[2]
    scorer = build_scorer({"health": 1.0, "packing": 1.0})
    ctx = score_context(st, None)
    once = scorer(st, req, [3], ctx)
    twice = scorer(st, req, [3, 3], ctx)
    assert twice.scores[3] == pytest.approx(2 * once.scores[3])


def _filter_by_row_loop(st: ClusterState, req: PodRequest, rows: list[int]) -> tuple[Any, ...]:
    """The general loop of ``filter_nodes(explain=True)``, written out: health, then
    model, then the kernel's code, node by node."""
    wants = req.demand.wants_gpu
    milli = req.gpu_milli_for(0) if wants else 0.0
    out = array("i", bytes(4 * st.n_nodes))
    count = req.gpu_count if wants else 0
    demand = array("d", req.row)
    n, r, d = st.n_nodes, st.n_res, st.max_dev
    fit.fit_nodes(st.free, st.dev_free, demand, n, r, d, milli, count, out)
    fits, failed = [], []
    for i in rows:
        info = st.nodes[i]
        if wants and not st.healthy[i]:
            failed.append(NodeFailure(info.name, f"GPU unhealthy: {info.health_reason}", True))
        elif wants and req.gpu_models and info.gpu_model not in req.gpu_models:
            allowed = ", ".join(sorted(req.gpu_models))
            text = f"GPU model {info.gpu_model or 'none'} not in {allowed}"
            failed.append(NodeFailure(info.name, text, True))
        elif out[i] < 0:
            fits.append(i)
        else:
            failed.append(_node_failure(st, req, i, out[i], milli, st.gpu_col))
    return tuple(fits), tuple(failed)


@pytest.mark.parametrize("sick", [0.0, 0.1])
@pytest.mark.parametrize("seed", range(4))
def test_filter_fast_path_answers_as_node_by_node(seed: int, sick: float) -> None:
    rng = random.Random(seed)
    st = _state(rng, 40, sick)
    for req in REQS:
        rows = rng.sample(range(st.n_nodes), 25)
        got = filter_nodes(st, req, rows=rows, explain=True)
        fits, failed = _filter_by_row_loop(st, req, rows)
        assert fits == filter_nodes(st, req, rows=rows, explain=False).fits
        assert got.fits == fits
        assert got.failed == failed
        assert dict(got.gpu_milli) == {i: req.gpu_milli_for(0) for i in fits}


# -- one pass over the candidates (filter and prioritize) ------------------------------------

MEMORY = _req(GpuDemand(count=1, memory=20 * 2**30, source="memory"), 1000.0)
FAST_REQS = [*REQS, _req(GpuDemand(count=8, per_device=Fraction(1), source="device"), 500.0)]
GATE_CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "t", "namespaces": ["ns"]}, {"name": "other"}],
        "resources": {name: {} for name in INDEX.names},
    }
)


def _names(rng: random.Random, st: ClusterState, k: int, *, repeat: bool) -> list[str]:
    """``k`` candidate names in a random order, some unknown to ``st``, some repeated."""
    names = [n.name for n in rng.sample(st.nodes, k)] + ["gone-1", "gone-2"]
    if repeat:
        names += rng.sample(names, 3)
    rng.shuffle(names)
    return names


@pytest.mark.parametrize("repeat", [False, True])
@pytest.mark.parametrize("sick", [0.0, 0.2])
@pytest.mark.parametrize("seed", range(4))
def test_filter_pod_one_pass_answers_as_filter_nodes(seed: int, sick: float, repeat: bool) -> None:
    rng = random.Random(seed)
    st = _state(rng, 50, sick)
    for req in FAST_REQS:
        names = _names(rng, st, 30, repeat=repeat)
        common: dict[str, Any] = {"config": GATE_CONFIG, "req": req, "names": names}
        got = pipeline.filter_pod(st, pending=[req], fair=None, **common)
        want = pipeline._filter_names(st, pending=[req], fair=None, **common)
        one_pass = placement.fit_rows(st, req, pipeline.candidate_rows(st, names))
        assert (one_pass is None) == bool(req.gpu_models)  # the model pod takes the loop
        assert got.passing == want.passing
        assert got.failed == want.failed and got.unresolvable == want.unresolvable
        assert got.gate == want.gate
        assert dict(got.gpu_milli) == dict(want.gpu_milli)
        assert list(got.gpu_milli) == list(want.gpu_milli)


@pytest.mark.parametrize("repeat", [False, True])
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("seed", range(4))
def test_node_scores_one_pass_equals_the_scorer(
    seed: int, weights: dict[str, float], repeat: bool
) -> None:
    rng = random.Random(seed)
    st = _state(rng, 50, 0.1)
    config = GATE_CONFIG.model_copy(
        update={"scoring": GATE_CONFIG.scoring.model_copy(update=weights)}
    )
    scorer = build_scorer(config.scoring.weights())
    ctx = score_context(st, MIX)
    for req in [*FAST_REQS, MEMORY]:
        names = _names(rng, st, 40, repeat=repeat)
        fitted = placement.fit_rows(st, req, pipeline.candidate_rows(st, names))
        one_pass = fitted and scorer.extender(st, req, fitted, ctx)
        general = req in (REQS[3], MEMORY)  # GPU models, GPU memory: filter_nodes
        assert (one_pass is None) == (general or bool(fitted and fitted.duplicates))
        ints, raw = verbs.node_scores(st, config, req, names, mix=MIX, context=ctx)
        want_ints, want_raw = verbs._scores_by_filter(st, req, names, scorer, ctx)
        assert list(ints) == want_ints
        assert array("d", raw).tobytes() == array("d", want_raw).tobytes()  # bit for bit


def test_node_scores_counts_a_repeated_fitting_node_as_before() -> None:
    st = _state(random.Random(3), 10, 0.0)
    req = REQS[2]  # CPU only: fits every node
    only = {"fragmentation": 0.0, "health": 0.0, "packing": 1.0}
    config = GATE_CONFIG.model_copy(update={"scoring": GATE_CONFIG.scoring.model_copy(update=only)})
    _, once = verbs.node_scores(st, config, req, ["n003"])
    ints, raw = verbs.node_scores(st, config, req, ["n003", "n004", "n003"])
    assert 0 < once[0] < 0.5
    assert raw[0] == raw[2] == 2 * once[0]  # counted twice, as the scorer always did
    assert ints[0] == ints[2] == round(20 * once[0])


@pytest.mark.parametrize("seed", range(5))
def test_dumps_scores_is_dumps_of_encode_scores(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = 'ab-.0"\\\u00e9\u2603\n\t/<>&'
    hosts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for _ in range(40)]
    scores = [rng.randrange(0, 11) for _ in hosts]
    want = wire.dumps(wire.encode_scores(hosts, scores))
    assert (
        wire.dumps_scores(hosts, scores)
        == want
        == json.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)])
    )
    assert wire.dumps_scores(hosts, array("q", scores)) == want
    assert wire.dumps_scores([], []) == "[]"
    odd = [*scores[:-1], rng.choice([11, -1, 2**70])]  # outside 0..10: the generic writer
    assert wire.dumps_scores(hosts, odd) == wire.dumps(wire.encode_scores(hosts, odd))


@pytest.mark.parametrize(
    ("hosts", "scores", "error"),
    [(["a"], [True], TypeError), (["a"], [1.0], TypeError), ([1], [1], TypeError)],
)
def test_dumps_scores_refuses_as_encode_scores(hosts: Any, scores: Any, error: type) -> None:
    with pytest.raises(error):
        wire.encode_scores(hosts, scores)
    with pytest.raises(error):
        wire.dumps_scores(hosts, scores)
    with pytest.raises(ValueError, match="one score per host"):
        wire.dumps_scores(["a", "b"], [1])


def test_filter_pod_one_pass_fails_every_fitting_node_when_gated() -> None:
    st = _state(random.Random(5), 30, 0.0)
    for i in range(18):  # tenant t holds most of the CPU; "other" waits for more than is left
        row = (0.0, 64000.0, 0.0)
        st.bind(uid=f"hog{i}", node=f"n{i:03d}", row=row, tenant="t", allow_overcommit=True)
    st.bind(uid="small", node="n029", row=(0.0, 1.0, 0.0), tenant="other")
    mine = dataclasses.replace(REQS[2], tenant="t", uid="mine")
    half = _req(GpuDemand(), 32000.0)
    theirs = [dataclasses.replace(half, tenant="other", uid=f"o{k}") for k in range(30)]
    names = _names(random.Random(6), st, 29, repeat=False)
    common: dict[str, Any] = {"config": GATE_CONFIG, "req": mine, "names": names}
    got = pipeline.filter_pod(st, pending=[mine, *theirs], fair=None, **common)
    want = pipeline._filter_names(st, pending=[mine, *theirs], fair=None, **common)
    assert got.gate is not None and not got.gate.allowed
    assert got.passing == want.passing == ()
    assert got.failed == want.failed and got.unresolvable == want.unresolvable
    assert got.gate.reason in got.failed.values()
    assert dict(got.gpu_milli) == dict(want.gpu_milli) == {}


@pytest.mark.parametrize("seed", range(6))
def test_answer_bodies_are_json_dumps(seed: int) -> None:
    """What the HTTP adapter sends (``body()``) is ``json.dumps`` of what the verbs return."""
    rng = random.Random(seed)
    alphabet = "ab-.0" if seed % 2 else 'ab-.0"\\\u00e9\n'
    hosts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 9))) for _ in range(30)]
    scores = array("q", [rng.randrange(0, 11) for _ in hosts])
    want = json.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)])
    assert wire.Scores(hosts, scores).body() == want.encode()
    assert wire.Scores(tuple(hosts), list(scores)).body() == want.encode()
    failed = {h: "Insufficient cpu \u2603" for h in hosts[:3]}
    nodes = wire.NodeList(({"metadata": {"name": "x"}},), {"metadata": {}, "items": []})
    for result in (
        wire.ExtenderFilterResult(None, tuple(hosts), failed, {}),
        wire.ExtenderFilterResult(None, (), None, failed, "boom"),
        wire.ExtenderFilterResult(nodes, None, {}, {}),
        wire.ExtenderFilterResult(nodes, tuple(hosts[:2]), {}, failed),
    ):
        assert result.body() == json.dumps(result.encode()).encode()


def test_candidate_rows_follow_the_node_set() -> None:
    st = _state(random.Random(8), 12, 0.0)
    names = ["n003", "gone", "n011", "n000"]
    assert pipeline.candidate_rows(st, names).tolist() == [3, -1, 11, 0]
    other = _state(random.Random(9), 4, 0.0)
    assert pipeline.candidate_rows(other, names).tolist() == [3, -1, -1, 0]
    st.remove_node("n003")  # the last row moves into its place
    st.add_node("gone", {"cpu": Fraction(8)})
    want = [st.node_index.get(n, -1) for n in names]
    assert pipeline.candidate_rows(st, names).tolist() == want
    assert want[0] == -1 and want[1] >= 0
    copied = pickle.loads(pickle.dumps(st))  # the state stays picklable with its table
    assert pipeline.candidate_rows(copied, names).tolist() == want
    assert pipeline.candidate_rows(copy.deepcopy(st), names).tolist() == want
    wide = ClusterState(INDEX)
    wide.add_node("n\u2603", {"cpu": Fraction(8)})  # not held by a NameTable: the dict
    assert pipeline.candidate_rows(wide, ["n\u2603", "n"]).tolist() == [0, -1]
