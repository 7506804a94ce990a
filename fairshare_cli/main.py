"""The ``fairshare`` parser and entry points (``fairshare``, ``kubectl fairshare``,
``python -m fairshare_cli``). Errors a user can cause print ``error: ...`` and exit 1,
never a traceback; the server commands import their apps lazily.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from fairshare import __version__
from fairshare.errors import FairshareError
from fairshare_cli import certs, chargeback, live, offline, servers


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fairshare",
        description="Fair-share admission webhook and scheduler extender for GPU clusters.",
    )
    p.add_argument("--version", action="version", version=f"fairshare {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    # The order of `fairshare --help`.
    offline.add_parsers(sub)
    certs.add_parsers(sub)
    live.add_parsers(sub)
    chargeback.add_parsers(sub)
    servers.add_parsers(sub)
    return p


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl fairshare ...``: the same commands as a kubectl plugin."""
    return main(argv, prog="kubectl fairshare")


def main(argv: Sequence[str] | None = None, *, prog: str = "fairshare") -> int:
    parser = build_parser()
    parser.prog = prog
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except FairshareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
