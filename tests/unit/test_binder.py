"""The extender's Binding POST: the plan's Binding, to pods/binding, with the client's
credentials, on the ApiClient's own connection pool (which closing the binder leaves
open); an API error fails the bind with its status."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api

from extender import binding, verbs


def plan(name: str = "p-1", namespace: str = "team-a") -> verbs.BindPlan:
    body = verbs.binding_body(
        name=name,
        namespace=namespace,
        uid="u1",
        node="n1",
        annotations={"fairshare.io/gpu-devices": "0:1000"},
    )
    return verbs.BindPlan(uid="u1", name=name, namespace=namespace, node="n1", binding=body)


async def serve(port: int, status: int, seen: list[dict[str, Any]]) -> web.AppRunner:
    async def bind(request: web.Request) -> web.Response:
        seen.append(
            {
                "path": request.path,
                "auth": request.headers.get("authorization"),
                "type": request.headers.get("Content-Type"),
                "body": json.loads(await request.read()),
            }
        )
        if status >= 300:
            return web.json_response({"kind": "Status", "reason": "Conflict"}, status=status)
        return web.json_response({"kind": "Status", "status": "Success"}, status=status)

    async def namespaces(request: web.Request) -> web.Response:
        return web.json_response({"kind": "NamespaceList", "metadata": {}, "items": []})

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", bind)
    app.router.add_get("/api/v1/namespaces", namespaces)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_the_binding_is_posted_with_the_clients_token(unused_tcp_port: int) -> None:
    seen: list[dict[str, Any]] = []
    runner = await serve(unused_tcp_port, 201, seen)
    config = Configuration(host=f"http://127.0.0.1:{unused_tcp_port}")
    config.api_key = {"BearerToken": "secret-token"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    try:
        async with ApiClient(config) as api:
            bind = binding.api_binder(api)
            await bind(plan())
            await bind.close()
            # The pool is the client's: still usable after the binder is closed.
            await CoreV1Api(api).list_namespace()
    finally:
        await runner.cleanup()
    assert seen == [
        {
            "path": "/api/v1/namespaces/team-a/pods/p-1/binding",
            "auth": "Bearer secret-token",
            "type": "application/json",
            "body": dict(plan().binding),
        }
    ]


async def test_an_api_error_fails_the_bind_with_its_status(unused_tcp_port: int) -> None:
    seen: list[dict[str, Any]] = []
    runner = await serve(unused_tcp_port, 409, seen)
    try:
        async with ApiClient(Configuration(host=f"http://127.0.0.1:{unused_tcp_port}")) as api:
            bind = binding.api_binder(api)
            with pytest.raises(binding.BindingError, match=r"HTTP 409.*Conflict"):
                await bind(plan())
            await bind.close()
    finally:
        await runner.cleanup()
    assert len(seen) == 1 and seen[0]["auth"] is None
