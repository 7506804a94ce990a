"""Command-line tools the tests build from Go modules (tools/<tool>/build.sh, cached outside
the clone): the path of the built binary, or a skip saying why (a failure in strict mode,
where everything that can run here must run).

Strict mode: ``FAIRSHARE_STRICT`` or ``CI`` set (not "0"/"false"/"no"). `make test` sets
``FAIRSHARE_STRICT=1`` unless run as `make test STRICT=0` (a machine without Go); .ci/run
sets both."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _set(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def strict() -> bool:
    """A missing tool the project can build fails the test instead of skipping it."""
    return _set("FAIRSHARE_STRICT") or _set("CI")


in_ci = strict  # the older name


def skip_or_fail(msg: str) -> NoReturn:
    """Skip saying why; in strict mode fail instead (nothing buildable may be missing)."""
    if strict():
        pytest.fail(f"strict mode (FAIRSHARE_STRICT or CI set), so this must run: {msg}",
                    pytrace=False)  # fmt: skip
    pytest.skip(msg)


def built_tool(tool: str) -> str:
    """Build (or find cached) ``tool`` with tools/<tool>/build.sh and return its path."""
    script = ROOT / "tools" / tool / "build.sh"
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        skip_or_fail(f"{tool} could not be built (tools/{tool}/build.sh): {out.stderr.strip()}")
    return out.stdout.strip().splitlines()[-1]


def e2e_kubectl() -> Path:
    """kubectl of the e2e control plane build (`make cluster-bins`, linked as .e2e/bin)."""
    kubectl = ROOT / ".e2e" / "bin" / "kubectl"
    if not kubectl.is_file():
        skip_or_fail(f"no kubectl at {kubectl} (run `make cluster-bins`, needs Go)")
    return kubectl
