"""Admission never opens while the webhook restarts (issue 31, item 4), on the real
control plane.

A tenant with a GPU limit of 2 already runs two 1-GPU pods. Eight creators (asyncio
tasks, each creating 1-GPU pods in that tenant's namespace in a loop) run through

* an in-place restart of the webhook (stopped, started again on the same port, as a
  kubelet restarts a crashed container behind a Service): its first answers come before
  its first list of the cluster is complete, and must not be made on an empty view;
* a handover restart (`dev.restart_webhook`): a new webhook, ready, registered in place,
  then the old one stopped; no request may even fail for want of a webhook;
* `dev.py up` run again after the webhook process was SIGKILLed: the registrations must
  stay (pointing at the dead webhook, failurePolicy Fail) until the new one is ready.

And a webhook process asked from the instant its port opens (AdmissionReviews posted
straight to it, before its first list of the cluster can be done) never allows the pod.

The first list is quick, usually done within the 2 s a request waits for it, so left
alone these restarts might never answer a request before it. In the in-place restart and
the starting webhook, the new webhook therefore runs as a ServiceAccount with the
webhook's RBAC except reading pods (`ListHold`): its pod list is refused (403) and
retried, so the first list cannot finish, until the test sees the webhook's first answer
(in-place: its first "not synced" refusal) and grants pods. Both tests require at least
one 503 "not synced" refusal (webhook.app.NOT_SYNCED_MESSAGE).

Each time nothing is admitted: the creators' creates are all refused and the namespace
holds the same two pods. What the creators saw is recorded in `FAULT_SUMMARY`.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    CONFIG_HEAD,
    FAULT_SUMMARY,
    GPU,
    PAUSE_IMAGE,
    ROOT,
    STATE_DIR,
    Cluster,
    FairshareDev,
    TenantNamespace,
    dev_module,
    unique,
)

pytestmark = pytest.mark.e2e

LIMIT = 2
CREATORS = 8
NOT_SYNCED = "has not finished its first list of the cluster"


def gpu_pod(name: str) -> dict[str, Any]:
    limits = {"cpu": "10m", "memory": "16Mi", GPU: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}],
            # Nowhere to run: the pods only hold quota (pending pods count as usage).
            "nodeSelector": {"fairshare-e2e/pool": "nowhere"},
            "terminationGracePeriodSeconds": 0,
        },
    }


@dataclass
class Tally:
    """What the creators' creates came back with."""

    admitted: list[str] = field(default_factory=list)
    over_limit: int = 0
    """Refused by the webhook's quota check (403)."""
    not_synced: int = 0
    """Refused by the webhook before its first list (503, webhook.app.NOT_SYNCED_MESSAGE)."""
    unreachable: int = 0
    """Refused by kube-apiserver: no webhook answered (failurePolicy Fail)."""
    other: collections.Counter[str] = field(default_factory=collections.Counter)
    during: int = 0
    """Creates sent while the restart was under way."""

    @property
    def attempts(self) -> int:
        return (
            len(self.admitted)
            + self.over_limit
            + self.not_synced
            + self.unreachable
            + sum(self.other.values())
        )

    def line(self) -> str:
        return (
            f"{self.attempts} creates ({self.during} during the restart): "
            f"{len(self.admitted)} admitted, {self.over_limit} over the limit, "
            f"{self.not_synced} before the first list, {self.unreachable} no webhook, "
            f"other {dict(self.other)}"
        )


def classify(tally: Tally, exc: ApiException) -> None:
    try:
        message = str(json.loads(exc.body).get("message", ""))
    except (TypeError, ValueError):
        message = str(exc.body)
    if exc.status == 403 and "would exceed its" in message:
        tally.over_limit += 1
    elif NOT_SYNCED in message:
        tally.not_synced += 1
    elif "failed calling webhook" in message:
        tally.unreachable += 1
    else:
        tally.other[f"{exc.status} {message[:80]}"] += 1


