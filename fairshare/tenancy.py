"""Which tenant a namespace belongs to.

Pure: no network. Must not import aiohttp, kubernetes_asyncio or prometheus_client.

Resolution order, first match wins (so a label on a namespace cannot override an
administrator's explicit list):

1. the tenant whose ``namespaces`` lists the namespace;
2. the namespace label ``fairshare.io/tenant=<name>``, when it names a configured tenant;
3. the first tenant (in config order) whose ``namespaceSelector`` matchLabels all match;
4. the ``defaultTenant`` policy: ``tenant`` → the default tenant's name,
   ``deny-gpu`` / ``allow`` → no tenant (the caller denies GPU pods or lets them pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NewType

from fairshare import fairness
from fairshare.config.schema import FairShareConfig
from fairshare.resources import LABEL_TENANT

TenantName = NewType("TenantName", str)


@dataclass(frozen=True)
class TenantResolution:
    """The outcome of resolving a namespace: a tenant or none, and why."""

    tenant: TenantName | None
    source: str  # "namespaces", "label", "selector", "default", "deny-gpu", "untracked"
    unknown_label: str | None = None
    """The namespace's tenant label when it was ignored (see ``label_warning``)."""
    label_is_inner: bool = False
    """The ignored label names a tenant with children (namespaces belong to leaves)."""

    def label_warning(self, namespace: str) -> str | None:
        """Why the namespace's tenant label was ignored, or None when it was not."""
        if self.unknown_label is None:
            return None
        head = f"namespace {namespace} has label {LABEL_TENANT}={self.unknown_label}, "
        if self.label_is_inner:
            return (
                head + f"which names {self.unknown_label}, a tenant with child tenants "
                "(namespaces belong to tenants without children); it was ignored"
            )
        return head + "which names no configured tenant; it was ignored"


def resolve_tenant(
    namespace: str, labels: Mapping[str, str], config: FairShareConfig
) -> TenantResolution:
    """Resolve ``namespace`` (with its labels) to a tenant of ``config``."""
    for t in config.tenants:
        if namespace in t.namespaces:
            return TenantResolution(TenantName(t.name), "namespaces")
    label = labels.get(LABEL_TENANT)
    unknown: str | None = None
    inner = False
    if label is not None:
        if config.tenant(label) is not None and not config.children(label):
            # Namespaces belong to tenants without children (leaves of the tree).
            return TenantResolution(TenantName(label), "label")
        unknown = label
        inner = config.tenant(label) is not None
    for t in config.tenants:
        sel = t.namespace_selector
        if sel and all(labels.get(k) == v for k, v in sel.items()):
            return TenantResolution(TenantName(t.name), "selector", unknown, inner)
    policy = config.default_tenant
    if policy.mode == "tenant":
        return TenantResolution(TenantName(policy.name), "default", unknown, inner)
    if policy.mode == "deny-gpu":
        return TenantResolution(None, "deny-gpu", unknown, inner)
    return TenantResolution(None, "untracked", unknown, inner)


def tenant_weights(config: FairShareConfig) -> dict[str, float]:
    """Every tenant's weight, including the implicit default tenant (weight 1).

    In a tree of tenants, the weight in the whole tree (``fairness.effective_weights``):
    a top-level tenant's weight, times each level's share among its siblings.
    """
    weights = {t.name: float(t.weight) for t in config.tenants}
    if config.default_tenant.mode == "tenant":
        weights.setdefault(config.default_tenant.name, 1.0)
    if not config.is_hierarchical():
        return weights
    parents = {t.name: t.parent for t in config.tenants}
    return fairness.effective_weights(weights, parents)
