"""The node fairshare itself chooses: scores on CHOICE_LEVELS levels, ties to one fixed
random node order (the simulator's ``ours`` and the extender's ``--pick-in-filter``)."""

from __future__ import annotations

from fractions import Fraction

from fairshare.placement import (
    CHOICE_LEVELS,
    PodRequest,
    WorkloadMix,
    build_workload_mix,
    choice_levels,
    choose_level,
    class_key,
    node_rank,
)
from fairshare.resources import GpuDemand, PodDemand, ResourceIndex
from fairshare.simulator import openb
from fairshare.simulator.engine import Simulation
from fairshare.state.cluster import ClusterState


def test_a_higher_level_wins_whatever_the_rank():
    step = 1.0 / CHOICE_LEVELS
    scores = {0: 0.5, 1: 0.5 + step}
    assert choose_level(scores, [0, 1], rank=lambda i: -i if i == 0 else 10) == 1


def test_near_equal_scores_share_a_level_and_the_rank_decides():
    scores = {0: 0.500, 1: 0.505, 2: 0.2}
    assert round(0.500 * CHOICE_LEVELS) == round(0.505 * CHOICE_LEVELS)
    assert choose_level(scores, [0, 1, 2], rank=[5, 9, 0].__getitem__) == 0
    assert choose_level(scores, [0, 1, 2], rank=[9, 5, 0].__getitem__) == 1


def test_rows_without_a_score_are_not_chosen_and_nothing_scored_is_none():
    assert choose_level({3: 0.1}, [0, 1, 3], rank=lambda i: i) == 3
    assert choose_level({}, [0, 1], rank=lambda i: i) is None


def test_node_rank_is_a_stable_hash_of_the_name():
    assert node_rank("gpu-1") == node_rank("gpu-1")
    ranks = {node_rank(f"node-{i}") for i in range(1000)}
    assert len(ranks) == 1000
    # Not the name order: a fixed random order.
    names = sorted(f"node-{i:03d}" for i in range(50))
    assert sorted(names, key=node_rank) != names


def _sim(tie_rank: list[int]) -> Simulation:
    config = openb.trace_config(1)
    sim = Simulation(config, policy="ours", seed=1, tie_rank=tie_rank)
    for k in range(3):
        sim.add_node(f"n{k}", {"cpu": Fraction(8), "memory": Fraction(64 * 2**30)}, {})
    return sim


