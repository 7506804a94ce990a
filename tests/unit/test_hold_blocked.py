"""``holdForBlockedTenants``: a blocked (not unrunnable) pod of a lower-share tenant holds
tenants above their fair share.

Two nodes of 4 GPUs. Tenant a holds n1's 4 GPUs and 2 of n2's; b holds nothing and
waits. a's next 1-GPU pod would take it to 7/8 of the GPUs, above its fair share of 1/2.
b's pending pod of 4 GPUs fits no node now (n2 has 2 free) but would fit n2 drained:
blocked. Without the option a goes on (nothing of b fits now); with it, a waits. A pod
that fits no node even drained (8 GPUs, a selector matching no node), or that is not
waiting (scheduling gate, another scheduler), never holds anyone.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from fairshare import fairness, gate
from fairshare.config.loading import config_from_mapping
from fairshare.errors import ConfigError
from fairshare.placement import PodRequest
from fairshare.simulator.engine import Simulation
from fairshare.state import objects
from fairshare.state.cluster import ClusterState
from tests.unit.test_state_objects import node, pod, state_with


def _config(hold: bool | None) -> Any:
    doc: dict[str, Any] = {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": t, "namespaces": [t]} for t in ("a", "b", "c")],
    }
    if hold is not None:
        doc["holdForBlockedTenants"] = hold
    return config_from_mapping(doc)


OFF, ON = _config(False), _config(True)


def _pending(st: ClusterState, name: str, ns: str, gpu: int, **spec: Any) -> PodRequest:
    obj = pod(name, ns=ns, gpu=gpu, phase="Pending")
    obj["spec"].update(spec)
    return objects.pod_request(obj, config=ON, tenant=ns, index=st.index)


def _world() -> tuple[ClusterState, PodRequest]:
    st = state_with(node("n1"), node("n2"), config=ON)
    for k in range(4):
        objects.apply_pod(st, pod(f"a{k}", ns="a", gpu=1, node_name="n1"), ON, "a")
    for k in range(4, 6):
        objects.apply_pod(st, pod(f"a{k}", ns="a", gpu=1, node_name="n2"), ON, "a")
    return st, _pending(st, "a6", "a", 1)


def test_a_blocked_lower_share_pod_holds_a_tenant_above_its_fair_share():
    st, a_next = _world()
    b0 = _pending(st, "b0", "b", 4)
    assert not gate.has_fitting_pending(st, "b", [b0])  # blocked: fits nowhere now
    assert gate.pod_fits_drained(st, b0)  # ... but n2 drained would take it

    passed = gate.check_fair_gate(st, config=OFF, req=a_next, pending=[b0, a_next])
    assert passed is not None and passed.allowed, passed  # option off: the old gate

    held = gate.check_fair_gate(st, config=ON, req=a_next, pending=[b0, a_next])
    assert held is not None and not held.allowed
    assert (held.waiting_for, held.blocked) == ("b", "b/b0 (nvidia.com/gpu 4, cpu 1)")
    assert held.reason == (
        "tenant a above its fair share (0.88 > 0.50) while b waits (holdForBlockedTenants: "
        "its pod b/b0 (nvidia.com/gpu 4, cpu 1) fits no node now but would fit a drained one)"
    )


def test_a_lower_share_pod_that_fits_now_keeps_the_old_reason():
    st, a_next = _world()
    b0 = _pending(st, "b0", "b", 2)  # fits n2 now
    held = gate.check_fair_gate(st, config=ON, req=a_next, pending=[b0, a_next])
    assert held is not None and not held.allowed
    assert held.blocked == ""
    assert held.reason == "tenant a above its fair share (0.88 > 0.75) while b waits"


UNRUNNABLE: dict[str, tuple[int, dict[str, Any]]] = {
    "more GPUs than a node has": (8, {}),
    "node selector matching no node": (4, {"nodeSelector": {"zone": "nowhere"}}),
    "scheduling gate": (4, {"schedulingGates": [{"name": "hold"}]}),
    "another scheduler": (4, {"schedulerName": "someone-else"}),
}


@pytest.mark.parametrize("why", list(UNRUNNABLE))
def test_an_unrunnable_or_not_waiting_pod_holds_no_one(why):
    st, a_next = _world()
    gpus, spec = UNRUNNABLE[why]
    b0 = _pending(st, "b0", "b", gpus, **spec)
    passed = gate.check_fair_gate(st, config=ON, req=a_next, pending=[b0, a_next])
    assert passed is not None and passed.allowed, passed


def test_a_tenant_within_its_fair_share_is_never_held():
    st = state_with(node("n1"), node("n2"), config=ON)
    objects.apply_pod(st, pod("a0", ns="a", gpu=1, node_name="n1"), ON, "a")
    a_next = _pending(st, "a1", "a", 1)
    b0 = _pending(st, "b0", "b", 4)
    c0 = _pending(st, "c0", "c", 4)
    assert gate.check_fair_gate(st, config=ON, req=a_next, pending=[b0, c0, a_next]) is None


def test_the_lowest_share_blocked_tenant_is_named():
    """b holds 1 GPU, c none: both blocked, c (lower share) is the one a waits for."""
    st, a_next = _world()
    st.unbind("uid-a5")
    objects.apply_pod(st, pod("b9", ns="b", gpu=1, node_name="n2"), ON, "b")
    b0, c0 = _pending(st, "b0", "b", 4), _pending(st, "c0", "c", 3)
    held = gate.check_fair_gate(st, config=ON, req=a_next, pending=[b0, c0, a_next])
    assert held is not None and not held.allowed
    assert held.waiting_for == "c" and held.blocked.startswith("c/c0 ")


def test_drained_probes_are_memoised_per_node_change_and_dominated_shapes_skipped(monkeypatch):
    """b queues 8-, 9- and 10-GPU pods (none fits a 4-GPU node even drained) twice. The
    drained fit is probed for the 8-GPU shape only (the others dominate it), once for
    every decision until a node changes; binds leave it alone."""
    st, a_next = _world()
    queue = [_pending(st, f"b{g}{k}", "b", g) for k in range(2) for g in (8, 9, 10)]
    drained_probes: list[int] = []
    real = gate.cluster.pod_fits_somewhere

    def counting(state: ClusterState, p: PodRequest) -> bool:
        if state is st.drained():
            drained_probes.append(p.gpu_count)
        return real(state, p)

    monkeypatch.setattr(gate.cluster, "pod_fits_somewhere", counting)
    for _ in range(2):
        passed = gate.check_fair_gate(st, config=ON, req=a_next, pending=[*queue, a_next])
        assert passed is not None and passed.allowed
    assert drained_probes == [8]
    objects.apply_pod(st, pod("c9", ns="c", gpu=1, node_name="n2"), ON, "c")  # a bind
    st.unbind("uid-c9")  # room given back: still the same nodes
    gate.check_fair_gate(st, config=ON, req=a_next, pending=[*queue, a_next])
    assert drained_probes == [8]
    objects.apply_node(st, node("n3"), ON)  # a node change: probe again
    passed = gate.check_fair_gate(st, config=ON, req=a_next, pending=[*queue, a_next])
    assert passed is not None and passed.allowed
    assert drained_probes == [8, 8]


def test_drained_twin_has_the_nodes_and_none_of_the_pods():
    st, _ = _world()
    twin = st.drained()
    assert twin is st.drained()  # cached
    assert [n.name for n in twin.nodes] == ["n1", "n2"]
    assert list(twin.free) == list(st.capacity) and not twin.pods
    assert all(v == 1000.0 for v in twin.node_devices(0)[:4])


def test_check_gate_counts_a_blocked_contender():
    blocked = gate.Contender("b", fairness.CurrentShare(0.0), False, "b/p (nvidia.com/gpu 4)")
    idle = gate.Contender("c", fairness.CurrentShare(0.0), False)
    d = gate.check_gate(
        tenant="a",
        current_share=fairness.CurrentShare(0.8),
        share_after=fairness.ShareAfter(0.9),
        fair_share=0.5,
        contenders=[blocked, idle],
    )
    assert (d.allowed, d.waiting_for, d.blocked) == (False, "b", "b/p (nvidia.com/gpu 4)")
    d = gate.check_gate(
        tenant="a",
        current_share=fairness.CurrentShare(0.8),
        share_after=fairness.ShareAfter(0.9),
        fair_share=0.5,
        contenders=[idle],
    )
    assert d.allowed


def test_config_option_defaults_off_and_takes_booleans_only():
    assert _config(None).hold_for_blocked_tenants is False
    assert ON.hold_for_blocked_tenants is True
    with pytest.raises(ConfigError, match="holdForBlockedTenants"):
        _config("sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="holdForBlockedTenant"):
        config_from_mapping(
            {
                "apiVersion": "fairshare.io/v1alpha1",
                "kind": "FairShareConfig",
                "holdForBlockedTenant": True,
            }
        )


def _sim_pod(name: str, ns: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": gpus}}}]
        },
    }


@pytest.mark.parametrize("hold", [False, True])
def test_the_simulator_runs_the_same_gate(hold):
    """The same story in the simulator (same core): a takes 6 of 8 GPUs while alone, b
    then queues a 4-GPU pod (no node has 4 free), a a seventh pod."""
    sim = Simulation(ON if hold else OFF, policy="ours")
    for n in ("n1", "n2"):
        sim.add_node(n, {"nvidia.com/gpu": Fraction(4), "cpu": Fraction(32)}, {})
    for k in range(6):
        sim.submit(sim.request_for(_sim_pod(f"a{k}", "a", 1), uid=f"a{k}"))
        assert sim.try_place(f"a{k}").status == "running"
    sim.submit(sim.request_for(_sim_pod("b0", "b", 4), uid="b0"))
    sim.submit(sim.request_for(_sim_pod("a6", "a", 1), uid="a6"))
    assert sim.try_place("b0").status == "pending"  # blocked
    out = sim.try_place("a6")
    if hold:
        assert out.status == "pending"
        assert "while b waits (holdForBlockedTenants: its pod b/b0 " in sim.last_reason["a6"]
    else:
        assert out.status == "running"
