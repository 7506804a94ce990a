"""The gate skips a request shape that asks at least as much as one that fits nowhere.

``gate.dominates(big, small)``: every node that takes ``big`` takes ``small``, so if
``small`` fits nowhere ``big`` fits nowhere either and ``has_fitting_pending`` does not
probe it. A shape that does not dominate a known misfit is still probed.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from fairshare import eligibility, gate
from fairshare.placement import PodRequest
from fairshare.resources import CPU, GPU, MEMORY, GpuDemand, PodDemand
from fairshare.state.cluster import ClusterState
from tests.unit.test_eligibility import CONFIG
from tests.unit.test_state_objects import node, state_with

GI = 2**30


def req(
    st: ClusterState,
    name: str,
    *,
    gpus: int = 0,
    share: Fraction = Fraction(1),
    cpu: int = 1,
    models: str = "",
    memory: int | None = None,
    source: str = "device",
    tenant: str = "b",
    constraints: eligibility.NodeConstraints = eligibility.UNCONSTRAINED,
) -> PodRequest:
    gpu = GpuDemand()
    if gpus:
        per = Fraction(0) if memory is not None else share
        gpu = GpuDemand(count=gpus, per_device=per, memory=memory, source=source)
    amounts = {CPU: Fraction(cpu), MEMORY: Fraction(GI)}
    if gpus and memory is None:
        amounts[GPU] = gpu.total
    demand = PodDemand(amounts, gpu)
    return PodRequest(
        uid=f"uid-{name}",
        name=name,
        namespace=tenant,
        tenant=tenant,
        demand=demand,
        row=tuple(st.index.kernel_vector(demand.amounts)),
        gpu_models=frozenset(m for m in models.split("|") if m),
        constraints=constraints,
    )


ST = state_with(node("n1"), node("n2"), config=CONFIG)
ZONE_A = eligibility.parse_node_constraints({"nodeSelector": {"zone": "a"}})

DOMINANCE = [
    # (big, small, big dominates small)
    (req(ST, "b", gpus=2), req(ST, "s", gpus=1), True),
    (req(ST, "b", gpus=1), req(ST, "s", gpus=1), True),
    (req(ST, "b", gpus=1), req(ST, "s", gpus=2), False),
    (req(ST, "b", gpus=2, cpu=1), req(ST, "s", gpus=1, cpu=2), False),  # less CPU
    (req(ST, "b", gpus=1), req(ST, "s", gpus=1, share=Fraction(1, 2)), True),
    (req(ST, "b", gpus=1, share=Fraction(1, 2)), req(ST, "s", gpus=1), False),
    (req(ST, "b", gpus=1, cpu=4), req(ST, "s", cpu=2), True),  # a CPU pod, any node
    (req(ST, "b", cpu=4), req(ST, "s", gpus=1), False),
    # GPU models: the same or fewer models dominate; any model does not dominate a few.
    (req(ST, "b", gpus=1, models="T4"), req(ST, "s", gpus=1), True),
    (req(ST, "b", gpus=1, models="T4"), req(ST, "s", gpus=1, models="T4|V100"), True),
    (req(ST, "b", gpus=1, models="T4|V100"), req(ST, "s", gpus=1, models="T4"), False),
    (req(ST, "b", gpus=1), req(ST, "s", gpus=1, models="T4"), False),
    # Other node constraints, GPU-memory requests and MIG slices: never.
    (req(ST, "b", gpus=2, constraints=ZONE_A), req(ST, "s", gpus=1), False),
    (req(ST, "b", gpus=2), req(ST, "s", gpus=1, constraints=ZONE_A), False),
    (req(ST, "b", gpus=2, constraints=ZONE_A), req(ST, "s", gpus=1, constraints=ZONE_A), True),
    (req(ST, "b", gpus=1, memory=20 * GI), req(ST, "s", gpus=1, memory=10 * GI), False),
    (req(ST, "b", gpus=2, source="mig"), req(ST, "s", gpus=1, source="mig"), False),
]


@pytest.mark.parametrize(("big", "small", "expected"), DOMINANCE)
def test_dominates(big: PodRequest, small: PodRequest, expected: bool) -> None:
    assert gate.dominates(big, small) is expected


def test_no_dominance_on_a_cluster_with_mig_nodes() -> None:
    assert gate.dominates(req(ST, "b", gpus=2), req(ST, "s", gpus=1))
    assert not gate.dominates(req(ST, "b", gpus=2), req(ST, "s", gpus=1), mig=True)


def _probing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    probed: list[str] = []
    real = gate.cluster.pod_fits_somewhere

    def counting(state: ClusterState, p: PodRequest) -> bool:
        probed.append(p.name)
        return real(state, p)

    monkeypatch.setattr(gate.cluster, "pod_fits_somewhere", counting)
    return probed


def test_a_shape_dominating_a_misfit_is_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 4-GPU A100 nodes, 32 CPUs each. b's queue: 5 GPUs (fits nowhere), then shapes
    that ask at least as much (6 GPUs; 5 GPUs and more CPU; 5 GPUs of A100 only): never
    probed; then shapes that do not (4 GPUs and 33 CPUs: more CPU, fewer GPUs; 4 GPUs of
    T4 only) are probed, and fit nowhere; the last (2 GPUs) is probed and fits."""
    st = state_with(node("n1"), node("n2"), config=CONFIG)
    probed = _probing(monkeypatch)
    queue = [
        req(st, "five", gpus=5),
        req(st, "six", gpus=6),
        req(st, "five-more-cpu", gpus=5, cpu=8),
        req(st, "five-a100", gpus=5, models="A100"),
        req(st, "four-33-cpus", gpus=4, cpu=33),
        req(st, "four-t4", gpus=4, models="T4"),
        req(st, "two", gpus=2),
    ]
    assert gate.has_fitting_pending(st, "b", queue)
    assert probed == ["five", "four-33-cpus", "four-t4", "two"]
    # What was skipped is remembered as fitting nowhere: the next call probes only the
    # shape that fits (its answer is per state; no memo was passed).
    probed.clear()
    assert not gate.has_fitting_pending(st, "b", queue[:-1])
    assert probed == []


def test_the_gate_skips_dominating_shapes_across_tenants(monkeypatch: pytest.MonkeyPatch) -> None:
    """a is above its fair share; b waits for 5 GPUs then 8 (fits nowhere, skipped), c's
    pods are not in the queue. The gate probes b's 5-GPU shape once, skips the 8-GPU one,
    and lets a through: nobody behind it can run."""
    from fairshare.state import objects
    from tests.unit.test_eligibility import _pending
    from tests.unit.test_state_objects import pod

    st = state_with(node("n1"), node("n2"), config=CONFIG)
    for k in range(4):
        objects.apply_pod(st, pod(f"a{k}", ns="a", gpu=1, node_name="n1"), CONFIG, "a")
    a_next = objects.pod_request(_pending("a4", "a", 1), config=CONFIG, tenant="a", index=st.index)
    probed = _probing(monkeypatch)
    queue = [req(st, "five", gpus=5), req(st, "eight", gpus=8), a_next]
    decision = gate.check_fair_gate(st, config=CONFIG, req=a_next, pending=queue)
    assert decision is not None and decision.allowed, decision
    assert probed == ["five"]
