"""Which tenant a namespace belongs to. The first match wins, so a namespace label cannot
override an administrator's explicit list:

1. the tenant whose ``namespaces`` lists the namespace;
2. the label ``fairshare.io/tenant=<name>``, when it names a configured tenant;
3. the tenant whose ``namespaceSelector`` matches (validation allows at most one);
4. ``defaultTenant``: ``tenant`` → the default tenant; ``deny-gpu`` / ``allow`` → none.

A resolution names the tenants a later step would have chosen (``passed_over``), so the
webhook can warn about them.
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
    passed_over: tuple[tuple[TenantName, str], ...] = ()
    """Other tenants a later step would have given the namespace to, with that step
    (``"label"`` or ``"selector"``), in config order."""

    def warnings(self, namespace: str) -> tuple[str, ...]:
        """Everything about this resolution its user should hear (label, passed over)."""
        label = self.label_warning(namespace)
        passed = self.passed_over_warning(namespace)
        return tuple(w for w in (label, passed) if w is not None)

    def passed_over_warning(self, namespace: str) -> str | None:
        """``namespace x is in tenant a (listed in its namespaces); its label
        fairshare.io/tenant=b is ignored``, or None when no tenant was passed over."""
        if not self.passed_over or self.tenant is None:
            return None
        how = {
            "namespaces": "listed in its namespaces",
            "label": f"by its label {LABEL_TENANT}",
        }.get(self.source, self.source)
        others = []
        for name, step in self.passed_over:
            if step == "label":
                others.append(f"its label {LABEL_TENANT}={name}")
            else:
                others.append(f"the namespaceSelector of tenant {name}")
        return (
            f"namespace {namespace} is in tenant {self.tenant} ({how}); "
            f"{' and '.join(others)} {'is' if len(others) == 1 else 'are'} ignored"
        )

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
    label = labels.get(LABEL_TENANT)
    label_is_leaf = label is not None and config.tenant(label) is not None
    # Namespaces belong to tenants without children (leaves of the tree).
    label_is_leaf = label_is_leaf and not config.children(label or "")
    for t in config.tenants:
        if namespace in t.namespaces:
            passed = _passed_over(t.name, labels, config, label if label_is_leaf else None)
            return TenantResolution(TenantName(t.name), "namespaces", passed_over=passed)
    unknown: str | None = None
    inner = False
    if label is not None:
        if label_is_leaf:
            passed = _passed_over(label, labels, config, None)
            return TenantResolution(TenantName(label), "label", passed_over=passed)
        unknown = label
        inner = config.tenant(label) is not None
    for t in config.tenants:
        if _selects(t.namespace_selector, labels):
            return TenantResolution(TenantName(t.name), "selector", unknown, inner)
    policy = config.default_tenant
    if policy.mode == "tenant":
        return TenantResolution(TenantName(policy.name), "default", unknown, inner)
    if policy.mode == "deny-gpu":
        return TenantResolution(None, "deny-gpu", unknown, inner)
    return TenantResolution(None, "untracked", unknown, inner)


def _selects(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in (selector or {}).items())


def _passed_over(
    owner: str, labels: Mapping[str, str], config: FairShareConfig, label: str | None
) -> tuple[tuple[TenantName, str], ...]:
    """Tenants other than ``owner`` that ``label`` (a leaf tenant's name) or a selector
    would have given the namespace to."""
    found: list[tuple[TenantName, str]] = []
    if label is not None and label != owner:
        found.append((TenantName(label), "label"))
    for t in config.tenants:
        if t.name != owner and _selects(t.namespace_selector, labels):
            found.append((TenantName(t.name), "selector"))
    return tuple(found)


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
