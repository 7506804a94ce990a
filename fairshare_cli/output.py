"""What several command families print: config errors and reports."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from fairshare.errors import ConfigError


def print_config_error(what: str, exc: ConfigError, out: TextIO) -> None:
    """Every problem of an invalid config or scenario, one field path a line."""
    print(f"error: {what} is invalid ({len(exc.errors)} problem(s)):", file=out)
    for e in exc.errors:
        print(f"  {e.path}: {e.message}", file=out)


def write_report(report: dict[str, Any], path: Path | None) -> None:
    """The JSON report to ``path`` (nothing when None)."""
    if path is not None:
        path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        print(f"report written to {path}", file=sys.stderr)


def print_report(report: dict[str, Any], output: str, text: Callable[[Any], str]) -> None:
    """``report`` on stdout as ``-o json``, ``-o yaml`` or the table ``text`` renders."""
    if output == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    elif output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(report, sort_keys=False))
    else:
        sys.stdout.write(text(report))
    sys.stdout.flush()
