"""The ``fairshare`` command line (and ``kubectl fairshare``): the composition root above
the core and the apps.

``offline`` (``config``, ``simulate``), ``certs`` (``certs``, ``client-certs``), ``live``
(``status``, ``explain``) and ``servers`` (``webhook``, ``extender``, ``gpu-reporter``,
``reclaimer``); ``main`` builds the parser. Each command imports what it runs inside its
function, so ``fairshare simulate`` never loads aiohttp.
"""
