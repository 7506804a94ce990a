"""`fairshare status --watch`: Ctrl-C ends the watch even when it lands inside
``asyncio.run`` in code that swallows the task cancellation asyncio makes of it."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from fairshare_cli import live
from fairshare_cli import main as cli


def test_ctrl_c_inside_asyncio_ends_the_watch(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    rounds = 0

    async def swallowing() -> dict[str, Any]:
        os.kill(os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return {"kind": "FairshareStatus"}  # cancellation turned into a result
        return {"kind": "FairshareStatus"}

    def status_once(args: Any) -> dict[str, Any]:
        nonlocal rounds
        rounds += 1
        if rounds > 3:
            raise AssertionError("the watch went on after Ctrl-C")
        return asyncio.run(swallowing())

    monkeypatch.setattr(live, "_status_once", status_once)
    monkeypatch.setattr(live.time, "sleep", lambda s: None)
    before = signal.getsignal(signal.SIGINT)
    args = cli.build_parser().parse_args(["status", "--watch", "1", "-o", "json"])
    assert live.cmd_status(args) == 0
    assert rounds == 1
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
