"""POST a pod's Binding to the API server: the extender's bind verb, as an adapter.

Imports kubernetes_asyncio. The Binding's ``metadata.annotations`` carry
``fairshare.io/gpu-devices``; the pods/binding storage copies them onto the pod in the
same write that sets ``spec.nodeName`` (with the pod UID as a precondition), so a crash
can never leave a device annotation without a binding, or the reverse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client as k8s_client

from scheduler_plugin.verbs import BindPlan

_client: Any = k8s_client


class BindingError(Exception):
    """The API server refused the Binding (the message carries its status and reason)."""


BIND_TIMEOUT = 5.0
"""Seconds a Binding POST may take (kube-scheduler's default extender httpTimeout)."""


def bind_timeout(lease_duration: float | None, renew_deadline: float | None) -> float:
    """How long one Binding POST may take. With leader election it must end before
    another replica can take the Lease after this one stopped renewing
    (``lease_duration - renew_deadline``), so a bind of the old term cannot land after
    the new leader's catch-up list and double-book a device."""
    if lease_duration is None or renew_deadline is None:
        return BIND_TIMEOUT
    return max(0.5, min(BIND_TIMEOUT, (lease_duration - renew_deadline) * 0.8))


def api_binder(
    api_client: Any, *, timeout: float = BIND_TIMEOUT
) -> Callable[[BindPlan], Awaitable[None]]:
    """A binder that creates ``plan.binding`` through ``pods/binding``, giving up (and
    failing the bind, which kube-scheduler retries) after ``timeout`` seconds."""
    v1 = _client.CoreV1Api(api_client)

    async def bind(plan: BindPlan) -> None:
        # Raw JSON in and out: the generated V1Binding model rejects some valid replies.
        resp = await v1.create_namespaced_pod_binding(
            plan.name,
            plan.namespace,
            dict(plan.binding),
            _preload_content=False,
            _request_timeout=timeout,
        )
        # With _preload_content=False the client hands back error statuses unraised.
        if resp.status >= 300:
            detail = (await resp.read()).decode(errors="replace")[:300]
            raise BindingError(f"HTTP {resp.status}: {detail}")
        resp.release()

    return bind
