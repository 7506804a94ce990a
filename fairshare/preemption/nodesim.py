"""One node of a cluster state, copied: release pods on it, test a fit, reserve a pod.

The reclaim planner judges victims on these copies (the cluster's state is never
changed), and a reclaim hold (``holds.held_off``) counts its pod as running on one.
"""

from __future__ import annotations

from fairshare.placement import PodRequest, choose_devices, filter_nodes
from fairshare.state.cluster import BoundPod, ClusterState


def node_copy(state: ClusterState, i: int) -> ClusterState:
    """A one-node ``ClusterState`` holding row ``i``'s free vector and device ledger."""
    r, d = state.n_res, state.max_dev
    sim = ClusterState(state.index, max_dev=d)
    info = state.nodes[i]
    sim.nodes.append(info)
    sim.node_index[info.name] = 0
    sim.capacity.extend(state.capacity[i * r : (i + 1) * r])
    sim.free.extend(state.free[i * r : (i + 1) * r])
    sim.dev_free.extend(state.dev_free[i * d : (i + 1) * d])
    sim.healthy.append(state.healthy[i])
    sim.node_model.append(state.node_model[i])
    sim.model_ids = dict(state.model_ids)
    return sim


def clone(sim: ClusterState) -> ClusterState:
    """Another copy of a one-node copy."""
    return node_copy(sim, 0)


def release(sim: ClusterState, pod: BoundPod) -> None:
    """Give ``pod``'s row and devices back to the one-node copy."""
    for k, v in enumerate(pod.row):
        sim.free[k] += v
    for dev, milli in pod.devices:
        if 0 <= dev < sim.max_dev:
            sim.dev_free[dev] += milli


def fits(sim: ClusterState, req: PodRequest) -> bool:
    """Does ``req`` fit the one-node copy now?"""
    return bool(filter_nodes(sim, req, rows=(0,), explain=False).fits)


def reserve(sim: ClusterState, req: PodRequest) -> None:
    """Take ``req``'s place on the one-node copy (so the next beneficiary cannot)."""
    res = filter_nodes(sim, req, rows=(0,), explain=False)
    milli = res.gpu_milli.get(0, 0.0)
    row = req.row_on(sim.gpu_col, milli)
    devices = choose_devices(sim, req, 0, milli=milli) if req.demand.wants_gpu else ()
    for k, v in enumerate(row):
        sim.free[k] -= v
    for dev, m in devices:
        sim.dev_free[dev] -= m
