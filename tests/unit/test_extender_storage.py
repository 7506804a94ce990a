"""The extender counts bound PVC storage in the tenants' usage, as admission counts it
against ``limit.storage`` (it used to watch no PVCs: storage was 0 in every share)."""

from __future__ import annotations

from typing import Any

from extender.reclaimer import KINDS
from fairshare.config.reloading import ConfigHolder
from fairshare.resources import STORAGE
from tests.extender_side import Side
from tests.unit.test_config_columns import SLIM
from tests.unit.test_state_objects import CONFIG, node

GI = 2**30


def pvc(name: str, ns: str, size: str, phase: str = "Bound") -> dict[str, Any]:
    return {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns, "uid": f"pvc-{name}"},
        "spec": {"resources": {"requests": {"storage": size}}},
        "status": {"phase": phase},
    }


def storage_of(tr: Side, tenant: str) -> float:
    return tr.state.usage_of(tenant)[tr.state.index.column(STORAGE)]


def test_bound_pvcs_count_in_the_tenants_storage() -> None:
    tr = Side(lambda: CONFIG)
    tr.on_resync("Node", [node("n1")])
    tr.on_resync("PersistentVolumeClaim", [pvc("a", "prod", "100Gi"), pvc("b", "prod", "1Ti")])
    assert storage_of(tr, "prod") == 1124 * GI
    tr.on_event("PersistentVolumeClaim", "ADDED", pvc("c", "prod", "5Gi", phase="Pending"))
    assert storage_of(tr, "prod") == 1124 * GI  # not provisioned yet: holds nothing
    tr.on_event("PersistentVolumeClaim", "MODIFIED", pvc("c", "prod", "5Gi"))
    tr.on_event("PersistentVolumeClaim", "DELETED", pvc("b", "prod", "1Ti"))
    assert storage_of(tr, "prod") == 105 * GI
    tr.on_resync("PersistentVolumeClaim", [])
    assert storage_of(tr, "prod") == 0


def test_storage_follows_the_namespace_to_its_tenant() -> None:
    tr = Side(lambda: CONFIG)
    tr.on_event("PersistentVolumeClaim", "ADDED", pvc("a", "lab", "10Gi"))
    assert storage_of(tr, "research") == 0  # lab belongs to no tenant yet
    tr.on_event("Namespace", "ADDED", {"metadata": {"name": "lab", "labels": {"team": "research"}}})
    assert storage_of(tr, "research") == 10 * GI


def test_storage_survives_a_config_swap_and_goes_with_its_column() -> None:
    holder = ConfigHolder(CONFIG)
    tr = Side(holder.get)
    tr.on_event("PersistentVolumeClaim", "ADDED", pvc("a", "prod", "10Gi"))
    holder.swap(SLIM.model_copy(update={"tenants": CONFIG.tenants}))
    assert not tr.state.index.has(STORAGE) and tr.storage_usage == {}
    holder.swap(CONFIG)
    assert storage_of(tr, "prod") == 10 * GI


def test_the_reclaimer_watches_pvcs_too() -> None:
    assert "PersistentVolumeClaim" in KINDS  # its shares count storage as the extender's


def test_declared_storage_capacity_makes_pvc_storage_count_in_shares() -> None:
    from fairshare import cluster_shares
    from fairshare.config.loading import config_from_mapping

    declared = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"name": "prod", "namespaces": ["prod"]}],
            "capacity": {"storage": "10Ti"},
        }
    )
    holder = ConfigHolder(CONFIG)
    tr = Side(holder.get)
    tr.on_resync("Node", [node("n1")])
    tr.on_event("PersistentVolumeClaim", "ADDED", pvc("a", "prod", "5Ti"))
    # No storage capacity known: the column counts in no share (never +inf).
    assert cluster_shares.current_shares(tr.state, CONFIG)["prod"] == 0
    holder.swap(declared)
    assert cluster_shares.current_shares(tr.state, declared)["prod"] == 0.5
