"""The webhook's aiohttp app over HTTP (in-process server, no TLS): the adapter layer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fairshare.config import loading
from webhook import app as webhook_app

CONFIG = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "nlp", "namespaces": ["nlp"], "limit": {"nvidia.com/gpu": "10"}}],
    }
)


def review_body(uid: str, name: str, gpus: int, *, namespace: str = "nlp") -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "resources": {
                        "requests": {"nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ]
        },
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


@pytest.fixture
async def client():
    ready = {"v": False}
    deps = webhook_app.build_deps(config=lambda: CONFIG, ready=lambda: ready["v"])
    deps.tracker.on_resync("Namespace", [{"metadata": {"name": "nlp"}}])
    app = webhook_app.make_app(deps)
    async with TestClient(TestServer(app)) as c:
        c.ready = ready  # type: ignore[attr-defined]
        c.deps = deps  # type: ignore[attr-defined]
        yield c


async def test_mutate_labels_the_tenant(client):
    r = await client.post("/mutate", json=review_body("u1", "p", 1))
    assert r.status == 200
    body = await r.json()
    assert body["response"]["uid"] == "u1" and body["response"]["allowed"] is True
    assert body["response"]["patchType"] == "JSONPatch"


async def test_validate_denies_over_limit_with_403(client):
    r = await client.post("/validate", json=review_body("u2", "big", 11))
    body = await r.json()
    resp = body["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert "nvidia.com/gpu" in resp["status"]["message"] and "nlp" in resp["status"]["message"]


@pytest.mark.parametrize(
    "payload",
    [b"", b"{", b"[]", b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}'],
    ids=["empty", "truncated", "array", "no-request"],
)
async def test_malformed_bodies_get_400(client, payload):
    r = await client.post("/validate", data=payload)
    assert r.status == 400
    assert "malformed AdmissionReview" in await r.text()


async def test_readyz_follows_sync_and_metrics_render(client):
    assert (await client.get("/readyz")).status == 503
    client.ready["v"] = True
    assert (await client.get("/readyz")).status == 200
    await client.post("/validate", json=review_body("u3", "p3", 1))
    text = await (await client.get("/metrics")).text()
    assert 'fairshare_admission_requests_total{decision="allowed"' in text


async def test_200_concurrent_creates_against_10_gpus_admit_exactly_10(client):
    bodies = [review_body(f"u{i}", f"p{i}", 1) for i in range(200)]
    results = await asyncio.gather(*(client.post("/validate", json=b) for b in bodies))
    answers = [json.loads(await r.text())["response"] for r in results]
    assert sum(a["allowed"] for a in answers) == 10
    assert len(client.deps.ledger) == 10


async def test_policy_crash_is_a_visible_denial(client, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("bug")

    monkeypatch.setattr(webhook_app.review, "admit", boom)
    body = await (await client.post("/validate", json=review_body("u4", "p4", 1))).json()
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 500


# --- closed until the first complete list of the cluster (issue 31, item 4) --------------

LIMITED = loading.config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "nlp", "namespaceSelector": {"team": "nlp"}, "limit": {"nvidia.com/gpu": "2"}}
        ],
    }
)


@pytest.fixture
async def starting():
    """A webhook whose state source has not finished its first list (``synced`` unset),
    with ``/readyz`` wired to the same event as ``serve`` wires it."""
    synced = asyncio.Event()
    deps = webhook_app.build_deps(config=lambda: LIMITED, ready=synced.is_set)
    deps.synced, deps.sync_wait = synced, 0.3
    app = webhook_app.make_app(deps)
    async with TestClient(TestServer(app)) as c:
        c.synced = synced  # type: ignore[attr-defined]
        c.deps = deps  # type: ignore[attr-defined]
        yield c


def _first_list(deps: webhook_app.WebhookDeps, synced: asyncio.Event) -> None:
    """What the informers deliver: namespace nlp labelled into the tenant, and two pods
    of one GPU each already running there (the tenant is at its limit of 2)."""
    deps.tracker.on_resync("Namespace", [{"metadata": {"name": "nlp", "labels": {"team": "nlp"}}}])
    running = []
    for i in range(2):
        pod = review_body(f"r{i}", f"running-{i}", 1)["request"]["object"]
        pod["metadata"]["uid"] = f"running-uid-{i}"
        pod["spec"]["nodeName"] = "gpu-1"
        pod["status"] = {"phase": "Running"}
        running.append(pod)
    deps.tracker.on_resync("Pod", running)
    synced.set()


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
async def test_before_the_first_list_a_request_is_denied_with_a_clear_503(starting, path):
    # Nothing listed yet: the usage view is empty, so the old code admitted this pod
    # (0 + 1 <= 2) although the tenant may already be at its limit.
    r = await starting.post(path, json=review_body("early", "early", 1))
    assert r.status == 200
    resp = (await r.json())["response"]
    assert resp["uid"] == "early" and resp["allowed"] is False
    assert resp["status"]["code"] == 503
    assert resp["status"]["message"] == webhook_app.NOT_SYNCED_MESSAGE
    assert "internal error" not in resp["status"]["message"]
    assert len(starting.deps.ledger) == 0, "a denied request reserves nothing"
    assert (await starting.get("/readyz")).status == 503


async def test_a_request_waits_for_the_first_list_and_is_judged_on_it(starting):
    async def list_soon() -> None:
        await asyncio.sleep(0.05)
        _first_list(starting.deps, starting.synced)

    lister = asyncio.create_task(list_soon())
    r = await starting.post("/validate", json=review_body("waits", "third", 1))
    await lister
    resp = (await r.json())["response"]
    # Judged against the two running pods the first list brought: 2 + 1 > 2.
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert "nvidia.com/gpu" in resp["status"]["message"]
    assert (await starting.get("/readyz")).status == 200


async def test_after_the_first_list_answers_do_not_wait(starting):
    _first_list(starting.deps, starting.synced)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r = await starting.post("/validate", json=review_body("late", "third", 1))
    took = loop.time() - t0
    resp = (await r.json())["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert took < starting.deps.sync_wait
    # A pod in a namespace of no limited tenant is allowed once the state is complete.
    starting.deps.tracker.on_event("Namespace", "ADDED", {"metadata": {"name": "free"}})
    free = await starting.post("/validate", json=review_body("free", "p", 1, namespace="free"))
    assert (await free.json())["response"]["allowed"] is True


def test_deps_built_for_serving_start_closed():
    deps = webhook_app.WebhookDeps(
        config=lambda: LIMITED,
        tracker=webhook_app.UsageTracker(lambda: LIMITED),
        ledger=webhook_app.ReservationLedger(ttl=30),
        registry=webhook_app.CollectorRegistry(),
        metrics=webhook_app.metrics_mod.Metrics(webhook_app.CollectorRegistry()),
        ready=lambda: True,
    )
    assert not deps.synced.is_set()
