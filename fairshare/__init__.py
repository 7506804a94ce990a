"""fairshare's core, shared by the admission webhook (``webhook``) and the kube-scheduler
extender (``extender``): config, quantities, tenancy, cluster state, fairness, placement,
metrics and the simulator. Importing it has no side effects.
"""

__version__ = "0.1.0"
