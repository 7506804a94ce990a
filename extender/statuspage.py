"""The extender's read-only status page: ``GET /status`` (HTML) and ``/status.json``.

The report is ``fairshare.report.build_status`` on the cache's snapshot (the numbers the
verbs decide with), rendered as one self-contained page that reloads itself every
``REFRESH_SECONDS``, and built at most once per ``MIN_INTERVAL`` while the state is
unchanged. Like ``/metrics`` it needs no client certificate (``serving.PUBLIC_PATHS``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from aiohttp import web

from extender.ganging import GangCoordinator
from extender.snapshot import Snapshot
from fairshare import report
from fairshare.config.schema import FairShareConfig

REFRESH_SECONDS = 10
MIN_INTERVAL = 2.0


class StatusPage:
    """Builds (and briefly caches) the report from the cache's snapshot."""

    def __init__(
        self,
        snapshot: Callable[[], AbstractContextManager[Snapshot]],
        config: Callable[[], FairShareConfig],
        *,
        unreadable: Callable[[], Mapping[str, str]] = dict,
        now: Callable[[], float] = time.monotonic,
        usage_history: Callable[[], Callable[[], dict[str, Any]] | None] | None = None,
        gangs: Callable[[], GangCoordinator | None] | None = None,
    ) -> None:
        self.usage_history = usage_history
        self.gangs = gangs
        self.snapshot = snapshot
        self.unreadable = unreadable
        self.config = config
        self.now = now
        self._cached: tuple[Any, float, dict[str, Any]] | None = None

    def report(self) -> dict[str, Any]:
        data = self._report()
        source = self.usage_history() if self.usage_history is not None else None
        kept = source() if source is not None else {}
        return {**data, "usageHistory": kept} if kept else data

    def _report(self) -> dict[str, Any]:
        config = self.config()
        with self.snapshot() as snap:
            return self._report_of(config, snap)

    def _report_of(self, config: FairShareConfig, snap: Snapshot) -> dict[str, Any]:
        coordinator = self.gangs() if self.gangs is not None else None
        plans = tuple(
            (k, v.arrived, v.complete)
            for k, v in (coordinator.plan_views() if coordinator else {}).items()
        )
        key = (snap.state.version, len(snap.pending), id(config), plans)
        now = self.now()
        if self._cached is not None:
            old_key, at, data = self._cached
            if old_key == key and now - at < MIN_INTERVAL:
                return data
        statuses = coordinator.statuses(config, snap) if coordinator else ()
        data = report.build_status(
            config=config,
            state=snap.state,
            pending=list(snap.queue),
            mix=snap.mix,
            unreadable=dict(self.unreadable()),
            gangs=[g.as_dict() for g in statuses],
            group_fits=snap.groups if coordinator else None,
        )
        self._cached = (key, now, data)
        return data

    async def html(self, request: web.Request) -> web.Response:
        body = report.render_status_html(self.report(), refresh=REFRESH_SECONDS)
        return web.Response(text=body, content_type="text/html", charset="utf-8")

    async def json(self, request: web.Request) -> web.Response:
        return web.json_response(self.report())


def add_routes(
    app: web.Application,
    snapshot: Callable[[], AbstractContextManager[Snapshot]],
    config: Callable[[], FairShareConfig],
    *,
    unreadable: Callable[[], Mapping[str, str]] = dict,
    usage_history: Callable[[], Callable[[], dict[str, Any]] | None] | None = None,
    gangs: Callable[[], GangCoordinator | None] | None = None,
) -> StatusPage:
    """``GET /status`` and ``GET /status.json`` on ``app``; ``usage_history`` gives the
    leader's usage history (``extender.usagehistory``), shown under
    ``usageHistory`` while it is kept; ``gangs`` the extender's pod groups and their live
    plans (``ganging.GangCoordinator``), shown under ``gangs`` while any exists."""
    page = StatusPage(
        snapshot, config, unreadable=unreadable, usage_history=usage_history, gangs=gangs
    )
    app.router.add_get("/status", page.html)
    app.router.add_get("/status.json", page.json)
    return page
