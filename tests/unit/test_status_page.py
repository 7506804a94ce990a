"""The extender's read-only status page: the same report `fairshare status` builds."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer

import serving
from extender import app as ext_app
from extender import statuspage
from fairshare import report
from tests.unit.test_report import CONFIG, snapshot


def deps() -> Any:
    async def binder(plan: Any) -> None:
        return None

    d = ext_app.build_deps(config=lambda: CONFIG, ready=lambda: True, binder=binder)
    snapshot().feed(d.sink, ("Namespace", "Node", "Pod"))
    return d


async def test_status_json_is_the_report_of_the_cache() -> None:
    d = deps()
    async with TestClient(TestServer(ext_app.make_app(d))) as c:
        resp = await c.get("/status.json")
        assert resp.status == 200
        data = await resp.json()
    want = report.build_status(
        config=CONFIG,
        state=d.cache.state,
        pending=list(d.snapshot().queue),
        mix=d.cache.mix(),
        unreadable=d.cache.unreadable,
    )
    assert data == want
    a = next(t for t in data["tenants"] if t["name"] == "a")
    assert a["pods"] == {"running": 2, "pending": 1, "held": 1}
    assert "quotaUsed" not in a["resources"][0]  # the extender keeps no webhook usage


async def test_status_page_is_self_contained_html() -> None:
    async with TestClient(TestServer(ext_app.make_app(deps()))) as c:
        resp = await c.get("/status")
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
        page = await resp.text()
    assert f'content="{statuspage.REFRESH_SECONDS}"' in page
    assert "<script" not in page and "src=" not in page and "href=" not in page
    assert "a/a-3" in page and "while b waits" in page


async def test_status_is_public_like_metrics() -> None:
    assert {"/status", "/status.json", "/metrics"} <= serving.PUBLIC_PATHS


def test_report_is_cached_briefly_while_the_state_is_unchanged() -> None:
    d = deps()
    clock = [100.0]
    page = statuspage.StatusPage(d.reading, lambda: CONFIG, now=lambda: clock[0])
    first = page.report()
    assert page.report() is first
    clock[0] += statuspage.MIN_INTERVAL
    assert page.report() is not first
