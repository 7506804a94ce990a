"""UsageTracker: per-tenant usage across namespaces, kept exact under events."""

from __future__ import annotations

from fractions import Fraction as F

from fairshare.config import loading
from fairshare.state.usage import UsageTracker
from tests.builders import make_pod

CONFIG = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "nlp", "namespaces": ["nlp-train"]},
            {"name": "vision", "namespaces": ["vision"]},
        ],
    }
)


def _pod(name, ns, uid, **req):
    pod = make_pod(name).ns(ns).req(**req).obj()
    pod["metadata"]["uid"] = uid
    return pod


def _ns(name, **labels):
    return {"metadata": {"name": name, "labels": labels}}


def test_usage_sums_over_the_tenants_namespaces():
    t = UsageTracker(lambda: CONFIG)
    t.on_resync("Namespace", [_ns("nlp-train"), _ns("nlp-serve", **{"fairshare.io/tenant": "nlp"})])
    t.on_resync(
        "Pod",
        [
            _pod("a", "nlp-train", "u1", gpu=2, cpu="1"),
            _pod("b", "nlp-serve", "u2", gpu=1, cpu="500m"),
            _pod("c", "vision", "u3", gpu=4),
        ],
    )
    # nlp: 2 + 1 GPUs and 1.5 cores over its two namespaces (one by label)
    assert t.tenant_usage("nlp") == {"nvidia.com/gpu": F(3), "cpu": F(3, 2)}
    assert t.tenant_namespaces("nlp") == ("nlp-serve", "nlp-train")
    assert t.tenant_usage("vision") == {"nvidia.com/gpu": F(4)}


def test_modify_delete_and_terminal_pods_subtract_exactly():
    t = UsageTracker(lambda: CONFIG)
    pod = _pod("a", "vision", "u1", gpu=2)
    t.on_event("Pod", "ADDED", pod)
    t.on_event("Pod", "MODIFIED", pod)  # the same pod again counts once
    assert t.tenant_usage("vision") == {"nvidia.com/gpu": F(2)}
    done = _pod("a", "vision", "u1", gpu=2)
    done["status"] = {"phase": "Succeeded"}
    t.on_event("Pod", "MODIFIED", done)
    assert t.tenant_usage("vision") == {}
    t.on_event("Pod", "ADDED", _pod("b", "vision", "u2", gpu=1))
    t.on_event("Pod", "DELETED", _pod("b", "vision", "u2", gpu=1))
    assert t.tenant_usage("vision") == {}


def test_claims_count_as_storage_and_bad_pods_do_not_crash():
    t = UsageTracker(lambda: CONFIG)
    pvc = {
        "metadata": {"name": "w", "namespace": "vision", "uid": "p1"},
        "spec": {"resources": {"requests": {"storage": "100Gi"}}},
    }
    t.on_event("PersistentVolumeClaim", "ADDED", pvc)
    bad = _pod("x", "vision", "u9", cpu="lots")
    t.on_event("Pod", "ADDED", bad)
    assert t.tenant_usage("vision") == {"storage": F(100 * 2**30)}
    assert "lots" in t.unreadable["u9"]


def test_seen_listener_and_device_memory():
    t = UsageTracker(lambda: CONFIG)
    seen: list[str] = []
    t.listeners.append(lambda name, _event: seen.append(name))
    t.on_event("Pod", "ADDED", _pod("a", "vision", "u1", gpu=1))
    assert seen == ["vision/a"] and t.has_pod("vision", "a")
    t.on_event(
        "Node", "ADDED", {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.memory": "81559"}}}
    )
    assert t.max_device_memory() == 81559 * 2**20
