"""MIG slices in both NVIDIA device-plugin strategies: capacity, placement, accounting.

Default ``mig`` table: ``1g.10gb`` and ``1g.5gb`` are 1/7 of a GPU, i.e. 143 milli-GPU
per slice in the kernel's units (rounded up, so 7 slices are 1001 milli-GPU and 7 pods
of one slice fill them exactly).
"""

from __future__ import annotations

from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare import cluster_shares, mig, pipeline
from fairshare.config.loading import config_from_mapping
from fairshare.placement import filter_nodes, fits_after_release
from fairshare.state import objects
from tests.builders import make_pod
from tests.unit.test_state_objects import state_with

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
)
SLICE = 143.0  # ceil(1000 / 7)


def mig_node(
    name: str, allocatable: dict[str, str], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"} | (labels or {})},
        "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi"} | allocatable},
    }


def mixed(name: str = "m", **slices: int) -> dict[str, Any]:
    alloc = {f"nvidia.com/mig-{p.replace('_', '.')}": str(n) for p, n in slices.items()}
    return mig_node(name, alloc, {"nvidia.com/mig.strategy": "mixed"})


def single(name: str = "s", *, units: int = 14, profile: str = "1g.5gb") -> dict[str, Any]:
    labels = {
        "nvidia.com/gpu.product": f"NVIDIA-A100-SXM4-40GB-MIG-{profile}",
        "nvidia.com/mig.strategy": "single",
    }
    return mig_node(name, {"nvidia.com/gpu": str(units)}, labels)


def mig_pod(name: str, ns: str = "a", *, profile: str = "1g.10gb", n: int = 1, node: str = ""):
    obj = make_pod(name).ns(ns).req(cpu="1", **{f"nvidia.com/mig-{profile}": str(n)}).obj()
    return _finish(obj, name, node)


def gpu_pod(name: str, ns: str = "a", *, gpus: int = 1, node: str = "", fraction: str = ""):
    builder = make_pod(name).ns(ns)
    if fraction:
        builder.ann(**{"fairshare.io/gpu-fraction": fraction}).req(cpu="1")
    else:
        builder.req(cpu="1", gpu=gpus)
    return _finish(builder.obj(), name, node)


def _finish(obj: dict[str, Any], name: str, node: str) -> dict[str, Any]:
    obj["metadata"]["uid"] = f"uid-{name}"
    if node:
        obj["spec"]["nodeName"] = node
    obj["status"] = {"phase": "Running" if node else "Pending"}
    return obj


def req(st, obj):
    ns = obj["metadata"]["namespace"]
    return objects.pod_request(obj, config=CONFIG, tenant=ns, index=st.index)


def gpu_capacity(st, name: str) -> float:
    i = st.node_index[name]
    return st.capacity[i * st.n_res + st.gpu_col]


# -- inventory ------------------------------------------------------------------------------

INVENTORY_CASES = [
    # (allocatable, labels, devices, slices, single)
    ({"nvidia.com/mig-1g.10gb": 7}, {}, 0, {"1g.10gb": 7}, ""),
    ({"nvidia.com/gpu": 2, "nvidia.com/mig-3g.40gb": 2}, {}, 2, {"3g.40gb": 2}, ""),
    ({"nvidia.com/mig-9g.1tb": 3}, {}, 0, {}, ""),  # not in the table: not counted
    ({"nvidia.com/gpu": 8}, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, 8, {}, ""),
    (
        {"nvidia.com/gpu": 14},
        {"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"},
        0,
        {"1g.5gb": 14},
        "1g.5gb",
    ),
    (
        {"nvidia.com/gpu": 14},
        {"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/mig.strategy": "mixed"},
        14,
        {},
        "",
    ),
]


@pytest.mark.parametrize(("alloc", "labels", "devices", "slices", "profile"), INVENTORY_CASES)
def test_node_inventory(alloc, labels, devices, slices, profile):
    from fractions import Fraction

    amounts = {k: Fraction(v) for k, v in alloc.items()}
    got = mig.node_slices(amounts, labels, CONFIG.mig_fractions())
    assert (got.devices, dict(got.slices), got.single) == (devices, slices, profile)


