"""Build the Cython kernels in _native/.

FAIRSHARE_NO_EXTENSIONS=1 at build time skips compilation; the pure-Python
twins are then used. Compiled with -ffp-contract=off (and never -ffast-math)
so that the C kernels produce the same floats as their Python twins.
"""

import os

from setuptools import Extension, setup

KERNELS = ["drf_c", "fit_c", "names_c", "scoring_c"]


def extensions() -> list[Extension]:
    if os.environ.get("FAIRSHARE_NO_EXTENSIONS"):
        return []
    from Cython.Build import cythonize

    exts = [
        Extension(
            f"_native.{name}",
            [f"_native/{name}.pyx"],
            extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"],
        )
        for name in KERNELS
    ]
    return cythonize(
        exts,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )


setup(ext_modules=extensions())
