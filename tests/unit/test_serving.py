"""serving: the aiohttp plumbing the webhook and the extender share."""

from __future__ import annotations

import asyncio
import gc

import pytest

import serving


async def test_freeze_after_sync_freezes_only_once_synced() -> None:
    synced = asyncio.Event()
    before = gc.get_freeze_count()
    ctx = serving.freeze_after_sync(synced)(None)  # type: ignore[arg-type]
    await ctx.__anext__()
    try:
        for _ in range(5):
            await asyncio.sleep(0)
        assert gc.get_freeze_count() == before
        synced.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
        with pytest.raises(StopAsyncIteration):
            await ctx.__anext__()


async def test_freeze_after_sync_is_cancelled_cleanly_before_the_sync() -> None:
    before = gc.get_freeze_count()
    ctx = serving.freeze_after_sync(asyncio.Event())(None)  # type: ignore[arg-type]
    await ctx.__anext__()
    with pytest.raises(StopAsyncIteration):
        await ctx.__anext__()
    assert gc.get_freeze_count() == before
