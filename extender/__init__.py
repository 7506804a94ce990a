"""The kube-scheduler extender: filter, prioritize, preempt and bind over the DRF core.

Pure modules (no aiohttp, kubernetes_asyncio or prometheus_client):

* ``wire`` — extender v1 JSON (PascalCase, case-insensitive decoding) in and out;
* ``filtering`` — resource/device/health fit from ``fairshare.placement`` plus the
  fair-share gate, computed as the simulator computes it;
* ``verbs`` — one pure function per verb: decoded args + the tracker's
  ``ExtenderView`` + config → answer; ``bind_decision`` decides a bind whole, and
  ``commit_bind`` accounts it before the Binding POST; preempt's victims are judged by
  ``fairshare.preemption``.

Adapters: ``tracking`` (the cluster state kept from watch events, and the view it hands
the verbs), ``app`` (aiohttp: decode, call the verb, encode; the bind lock, the Binding
POST through ``binding``), ``ganging`` (pod groups), ``reclaimer`` (acts on the plans of
``fairshare.preemption.reclaim``), ``requeue`` and the GPU handoffs.
"""
