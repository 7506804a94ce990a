"""The node fairshare itself chooses: scores on CHOICE_LEVELS levels, ties to one fixed
random node order (the simulator's ``ours`` and the extender's ``--pick-in-filter``)."""

from __future__ import annotations

from fractions import Fraction

from fairshare.placement import CHOICE_LEVELS, choose_level, node_rank
from fairshare.simulator import openb
from fairshare.simulator.engine import Simulation


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
