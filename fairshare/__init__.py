"""fairshare: fair-share admission webhook and kube-scheduler extender for GPU clusters.

This package is the shared core used by both apps (``webhook`` and ``extender``):
config schema, quantities, tenancy, cluster state, metrics and the simulator. It must never
import ``aiohttp``, ``webhook`` or ``extender``; importing it has no side effects.
"""

__version__ = "0.1.0"
