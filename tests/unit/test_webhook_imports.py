"""Every webhook module imports on its own (no cycles) and pulls in no adapter library."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import webhook

MODULES = sorted(info.name for info in pkgutil.walk_packages(webhook.__path__, prefix="webhook."))
PURE = [name for name in MODULES if name.split(".")[-1] not in {"app", "main"}]
FORBIDDEN = ("aiohttp", "kubernetes_asyncio", "prometheus_client", "extender")


def test_the_core_modules_are_all_found() -> None:
    for name in ("wire", "patches", "review", "reservations", "view", "policies.quota"):
        assert f"webhook.{name}" in MODULES


@pytest.mark.parametrize("module", PURE, ids=PURE)
def test_imports_alone_without_adapter_libraries(module: str) -> None:
    # A fresh interpreter per module finds import cycles that a warm sys.modules hides
    # (aiohttp's test_circular_imports idea); -W error keeps import-time warnings fatal.
    code = f"import sys, {module}\nprint(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == ""
