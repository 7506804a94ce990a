"""POST a pod's Binding to the API server: the bind verb's adapter. The Binding's
annotations carry ``fairshare.io/gpu-devices``, and the pods/binding subresource copies
them onto the pod in the same write that sets ``spec.nodeName`` (the pod UID as a
precondition), so a device annotation never exists without its binding, or the reverse.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import aiohttp

from extender.verbs import BindPlan


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


class ApiBinder:
    """A binder that creates ``plan.binding`` through ``pods/binding``, giving up (and
    failing the bind, which kube-scheduler retries) after ``timeout`` seconds.

    The POST goes out on the ``ApiClient``'s own connection pool (its TLS connections to
    the API server, client certificate and ``tls-server-name`` included) but not through
    its generated method: that one re-serialises the body and, its session trusting the
    environment, reads ``~/.netrc`` and the proxy variables in a worker thread for every
    request; a bind is on kube-scheduler's path for every pod. A proxy of the kubeconfig
    and a bearer token (refreshed by the configuration's hook) are used as the client
    uses them. ``close()`` closes only this session, never the shared pool.
    """

    def __init__(self, api_client: Any, *, timeout: float = BIND_TIMEOUT) -> None:
        self.config = api_client.configuration
        rest = api_client.rest_client
        self.session = aiohttp.ClientSession(
            connector=rest.pool_manager.connector, connector_owner=False, trust_env=False
        )
        self.extra: dict[str, Any] = {}
        if rest.server_hostname:
            self.extra["server_hostname"] = rest.server_hostname
        if rest.proxy:
            self.extra["proxy"] = rest.proxy
        if rest.proxy_headers:
            self.extra["proxy_headers"] = rest.proxy_headers
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.agent = str(api_client.user_agent)

    async def __call__(self, plan: BindPlan) -> None:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": self.agent,
        }
        token = (await self.config.auth_settings()).get("BearerToken")
        if token and token.get("value"):
            headers["authorization"] = token["value"]
        ns, name = quote(plan.namespace, safe=""), quote(plan.name, safe="")
        url = f"{self.config.host}/api/v1/namespaces/{ns}/pods/{name}/binding"
        async with self.session.post(
            url,
            data=json.dumps(plan.binding).encode(),
            headers=headers,
            timeout=self.timeout,
            **self.extra,
        ) as resp:
            if resp.status >= 300:
                detail = (await resp.read()).decode(errors="replace")[:300]
                raise BindingError(f"HTTP {resp.status}: {detail}")
            await resp.read()

    async def close(self) -> None:
        await self.session.close()


def api_binder(api_client: Any, *, timeout: float = BIND_TIMEOUT) -> ApiBinder:
    """The ``ApiBinder`` of ``api_client`` (call it in the event loop that serves)."""
    return ApiBinder(api_client, timeout=timeout)
