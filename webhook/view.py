"""The webhook's name for what admission reads of the cluster: ``TenantUsageView`` and
``StaticView`` live in the core (``fairshare.usageview``, so the ``status`` / ``explain``
reports use the same type) and are re-exported here for the webhook's modules.
"""

from __future__ import annotations

from fairshare.usageview import StaticView, TenantUsageView

__all__ = ["StaticView", "TenantUsageView"]
