"""Events the extender records on pods (``kubectl describe pod`` shows them). An adapter."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

from kubernetes_asyncio import client

from extender.leader import call_raw
from fairshare.placement import PodRequest

log = logging.getLogger("fairshare.extender.events")

COMPONENT: Final = "fairshare-extender"
REASON_PREEMPTION: Final = "FairSharePreemption"
"""On a preemptor: the victims kube-scheduler proposed that the preemption policy refused."""
REASON_GANG: Final = "FairShareGang"
"""On a pod group's members: the group waits for something its owner can change
(``fairshare.gangs.status``)."""


def event_body(
    namespace: str,
    name: str,
    uid: str,
    reason: str,
    message: str,
    *,
    warning: bool = False,
    component: str = COMPONENT,
) -> dict[str, Any]:
    """A core/v1 Event on pod ``namespace/name`` (the message cut at 1024 characters)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace, "uid": uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }  # fmt: skip


async def _post(core: Any, body: dict[str, Any]) -> None:
    ns, name = body["metadata"]["namespace"], body["involvedObject"]["name"]
    try:
        status, _ = await call_raw(core.create_namespaced_event(ns, body, _preload_content=False))
        if not 200 <= status < 300:
            log.warning("event on %s/%s: HTTP %s", ns, name, status)
    except Exception as exc:  # an Event is an explanation, never worth a failure
        log.warning("event on %s/%s: %s", ns, name, exc)


post_event = _post
"""POST an Event body (``event_body``); a failure is logged, never raised."""


def gang_recorder(
    api_client: Any,
) -> Callable[[Any, Sequence[tuple[str, str, str]], str], None]:
    """A ``GangCoordinator.on_wait``: a ``FairShareGang`` Warning Event on each member
    (namespace, name, uid) not bound yet, written in the background."""

    core: Any = client.CoreV1Api(api_client)
    tasks: set[asyncio.Task[None]] = set()

    def record(key: Any, members: Sequence[tuple[str, str, str]], text: str) -> None:
        log.info("gang %s waits: %s", key, text)
        loop = asyncio.get_running_loop()
        for ns, name, uid in members:
            body = event_body(ns, name, uid, REASON_GANG, text, warning=True)
            task = loop.create_task(_post(core, body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    return record


def preemption_recorder(api_client: Any) -> Callable[[PodRequest, str], None]:
    """An ``ExtenderDeps.on_preempt`` that records a ``FairSharePreemption`` Event on the
    preemptor (in the background: the preempt verb does not wait for the API)."""

    core: Any = client.CoreV1Api(api_client)
    tasks: set[asyncio.Task[None]] = set()

    async def post(req: PodRequest, text: str) -> None:
        body = event_body(
            req.namespace, req.name, req.uid, REASON_PREEMPTION,
            f"preemption policy spared: {text}",
        )  # fmt: skip
        await _post(core, body)

    def record(req: PodRequest, text: str) -> None:
        log.info("preemption for %s/%s: spared %s", req.namespace, req.name, text)
        task = asyncio.get_running_loop().create_task(post(req, text))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return record
