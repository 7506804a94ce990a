"""The ``fairshare`` command line (and ``kubectl fairshare``), the composition root above
the core and the apps: ``offline`` (``config``, ``simulate``), ``certs``, ``live``
(``status``, ``explain``) and ``servers`` (the long-running processes); ``main`` builds
the parser. Each command imports what it runs inside its function, so ``fairshare
simulate`` never loads aiohttp.
"""