async def run_creators_through(
    api: client.ApiClient,
    namespace: str,
    restart: Callable[[], Awaitable[None]],
    tally: Tally | None = None,
) -> Tally:
    """Eight creators from 1 s before `restart` until 2 s after it returned; what they saw
    goes in `tally` (a new one when None), which `restart` may watch."""
    core = client.CoreV1Api(api)
    tally = Tally() if tally is None else tally
    stop = asyncio.Event()
    restarting = asyncio.Event()

    async def creator(k: int) -> None:
        i = 0
        while not stop.is_set():
            name = f"c{k}-{i}-{unique('p')[-6:]}"
            i += 1
            if restarting.is_set():
                tally.during += 1
            try:
                await core.create_namespaced_pod(namespace, gpu_pod(name))
                tally.admitted.append(name)
            except ApiException as exc:
                classify(tally, exc)
            except Exception as exc:  # the client's own errors: counted, never admitted
                tally.other[type(exc).__name__] += 1
            await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(creator(k)) for k in range(CREATORS)]
    try:
        await asyncio.sleep(1.0)
        restarting.set()
        await restart()
        restarting.clear()
        await asyncio.sleep(2.0)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return tally


async def tenant_at_limit(
    api: client.ApiClient, fairshare: FairshareDev, tenant_namespace: TenantNamespace
) -> tuple[str, set[str]]:
    tenant = unique("closed")
    config = CONFIG_HEAD + f'tenants:\n- name: {tenant}\n  limit:\n    {GPU}: "{LIMIT}"\n'
    await fairshare.set_config(api, config)
    namespace = await tenant_namespace(tenant)
    core = client.CoreV1Api(api)
    first = {f"first-{i}" for i in range(LIMIT)}
    for name in sorted(first):
        await core.create_namespaced_pod(namespace, gpu_pod(name))
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(namespace, gpu_pod("one-too-many"))
    assert refused.value.status == 403, "the tenant is at its limit before the restart"
    return namespace, first


async def assert_nothing_admitted(
    api: client.ApiClient, namespace: str, first: set[str], tally: Tally, what: str
) -> None:
    FAULT_SUMMARY.append(f"admission during {what}: {tally.line()}")
    pods = (await client.CoreV1Api(api).list_namespaced_pod(namespace)).items
    names = {p.metadata.name for p in pods}
    assert tally.admitted == [], f"admitted past the limit during {what}: {tally.line()}"
    assert names == first, f"pods of the tenant after {what}: {sorted(names)}"
    assert tally.during > 0, f"no create was sent while {what} was under way: {tally.line()}"
    assert not tally.other, f"unexpected answers during {what}: {tally.line()}"


HOLD_LIMIT = 20.0
"""Seconds a `ListHold` waits for what releases it before it releases anyway (then the
test fails on its assertions, not on a webhook that never becomes ready)."""


@dataclass
class ListHold:
    """A kubeconfig for a webhook that cannot finish its first list of the cluster until
    `release`: a ServiceAccount bound to the webhook's ClusterRole of
    manifests/base/rbac-webhook.yaml without pods (and with the config's ConfigMap), so
    its pod list is refused (403) and retried with backoff; `release` binds a ClusterRole
    that reads pods."""

    api: client.ApiClient
    kubeconfig: str
    namespace: str
    name: str
    released: bool = False

    async def release_when(self, seen: Callable[[], bool]) -> bool:
        """Grant pods once `seen()` (polled) or after `HOLD_LIMIT` seconds; whether
        `seen()` came first."""
        deadline = time.monotonic() + HOLD_LIMIT
        while not (came := seen()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.release()
        return came

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        await client.RbacAuthorizationV1Api(self.api).create_cluster_role_binding(
            binding(f"{self.name}-pods", self.namespace)
        )


def binding(name: str, namespace: str) -> dict[str, Any]:
    """ClusterRole `name` bound to `namespace`'s default ServiceAccount."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
    }


def webhook_rules() -> list[dict[str, Any]]:
    """The rules of the webhook's ClusterRole as the manifests ship it."""
    docs = yaml.safe_load_all((ROOT / "manifests/base/rbac-webhook.yaml").read_text())
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    return list(role["rules"])


@pytest.fixture
async def list_hold(
    api: client.ApiClient, cluster: Cluster, namespace: str, tmp_path: Path
) -> AsyncIterator[ListHold]:
    name = unique("held-webhook")
    rbac = client.RbacAuthorizationV1Api(api)
    rules = []
    for rule in webhook_rules():
        kept = [r for r in rule["resources"] if r != "pods"]
        if kept:
            rules.append({**rule, "resources": kept})
    assert len(rules) == len(webhook_rules()) and rules != webhook_rules(), "pods dropped"
    read = ["get", "list", "watch"]
    rules.append({"apiGroups": [""], "resources": ["configmaps"], "verbs": read})
    pods = [{"apiGroups": [""], "resources": ["pods"], "verbs": read}]
    for role, role_rules in ((name, rules), (f"{name}-pods", pods)):
        await rbac.create_cluster_role({"metadata": {"name": role}, "rules": role_rules})
    await rbac.create_cluster_role_binding(binding(name, namespace))
    token = await client.CoreV1Api(api).create_namespaced_service_account_token(
        "default", namespace, {"spec": {"expirationSeconds": 3600}}
    )
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    entry = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    kubeconfig = tmp_path / "held-webhook.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [entry],
                "users": [{"name": name, "user": {"token": token.status.token}}],
                "contexts": [{"name": name, "context": {"cluster": entry["name"], "user": name}}],
                "current-context": name,
            }
        )
    )
    yield ListHold(api, str(kubeconfig), namespace, name)
    for role in (name, f"{name}-pods"):
        for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            try:
                await delete(role)
            except ApiException as exc:
                if exc.status != 404:
                    raise


