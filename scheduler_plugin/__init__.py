"""The kube-scheduler extender: filter, prioritize, preempt and bind over the DRF core.

Pure modules (no aiohttp, kubernetes_asyncio or prometheus_client):

* ``wire`` — extender v1 JSON (PascalCase, case-insensitive decoding) in and out;
* ``filtering`` — resource/device/health fit from ``fairshare.placement`` plus the
  fair-share gate, computed as the simulator computes it;
* ``preemption`` — the veto that keeps every tenant at or above ``guaranteed``;
* ``verbs`` — one pure function per verb: decoded args + ``ClusterState`` → answer,
  and ``bind_plan``/``commit_bind`` around the Binding POST.

Adapters still to come: ``binding`` (annotate + POST the Binding) and ``app`` (aiohttp).
"""
