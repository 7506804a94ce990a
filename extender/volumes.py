"""The cache's PersistentVolumeClaim ledger: each tenant's ``storage`` from its
namespaces' Bound PVCs (the webhook counts the same requests against ``limit.storage``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.claims import settle_usage
from fairshare import resources, tenancy
from fairshare.config.schema import FairShareConfig
from fairshare.state import usage
from fairshare.state.cluster import ClusterState

KIND_PVC = "PersistentVolumeClaim"


@dataclass
class VolumeLedger:
    volume_claims: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Bound PVCs by uid: (namespace, storage bytes requested)."""
    storage_usage: dict[str, float] = field(default_factory=dict)
    """Bytes added to each tenant's ``storage`` column for its bound PVCs."""

    def take(self, pvc: Mapping[str, Any], *, deleted: bool) -> None:
        """Remember a PVC's storage request while it is Bound (what it holds)."""
        meta = pvc.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        key = str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        status = pvc.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        size = usage.claim_storage(dict(pvc))
        if deleted or phase != "Bound" or not size:
            self.volume_claims.pop(key, None)
            return
        ns = str(meta.get("namespace") or "default")
        self.volume_claims[key] = (ns, resources.to_kernel_units(resources.STORAGE, size))

    def recount(
        self,
        state: ClusterState,
        write: Callable[[], ClusterState],
        config: FairShareConfig,
        namespace_labels: Mapping[str, Mapping[str, str]],
    ) -> None:
        """Re-derive each tenant's ``storage`` (``write()``: the state to change, asked
        only when a figure changes)."""
        if not state.index.has(resources.STORAGE):
            self.storage_usage = {}
            return
        by_ns: dict[str, float] = {}
        for ns, size in self.volume_claims.values():
            by_ns[ns] = by_ns.get(ns, 0.0) + size
        want: dict[str, float] = {}
        for ns, size in sorted(by_ns.items()):
            labels = namespace_labels.get(ns, {})
            owner = tenancy.resolve_tenant(ns, labels, config).tenant
            if owner is not None:
                want[owner] = want.get(owner, 0.0) + size
        col = state.index.column(resources.STORAGE)
        self.storage_usage = settle_usage(write, col, want, self.storage_usage)
