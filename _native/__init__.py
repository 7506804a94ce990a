"""Kernel selector: the compiled Cython kernels, or their pure-Python twins.

Callers write ``from _native import drf, fit, names, scoring``. ``FAIRSHARE_NO_EXTENSIONS``
(non-empty) or a Python other than CPython forces the twins; otherwise each compiled
module is used when it imports. ``IMPLEMENTATION`` is ``"c"`` only when every compiled
module loaded, so a partial build cannot pass for a full one.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

NO_EXTENSIONS: bool = bool(os.environ.get("FAIRSHARE_NO_EXTENSIONS")) or (
    sys.implementation.name != "cpython"
)


def _load(name: str) -> tuple[ModuleType, bool]:
    if not NO_EXTENSIONS:
        try:
            return __import__(f"_native.{name}_c", fromlist=["_"]), True
        except ImportError:
            pass
    return __import__(f"_native.{name}_py", fromlist=["_"]), False


drf, _drf_c = _load("drf")
fit, _fit_c = _load("fit")
names, _names_c = _load("names")
scoring, _scoring_c = _load("scoring")

IMPLEMENTATION: str = "c" if (_drf_c and _fit_c and _names_c and _scoring_c) else "py"

__all__ = ["IMPLEMENTATION", "NO_EXTENSIONS", "drf", "fit", "names", "scoring"]
