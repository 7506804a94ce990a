"""Security of the admission path, through the webhook and extender apps in-process.

* No secret or token in the logs: requests carrying an ``Authorization`` header, a
  Secret object (``data``/``stringData``) in an AdmissionReview, or a token inside a
  malformed body are handled with every logger at DEBUG, and the token never appears.
* A pod cannot pick another tenant's label, and its ``schedulerName`` does not matter to
  the quota: the webhook judges every pod, whatever scheduler it names.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fairshare.config import loading
from tests.reliability.conftest import WEBHOOK_CONFIG, extender_app, webhook_app
from tests.reliability.test_hostile_input import admission_review, check_admission_answer

TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6InNlY3JldC10b2tlbi1kby1ub3QtbG9nIn0.c2VjcmV0"
SECRET_VALUE = "hunter2-super-secret-password"
SECRET_B64 = base64.b64encode(SECRET_VALUE.encode()).decode()
NEEDLES = (TOKEN, SECRET_VALUE, SECRET_B64)


def secret_review(operation: str = "CREATE") -> dict[str, Any]:
    review = admission_review(uid=f"secret-{operation}")
    req = review["request"]
    req["kind"] = req["requestKind"] = {"group": "", "version": "v1", "kind": "Secret"}
    req["resource"] = req["requestResource"] = {"group": "", "version": "v1", "resource": "secrets"}
    req["operation"] = operation
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db", "namespace": "nlp"},
        "type": "Opaque",
        "data": {"password": SECRET_B64, "token": base64.b64encode(TOKEN.encode()).decode()},
        "stringData": {"password": SECRET_VALUE},
    }
    req["object"] = secret
    req["oldObject"] = copy.deepcopy(secret) if operation != "CREATE" else None
    if operation == "DELETE":
        req["object"] = None
    return review


def pod_with_secret_env(gpus: str = "1", uid: str = "env") -> dict[str, Any]:
    review = admission_review(uid=uid, gpus=gpus)
    container = review["request"]["object"]["spec"]["containers"][0]
    container["env"] = [{"name": "TOKEN", "value": TOKEN}, {"name": "PW", "value": SECRET_VALUE}]
    review["request"]["object"]["metadata"]["annotations"]["leak"] = SECRET_B64
    return review


def assert_no_secret(text: str) -> None:
    for needle in NEEDLES:
        assert needle not in text


@pytest.fixture
async def webhook_client():
    app, deps = webhook_app()
    async with TestClient(TestServer(app)) as client:
        client.deps = deps  # type: ignore[attr-defined]
        yield client


async def test_no_token_or_secret_in_webhook_logs(webhook_client, caplog):
    caplog.set_level(logging.DEBUG)
    auth = {"Authorization": f"Bearer {TOKEN}", "Cookie": f"session={TOKEN}"}
    bodies: list[bytes] = [
        json.dumps(secret_review(op)).encode() for op in ("CREATE", "UPDATE", "DELETE")
    ]
    bodies.append(json.dumps(pod_with_secret_env()).encode())
    bodies.append(json.dumps(pod_with_secret_env(gpus="99")).encode())  # a denial
    bodies.append(json.dumps(pod_with_secret_env(gpus="-1")).encode())  # malformed quantity
    broken = copy.deepcopy(pod_with_secret_env())
    broken["request"]["object"]["spec"]["initContainers"] = [None]  # internal-error path
    bodies.append(json.dumps(broken).encode())
    bodies.append(json.dumps(secret_review())[:200].encode())  # truncated: a 400
    bodies.append(b'{"apiVersion": "' + TOKEN.encode() + b'"}')  # token in a 400 reason?
    bodies.append(b'{"request": {"uid": "' + SECRET_VALUE.encode() + b'"}, ')
    responses = []
    for body in bodies:
        for path in ("/mutate", "/validate"):
            r = await webhook_client.post(path, data=body, headers=auth)
            assert r.status in (200, 400)
            if r.status == 200:  # a 400 may quote the caller's own bad field back to it
                responses.append(await r.text())
    metrics = await (await webhook_client.get("/metrics", headers=auth)).text()
    assert caplog.records, "the internal-error path should have logged something"
    assert_no_secret(caplog.text)
    for record in caplog.records:
        assert_no_secret(record.getMessage())
    assert_no_secret(metrics)
    for text in responses:
        assert TOKEN not in text and SECRET_VALUE not in text


async def test_no_token_in_extender_logs(caplog):
    caplog.set_level(logging.DEBUG)
    app, _deps = extender_app()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with TestClient(TestServer(app)) as client:
        for path, body in (
            ("/filter", b'{"Pod": {"metadata": {"name": "' + TOKEN.encode() + b'"}}}'),
            ("/bind", b'{"PodName": "x", "PodNamespace": "a", "Node": "n1"}'),
            ("/preempt", b"{not json " + TOKEN.encode()),
        ):
            r = await client.post(path, data=body, headers=auth)
            assert r.status in (200, 400)
    for record in caplog.records:
        assert TOKEN not in record.getMessage()
    assert TOKEN not in caplog.text


# --------------------------------------------------------------------------- tenancy


def gpu_pod(
    uid: str,
    *,
    namespace: str = "nlp",
    gpus: str = "1",
    label: str | None = None,
    scheduler: str | None = "default-scheduler",
) -> dict[str, Any]:
    review = admission_review(uid=uid, namespace=namespace, gpus=gpus)
    pod = review["request"]["object"]
    pod["metadata"]["name"] = review["request"]["name"] = f"pod-{uid}"
    pod["metadata"]["annotations"] = {}
    pod["spec"].pop("initContainers")
    pod["spec"].pop("overhead")
    pod["spec"].pop("volumes")
    if label is not None:
        pod["metadata"]["labels"]["fairshare.io/tenant"] = label
    if scheduler is None:
        pod["spec"].pop("schedulerName")
    else:
        pod["spec"]["schedulerName"] = scheduler
    return review


async def review(client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(path, json=body)
    assert r.status == 200
    data = await r.read()
    check_admission_answer(data)
    response: dict[str, Any] = json.loads(data)["response"]
    return response


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


@pytest.mark.parametrize("claimed", ["vision", "open", "nobody", "NLP"])
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
async def test_pod_cannot_claim_another_tenants_label(webhook_client, claimed, path):
    response = await review(webhook_client, path, gpu_pod("x", label=claimed))
    assert response["allowed"] is False
    assert 400 <= response["status"]["code"] < 500
    assert "fairshare.io/tenant" in response["status"]["message"]


async def test_mutate_stamps_the_namespace_tenant(webhook_client):
    response = await review(webhook_client, "/mutate", gpu_pod("x"))
    stamp = {"op": "add", "path": "/metadata/labels/fairshare.io~1tenant", "value": "nlp"}
    assert stamp in patch_of(response)


SCHEDULERS = [
    None,
    "",
    "default-scheduler",
    "fairshare-scheduler",
    "my-own",
    "kube-batch",
    "x" * 63,
]


@pytest.mark.parametrize("over_with", SCHEDULERS)
async def test_scheduler_name_does_not_bypass_quota(webhook_client, over_with):
    # nlp's limit is 4 GPUs: four pods, each naming a different scheduler, fill it.
    for i, scheduler in enumerate(["default-scheduler", "my-own", None, "kube-batch"]):
        response = await review(
            webhook_client, "/validate", gpu_pod(f"fill{i}", scheduler=scheduler)
        )
        assert response["allowed"] is True, response
    response = await review(webhook_client, "/validate", gpu_pod("over", scheduler=over_with))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    # nor does a label naming a tenant without a limit, nor both together
    for label in ("open", "vision"):
        response = await review(
            webhook_client, "/validate", gpu_pod(f"l-{label}", label=label, scheduler=over_with)
        )
        assert response["allowed"] is False


async def test_watched_pods_count_for_their_namespace_tenant_whatever_their_label(webhook_client):
    # A running pod relabelled (pod labels are mutable) still counts for its namespace.
    running = copy.deepcopy(gpu_pod("r", gpus="4", label="open")["request"]["object"])
    running["metadata"]["uid"] = "uid-r"
    running["spec"]["nodeName"] = "n1"
    running["spec"]["schedulerName"] = "someone-else"
    running["status"] = {"phase": "Running"}
    webhook_client.deps.tracker.on_resync("Pod", [running])
    assert webhook_client.deps.tracker.tenant_usage("nlp").get("nvidia.com/gpu") == 4
    response = await review(webhook_client, "/validate", gpu_pod("one-more", scheduler="other"))
    assert response["allowed"] is False and response["status"]["code"] == 403


async def test_mutate_routes_default_scheduler_gpu_pods_and_validate_judges_the_rest():
    config = loading.config_from_mapping(
        {
            **WEBHOOK_CONFIG.model_dump(by_alias=True, mode="json", exclude_none=True),
            "schedulerName": "fairshare-scheduler",
        }
    )
    app, _deps = webhook_app(config)
    async with TestClient(TestServer(app)) as client:
        response = await review(client, "/mutate", gpu_pod("d", scheduler="default-scheduler"))
        assert any(
            op["path"] == "/spec/schedulerName" and op["value"] == "fairshare-scheduler"
            for op in patch_of(response)
        )
        # an explicit other scheduler is kept by mutate, but validate still counts it
        response = await review(client, "/mutate", gpu_pod("o", scheduler="other"))
        assert all(op["path"] != "/spec/schedulerName" for op in patch_of(response))
        response = await review(client, "/validate", gpu_pod("big", gpus="5", scheduler="other"))
        assert response["allowed"] is False and response["status"]["code"] == 403
