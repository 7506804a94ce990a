"""One kernel suite over both implementations (after multidict's ``tests/conftest.py``).

``impl`` is a session fixture parametrized over the pure-Python twins (id ``py``) and,
when they import, the compiled Cython modules (id ``c``); both carry the ``native``
marker. ``--native`` requires the compiled modules (a test errors if they do not
import), ``--no-native`` runs the twins only; the default runs ``c`` when it imports.
The option only exists when this directory is on the command line
(``pytest tests/native --no-native``); a bare ``pytest`` uses the default.

The C modules are imported directly, so ``FAIRSHARE_NO_EXTENSIONS`` (which steers the
``_native`` selector) does not hide them here: the twins are compared whenever both
exist. ``tests/native/test_native_loaded.py`` checks the selector itself.
"""

from __future__ import annotations

import argparse
import array
import importlib
import os
from dataclasses import dataclass
from types import ModuleType

import pytest

KERNEL_MODULES = ("drf", "fit", "names", "scoring")
NO_EXTENSIONS_ENV = "FAIRSHARE_NO_EXTENSIONS"


@dataclass(frozen=True)
class KernelImplementation:
    """One implementation of every kernel module: ``py`` (twins) or ``c`` (Cython)."""

    name: str
    drf: ModuleType
    fit: ModuleType
    names: ModuleType
    scoring: ModuleType

    def __str__(self) -> str:
        return self.name


def load_implementation(name: str) -> KernelImplementation:
    """Import ``_native.{drf,fit,names,scoring}_<name>``; raises ImportError if one is missing."""
    mods = [importlib.import_module(f"_native.{mod}_{name}") for mod in KERNEL_MODULES]
    return KernelImplementation(name, *mods)


def c_import_error() -> str | None:
    """Why the compiled modules do not import, or None when they do."""
    try:
        load_implementation("c")
    except ImportError as exc:
        return f"{exc}"
    return None


def extensions_disabled() -> bool:
    return bool(os.environ.get(NO_EXTENSIONS_ENV))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--native",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--native: also run the kernel tests on the compiled Cython modules and "
        "fail if they do not import; --no-native: pure-Python twins only "
        "(default: the compiled modules too when they import)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" not in metafunc.fixturenames:
        return
    try:
        want_c = metafunc.config.getoption("native")
    except ValueError:  # option not registered: this conftest was not an initial one
        want_c = None
    names = ["py"]
    if want_c or (want_c is None and c_import_error() is None):
        names.append("c")
    params = [pytest.param(n, id=n, marks=pytest.mark.native) for n in names]
    metafunc.parametrize("impl", params, indirect=True, scope="session")


@pytest.fixture(scope="session")
def impl(request: pytest.FixtureRequest) -> KernelImplementation:
    """The kernel implementation under test (``.drf``, ``.fit``, ``.scoring``, ``.name``)."""
    name: str = request.param
    try:
        return load_implementation(name)
    except ImportError as exc:
        pytest.fail(
            f"--native given but the compiled kernels do not import ({exc}); "
            "build them with `python setup.py build_ext --inplace`",
            pytrace=False,
        )


# --- buffer builders (flat, row-major, the kernels' dtypes) --------------------------


def d(*xs: float) -> array.array[float]:
    """float64 buffer."""
    return array.array("d", [float(x) for x in xs])


def q(*xs: int) -> array.array[int]:
    """int64 buffer."""
    return array.array("q", xs)


def b(*xs: int) -> array.array[int]:
    """int8 buffer (masks)."""
    return array.array("b", xs)


def zeros_d(n: int) -> array.array[float]:
    """float64 output buffer, pre-filled with a sentinel the kernels must overwrite."""
    return array.array("d", [12345.0] * n)


def zeros_i(n: int) -> array.array[int]:
    """int32 output buffer, pre-filled with a sentinel the kernels must overwrite."""
    return array.array("i", [12345] * n)
