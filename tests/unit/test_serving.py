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


def test_server_options_one_value_or_the_same_as_keywords() -> None:
    opts = serving.ServerOptions("127.0.0.1", 8443, config_file="c.yaml", state_file="s.json")
    assert serving.ServerOptions.given(opts, {}) is opts
    # The command line passes them as keywords to ``serve()``: the same value.
    flags: serving.ServerFlags = {
        "config_file": "c.yaml",
        "configmap": None,
        "kubeconfig": None,
        "state_file": "s.json",
        "host": "127.0.0.1",
        "port": 8443,
        "tls_cert": None,
        "tls_key": None,
    }
    assert serving.ServerOptions.given(None, flags) == opts
    with pytest.raises(TypeError, match="given twice: host"):
        serving.ServerOptions.given(opts, {"host": "0.0.0.0"})
    with pytest.raises(TypeError):
        serving.ServerOptions.given(None, {"host": "0.0.0.0"})  # no port


def test_server_options_tls_and_client_ca() -> None:
    from fairshare.errors import FairshareError

    plain = serving.ServerOptions("0.0.0.0", 8080, config_file="c.yaml")
    assert not plain.https
    assert plain.cert_reloader(client_ca=None, metrics=None) is None  # type: ignore[arg-type]
    plain.check_client_ca(None)
    with pytest.raises(FairshareError, match="--client-ca needs --tls-cert and --tls-key"):
        plain.check_client_ca("ca.crt")
    half = serving.ServerOptions("0.0.0.0", 8443, tls_cert="tls.crt")
    assert not half.https
    both = serving.ServerOptions("0.0.0.0", 8443, tls_cert="tls.crt", tls_key="tls.key")
    assert both.https
    both.check_client_ca("ca.crt")