def test_capacity_counts_slices_as_their_fraction_and_not_as_devices():
    st = state_with(mixed(**{"1g_10gb": 7}), single(units=14), config=CONFIG)
    assert gpu_capacity(st, "m") == 7 * SLICE
    assert gpu_capacity(st, "s") == 14 * SLICE
    for name in ("m", "s"):
        assert all(v < 0 for v in st.node_devices(st.node_index[name]))  # no devices
    assert st.mig_nodes == 2
    both = mig_node("both", {"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "2"})
    objects.apply_node(st, both, CONFIG)
    # 2 whole GPUs + 2 slices of 3/7 (429 milli-GPU each).
    assert gpu_capacity(st, "both") == 2000 + 2 * 429
    assert sum(v >= 0 for v in st.node_devices(st.node_index["both"])) == 2


# -- mixed strategy -------------------------------------------------------------------------


def test_mixed_pods_fill_the_slices_then_are_refused_with_the_profile_named():
    st = state_with(mixed(**{"1g_10gb": 7}), config=CONFIG)
    for k in range(7):
        p = mig_pod(f"p{k}")
        fr = filter_nodes(st, req(st, p), explain=True)
        assert fr.fits == (0,), fr.failed
        plan = verbs.bind_plan(
            wire.ExtenderBindingArgs(f"p{k}", "a", f"uid-p{k}", "m"),
            Snapshot.of(st, pending=[req(st, p)]),
        )
        assert plan.error == "" and plan.devices == () and plan.mig == ("1g.10gb", 1)
        assert "fairshare.io/gpu-devices" not in plan.annotations
        verbs.commit_bind(st, plan)
    assert st.usage_of("a")[st.gpu_col] == 7 * SLICE  # seven sevenths: the whole node
    eighth = req(st, mig_pod("p7"))
    fr = filter_nodes(st, eighth, explain=True)
    assert fr.fits == ()
    (failure,) = fr.failed
    assert failure.reason == "Insufficient nvidia.com/mig-1g.10gb (free 0, requested 1)"
    assert not failure.unresolvable  # evicting a slice holder would make room
    # Releasing one slice makes room again (what preemption checks).
    assert fits_after_release(st, eighth, 0, [st.pods["uid-p0"]])
    st.unbind("uid-p0")
    assert filter_nodes(st, eighth).fits == (0,)


def test_extender_filter_refuses_the_eighth_with_the_profile_named():
    st = state_with(mixed(**{"1g_10gb": 7}), config=CONFIG)
    for k in range(7):
        objects.apply_pod(st, mig_pod(f"p{k}", node="m"), CONFIG, "a")
    out = pipeline.filter_pod(
        st, config=CONFIG, req=req(st, mig_pod("p7")), names=["m"], pending=[]
    )
    assert out.passing == ()
    assert out.failed == {"m": "Insufficient nvidia.com/mig-1g.10gb (free 0, requested 1)"}


def test_mixed_pod_needs_its_profile_and_whole_gpus_stay_devices():
    st = state_with(
        mixed("small", **{"1g_10gb": 7}),
        mig_node("both", {"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "2"}),
        config=CONFIG,
    )
    three = req(st, mig_pod("t", profile="3g.40gb", n=2))
    fr = filter_nodes(st, three, explain=True)
    assert [st.nodes[i].name for i in fr.fits] == ["both"]
    assert {f.node: f.reason for f in fr.failed} == {
        "small": "Insufficient nvidia.com/mig-3g.40gb (free 0, requested 2)"
    }
    assert all(f.unresolvable for f in fr.failed)
    # A whole GPU and a shared one go to the devices of "both", never to slices.
    whole, half = req(st, gpu_pod("w")), req(st, gpu_pod("h", fraction="0.5"))
    for r in (whole, half):
        fr = filter_nodes(st, r, explain=True)
        assert [st.nodes[i].name for i in fr.fits] == ["both"]
        assert {f.node: f.reason for f in fr.failed} == {
            "small": "no GPU devices (only MIG slices)"
        }


def test_shares_count_a_mig_pod_as_its_fraction():
    # One node of 7 slices; a holds 1 slice: its GPU share is 1/7.
    st = state_with(mixed(**{"1g_10gb": 7}), config=CONFIG)
    objects.apply_pod(st, mig_pod("p0", node="m"), CONFIG, "a")
    shares = cluster_shares.current_shares(st, CONFIG)
    assert shares["a"] == pytest.approx(1 / 7, rel=1e-9)
    bound = st.pods["uid-p0"]
    assert bound.mig == ("1g.10gb", 1) and bound.devices == ()
    objects.delete_pod(st, "uid-p0")
    assert st.mig_used == {}
    assert st.usage_of("a")[st.gpu_col] == 0


# -- single strategy ------------------------------------------------------------------------


def test_single_strategy_gpu_units_are_slices():
    st = state_with(single(units=14), config=CONFIG)
    for k in range(14):
        p = gpu_pod(f"g{k}")
        plan = verbs.bind_plan(
            wire.ExtenderBindingArgs(f"g{k}", "a", f"uid-g{k}", "s"),
            Snapshot.of(st, pending=[req(st, p)]),
        )
        assert plan.error == "", plan.error
        assert plan.mig == ("1g.5gb", 1) and plan.devices == ()
        assert plan.row[st.gpu_col] == SLICE  # counts as 1/7 of a GPU, not as 1 GPU
        verbs.commit_bind(st, plan)
    fr = filter_nodes(st, req(st, gpu_pod("g14")), explain=True)
    assert [f.reason for f in fr.failed] == [
        "Insufficient nvidia.com/gpu (MIG 1g.5gb slices: free 0, requested 1)"
    ]
    assert st.usage_of("a")[st.gpu_col] == 14 * SLICE == gpu_capacity(st, "s")


def test_single_strategy_refuses_shared_gpu_pods_and_unknown_profiles():
    st = state_with(single(units=7), single("odd", units=7, profile="5g.99gb"), config=CONFIG)
    fr = filter_nodes(st, req(st, gpu_pod("h", fraction="0.5")), explain=True)
    assert fr.fits == ()
    assert {f.node: f.reason for f in fr.failed} == {
        "s": "no GPU devices (only MIG slices)",
        "odd": "Insufficient nvidia.com/gpu (free 0, requested 0.5)",  # uncounted slices
    }
    fr = filter_nodes(st, req(st, gpu_pod("w")), explain=True)
    assert [st.nodes[i].name for i in fr.fits] == ["s"]
    assert [f.reason for f in fr.failed] == [
        "MIG profile 5g.99gb of the node is not in the config's mig table"
    ]
    assert gpu_capacity(st, "odd") == 0


def test_watch_accounts_single_strategy_pods_as_slices():
    st = state_with(single(units=7), state_node := mig_node("plain", {"nvidia.com/gpu": "8"}),
                    config=CONFIG)  # fmt: skip
    assert state_node["metadata"]["name"] == "plain"
    objects.apply_pod(st, gpu_pod("on-s", gpus=2, node="s"), CONFIG, "a")
    objects.apply_pod(st, gpu_pod("on-plain", gpus=2, node="plain"), CONFIG, "a")
    assert st.pods["uid-on-s"].mig == ("1g.5gb", 2)
    assert st.pods["uid-on-s"].row[st.gpu_col] == 2 * SLICE
    assert st.pods["uid-on-plain"].mig is None
    assert st.pods["uid-on-plain"].row[st.gpu_col] == 2000
    assert st.mig_free(st.node_index["s"], "1g.5gb") == 5
    # A whole-GPU pod goes to either kind of node, with the right count on each.
    fits = filter_nodes(st, req(st, gpu_pod("x", gpus=5)), explain=True).fits
    assert sorted(st.nodes[i].name for i in fits) == ["plain", "s"]
    fits = filter_nodes(st, req(st, gpu_pod("x", gpus=6)), explain=True).fits
    assert [st.nodes[i].name for i in fits] == ["plain"]


def test_node_update_keeps_the_slices_held_and_removal_forgets_them():
    st = state_with(mixed(**{"1g_10gb": 7}), config=CONFIG)
    objects.apply_pod(st, mig_pod("p0", n=3, node="m"), CONFIG, "a")
    objects.apply_node(st, mixed(**{"1g_10gb": 7}), CONFIG)  # a status update
    assert st.mig_free(0, "1g.10gb") == 4
    assert st.free[st.gpu_col] == 4 * SLICE
    objects.delete_node(st, "m")
    assert st.mig_used == {} and st.mig_nodes == 0
