"""The kube-scheduler extender: filter, prioritize, preempt and bind over the DRF core.

``app`` (aiohttp) owns the ``cache`` (the one writer of the extender's state), the
``feedback`` (what kube-scheduler told it) and the gang coordinator (``ganging``). Each
call takes the cache's ``snapshot`` and runs a pure verb (``verbs``, with ``filtering``
and ``wire``); the other modules are adapters around them: binding, requeue, the GPU
handoffs, reclaim, leader election, usage history and the status page.
"""
