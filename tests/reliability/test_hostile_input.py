"""Hostile request bodies against both apps over real HTTP on loopback (issue 8, part 4).

Whatever arrives, the answer is a 400 (not an AdmissionReview / extender message), a 413
(over the body limit) or a 200 carrying a well-formed answer; never a 5xx, never a crash,
never a webhook denial with code 500 (an internal error answered fail-closed), and the
server still answers ``/healthz`` afterwards. Hypothesis generates the bodies:
random bytes, truncated and byte-mutated JSON, valid messages with fields replaced by
hostile values (wrong types, null, huge and non-finite numbers, deep nesting), lower-cased
keys, everything nulled. Fixed cases cover what random generation rarely reaches: 10,000
levels of nesting, 10 MB bodies, 1e400, 2**70, a 5,000-digit integer, invalid UTF-8.

``FUZZ_CASES`` counts every body sent; the terminal summary prints the totals.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.conftest import FUZZ_CASES, Client, extender_pod

ALLOWED_STATUS = {200, 400, 413}
EXAMPLES = 150
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# --------------------------------------------------------------------------- messages


def admission_review(uid: str = "u-1", namespace: str = "nlp", gpus: str = "1") -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": namespace,
            "labels": {"app": "x"},
            "annotations": {"fairshare.io/gpu-fraction": "0.5"},
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {
                        "requests": {"nvidia.com/gpu": gpus, "cpu": "1", "memory": "1Gi"},
                        "limits": {"nvidia.com/gpu": gpus},
                    },
                }
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "500m"}}}],
            "overhead": {"cpu": "100m"},
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}],
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
            "name": "p",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def filter_args() -> dict[str, Any]:
    return {"Pod": extender_pod(1), "Nodes": None, "NodeNames": ["n1", "n2", "ghost"]}


def filter_args_full_nodes() -> dict[str, Any]:
    from tests.reliability.conftest import extender_node

    return {
        "Pod": extender_pod(2),
        "Nodes": {"metadata": {}, "items": [extender_node("n1", 4), extender_node("n2", 0)]},
        "NodeNames": None,
    }


def preempt_args() -> dict[str, Any]:
    return {
        "Pod": extender_pod(3),
        "NodeNameToVictims": {"n1": {"Pods": [extender_pod(4)], "NumPDBViolations": 0}},
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u4"}], "NumPDBViolations": 1}},
    }


def bind_args() -> dict[str, Any]:
    return {"PodName": "p5", "PodNamespace": "a", "PodUID": "u5", "Node": "n1"}


# --------------------------------------------------------------------------- answer checks

PATCH_OPS = {"add", "remove", "replace", "move", "copy", "test"}


def check_admission_answer(data: bytes) -> None:
    """A 200 answer is an AdmissionReview response kube-apiserver would accept."""
    doc = json.loads(data)
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    resp = doc["response"]
    assert set(resp) <= {"uid", "allowed", "status", "patch", "patchType", "warnings"}
    assert isinstance(resp["uid"], str) and resp["uid"]
    assert isinstance(resp["allowed"], bool)
    if not resp["allowed"]:
        status = resp["status"]
        assert isinstance(status["code"], int) and isinstance(status["message"], str)
        # A 500 is an unexpected exception inside a policy, answered as a denial (fail
        # closed, still HTTP 200): safe for the cluster, but a bug in reading the request,
        # which must have been refused with a 4xx saying what is wrong.
        assert status["code"] != 500, f"internal-error denial: {status['message']}"
        assert 400 <= status["code"] < 500, status
    if "patch" in resp:
        assert resp["allowed"] and resp["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(resp["patch"], validate=True))
        assert isinstance(ops, list) and ops
        for op in ops:
            assert op["op"] in PATCH_OPS and op["path"].startswith("/")
    else:
        assert "patchType" not in resp
    for warning in resp.get("warnings", ()):
        assert isinstance(warning, str) and warning


def _string_map(value: Any) -> None:
    if value is not None:
        assert isinstance(value, dict)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def check_filter_answer(data: bytes) -> None:
    doc = json.loads(data)
    assert set(doc) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert isinstance(doc["Error"], str)
    if doc["NodeNames"] is not None:
        assert all(isinstance(n, str) for n in doc["NodeNames"])
    if doc["Nodes"] is not None:
        assert isinstance(doc["Nodes"]["items"], list)
    _string_map(doc["FailedNodes"])
    _string_map(doc["FailedAndUnresolvableNodes"])


def check_prioritize_answer(data: bytes) -> None:
    doc = json.loads(data)
    assert isinstance(doc, list)
    for item in doc:
        assert set(item) == {"Host", "Score"} and isinstance(item["Host"], str)
        assert type(item["Score"]) is int and 0 <= item["Score"] <= 10


def check_preempt_answer(data: bytes) -> None:
    doc = json.loads(data)
    assert set(doc) == {"NodeNameToMetaVictims"}
    for node, victims in doc["NodeNameToMetaVictims"].items():
        assert isinstance(node, str)
        assert type(victims["NumPDBViolations"]) is int
        assert all(isinstance(p["UID"], str) for p in victims["Pods"])


def check_bind_answer(data: bytes) -> None:
    doc = json.loads(data)
    assert set(doc) == {"Error"} and isinstance(doc["Error"], str)


WEBHOOK_TARGETS: dict[str, tuple[Callable[[], Any], Callable[[bytes], None]]] = {
    "/mutate": (admission_review, check_admission_answer),
    "/validate": (admission_review, check_admission_answer),
}
EXTENDER_TARGETS: dict[str, tuple[Callable[[], Any], Callable[[bytes], None]]] = {
    "/filter": (filter_args, check_filter_answer),
    "/scheduler/filter": (filter_args_full_nodes, check_filter_answer),
    "/prioritize": (filter_args, check_prioritize_answer),
    "/preempt": (preempt_args, check_preempt_answer),
    "/bind": (bind_args, check_bind_answer),
}


def send(client: Client, path: str, body: bytes, check: Callable[[bytes], None], tag: str) -> int:
    FUZZ_CASES[tag] += 1
    status, data = client.post(path, body)
    if status == 0:  # connection dropped: only acceptable for bodies over every limit
        assert len(body) > 3 * 1024 * 1024, f"{path}: connection dropped for {len(body)} bytes"
        return 413
    assert status in ALLOWED_STATUS, (path, status, data[:300], body[:300])
    if status == 200:
        check(data)
    return status


def still_serving(client: Client) -> None:
    status, data = client.get("/healthz")
    assert (status, data) == (200, b"ok\n")


# --------------------------------------------------------------------------- strategies

RAW = "@@raw:{}@@"
"""A string value replaced by a raw JSON token after ``json.dumps`` (numbers dumps can't
write, such as 1e400)."""

HUGE_TOKENS = [
    "1e400",
    "-1e400",
    "1e-400",
    str(2**70),
    str(-(2**70)),
    str(2**63),
    str(2**64 + 1),
    "1" * 400,
    "0." + "0" * 400 + "1",
    "123456789012345678901234567890.5e300",
]

QUANTITY_STRINGS = [
    "-1",
    "-0",
    "-1Gi",
    "-500m",
    "1e400",
    "1e1000000000",
    "9Ei",
    "10Ei",
    "99999999999999999999999",
    str(2**70),
    "1e18",
    "NaN",
    "Infinity",
    "0x10",
    " 1",
    "1 ",
    "１",
    "",
    "Ki",
    "1.5.5",
    "0.000000000001",
]

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(QUANTITY_STRINGS)
    | st.sampled_from(HUGE_TOKENS).map(RAW.format)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return doc


def _map_keys(doc: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(doc, dict):
        return {fn(k): _map_keys(v, fn) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_map_keys(v, fn) for v in doc]
    return doc


def _null_all(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _null_all(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_null_all(v) for v in doc]
    return None


def dumps(doc: Any) -> bytes:
    text = json.dumps(doc)
    for token in HUGE_TOKENS:
        text = text.replace(json.dumps(RAW.format(token)), token)
    return text.encode()


@st.composite
def mutated(draw: st.DrawFn, base: Callable[[], Any]) -> bytes:
    """A valid message, then structural and byte-level damage."""
    doc = copy.deepcopy(base())
    how = draw(st.sampled_from(["replace", "replace", "lower", "null", "drop"]))
    if how == "lower":
        doc = _map_keys(doc, str.lower)
    elif how == "null":
        doc = _null_all(doc)
    elif how == "drop":
        paths = [p for p in _paths(doc) if p and isinstance(p[-1], str)]
        for path in draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3, unique=True)):
            parent = doc
            try:
                for part in path[:-1]:
                    parent = parent[part]
                del parent[path[-1]]
            except (KeyError, IndexError, TypeError):
                pass
    else:
        for _ in range(draw(st.integers(1, 4))):
            paths = _paths(doc)
            path = draw(st.sampled_from(paths))
            doc = _set(doc, path, draw(json_value))
    body = dumps(doc)
    damage = draw(st.sampled_from(["none", "none", "truncate", "bytes", "utf8"]))
    if damage == "truncate" and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif damage == "bytes" and body:
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + draw(st.binary(min_size=1, max_size=4)) + body[at + 1 :]
    elif damage == "utf8":
        at = draw(st.integers(0, len(body)))
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]))
        body = body[:at] + bad + body[at:]
    return body


# --------------------------------------------------------------------------- fuzz tests


@pytest.mark.parametrize("path", sorted(WEBHOOK_TARGETS))
@FUZZ_SETTINGS
@given(data=st.data())
def test_webhook_survives_mutated_reviews(webhook_server, path, data):
    _server, client = webhook_server
    base, check = WEBHOOK_TARGETS[path]
    send(client, path, data.draw(mutated(base)), check, f"webhook{path}")


@pytest.mark.parametrize("path", sorted(EXTENDER_TARGETS))
@FUZZ_SETTINGS
@given(data=st.data())
def test_extender_survives_mutated_messages(extender_server, path, data):
    _server, client = extender_server
    base, check = EXTENDER_TARGETS[path]
    send(client, path, data.draw(mutated(base)), check, f"extender{path}")


ANY_BODY = st.binary(max_size=512) | json_value.map(dumps)


@FUZZ_SETTINGS
@given(path=st.sampled_from(sorted(WEBHOOK_TARGETS)), body=ANY_BODY)
def test_webhook_survives_random_bodies(webhook_server, path, body):
    send(webhook_server[1], path, body, WEBHOOK_TARGETS[path][1], "webhook/random")


@FUZZ_SETTINGS
@given(path=st.sampled_from(sorted(EXTENDER_TARGETS)), body=ANY_BODY)
def test_extender_survives_random_bodies(extender_server, path, body):
    send(extender_server[1], path, body, EXTENDER_TARGETS[path][1], "extender/random")


# --------------------------------------------------------------------------- fixed cases

DEEP = 10_000


def fixed_bodies(base: Callable[[], Any]) -> dict[str, bytes]:
    good = dumps(base())
    return {
        "deep-array": b"[" * DEEP + b"]" * DEEP,
        "deep-object": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
        "deep-inside": good[:-1] + b', "x": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        "1e400": good[:-1] + b', "x": 1e400}',
        "2**70": good[:-1] + b', "x": ' + str(2**70).encode() + b"}",
        "5000-digit-int": good[:-1] + b', "x": ' + b"7" * 5000 + b"}",
        "5000-digit-top": b"7" * 5000,
        "nan": good[:-1] + b', "x": NaN}',
        "invalid-utf8": good[:-2] + b'"\xff\xfe"}',
        "utf16": json.dumps(base()).encode("utf-16"),
        "bom": b"\xef\xbb\xbf" + good,
        "empty": b"",
        "null": b"null",
        "lower-keys": dumps(_map_keys(base(), str.lower)),
        "all-null": dumps(_null_all(base())),
        "truncated": good[: len(good) // 2],
        "duplicate-keys": good[:-1] + b', "kind": "Nope", "Pod": 1, "request": null}',
    }


@pytest.mark.parametrize("path", sorted(WEBHOOK_TARGETS))
def test_webhook_fixed_hostile_bodies(webhook_server, path):
    _server, client = webhook_server
    base, check = WEBHOOK_TARGETS[path]
    for name, body in fixed_bodies(base).items():
        status = send(client, path, body, check, "webhook/fixed")
        assert status in (200, 400), name
    still_serving(client)


@pytest.mark.parametrize("path", sorted(EXTENDER_TARGETS))
def test_extender_fixed_hostile_bodies(extender_server, path):
    _server, client = extender_server
    base, check = EXTENDER_TARGETS[path]
    for name, body in fixed_bodies(base).items():
        status = send(client, path, body, check, "extender/fixed")
        assert status in (200, 400), name
    still_serving(client)


TEN_MB = 10 * 1024 * 1024


def test_webhook_refuses_10mb_body_with_413_and_keeps_serving(webhook_server):
    _server, client = webhook_server
    review = admission_review()
    review["request"]["object"]["metadata"]["annotations"]["pad"] = "x" * TEN_MB
    status = send(client, "/validate", dumps(review), check_admission_answer, "webhook/10MB")
    assert status == 413
    status = send(client, "/mutate", b"[" * TEN_MB, check_admission_answer, "webhook/10MB")
    assert status == 413
    still_serving(client)
    status, data = client.post("/validate", dumps(admission_review(uid="after")))
    assert status == 200 and json.loads(data)["response"]["uid"] == "after"


def test_extender_handles_10mb_bodies_and_keeps_serving(extender_server):
    # 10 MB is under the extender's limit (64 MiB: a non-cache-capable filter carries
    # every Node), so these are read and judged: 200 or 400, never 5xx.
    _server, client = extender_server
    args = filter_args()
    args["NodeNames"] = [f"node-{i}" for i in range(TEN_MB // 12)]
    send(client, "/filter", dumps(args), check_filter_answer, "extender/10MB")
    send(
        client,
        "/bind",
        b'{"PodName": "' + b"x" * TEN_MB + b'"}',
        check_bind_answer,
        "extender/10MB",
    )
    send(client, "/preempt", b"[" * TEN_MB, check_preempt_answer, "extender/10MB")
    status = send(
        client, "/filter", b"{" * (70 * 1024 * 1024), check_filter_answer, "extender/70MB"
    )
    assert status == 413
    still_serving(client)
