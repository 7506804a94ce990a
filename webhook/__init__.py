"""The admission webhook (mutating + validating). The decisions are pure (``wire``,
``patches``, ``policies``, ``view``, ``reservations``, ``gangquota``, ``review``); ``app``
(aiohttp) and ``coordination`` (reservations shared through the API) are the adapters.
"""
