"""Model-aware fragmentation: task classes carry their GPU models (FGD's target workload).

A class restricted to some GPU models counts every idle GPU of a node of another model
as fragment (it cannot use any of it). Placing an unconstrained pod on such a node
therefore lowers the fragmentation measure, which pushes it off the models the
restricted pods need; the default scorer's packing tie-break must not undo that push.
"""

from __future__ import annotations

from fractions import Fraction

from fairshare.config.schema import FairShareConfig
from fairshare.placement import (
    PodRequest,
    WorkloadMix,
    build_scorer,
    build_workload_mix,
    candidates,
    class_key,
    cluster_fragmentation,
    fgd_raw,
    filter_nodes,
    score_bestfit,
    score_context,
    score_packing,
)
from fairshare.resources import GpuDemand, PodDemand, ResourceIndex
from fairshare.state.cluster import ClusterState

INDEX = ResourceIndex(("nvidia.com/gpu", "cpu", "memory"))
CPU_COL = INDEX.column("cpu")
T4 = frozenset({"T4"})


def _req(gpus: int, cpu: int, *, models: frozenset[str] = frozenset()) -> PodRequest:
    gpu = GpuDemand(count=gpus, per_device=Fraction(1), source="device") if gpus else GpuDemand()
    amounts = {"cpu": Fraction(cpu)}
    if gpus:
        amounts["nvidia.com/gpu"] = gpu.total
    row = tuple(INDEX.kernel_vector(amounts))
    return PodRequest("u", "p", "ns", None, PodDemand(amounts=amounts, gpu=gpu), row, models)


def _cluster(t4_gpus: int = 2, t4_cpu: int = 104) -> ClusterState:
    """Node 0: a T4 node; node 1: an idle 8-GPU G2 node (the trace's shapes)."""
    st = ClusterState(INDEX)
    for name, model, gpus, cpu in (("a-t4", "T4", t4_gpus, t4_cpu), ("b-g2", "G2", 8, 96)):
        alloc = {"nvidia.com/gpu": Fraction(gpus), "cpu": Fraction(cpu), "memory": Fraction(2**38)}
        st.add_node(name, alloc, labels={"nvidia.com/gpu.product": model})
    return st


def _mix(st: ClusterState, t4_only: int, anywhere: int) -> WorkloadMix:
    """A mix of 1-GPU classes: ``t4_only`` pods restricted to T4, ``anywhere`` not."""
    reqs = [_req(1, 1, models=T4)] * t4_only + [_req(1, 1)] * anywhere
    return build_workload_mix(
        (class_key(r, cpu_col=CPU_COL) for r in reqs), model_ids=st.model_ids, coverage=1.0
    )


def test_the_class_key_carries_the_allowed_models() -> None:
    st = _cluster()
    restricted, free = _req(1, 1, models=T4), _req(1, 1)
    assert class_key(restricted, cpu_col=CPU_COL) != class_key(free, cpu_col=CPU_COL)
    assert class_key(restricted, cpu_col=CPU_COL)[3] == T4
    mix = _mix(st, t4_only=3, anywhere=1)
    assert mix.size == 2  # same shape, two classes
    assert list(mix.popularity) == [0.75, 0.25]
    assert list(mix.models) == [1 << st.model_ids["T4"], 0]  # 0 = any model


def test_a_node_of_another_model_is_all_fragment_for_a_restricted_class() -> None:
    st = _cluster()
    # T4-only: the G2 node's 8 idle GPUs are fragment, the T4 node's 2 are not.
    assert cluster_fragmentation(st, _mix(st, t4_only=1, anywhere=0)) == 8000.0
    # Unconstrained: both nodes' idle GPUs are usable.
    assert cluster_fragmentation(st, _mix(st, t4_only=0, anywhere=1)) == 0.0
    # Frequency-weighted: a quarter of the mass cannot use G2.
    assert cluster_fragmentation(st, _mix(st, t4_only=1, anywhere=3)) == 2000.0


