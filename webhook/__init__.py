"""The admission webhook (mutating + validating): pure core first, HTTP adapter later.

Layout: ``wire`` (AdmissionReview models, decode/encode), ``patches`` (RFC 6902 ops),
``policies`` (``gpu_sharing``, ``quota``, ``config_guard``), ``view`` (the cluster facts a
decision reads), ``reservations`` (admitted-but-not-yet-watched pods) and ``review`` (the
whole decision). None of these import aiohttp, kubernetes_asyncio, prometheus_client or
extender; the aiohttp app, TLS and informers are separate adapter modules.
"""
