"""Golden AdmissionReview fixtures (``*.request.*``, ``*.response.json``, ``*.patch.json``).

``cluster.json`` is the cluster every request is judged against; ``cases`` loads it and
runs a request through the webhook core; ``regenerate`` rewrites the expected files
(review its diff like code).
"""
