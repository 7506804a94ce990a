"""GPUs published through DRA ResourceSlices are node capacity; KEP-5004 pods fit them.

The slices and classes are shaped as NVIDIA's DRA driver publishes them
(``tests/nvidia_dra.py``). Each test here fails on a fairshare that models GPUs from
``nvidia.com/gpu`` allocatable alone (capacity 0 on a DRA-only node, the filter's
``Insufficient nvidia.com/gpu``) or counts a KEP-5004 pod's generated claim besides its
own request.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare import cluster_shares, dra, verdicts
from fairshare.config.loading import config_from_mapping
from fairshare.resources import GPU
from fairshare.state import objects
from fairshare.state.usage import UsageTracker
from tests import nvidia_dra as nv
from tests.extender_side import Side
from tests.unit.test_state_objects import node, pod, state_with

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
)
CLASSES = {nv.GPU_CLASS: nv.device_class(), nv.MIG_CLASS: nv.device_class(nv.MIG_CLASS, "mig")}


def dra_node(name: str) -> dict[str, Any]:
    """A node of a DRA-only GPU fleet: no nvidia.com/gpu allocatable at all."""
    obj = node(name, gpus=0)
    del obj["status"]["allocatable"][GPU]
    return obj


# -- the device classes fairshare can read ---------------------------------------------------


def test_device_match_reads_nvidias_gpu_class_and_refuses_other_cel():
    got = dra.device_match(nv.device_class())
    assert got == dra.DeviceMatch(nv.DRIVER, ((nv.DRIVER, "type", "gpu"),))
    gpu, mig = nv.gpu_device("n1", 0), nv.mig_device("n1", 0, 0)
    assert isinstance(got, dra.DeviceMatch)
    assert got.matches(nv.DRIVER, gpu) and not got.matches(nv.DRIVER, mig)
    assert not got.matches("gpu.amd.com", gpu)
    # A fully qualified attribute name is the same attribute.
    qualified = copy.deepcopy(gpu)
    qualified["attributes"] = {f"{nv.DRIVER}/type": {"string": "gpu"}}
    assert got.matches(nv.DRIVER, qualified)
    odd = nv.device_class()
    odd["spec"]["selectors"][0]["cel"]["expression"] = (
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
    )
    reason = dra.device_match(odd)
    assert isinstance(reason, str) and "does not evaluate" in reason
    assert dra.device_match({"spec": {}}) == dra.DeviceMatch()  # no selector: every device


# -- capacity from slices ---------------------------------------------------------------------


def test_slice_capacity_counts_full_gpus_of_node_local_pools():
    slices = [
        nv.resource_slice("n1", 8, mig_per_gpu=7),  # MIG placements are not full GPUs
        nv.resource_slice("n2", 4, generation=1, name="n2-old"),
        nv.resource_slice("n2", 2, generation=2, name="n2-new"),  # the newest generation only
        nv.resource_slice("n3", 4, tainted=1),  # a NoSchedule device taint: not capacity
    ]
    network = nv.resource_slice("fabric", 2, name="fabric")
    del network["spec"]["nodeName"]
    network["spec"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": []}]}
    other = nv.resource_slice("n1", 3, name="n1-other")
    other["spec"]["driver"] = "gpu.example.com"
    other["spec"]["pool"]["name"] = "n1-example"
    got = dra.slice_capacity([*slices, network, other], CLASSES)
    assert dict(got.node_gpus) == {"n1": 8, "n2": 2, "n3": 3}
    assert dict(got.tainted) == {"n3": 1}
    assert got.unattributed == 2
    assert dict(got.problems) == {}
    # A configured class that does not exist (or cannot be read) counts nothing, and says so.
    missing = dra.slice_capacity(slices, {}, ("gpu.nvidia.com",))
    assert dict(missing.node_gpus) == {}
    assert dict(missing.problems) == {nv.GPU_CLASS: "DeviceClass gpu.nvidia.com not found"}


def test_apply_node_takes_dra_gpus_only_without_device_plugin_gpus():
    st = state_with(dra_node("dra"), node("dp", gpus=4), config=CONFIG)
    objects.apply_node(st, dra_node("dra"), CONFIG, dra_gpus=8)
    objects.apply_node(st, node("dp", gpus=4), CONFIG, dra_gpus=8)
    g = st.gpu_col
    assert st.capacity[st.node_index["dra"] * st.n_res + g] == 8000
    # allocatable > 0 keeps the device plugin (kube-scheduler delegates nothing there).
    assert st.capacity[st.node_index["dp"] * st.n_res + g] == 4000


# -- the extender's view follows slices live -------------------------------------------------


def _gpus(tr: Side, name: str) -> float:
    st = tr.state
    return st.capacity[st.node_index[name] * st.n_res + st.gpu_col] / 1000


def test_tracker_follows_slices_and_classes_live():
    tr = Side(lambda: CONFIG)
    tr.on_resync(dra.KIND_SLICE, [nv.resource_slice("n1", 8)])  # slices before the node
    tr.on_resync(dra.KIND_DEVICE_CLASS, list(CLASSES.values()))
    tr.on_resync("Node", [dra_node("n1"), dra_node("n2")])
    assert (_gpus(tr, "n1"), _gpus(tr, "n2")) == (8, 0)
    tr.on_event(dra.KIND_SLICE, "ADDED", nv.resource_slice("n2", 4))  # a node after
    assert _gpus(tr, "n2") == 4
    new = nv.resource_slice("n1", 6, generation=2, name="n1-gen2")
    tr.on_event(dra.KIND_SLICE, "ADDED", new)  # a new generation replaces the old
    assert _gpus(tr, "n1") == 6
    tr.on_event(dra.KIND_SLICE, "DELETED", new)
    assert _gpus(tr, "n1") == 8
    assert tr.state.total_capacity()[tr.state.gpu_col] == 12000
    tr.on_event(dra.KIND_DEVICE_CLASS, "DELETED", CLASSES[nv.GPU_CLASS])
    assert tr.state.total_capacity()[tr.state.gpu_col] == 0
    assert tr.unreadable == {"DeviceClass/gpu.nvidia.com": "DeviceClass gpu.nvidia.com not found"}
    # A pod bound meanwhile stays counted across the re-applied node.
    tr.on_event(dra.KIND_DEVICE_CLASS, "ADDED", CLASSES[nv.GPU_CLASS])
    tr.on_event("Pod", "ADDED", pod("p", ns="a", gpu=2, node_name="n1"))
    assert tr.state.usage_of("a")[tr.state.gpu_col] == 2000
    tr.on_event(dra.KIND_SLICE, "MODIFIED", nv.resource_slice("n1", 8, tainted=2))
    st = tr.state
    i = st.node_index["n1"] * st.n_res + st.gpu_col
    assert (st.capacity[i], st.free[i]) == (6000, 4000)


def _filter(tr: Side, p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    args = wire.decode_extender_args({"Pod": p, "NodeNames": names})
    view = Snapshot.of(tr.state, pending=tr.pending_queue(), namespace_labels=tr.namespace_labels)
    return verbs.filter_result(args, view, CONFIG).encode()


def test_a_kep5004_pod_fits_a_dra_only_node():
    """kube-scheduler serves ``nvidia.com/gpu: 1`` from DRA on a node with no such
    allocatable (shouldDelegateResourceToDRA): fairshare's filter must pass that node."""
    tr = Side(lambda: CONFIG)
    tr.on_resync("Node", [dra_node("n1")])
    tr.on_resync(dra.KIND_DEVICE_CLASS, [CLASSES[nv.GPU_CLASS]])
    tr.on_resync(dra.KIND_SLICE, [nv.resource_slice("n1", 8)])
    p = pod("p", ns="a", gpu=1)
    got = _filter(tr, p, ["n1"])
    assert got["NodeNames"] == ["n1"] and not got["FailedNodes"], got
    # 8 GPUs there: a 9-GPU pod still fails, naming the DRA capacity.
    big = _filter(tr, pod("q", ns="a", gpu=9), ["n1"])
    reasons = {**big["FailedNodes"], **big["FailedAndUnresolvableNodes"]}
    assert not big["NodeNames"] and "nvidia.com/gpu" in reasons["n1"], big