def test_an_unconstrained_pod_gains_by_leaving_t4_to_t4_only_pods() -> None:
    st = _cluster()
    ctx = score_context(st, _mix(st, t4_only=1, anywhere=3))
    pod = _req(1, 1)
    delta, device = fgd_raw(st, pod, candidates(st, [0, 1]), ctx)
    assert delta[0] == 0.0  # both classes still fit the T4 node after it
    assert delta[1] == 250.0  # 1 GPU that the T4-only quarter could not use is gone
    assert list(device) == [0, 0]


def test_the_default_scorer_follows_the_model_gradient_over_packing() -> None:
    # The T4 node is a perfect fit (best-fit packing's favourite, ~0.9 ahead of the idle
    # G2 node); the G2 node lowers fragmentation by 0.05 GPU (the T4-only mass). The
    # packing tie-break must not override that (plain best fit at weight 0.02 did).
    st = _cluster(t4_gpus=1, t4_cpu=8)
    mix = _mix(st, t4_only=1, anywhere=19)
    pod = _req(1, 8)
    fits = filter_nodes(st, pod).fits
    assert fits == (0, 1)
    scorer = build_scorer(FairShareConfig().scoring.weights())
    scored = scorer(st, pod, fits, score_context(st, mix))
    assert scored.best([n.name for n in st.nodes]) == 1
    # Without the T4-only class there is no gradient, and packing picks the tight fit.
    scored = scorer(st, pod, fits, score_context(st, _mix(st, t4_only=0, anywhere=1)))
    assert scored.best([n.name for n in st.nodes]) == 0


def test_packing_gives_no_pull_on_models_restricted_classes_may_use() -> None:
    st = _cluster()
    pod = _req(1, 1)
    mask = candidates(st, [0, 1])
    plain = score_context(st, _mix(st, t4_only=0, anywhere=1))
    restricted = score_context(st, _mix(st, t4_only=1, anywhere=3))
    best_fit, _ = score_bestfit(st, pod, mask, plain)
    assert best_fit[0] > best_fit[1] > 0.0  # best fit alone prefers the small T4 node
    # No restricted class: exactly best fit.
    assert list(score_packing(st, pod, mask, plain)[0]) == list(best_fit)
    # A T4-only class: no pull towards the T4 node, the G2 node keeps its best fit.
    out, _ = score_packing(st, pod, mask, restricted)
    assert list(out) == [0.0, best_fit[1]]


def test_the_coverage_cut_keeps_the_larger_of_equally_rare_classes() -> None:
    """At the cut, equal counts go larger key first (the FGD reference simulator's order)."""
    st = _cluster()
    common = (4.0, 1000.0, 1, frozenset())
    rare_small = (2.0, 1000.0, 1, frozenset())
    rare_big_cpu = (8.0, 1000.0, 1, T4)
    rare_two_gpus = (2.0, 1000.0, 2, frozenset())
    keys = [common] * 7 + [rare_small, rare_big_cpu, rare_two_gpus]
    # 7 of 10 pods, then one rare class reaches 80 %: the largest key, whatever the input order
    for order in (keys, list(reversed(keys))):
        mix = build_workload_mix(order, model_ids=st.model_ids, coverage=0.8)
        assert mix.size == 2
        assert list(mix.cpu) == [4.0, 8.0]
        assert list(mix.models) == [0, 1 << st.model_ids["T4"]]
        assert list(mix.popularity) == [0.875, 0.125]
    # at 90 %, the next one among the CPU ties: more devices first
    mix = build_workload_mix(keys, model_ids=st.model_ids, coverage=0.9)
    assert list(zip(mix.cpu, mix.gpu_count, strict=True)) == [(4.0, 1), (8.0, 1), (2.0, 2)]
    # an exact cut stops there: 70 % covered by the common class alone
    assert build_workload_mix(keys, model_ids=st.model_ids, coverage=0.7).size == 1
