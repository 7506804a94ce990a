"""AdmissionReview decoding (errors with specific reasons) and exact response encoding."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from fairshare.errors import WireFormatError
from webhook import patches, wire

ENVELOPE = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}


def body(**request: Any) -> bytes:
    return json.dumps({**ENVELOPE, "request": request}).encode()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "malformed JSON at line 1: Expecting value"),
        (b'{"kind": ', "malformed JSON at line 1: Expecting value"),
        (b"[" * 100_000, "malformed JSON: nested too deeply"),
        (b"\xff\xfe\x00", "body is not UTF-8 JSON: truncated data"),
        (b"[]", "AdmissionReview must be a JSON object, got an array"),
        (b"7", "AdmissionReview must be a JSON object, got a number"),
        (b"null", "AdmissionReview must be a JSON object, got null"),
        (
            b'{"kind":"AdmissionReview","request":{}}',
            'apiVersion must be "admission.k8s.io/v1", got missing',
        ),
        (
            b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}',
            'apiVersion must be "admission.k8s.io/v1", got "admission.k8s.io/v1beta1"',
        ),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}',
            'kind must be "AdmissionReview", got "Pod"',
        ),
        (json.dumps(ENVELOPE).encode(), "request is missing"),
        (json.dumps({**ENVELOPE, "request": []}).encode(), "request must be an object"),
        (body(operation="CREATE"), "request.uid is missing"),
        (body(uid=""), "request.uid must be a non-empty string"),
        (body(uid=7), "request.uid must be a non-empty string"),
        (body(uid="u", object="pod"), "request.object: Input should be a valid dictionary"),
        (
            body(uid="u", dryRun="maybe"),
            "request.dryRun: Input should be a valid boolean, unable to interpret input",
        ),
    ],
    ids=[
        "empty", "truncated", "nested", "not-utf8", "array", "number", "null",
        "no-apiversion", "v1beta1", "wrong-kind", "no-request", "request-array",
        "no-uid", "empty-uid", "uid-number", "object-string", "dryrun-string",
    ],
)  # fmt: skip
def test_decode_errors(raw: bytes, message: str) -> None:
    with pytest.raises(WireFormatError) as info:
        wire.decode_review(raw)
    assert str(info.value) == message


MAP = "must be a map of strings"


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": [[]]}, "request.object.metadata must be an object, got an array"),
        ({"spec": 7}, "request.object.spec must be an object, got a number"),
        ({"metadata": {"labels": [-170]}}, f"request.object.metadata.labels {MAP}"),
        ({"metadata": {"labels": "0"}}, f"request.object.metadata.labels {MAP}"),
        ({"metadata": {"labels": {"a": 1}}}, f"request.object.metadata.labels {MAP}"),
        ({"metadata": {"annotations": [{}]}}, f"request.object.metadata.annotations {MAP}"),
        ({"metadata": {"annotations": {"a": None}}}, f"request.object.metadata.annotations {MAP}"),
        ({"metadata": {"namespace": 1}},
         "request.object.metadata.namespace must be a string, got a number"),
    ],
)  # fmt: skip
def test_objects_of_the_wrong_shape_are_decode_errors(obj: dict[str, Any], message: str) -> None:
    """Found by the hostile-input fuzz: these reached the policies and came back as 500
    internal-error denials (review.py read labels with .get, gpu_sharing sorted the
    annotations, resources read spec with .get)."""
    for where in ("object", "oldObject"):
        with pytest.raises(WireFormatError) as info:
            wire.decode_review(body(uid="u", **{where: {"kind": "Pod", **obj}}))
        assert str(info.value) == message.replace("object", where, 1)
    assert wire.decode_review(body(uid="u", object={"metadata": None, "spec": None})).object


def test_decode_reads_camel_case_ignores_unknown_and_keeps_raw_objects() -> None:
    pod = {"metadata": {"generateName": "train-", "namespace": "a"}, "spec": {"x": {"y": 1}}}
    request = wire.decode_review(
        body(
            uid="705ab4f5",
            kind={"group": "", "version": "v1", "kind": "Pod"},
            resource={"group": "", "version": "v1", "resource": "pods"},
            requestKind={"group": "", "version": "v1", "kind": "Pod"},
            subResource="",
            namespace="a",
            operation="CREATE",
            userInfo={"username": "alice", "groups": ["g"], "extra": {"k": ["v"]}},
            object=pod,
            oldObject=None,
            dryRun=True,
            options={"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
            somethingNew={"added": "in 1.40"},
        )
    )
    assert request.uid == "705ab4f5"
    assert request.kind.kind == "Pod" and request.resource.resource == "pods"
    assert request.request_kind is not None and request.request_kind.kind == "Pod"
    assert request.name == ""  # generateName: no name yet at mutating admission
    assert request.operation == "CREATE" and request.dry_run is True
    assert request.user_info.username == "alice" and request.user_info.extra == {"k": ("v",)}
    assert request.object == pod
    assert request.old_object is None


def test_unknown_operation_is_not_a_decode_error() -> None:
    assert wire.decode_review(body(uid="u", operation="FROB")).operation == "FROB"


R = "admission.k8s.io/v1"


@pytest.mark.parametrize(
    ("response", "want"),
    [
        (wire.allow(), {"uid": "u1", "allowed": True}),
        (
            wire.deny(403, "no"),
            {"uid": "u1", "allowed": False, "status": {"code": 403, "message": "no"}},
        ),
        (
            wire.allow(warnings=("near", "near", "", "a\x1bb")),
            {"uid": "u1", "allowed": True, "warnings": ["near", "a b"]},
        ),
        (
            wire.deny(400, "bad", warnings=("w",)),
            {
                "uid": "u1",
                "allowed": False,
                "status": {"code": 400, "message": "bad"},
                "warnings": ["w"],
            },
        ),
    ],
    ids=["allow", "deny", "warnings-deduped-and-cleaned", "deny-with-warning"],
)  # fmt: skip
def test_encode_response(response: wire.AdmissionResponse, want: dict[str, Any]) -> None:
    assert wire.encode_response("u1", response) == {
        "apiVersion": R,
        "kind": "AdmissionReview",
        "response": want,
    }


def test_encode_response_with_patch() -> None:
    ops = (patches.add("/metadata/labels", {"fairshare.io/tenant": "nlp"}),)
    got = wire.encode_response("u2", wire.allow(patch=ops))["response"]
    assert list(got) == ["uid", "allowed", "patchType", "patch"]
    assert got["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(got["patch"])) == [
        {"op": "add", "path": "/metadata/labels", "value": {"fairshare.io/tenant": "nlp"}}
    ]


def test_empty_patch_sends_no_patch_fields() -> None:
    got = wire.encode_response("u", wire.allow(patch=()))["response"]
    assert "patch" not in got and "patchType" not in got


def test_encoded_response_round_trips_through_json() -> None:
    encoded = wire.encode_response("u", wire.deny(403, 'quote " and ü'))
    assert json.loads(json.dumps(encoded)) == encoded
