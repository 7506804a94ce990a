"""A pod's GPUs on one node of the state: the devices it takes (``choose_devices``) and its
MIG slices (``mig_use``, ``mig_row``). One rule for both sides of the ledger: the
extender's bind chooses devices with it, and ``state.objects`` restores a pod bound
without the ``fairshare.io/gpu-devices`` annotation with the same function.
"""

from __future__ import annotations

from fractions import Fraction

from fairshare.podrequest import PodRequest
from fairshare.resources import MILLI_GPU
from fairshare.state.cluster import ClusterState

__all__ = ["choose_devices", "gpu_fraction_str", "mig_row", "mig_use"]


def mig_use(state: ClusterState, req: PodRequest, i: int) -> tuple[str, int] | None:
    """(profile, slices) the pod takes on node row ``i`` if it runs on MIG slices there.

    A ``nvidia.com/mig-<profile>: n`` request takes n slices of that profile anywhere;
    ``nvidia.com/gpu: n`` takes n slices on a ``single``-strategy node (whose
    ``nvidia.com/gpu`` are slices); any other pod takes none (None).
    """
    g = req.demand.gpu
    if g.source == "mig":
        return (g.mig_profile, g.count)
    if g.source == "device":
        single = state.nodes[i].mig_single
        if single:
            return (single, g.count)
    return None


def mig_row(
    state: ClusterState, req: PodRequest, i: int, use: tuple[str, int]
) -> tuple[float, ...]:
    """The pod's kernel row on node ``i`` when it takes the slices ``use``: its GPU column
    is slices × the node's milli-GPU per slice (what the slices add to the node's GPU
    capacity), so a MIG pod counts as its fraction wherever it runs."""
    per_slice = state.nodes[i].mig.get(use[0], (0, 0.0))[1]
    if per_slice <= 0:
        return req.row
    row = list(req.row)
    row[state.gpu_col] = use[1] * per_slice
    return tuple(row)


def choose_devices(
    state: ClusterState, req: PodRequest, node: int, *, milli: float, hint: int = -1
) -> tuple[tuple[int, float], ...]:
    """Devices for the pod on ``node``: (device index, milli-GPU) pairs.

    Whole devices: the first fully free ones in index order. A share of one device:
    ``hint`` when it holds the share (the fragmentation term's choice), else the
    device with the least free that still holds it (best fit, lowest index on ties).
    """
    count = req.gpu_count
    if not req.demand.wants_gpu or count == 0:
        return ()
    devs = state.node_devices(node)
    if milli >= MILLI_GPU:
        whole = [k for k, v in enumerate(devs) if v >= MILLI_GPU][:count]
        return tuple((k, float(MILLI_GPU)) for k in whole)
    if count == 1 and 0 <= hint < len(devs) and devs[hint] >= milli:
        return ((hint, milli),)
    fitting = sorted((v, k) for k, v in enumerate(devs) if v >= milli)
    return tuple((k, milli) for _, k in fitting[:count])


def gpu_fraction_str(milli: float) -> str:
    return str(Fraction(int(milli), MILLI_GPU))
