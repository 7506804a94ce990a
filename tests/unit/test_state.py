"""ClusterState: arrays stay exact and consistent under add/bind/unbind/remove."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from fairshare.resources import CPU, GPU, MEMORY, ResourceIndex
from fairshare.state.cluster import ClusterState, StateError

IDX = ResourceIndex((GPU, CPU, MEMORY))


def _state() -> ClusterState:
    st = ClusterState(IDX)
    st.add_node(
        "a", {GPU: F(2), CPU: F(8), MEMORY: F(64)}, labels={"nvidia.com/gpu.memory": "81559"}
    )
    st.add_node("b", {GPU: F(4), CPU: F(16), MEMORY: F(128)})
    return st


def test_bind_and_unbind_are_exact_inverses():
    st = _state()
    before = (list(st.free), list(st.dev_free))
    st.bind(uid="p", node="a", row=[500.0, 1000.0, 8.0], devices=[(1, 500.0)], tenant="t")
    assert st.node_free(0) == [1500.0, 7000.0, 56.0]
    assert st.node_devices(0)[:2] == [1000.0, 500.0]
    assert st.usage_of("t") == [500.0, 1000.0, 8.0]
    st.unbind("p")
    assert (list(st.free), list(st.dev_free)) == before
    assert st.usage_of("t") == [0.0, 0.0, 0.0]


def test_device_overflow_is_refused():
    st = _state()
    st.bind(uid="p", node="a", row=[600.0, 0.0, 0.0], devices=[(0, 600.0)])
    with pytest.raises(StateError, match="device 0"):
        st.bind(uid="q", node="a", row=[600.0, 0.0, 0.0], devices=[(0, 600.0)])
    with pytest.raises(StateError, match="already bound"):
        st.bind(uid="p", node="a", row=[0.0, 0.0, 0.0])


def test_remove_node_keeps_rows_dense_and_drops_its_pods():
    st = _state()
    st.add_node("c", {GPU: F(8), CPU: F(32), MEMORY: F(256)})
    st.bind(uid="on-a", node="a", row=[1000.0, 0.0, 0.0], devices=[(0, 1000.0)], tenant="t")
    gone = st.remove_node("a")
    assert [p.uid for p in gone] == ["on-a"]
    assert st.usage_of("t") == [0.0, 0.0, 0.0]
    # "c" (the last row) moved into slot 0
    assert st.node_index == {"c": 0, "b": 1}
    assert st.node_free(0) == [8000.0, 32000.0, 256.0]
    assert len(st.free) == 2 * IDX.width and len(st.dev_free) == 2 * st.max_dev


def test_nodes_with_more_devices_grow_the_device_table():
    st = _state()
    st.add_node("big", {GPU: F(16), CPU: F(1), MEMORY: F(1)})
    assert st.max_dev == 16
    assert st.node_devices(0)[:3] == [1000.0, 1000.0, -1.0]
    assert st.node_devices(2).count(1000.0) == 16


def test_replacing_a_node_keeps_what_is_bound():
    st = _state()
    st.bind(uid="p", node="b", row=[1000.0, 4000.0, 0.0], devices=[(2, 1000.0)])
    st.add_node("b", {GPU: F(4), CPU: F(32), MEMORY: F(128)})  # CPU grew
    assert st.node_free(1) == [3000.0, 28000.0, 128.0]
    assert st.node_devices(1)[2] == 0.0


def test_device_memory_from_feature_discovery_label():
    st = _state()
    assert st.nodes[0].device_memory == 81559 * 1024 * 1024
    assert st.nodes[1].device_memory == 0


# -- GPU amounts that are not whole milli-GPU ---------------------------------------------


def _part(n: int, d: int) -> float:
    """A part of a DRA GPU as the tracker and the simulator put it in a row: the exact
    float of its milli-GPU (``objects.with_claim_gpus``)."""
    return float(F(n, d) * 1000)


@pytest.mark.parametrize("d", [3, 7, 6])
def test_d_shares_of_1_over_d_fill_a_device_exactly(d):
    """Rounded up to whole milli-GPU, six 1/7 MIG partitions held 858 and the seventh did
    not fit the 142 left; kept exact, d parts of 1/d fill the device to 0."""
    st = _state()
    share = _part(1, d)
    for k in range(d):
        assert st.node_devices(0)[0] >= share, k  # what the fit kernel compares
        st.bind(uid=f"p{k}", node="a", row=[share, 0.0, 0.0], devices=[(0, share)], tenant="t")
    assert st.node_devices(0)[0] == 0.0
    assert st.node_free(0)[0] == 1000.0
    assert st.usage_of("t")[0] == 1000.0
    with pytest.raises(StateError, match="device 0"):
        st.bind(uid="more", node="a", row=[share, 0.0, 0.0], devices=[(0, share)])
    for k in range(d):
        st.unbind(f"p{k}")
    assert st.node_devices(0)[:2] == [1000.0, 1000.0]
    assert st.node_free(0)[0] == 2000.0 and st.usage_of("t")[0] == 0.0
    assert st.total_free()[0] == 6000.0
    assert st._exact == {}  # nothing left to keep once the figures are whole again


def test_a_partition_taken_and_given_back_among_others_leaves_whole_gpus():
    """Float sums of 142.857142857142857 drifted: two free GPUs read 1999.9999999999995
    and a 2-GPU request was refused."""
    st = _state()
    seventh, third = _part(1, 7), _part(1, 3)
    st.bind(uid="w", node="b", row=[1000.0, 0.0, 0.0], devices=[(0, 1000.0)], tenant="t")
    st.bind(uid="m", node="b", row=[seventh, 0.0, 0.0], devices=[(1, seventh)], tenant="t")
    st.bind(uid="s", node="b", row=[third, 0.0, 0.0], devices=[(2, third)], tenant="u")
    st.unbind("w")
    st.unbind("m")
    assert st.node_free(1)[0] == 4000.0 - third
    st.unbind("s")
    assert st.node_free(1)[0] == 4000.0 and st.node_devices(1)[:4] == [1000.0] * 4
    assert st.usage_of("t")[0] == 0.0 and st.node_tenant_gpu["b"] == {"t": 0.0, "u": 0.0}


def test_a_closed_shared_gpu_reopens_with_exactly_its_room():
    st = _state()
    seventh = _part(1, 7)
    st.bind(uid="p", node="a", row=[seventh, 0.0, 0.0], devices=[(1, seventh)], group="g")
    st.close_group("g")
    assert st.node_devices(0)[1] == 0.0
    st.unbind("p")
    assert st.node_devices(0)[1] == 1000.0


def test_a_node_replaced_while_holding_parts_keeps_them_exactly():
    st = _state()
    seventh = _part(1, 7)
    st.bind(uid="p", node="b", row=[seventh, 0.0, 0.0], devices=[(0, seventh)])
    st.add_node("b", {GPU: F(4), CPU: F(32), MEMORY: F(128)})  # CPU grew
    st.unbind("p")
    assert st.node_free(1)[0] == 4000.0 and st.node_devices(1)[0] == 1000.0
