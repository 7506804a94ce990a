"""The ``fairshare`` command line (and ``kubectl fairshare``): the composition root.

It sits above the core (``fairshare``) and the apps (``webhook``, ``extender``):
its server commands start the apps, and ``status`` / ``explain`` feed one listing of the
cluster to the extender's tracker and the webhook's review. Nothing imports this package.

Modules, one per command family: ``offline`` (``config``, ``simulate``), ``certs``
(``certs``, ``client-certs``), ``live`` (``status``, ``explain``), ``servers``
(``webhook``, ``extender``, ``gpu-reporter``, ``reclaimer``); ``main`` builds the parser.
Every command imports what it runs inside its function, so ``fairshare simulate`` never
loads aiohttp.
"""
