"""The admission webhook (mutating + validating).

The decisions are pure: ``wire`` (AdmissionReview decode/encode), ``patches`` (RFC 6902
ops), ``policies``, ``view`` (what a decision reads of the cluster), ``reservations`` and
``gangquota`` (admitted pods not watched yet, gang holds) and ``review`` (the whole
decision). ``app`` (aiohttp) and ``coordination`` (reservations shared through the API)
are the adapters.
"""
