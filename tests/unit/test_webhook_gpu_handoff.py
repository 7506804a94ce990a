"""Handoff "reservation" at admission: ConfigMap name, env and volume of a fractional pod."""

from __future__ import annotations

from typing import Any

from fairshare.config.loading import config_from_mapping
from tests.builders import make_pod
from tests.wire.test_admission_wire import apply_patch
from webhook import patches
from webhook.policies import gpu_handoff, gpu_sharing
from webhook.policies.gpu_sharing import Rejection

CONFIG = config_from_mapping({"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig"})


def two_containers(**annotations: str) -> dict[str, Any]:
    pod = make_pod("train").ns("lab").annotations(annotations).req(cpu="1").obj()
    pod["spec"]["containers"].append(
        {"name": "worker", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    )
    return pod


def patched(pod: dict[str, Any], uid: str = "req-1") -> tuple[dict[str, Any], str]:
    builder = patches.PatchBuilder(pod)
    name = gpu_handoff.handoff_ops(pod, builder, request_uid=uid)
    return apply_patch(pod, [op.as_json() for op in builder.ops]), name


def test_names_fit_63_characters_and_differ_per_request():
    pod = {"metadata": {"generateName": "a" * 80 + "-"}, "spec": {}}
    one = gpu_handoff.configmap_name(pod, "uid-1")
    assert len(one) == 63 and one.endswith("-gpu") and one.startswith("aaa")
    assert one != gpu_handoff.configmap_name(pod, "uid-2")
    assert gpu_handoff.configmap_name({"metadata": {"name": "p"}}, "u").startswith("p-")


def test_the_named_container_gets_the_env_and_a_users_value_is_replaced():
    pod = two_containers(
        **{"fairshare.io/gpu-fraction": "0.5", "fairshare.io/gpu-container": "worker"}
    )
    out, name = patched(pod)
    assert "env" not in out["spec"]["containers"][0]
    env = {e["name"]: e for e in out["spec"]["containers"][1]["env"]}
    ref = env["NVIDIA_VISIBLE_DEVICES"]["valueFrom"]["configMapKeyRef"]
    # Required: no "optional", so the kubelet waits for the key.
    assert ref == {"name": name, "key": "NVIDIA_VISIBLE_DEVICES"}
    assert env["GPU_PORTION"]["valueFrom"]["configMapKeyRef"]["name"] == name
    assert [v for v in out["spec"]["volumes"] if v["name"] == "fairshare-gpu-handoff"] == [
        {"name": "fairshare-gpu-handoff", "configMap": {"name": name}}
    ]
    assert out["metadata"]["annotations"]["fairshare.io/gpu-configmap"] == name
    # Reinvocation (another request UID) keeps the name and adds nothing.
    again = patches.PatchBuilder(out)
    assert gpu_handoff.handoff_ops(out, again, request_uid="req-2") == name
    assert again.ops == ()


def test_an_unknown_gpu_container_is_refused():
    pod = two_containers(
        **{"fairshare.io/gpu-fraction": "0.5", "fairshare.io/gpu-container": "nope"}
    )
    got = gpu_sharing.check_gpu_sharing(pod, config=CONFIG)
    assert isinstance(got, Rejection)
    assert got.problem == "no container named 'nope'"
    assert got.allowed == "one of the pod's containers: c0, worker"


def test_bind_annotations_are_refused_at_create():
    for key in ("fairshare.io/gpu-group", "fairshare.io/gpu-uuid"):
        pod = make_pod("p").annotations({key: "x"}).obj()
        got = gpu_sharing.check_gpu_sharing(pod, config=CONFIG)
        assert isinstance(got, Rejection) and "set by the fairshare scheduler" in got.problem


HAMI = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "gpuSharing": {"handoff": "hami"},
    }
)


def test_hami_gives_the_gpu_container_one_replica_and_counts_the_share():
    from fairshare.resources import pod_demand

    pod = (
        make_pod("p")
        .ns("lab")
        .annotations({"fairshare.io/gpu-fraction": "0.25"})
        .req(cpu="1")
        .obj()
    )
    builder = patches.PatchBuilder(pod)
    gpu_handoff.hami_ops(pod, builder)
    out = apply_patch(pod, [op.as_json() for op in builder.ops])
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    # Valid under hami (the replica), refused under the default handoff; the share counts.
    assert not isinstance(gpu_sharing.check_gpu_sharing(out, config=HAMI), Rejection)
    assert isinstance(gpu_sharing.check_gpu_sharing(out, config=CONFIG), Rejection)
    demand = pod_demand(out, mig={})
    assert (demand.gpu.source, str(demand.gpu.total)) == ("fraction", "1/4")
    again = patches.PatchBuilder(out)
    gpu_handoff.hami_ops(out, again)
    assert again.ops == ()


def test_the_runtime_class_is_set_only_where_the_pod_chose_none():
    pod = (
        make_pod("p").ns("lab").annotations({"fairshare.io/gpu-fraction": "0.5"}).req(cpu="1").obj()
    )
    builder = patches.PatchBuilder(pod)
    gpu_handoff.handoff_ops(pod, builder, request_uid="u", runtime_class="nvidia")
    assert (
        apply_patch(pod, [op.as_json() for op in builder.ops])["spec"]["runtimeClassName"]
        == "nvidia"
    )
    pod["spec"]["runtimeClassName"] = "kata-nvidia"
    builder = patches.PatchBuilder(pod)
    gpu_handoff.handoff_ops(pod, builder, request_uid="u", runtime_class="nvidia")
    assert (
        apply_patch(pod, [op.as_json() for op in builder.ops])["spec"]["runtimeClassName"]
        == "kata-nvidia"
    )