async def test_in_place_restart_admits_nothing_before_the_first_list(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    list_hold: ListHold,
):
    namespace, first = await tenant_at_limit(api, fairshare, tenant_namespace)
    dev = dev_module()
    tally = Tally()
    seen: list[bool] = []

    async def restart() -> None:
        # The first list is held until the creators saw a "not synced" refusal.
        releasing = asyncio.create_task(list_hold.release_when(lambda: tally.not_synced > 0))
        try:
            fairshare.handles = await asyncio.to_thread(
                dev.restart_webhook, STATE_DIR, in_place=True, kubeconfig=list_hold.kubeconfig
            )
        finally:
            await list_hold.release()
            seen.append(await releasing)

    try:
        await run_creators_through(api, namespace, restart, tally)
    finally:
        # Back to the dev webhook's own credentials, with no gap in admission.
        fairshare.handles = await asyncio.to_thread(dev.restart_webhook, STATE_DIR)
    await assert_nothing_admitted(api, namespace, first, tally, "an in-place webhook restart")
    assert tally.not_synced > 0 and seen == [True], (
        f"no refusal before the first list during the in-place restart: {tally.line()}"
    )


async def test_handover_restart_keeps_a_ready_webhook_registered(
    api: client.ApiClient, fairshare: FairshareDev, tenant_namespace: TenantNamespace
):
    namespace, first = await tenant_at_limit(api, fairshare, tenant_namespace)
    dev = dev_module()
    old_port = fairshare.handles.webhook_port

    async def restart() -> None:
        fairshare.handles = await asyncio.to_thread(dev.restart_webhook, STATE_DIR)

    tally = await run_creators_through(api, namespace, restart)
    assert fairshare.handles.webhook_port != old_port
    await assert_nothing_admitted(api, namespace, first, tally, "a handover webhook restart")
    # Registered throughout, and only ever with a webhook that had its first list.
    assert tally.unreachable == 0 and tally.not_synced == 0, tally.line()


async def test_dev_up_after_the_webhook_was_killed_admits_nothing(
    api: client.ApiClient, fairshare: FairshareDev, tenant_namespace: TenantNamespace
):
    namespace, first = await tenant_at_limit(api, fairshare, tenant_namespace)
    dev = dev_module()
    config_before = await fairshare.current_config_text(api)

    async def kill_and_rerun_up() -> None:
        os.kill(fairshare.handles.webhook_pid, signal.SIGKILL)
        t0 = time.monotonic()
        # `make dev-up` again: the same call as `dev.py up` without --config.
        fairshare.handles = await asyncio.to_thread(dev.start, STATE_DIR, None, cluster=False)
        FAULT_SUMMARY.append(f"dev.py up after SIGKILL took {time.monotonic() - t0:.1f}s")

    tally = await run_creators_through(api, namespace, kill_and_rerun_up)
    await assert_nothing_admitted(
        api, namespace, first, tally, "`dev.py up` after the webhook was killed"
    )
    assert dev.status(STATE_DIR)["up"], "both servers ready again"
    assert await fairshare.current_config_text(api) == config_before
    # The new webhook is the one registered, and it judges: still at the limit.
    with pytest.raises(ApiException) as refused:
        await client.CoreV1Api(api).create_namespaced_pod(namespace, gpu_pod("after"))
    assert refused.value.status == 403


