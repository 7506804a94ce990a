"""Command-line tools the tests build from Go modules (tools/<tool>/build.sh, cached outside
the clone): the path of the built binary, or a skip saying why (a failure under CI, where
everything that can run here must run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def built_tool(tool: str) -> str:
    """Build (or find cached) ``tool`` with tools/<tool>/build.sh and return its path."""
    script = ROOT / "tools" / tool / "build.sh"
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        msg = f"{tool} could not be built (tools/{tool}/build.sh): {out.stderr.strip()}"
        if in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return out.stdout.strip().splitlines()[-1]
