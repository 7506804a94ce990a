"""The kube-scheduler extender: filter, prioritize, preempt and bind over the DRF core.

``app`` (aiohttp) owns the ``cache`` (the one writer of the extender's state, fed by the
watches; its ``claims`` and ``volumes`` ledgers, ``columns`` for a config that changes
the resource columns), the ``feedback`` (what kube-scheduler told it) and the gang
coordinator (``ganging``). Each call takes the cache's ``snapshot``, a frozen value, and
calls a pure verb (``verbs``, with ``wire``; the filter is ``fairshare.pipeline``'s).
Around them: ``binding`` (the Binding POST), ``requeue``, ``reserving`` / ``handoff`` /
``hami`` (shared GPUs), ``reclaimer`` (acts on ``fairshare.preemption.reclaim``'s
plans), ``leader``, ``usagehistory``, ``lastgood``, ``events`` and ``statuspage``.
"""
