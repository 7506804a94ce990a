"""The extender's pure modules import alone and pull in no HTTP, client or metrics library.

Each module is imported in a fresh interpreter (aiohttp's ``test_circular_imports``
idea), so an import cycle or a stray adapter import shows up here even before
``lint-imports`` has a contract for the module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "fairshare.state.objects",
    "extender",
    "extender.wire",
    "extender.snapshot",
    "extender.feedback",
    "extender.cache",
    "extender.verbs",
    "fairshare.preemption.proposal",
    "fairshare.preemption.victims",
]
FORBIDDEN = ("aiohttp", "kubernetes_asyncio", "prometheus_client", "webhook")


@pytest.mark.parametrize("module", PURE, ids=PURE)
def test_pure_module_imports_alone_without_adapters(module):
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
