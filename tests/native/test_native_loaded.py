"""The build guard (after yarl's ``test_quoting_c_loaded``): CI must not test the
pure-Python twins twice by accident. Fails unless the ``_native`` selector picked the
compiled kernels, or ``FAIRSHARE_NO_EXTENSIONS`` asks for the twins, in which case the
selector must honour it.
"""

from __future__ import annotations

import _native

from .conftest import KERNEL_MODULES, NO_EXTENSIONS_ENV, extensions_disabled


def test_native_loaded() -> None:
    if extensions_disabled():
        assert _native.IMPLEMENTATION == "py", f"{NO_EXTENSIONS_ENV} is set but C was selected"
        return
    assert _native.IMPLEMENTATION == "c", (
        "the compiled kernels did not load; run `python setup.py build_ext --inplace` "
        f"(or set {NO_EXTENSIONS_ENV}=1 to test the pure-Python twins on purpose)"
    )


def test_selected_modules_match_implementation() -> None:
    suffix = _native.IMPLEMENTATION
    for name in KERNEL_MODULES:
        module = getattr(_native, name)
        assert module.__name__ == f"_native.{name}_{suffix}"