def _place_one(sim: Simulation) -> str:
    pod = {
        "metadata": {"name": "p", "namespace": "tenant-0"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }
    out = sim.submit(sim.request_for(pod, uid="u1"))
    sim.try_place(out.uid)
    node = sim.outcomes[out.uid].node
    assert node is not None
    return node


def test_ours_in_the_simulator_sends_equal_nodes_to_the_first_in_its_tie_order():
    # Three empty, identical nodes: equal scores; the seeded order decides.
    assert _place_one(_sim([2, 0, 1])) == "n1"
    assert _place_one(_sim([1, 2, 0])) == "n2"


# -- which pods get the levels ------------------------------------------------------

INDEX = ResourceIndex(("nvidia.com/gpu", "cpu", "memory"))


def _req(gpu: GpuDemand, *, models: frozenset[str] = frozenset()) -> PodRequest:
    amounts = {"cpu": Fraction(4)}
    if gpu.count and gpu.source != "mig":
        amounts["nvidia.com/gpu"] = gpu.total
    row = tuple(INDEX.kernel_vector(amounts))
    return PodRequest("u", "p", "ns", None, PodDemand(amounts=amounts, gpu=gpu), row, models)


WHOLE = GpuDemand(count=1, per_device=Fraction(1), source="device")
WHOLE_2 = GpuDemand(count=2, per_device=Fraction(1), source="device")
HALF = GpuDemand(count=1, per_device=Fraction(1, 2), source="fraction")
BY_MEMORY = GpuDemand(count=1, per_device=Fraction(0), memory=8 << 30, source="memory")
SLICE = GpuDemand(count=1, per_device=Fraction(1), source="mig", mig_profile="1g.10gb")


def _mix(*, restricted: bool) -> WorkloadMix:
    st = ClusterState(INDEX)
    for name, model in (("a", "T4"), ("b", "G2")):
        alloc = {"nvidia.com/gpu": Fraction(8), "cpu": Fraction(96), "memory": Fraction(2**38)}
        st.add_node(name, alloc, labels={"nvidia.com/gpu.product": model})
    reqs = [_req(WHOLE)] * 3 + [_req(HALF)] * 2
    if restricted:
        reqs.append(_req(WHOLE, models=frozenset({"T4"})))
    cpu_col = INDEX.column("cpu")
    keys = (class_key(r, cpu_col=cpu_col) for r in reqs)
    return build_workload_mix(keys, model_ids=st.model_ids, coverage=1.0)


def test_whole_gpu_pods_choose_by_the_exact_score_without_model_restricted_classes():
    mix = _mix(restricted=False)
    assert mix.restricted_models == 0
    assert choice_levels(_req(WHOLE), mix) is None
    assert choice_levels(_req(WHOLE_2), mix) is None
    assert choice_levels(_req(WHOLE), None) is None


def test_a_model_restricted_class_puts_whole_gpu_pods_back_on_the_levels():
    mix = _mix(restricted=True)
    assert mix.restricted_models != 0
    assert choice_levels(_req(WHOLE), mix) == CHOICE_LEVELS
    assert choice_levels(_req(WHOLE_2), mix) == CHOICE_LEVELS


def test_shared_slice_and_cpu_only_pods_always_use_the_levels():
    mix = _mix(restricted=False)
    for gpu in (HALF, BY_MEMORY, SLICE, GpuDemand()):
        assert choice_levels(_req(gpu), mix) == CHOICE_LEVELS, gpu


def test_exact_scores_separate_what_one_level_ties():
    scores = {0: 0.500, 1: 0.505}
    assert choose_level(scores, [0, 1], rank=[0, 1].__getitem__) == 0  # one level
    assert choose_level(scores, [0, 1], rank=[0, 1].__getitem__, levels=None) == 1
    # Equal exact scores still go to the lowest rank.
    assert choose_level({0: 0.5, 1: 0.5}, [0, 1], rank=[1, 0].__getitem__, levels=None) == 1


def test_the_extender_picks_a_whole_gpu_pod_by_the_exact_score_over_the_tie_order():
    # An idle 8-GPU node and an idle 2-GPU node score within one level for a 1-GPU
    # pod; the tie order prefers the 8-GPU node, the exact score the 2-GPU node.
    from extender.verbs import node_scores, pick_best

    big, small = sorted(("g-1", "g-2"), key=node_rank)
    config = openb.trace_config(1)
    st = ClusterState(INDEX)
    for name, gpus in ((big, 8), (small, 2)):
        alloc = {"nvidia.com/gpu": Fraction(gpus), "cpu": Fraction(96), "memory": Fraction(2**38)}
        st.add_node(name, alloc, labels={})
    names = [big, small]
    mix = _mix(restricted=False)
    _ints, raw = node_scores(st, config, _req(WHOLE), names, mix=mix)
    assert raw[1] > raw[0]
    assert round(raw[0] * CHOICE_LEVELS) == round(raw[1] * CHOICE_LEVELS)
    assert pick_best(st, config, _req(WHOLE), names, mix=mix) == small
    # A half-GPU pod keeps the levels: the tie order decides.
    _ints, raw = node_scores(st, config, _req(HALF), names, mix=mix)
    assert round(raw[0] * CHOICE_LEVELS) == round(raw[1] * CHOICE_LEVELS)
    assert pick_best(st, config, _req(HALF), names, mix=mix) == big