# -- usage: a KEP-5004 pod and its generated claim count once ---------------------------------


def generated_claim(pod_name: str, ns: str, gpus: int) -> dict[str, Any]:
    """The claim kube-scheduler creates for a pod's DRA-backed nvidia.com/gpu, allocated."""
    name = f"{pod_name}-extended-resources-abcde"
    return {
        "apiVersion": dra.API_VERSION,
        "kind": dra.KIND_CLAIM,
        "metadata": {
            "name": name,
            "namespace": ns,
            "annotations": {dra.EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "container-0-request-0",
                        "exactly": {
                            "deviceClassName": nv.GPU_CLASS,
                            "allocationMode": "ExactCount",
                            "count": gpus,
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "container-0-request-0",
                            "driver": nv.DRIVER,
                            "pool": "n1",
                            "device": f"gpu-{k}",
                        }
                        for k in range(gpus)
                    ]
                }
            }
        },
    }


def kep5004_pod(name: str, ns: str, gpus: int, node_name: str = "n1") -> dict[str, Any]:
    p = pod(name, ns=ns, gpu=gpus, node_name=node_name)
    claim = generated_claim(name, ns, gpus)["metadata"]["name"]
    p["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": claim,
        "requestMappings": [
            {"containerName": "main", "resourceName": GPU, "requestName": "container-0-request-0"}
        ],
    }
    return p


