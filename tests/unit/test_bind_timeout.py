"""The Binding POST gives up in time: alone after kube-scheduler's own 5 s, with leader
election before another replica can take the Lease (a bind of an old term must not land
after the next leader's catch-up list)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from extender import binding, verbs


@pytest.mark.parametrize(
    ("lease", "renew", "want"),
    [
        (None, None, 5.0),  # no election: kube-scheduler's default httpTimeout
        (15, 10.0, 4.0),  # the defaults: 80 % of the 5 s between renew deadline and expiry
        (60, 10.0, 5.0),  # never longer than the scheduler waits
        (4, 3.0, 0.8),
        (2, 1.9, 0.5),  # a floor, so a bind can still be made at all
    ],
)
def test_bind_timeout(lease: int | None, renew: float | None, want: float) -> None:
    assert binding.bind_timeout(lease, renew) == pytest.approx(want)


async def test_a_slow_binding_post_fails_after_the_timeout(unused_tcp_port: int) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", unused_tcp_port)
    await site.start()
    config = Configuration(host=f"http://127.0.0.1:{unused_tcp_port}")
    try:
        async with ApiClient(config) as api:
            bind = binding.api_binder(api, timeout=0.3)
            plan = verbs.BindPlan(
                uid="u1",
                name="p",
                namespace="ns",
                node="n1",
                tenant=None,
                row=(),
                devices=(),
                annotations={},
                binding={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}},
            )
            started = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await bind(plan)
            assert time.monotonic() - started < 4
    finally:
        await runner.cleanup()