def review(namespace: str, name: str) -> dict[str, Any]:
    obj = gpu_pod(name)
    obj["metadata"]["namespace"] = namespace
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": obj,
            "dryRun": True,
        },
    }


def first_answers(
    url: str, ctx: ssl.SSLContext, namespace: str, count: int, answers: list[Any]
) -> list[Any]:
    """The first `count` answers of `url`, asked in a loop from before its port opens,
    appended to `answers` as they come."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    deadline = time.monotonic() + 60
    while len(answers) < count and time.monotonic() < deadline:
        body = json.dumps(review(namespace, unique("early"))).encode()
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with opener.open(req, timeout=5) as resp:
                answers.append(json.loads(resp.read())["response"])
        except (urllib.error.URLError, ConnectionError, ssl.SSLError):
            time.sleep(0.002)  # not listening yet
    return answers


async def test_a_starting_webhook_never_allows_from_an_incomplete_view(
    api: client.ApiClient,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
    list_hold: ListHold,
):
    namespace, _first = await tenant_at_limit(api, fairshare, tenant_namespace)
    dev = dev_module()
    layout = dev.Layout(STATE_DIR)
    port = dev.cluster_module().free_port()
    state = {**dev.cluster_state(STATE_DIR), "kubeconfig": list_hold.kubeconfig}
    argv = dev.server_argv(layout, state, "webhook", port)
    ctx = fairshare.handles.client_context("webhook")
    url = f"https://127.0.0.1:{port}/validate"
    answers: list[Any] = []
    asking = asyncio.create_task(asyncio.to_thread(first_answers, url, ctx, namespace, 20, answers))
    # The first list is held until the webhook's first answer.
    releasing = asyncio.create_task(list_hold.release_when(lambda: bool(answers)))
    proc = dev._spawn(argv, layout.logs / "fairshare-webhook-cold.log")
    try:
        await asking
    finally:
        dev.stop_server("webhook-cold", proc.pid)
        await list_hold.release()
        await releasing
    codes = collections.Counter(
        "allowed" if a["allowed"] else str(a["status"]["code"]) for a in answers
    )
    FAULT_SUMMARY.append(f"first 20 answers of a starting webhook: {dict(codes)}")
    assert len(answers) == 20, f"the starting webhook answered {len(answers)} of 20"
    assert codes["allowed"] == 0, f"allowed before its first list: {dict(codes)}"
    assert set(codes) <= {"403", "503"}, dict(codes)
    refusals = [a["status"]["message"] for a in answers if a["status"]["code"] == 503]
    assert refusals, f"no refusal before the first list: {dict(codes)}"
    assert all(NOT_SYNCED in m for m in refusals), refusals


async def test_a_limit_below_usage_is_applied_with_a_warning(
    api: client.ApiClient,
    cluster: Cluster,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
):
    """Not a restart, but the same drive (issue 31): the config guard admits a limit below
    the tenant's usage and kubectl shows kube-apiserver's Warning header for it."""
    dev = dev_module()
    namespace, _first = await tenant_at_limit(api, fairshare, tenant_namespace)
    text = await fairshare.current_config_text(api)
    lower = text.replace(f'{GPU}: "{LIMIT}"', f'{GPU}: "1"')
    assert lower != text
    tenant = await tenant_of(api, namespace)
    patch = json.dumps({"data": {dev.CONFIG_KEY: lower}})
    out = await asyncio.to_thread(
        cluster.kubectl,
        "-n",
        dev.SYSTEM_NAMESPACE,
        "patch",
        "configmap",
        dev.CONFIGMAP,
        "--type=merge",
        "-p",
        patch,
    )
    assert (
        f"Warning: tenant {tenant}: {GPU} limit 1 is below current usage 2; new pods are "
        "refused until usage is under it"
    ) in out.stderr, out.stderr
    assert await fairshare.current_config_text(api) == lower, "the edit was applied"


async def tenant_of(api: client.ApiClient, namespace: str) -> str:
    ns = await client.CoreV1Api(api).read_namespace(namespace)
    return str(ns.metadata.labels["fairshare.io/tenant"])