def test_generated_claim_is_not_counted_twice_with_the_pods_request():
    claim = generated_claim("p", "a", 2)
    assert dra.is_extended_resource_claim(claim) and dra.claim_gpus(claim) == 0
    assert dra.extended_resource_claim_name(kep5004_pod("p", "a", 2)) == claim["metadata"]["name"]
    # The webhook's usage (and so admission and status' quota columns).
    usage = UsageTracker(lambda: CONFIG)
    usage.on_resync("Pod", [kep5004_pod("p", "a", 2)])
    usage.on_resync(dra.KIND_CLAIM, [claim])
    assert usage.tenant_usage("a").get(GPU) == 2
    # The extender's.
    tr = Side(lambda: CONFIG)
    tr.on_resync(dra.KIND_DEVICE_CLASS, [CLASSES[nv.GPU_CLASS]])
    tr.on_resync(dra.KIND_SLICE, [nv.resource_slice("n1", 8)])
    tr.on_resync("Node", [dra_node("n1")])
    tr.on_resync(dra.KIND_CLAIM, [claim])
    tr.on_resync("Pod", [kep5004_pod("p", "a", 2)])
    assert tr.state.usage_of("a")[tr.state.gpu_col] == 2000


# -- one fleet ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dra_first", [True, False])
def test_a_mixed_fleet_gives_one_set_of_shares(dra_first: bool):
    """4 GPUs of a on the device-plugin node, 4 of b on the DRA node: equal shares of 16."""
    tr = Side(lambda: CONFIG)
    kinds = [
        (dra.KIND_DEVICE_CLASS, [CLASSES[nv.GPU_CLASS]]),
        (dra.KIND_SLICE, [nv.resource_slice("dra", 8)]),
    ]
    nodes = ("Node", [dra_node("dra"), node("dp", gpus=8, cpu="1000")])
    for kind, objs in [*kinds, nodes] if dra_first else [nodes, *kinds]:
        tr.on_resync(kind, objs)
    tr.on_resync(
        "Pod", [pod("pa", ns="a", gpu=4, node_name="dp"), kep5004_pod("pb", "b", 4, "dra")]
    )
    assert tr.state.total_capacity()[tr.state.gpu_col] == 16000
    shares = cluster_shares.current_shares(tr.state, CONFIG)
    assert shares["a"] == shares["b"] == 4 / 16


# -- kube-scheduler's DRA verdicts on KEP-5004 pods ---------------------------------------------

DRA_VERDICT = (
    "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, "
    "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
)


