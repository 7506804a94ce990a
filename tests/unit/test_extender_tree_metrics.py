"""Extender metrics in a tree of tenants: an inner tenant's usage is its subtree's, and
chargeback still charges each pod once (to its leaf)."""

from __future__ import annotations

from typing import Any

from extender import app as ext_app
from extender import serve as ext_serve
from fairshare.config.loading import config_from_mapping
from tests.unit.test_state_objects import node, pod

TREE = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "ml"},
            {"name": "a1", "parent": "ml", "namespaces": ["a1"]},
            {"name": "a2", "parent": "ml", "namespaces": ["a2"]},
            {"name": "b1", "namespaces": ["b1"]},
        ],
    }
)
GPU = "nvidia.com/gpu"


def _sample(deps: Any, name: str, tenant: str) -> float | None:
    value = deps.registry.get_sample_value(name, {"tenant": tenant, "resource": GPU})
    return None if value is None else float(value)


def test_an_inner_tenant_reports_its_subtree_usage_and_is_not_billed_twice() -> None:
    deps = ext_app.build_deps(config=lambda: TREE, ready=lambda: True)
    deps.sink.on_resync("Node", [node("n", gpus=8)])
    bound = [pod("x1", ns="a1", gpu=1, node_name="n"), pod("x2", ns="a1", gpu=1, node_name="n")]
    bound += [pod("y1", ns="a2", gpu=1, node_name="n"), pod("z1", ns="b1", gpu=1, node_name="n")]
    deps.sink.on_resync("Pod", bound)
    ext_serve.publish_metrics(deps, seconds=10)
    usage = "fairshare_tenant_usage"
    assert _sample(deps, usage, "ml") == 3.0
    assert (_sample(deps, usage, "a1"), _sample(deps, usage, "a2")) == (2.0, 1.0)
    assert _sample(deps, usage, "b1") == 1.0
    seconds = "fairshare_tenant_resource_seconds_total"
    billed = {t: _sample(deps, seconds, t) or 0.0 for t in ("ml", "a1", "a2", "b1")}
    assert billed == {"ml": 0.0, "a1": 20.0, "a2": 10.0, "b1": 10.0}
