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
