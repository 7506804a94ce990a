"""The kube-scheduler extender: filter, prioritize, preempt and bind over the DRF core.

``app`` (aiohttp) owns the ``cache`` (the one writer of the extender's state), the
``feedback`` (what kube-scheduler told it) and the gang coordinator (``ganging``); each
call runs a pure verb (``verbs``) on the cache's ``snapshot``. The other modules are the
adapters around them.
"""
