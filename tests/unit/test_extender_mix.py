"""The extender's workload mix follows the pods it sees: a pod of a GPU shape the mix
has not seen (the first pod restricted to a GPU model, the first 4-GPU pod) is in the
next mix at once, and in a small cluster the popularity is rebuilt after a tenth of the
pods changed, not after a fixed 100 changes. Found driving the local control plane:
with the mix built from the first pod, unconstrained pods filled the T4 node that a
T4-only pod had just shown the workload needs."""

from __future__ import annotations

from typing import Any

from fairshare.config.loading import config_from_mapping
from tests.builders import make_pod
from tests.extender_side import Side
from tests.unit.test_state_objects import node

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "prod", "namespaces": ["prod"]}],
    }
)


def gpu_pod(name: str, *, gpus: int = 1, model: str | None = None) -> dict[str, Any]:
    obj = make_pod(name).ns("prod").req(gpu=gpus, cpu="1").obj()
    obj["metadata"]["uid"] = f"uid-{name}"
    obj["metadata"]["resourceVersion"] = "1"
    if model is not None:
        obj["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": model}
    obj["status"] = {"phase": "Pending"}
    return obj


def tracker() -> Side:
    t = Side(lambda: CONFIG)
    t4 = node("t4")
    t4["metadata"]["labels"]["nvidia.com/gpu.product"] = "T4"
    t.on_resync("Node", [node("a100"), t4])
    t.on_resync("Namespace", [{"metadata": {"name": "prod"}}])
    return t


def test_the_first_model_restricted_pod_is_in_the_next_mix() -> None:
    # Restricted by its node selector on the GPU product label, as users write it.
    t = tracker()
    t.on_event("Pod", "ADDED", gpu_pod("a"))
    first = t.mix()
    assert first is not None and first.restricted_models == 0
    t.on_event("Pod", "ADDED", gpu_pod("t4-only", model="T4"))
    mix = t.mix()
    assert mix is not first
    assert mix is not None and mix.restricted_models != 0
    assert mix.size == 2


def test_a_new_device_count_is_in_the_next_mix() -> None:
    t = tracker()
    t.on_event("Pod", "ADDED", gpu_pod("a"))
    assert list(t.mix().gpu_count) == [1]  # type: ignore[union-attr]
    t.on_event("Pod", "ADDED", gpu_pod("b", gpus=4))
    assert sorted(t.mix().gpu_count) == [1, 4]  # type: ignore[union-attr]


def test_pods_of_known_shapes_rebuild_after_a_tenth_of_the_pods_changed() -> None:
    t = tracker()
    for i in range(30):
        t.on_event("Pod", "ADDED", gpu_pod(f"p{i}"))
    for i in range(3):
        t.on_event("Pod", "ADDED", gpu_pod(f"big{i}", gpus=4))
    base = t.mix()
    assert base is not None and sorted(base.gpu_count) == [1, 4]
    # 33 pods: a tenth is 3 changes; two more 1-GPU pods keep the mix as it is...
    t.on_event("Pod", "ADDED", gpu_pod("q0"))
    t.on_event("Pod", "ADDED", gpu_pod("q1"))
    assert t.mix() is base
    # ...the third rebuilds it, with the new popularity.
    t.on_event("Pod", "ADDED", gpu_pod("q2"))
    mix = t.mix()
    assert mix is not base and mix is not None
    one = list(mix.gpu_count).index(1)
    assert abs(mix.popularity[one] - 33 / 36) < 1e-9


def test_a_large_cluster_still_rebuilds_at_most_every_mix_every_changes() -> None:
    t = Side(lambda: CONFIG, mix_every=5)
    t.on_resync("Node", [node("a100")])
    t.on_resync("Namespace", [{"metadata": {"name": "prod"}}])
    for i in range(200):
        t.on_event("Pod", "ADDED", gpu_pod(f"p{i}"))
    base = t.mix()
    for i in range(4):
        t.on_event("Pod", "ADDED", gpu_pod(f"q{i}"))
        assert t.mix() is base  # 200 pods: a tenth is 20, capped at mix_every = 5
    t.on_event("Pod", "ADDED", gpu_pod("q4"))
    assert t.mix() is not base


# -- which pods are model-restricted ---------------------------------------------------


def _models(pod: dict[str, Any]) -> frozenset[str]:
    from fairshare import resources
    from fairshare.state import objects

    index = resources.ResourceIndex(("nvidia.com/gpu", "cpu", "memory"))
    return objects.pod_request(pod, config=CONFIG, tenant="prod", index=index).gpu_models


def _affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]
            }
        }
    }


def _in(key: str, *values: str, op: str = "In") -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


PRODUCT = "nvidia.com/gpu.product"


def test_a_node_selector_on_the_gpu_product_restricts_the_models() -> None:
    assert _models(gpu_pod("a", model="Tesla-T4")) == {"Tesla-T4"}
    assert _models(gpu_pod("b")) == frozenset()


def test_required_affinity_pins_the_models_only_when_every_term_does() -> None:
    pod = gpu_pod("a")
    pod["spec"]["affinity"] = _affinity([_in(PRODUCT, "T4", "A10")], [_in(PRODUCT, "L4")])
    assert _models(pod) == {"T4", "A10", "L4"}
    # A second term without the key lets any model through: not restricted.
    pod["spec"]["affinity"] = _affinity([_in(PRODUCT, "T4")], [_in("zone", "a")])
    assert _models(pod) == frozenset()
    # NotIn excludes models but pins none.
    pod["spec"]["affinity"] = _affinity([_in(PRODUCT, "T4", op="NotIn")])
    assert _models(pod) == frozenset()
    # Selector and affinity together: both must hold.
    pod["spec"]["nodeSelector"] = {PRODUCT: "T4"}
    pod["spec"]["affinity"] = _affinity([_in(PRODUCT, "T4", "A10")])
    assert _models(pod) == {"T4"}


def test_the_annotation_wins_and_cpu_only_pods_have_no_models() -> None:
    pod = gpu_pod("a", model="Tesla-T4")
    pod["metadata"].setdefault("annotations", {})["fairshare.io/gpu-models"] = "A100|H100"
    assert _models(pod) == {"A100", "H100"}
    cpu_only = make_pod("c").ns("prod").req(cpu="1").obj()
    cpu_only["spec"]["nodeSelector"] = {PRODUCT: "Tesla-T4"}
    assert _models(cpu_only) == frozenset()
