"""What admission reads of the cluster: the ``TenantUsageView`` protocol, shared by the
webhook's decisions and the ``status`` / ``explain`` reports.

Usage is per tenant, summed over its namespaces, in exact ``Fraction`` amounts of natural
units. ``StaticView`` is the plain-data implementation; ``ExcludingView`` leaves one
pod's own usage out (``fairshare explain``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

__all__ = ["ExcludingView", "StaticView", "TenantUsageView"]


class TenantUsageView(Protocol):
    """Read-only cluster facts for admission decisions (the webhook's ``UsageTracker``
    is one)."""

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        """The namespace's labels (empty when the namespace is unknown)."""
        ...

    def tenant_usage(self, tenant: str) -> Mapping[str, Fraction]:
        """The tenant's current usage by resource name (absent resources are zero)."""
        ...

    def tenant_namespaces(self, tenant: str) -> Sequence[str]:
        """The namespaces whose pods were counted in ``tenant_usage``."""
        ...

    def max_device_memory(self) -> int | None:
        """Bytes of the largest GPU device in the cluster, None when unknown."""
        ...


@dataclass(frozen=True)
class StaticView:
    """A ``TenantUsageView`` over plain mappings (tests, snapshots, ``--state`` files)."""

    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    usage: Mapping[str, Mapping[str, Fraction]] = field(default_factory=dict)
    namespaces: Mapping[str, Sequence[str]] = field(default_factory=dict)
    device_memory: int | None = None

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        return self.labels.get(namespace, {})

    def tenant_usage(self, tenant: str) -> Mapping[str, Fraction]:
        return self.usage.get(tenant, {})

    def tenant_namespaces(self, tenant: str) -> Sequence[str]:
        return self.namespaces.get(tenant, ())

    def max_device_memory(self) -> int | None:
        return self.device_memory


@dataclass(frozen=True)
class ExcludingView:
    """``base`` without one pod's own usage: what admission would count were the pod
    created now (an existing pod is already in the webhook's usage)."""

    base: TenantUsageView
    namespace: str
    amounts: Mapping[str, Fraction]
    tenant: str | None

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        return self.base.namespace_labels(namespace)

    def tenant_usage(self, tenant: str) -> Mapping[str, Fraction]:
        used = dict(self.base.tenant_usage(tenant))
        if tenant == self.tenant:
            for k, v in self.amounts.items():
                used[k] = used.get(k, Fraction(0)) - v
        return used

    def tenant_namespaces(self, tenant: str) -> Sequence[str]:
        return self.base.tenant_namespaces(tenant)

    def max_device_memory(self) -> int | None:
        return self.base.max_device_memory()