def test_dra_capacity_verdicts_of_kep5004_pods_are_checked_by_fairshare():
    """kube-scheduler writes 'cannot allocate all claims' for a KEP-5004 pod it tried while
    in-flight pods held the DRA GPUs: for such a pod it means "not enough free GPUs", which
    fairshare checks itself, so the pod keeps waiting (and the gate at bind holds the
    tenant that took them); a pod with claims of its own stays judged by kube-scheduler."""

    assert verdicts.rejected_by_kube_scheduler(DRA_VERDICT)
    assert not verdicts.rejected_by_kube_scheduler(DRA_VERDICT, dra_gpus_checked=True)
    kep = pod("k", ns="b", gpu=1, phase="Pending")
    with_claim = pod("c", ns="b", phase="Pending")
    with_claim["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": "t"}]
    assert dra.asks_gpus_without_claims(kep) and not dra.asks_gpus_without_claims(with_claim)
    tr = Side(lambda: CONFIG)
    tr.on_resync(dra.KIND_DEVICE_CLASS, [CLASSES[nv.GPU_CLASS]])
    tr.on_resync(dra.KIND_SLICE, [nv.resource_slice("n1", 4)])
    tr.on_resync("Node", [dra_node("n1")])
    for p in (kep, with_claim):
        p["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            | {"message": DRA_VERDICT}
        ]
    tr.on_resync("Pod", [kep, with_claim])
    assert tr.pending["uid-k"].waiting and not tr.pending["uid-k"].unschedulable
    assert not tr.pending["uid-c"].waiting and tr.pending["uid-c"].unschedulable == DRA_VERDICT


# -- claims hold devices of a DRA GPU node -----------------------------------------------------


def gpu_claim(name: str, ns: str, gpus: int) -> dict[str, Any]:
    """An allocated claim of ``gpus`` devices of the GPU class (not a generated one)."""
    obj = generated_claim(name, ns, gpus)
    obj["metadata"] = {"name": name, "namespace": ns}
    return obj


def claim_user(name: str, ns: str, claims: list[str], node_name: str = "n1") -> dict[str, Any]:
    p = pod(name, ns=ns, node_name=node_name)
    p["spec"]["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    return p


def _free_and_usage(tr: Side, tenant: str = "a") -> tuple[float, float]:
    st = tr.state
    free = st.free[st.node_index["n1"] * st.n_res + st.gpu_col] / 1000
    return free, st.usage_of(tenant)[st.gpu_col] / 1000


def test_claims_on_a_dra_node_take_its_free_gpus_once():
    """The devices kube-scheduler allocated to a pod's claim on a DRA-only node are not
    free in fairshare's view either (status' gpusAllocated, the gate's 'fits now', scores),
    and count once in the tenant's usage, however many pods share the claim."""
    tr = Side(lambda: CONFIG)
    tr.on_resync(dra.KIND_DEVICE_CLASS, [CLASSES[nv.GPU_CLASS]])
    tr.on_resync(dra.KIND_SLICE, [nv.resource_slice("n1", 8)])
    tr.on_resync("Node", [dra_node("n1")])
    tr.on_resync(dra.KIND_CLAIM, [gpu_claim("c2", "a", 2)])
    tr.on_resync("Pod", [claim_user("p0", "a", ["c2"])])
    assert _free_and_usage(tr) == (6, 2)
    tr.on_event("Pod", "ADDED", claim_user("p1", "a", ["c2"]))  # shared: still 2
    assert _free_and_usage(tr) == (6, 2)
    tr.on_event("Pod", "DELETED", claim_user("p0", "a", ["c2"]))  # p1 carries it now
    assert _free_and_usage(tr) == (6, 2)
    assert tr.carried == {"a/c2": "uid-p1"}
    tr.on_event(dra.KIND_CLAIM, "MODIFIED", gpu_claim("c2", "a", 3))
    assert _free_and_usage(tr) == (5, 3)
    # A KEP-5004 pod fits the 5 GPUs left, not 6.
    assert _filter(tr, pod("k5", ns="b", gpu=5), ["n1"])["NodeNames"] == ["n1"]
    assert _filter(tr, pod("k6", ns="b", gpu=6), ["n1"])["NodeNames"] == []
    # The slice gone, n1 has no GPUs: the claim still counts in usage, on no device.
    tr.on_event(dra.KIND_SLICE, "DELETED", nv.resource_slice("n1", 8))
    assert _free_and_usage(tr)[1] == 3 and tr.carried == {}
    tr.on_event(dra.KIND_SLICE, "ADDED", nv.resource_slice("n1", 8))
    assert _free_and_usage(tr) == (5, 3)
    tr.on_event("Pod", "DELETED", claim_user("p1", "a", ["c2"]))
    assert _free_and_usage(tr) == (8, 0) and tr.carried == {}
