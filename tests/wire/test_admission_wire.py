"""Golden AdmissionReview tests: requests as kube-apiserver sends them, exact responses.

Each case in ``tests/wire/admission/`` is decoded, judged and encoded by the webhook core
and compared as parsed JSON with the expected body (so key spelling and casing must be
exact: kube-apiserver decodes responses case-sensitively). Patches are decoded and
applied to the object *as sent* with a small RFC 6902 applier that fails, as
kube-apiserver does, on an ``add`` under a missing parent.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import pytest

from fairshare.errors import WireFormatError
from fairshare.resources import ANN_GPU_FRACTION, LABEL_TENANT
from tests.wire.admission import cases
from webhook import review, wire

CASES = cases.all_cases()
RESPONSE_KEYS = {"uid", "allowed", "status", "patchType", "patch", "warnings"}
STATUS_KEYS = {"code", "message"}


@pytest.fixture(scope="module")
def cluster() -> cases.Cluster:
    return cases.load_cluster()


def by_phase(*phases: str) -> list[cases.Case]:
    return [case for case in CASES if case.phase in phases]


def ids(items: list[cases.Case]) -> list[str]:
    return [case.name for case in items]


# --- a tiny RFC 6902 applier (add / replace / remove), strict like evanphx/json-patch ----


class PatchApplyError(Exception):
    pass


def unescape(token: str) -> str:
    # RFC 6901: decode ~1 first, then ~0.
    return token.replace("~1", "/").replace("~0", "~")


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    if not path.startswith("/"):
        raise PatchApplyError(f"path {path!r} must start with /")
    tokens = [unescape(t) for t in path.split("/")[1:]]
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, list):
            node = node[int(token)]
        elif isinstance(node, dict) and token in node and node[token] is not None:
            node = node[token]
        else:
            raise PatchApplyError(f"{path}: missing parent {token!r}")
    return node, tokens[-1]


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        parent, last = _parent(doc, op["path"])
        if op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] in ("replace", "remove"):
            if isinstance(parent, dict) and last not in parent:
                raise PatchApplyError(f"{op['op']} of missing member {op['path']}")
            if op["op"] == "replace":
                parent[last if isinstance(parent, dict) else int(last)] = op["value"]
            else:
                del parent[last if isinstance(parent, dict) else int(last)]
        else:
            raise PatchApplyError(f"unsupported op {op['op']!r}")
    return doc


@pytest.mark.parametrize(
    ("doc", "ops", "want"),
    [
        ({"a": {}}, [{"op": "add", "path": "/a/b~1c", "value": 1}], {"a": {"b/c": 1}}),
        ({"a": {}}, [{"op": "add", "path": "/a/b~0c", "value": 1}], {"a": {"b~c": 1}}),
        ({"a": {"x": 1}}, [{"op": "replace", "path": "/a/x", "value": 2}], {"a": {"x": 2}}),
        ({"a": [1]}, [{"op": "add", "path": "/a/-", "value": 2}], {"a": [1, 2]}),
    ],
    ids=["escaped-slash", "escaped-tilde", "replace", "append"],
)
def test_applier_applies(doc: Any, ops: list[dict[str, Any]], want: Any) -> None:
    assert apply_patch(doc, ops) == want


@pytest.mark.parametrize(
    ("doc", "ops"),
    [
        ({"metadata": {}}, [{"op": "add", "path": "/metadata/labels/a", "value": "1"}]),
        ({"metadata": {"labels": None}}, [{"op": "add", "path": "/metadata/labels/a", "value": 1}]),
        ({"a": {}}, [{"op": "replace", "path": "/a/x", "value": 2}]),
    ],
    ids=["add-under-missing-parent", "add-under-null-parent", "replace-missing"],
)
def test_applier_is_strict(doc: Any, ops: list[dict[str, Any]]) -> None:
    with pytest.raises(PatchApplyError):
        apply_patch(doc, ops)


# --- the golden cases ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", by_phase("mutate", "validate"), ids=ids(by_phase("mutate", "validate"))
)
def test_golden_response(case: cases.Case, cluster: cases.Cluster) -> None:
    expected = json.loads(case.response.read_text())
    assert cases.answer(case, cluster) == expected


@pytest.mark.parametrize("case", by_phase("malformed"), ids=ids(by_phase("malformed")))
def test_golden_malformed(case: cases.Case) -> None:
    with pytest.raises(WireFormatError) as info:
        wire.decode_review(case.body())
    assert str(info.value) == case.error.read_text().rstrip("\n")


@pytest.mark.parametrize(
    "case", by_phase("mutate", "validate"), ids=ids(by_phase("mutate", "validate"))
)
def test_expected_files_have_exact_wire_keys(case: cases.Case) -> None:
    """The expected bodies themselves use kube-apiserver's exact (case-sensitive) keys."""
    body = json.loads(case.response.read_text())
    request = json.loads(case.body())
    assert list(body) == ["apiVersion", "kind", "response"]
    assert (body["apiVersion"], body["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response = body["response"]
    assert set(response) <= RESPONSE_KEYS
    assert response["uid"] == request["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if "status" in response:
        assert not response["allowed"]
        assert set(response["status"]) == STATUS_KEYS
        assert response["status"]["code"] in (400, 403)
    assert ("patch" in response) == ("patchType" in response)
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        assert re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", response["patch"])


@pytest.mark.parametrize("case", by_phase("validate"), ids=ids(by_phase("validate")))
def test_validating_answers_never_patch(case: cases.Case, cluster: cases.Cluster) -> None:
    body = cases.answer(case, cluster)
    assert isinstance(body, dict)
    assert "patch" not in body["response"]
    assert "patchType" not in body["response"]


MUTATED = [case for case in by_phase("mutate") if case.patch.exists()]


@pytest.mark.parametrize("case", MUTATED, ids=ids(MUTATED))
def test_patch_decodes_and_applies_to_object_as_sent(
    case: cases.Case, cluster: cases.Cluster
) -> None:
    body = json.loads(case.response.read_text())
    ops = json.loads(base64.b64decode(body["response"]["patch"], validate=True))
    assert ops == json.loads(case.patch.read_text())
    sent = json.loads(case.body())["request"]["object"]
    patched = apply_patch(sent, ops)
    assert patched["metadata"]["labels"][LABEL_TENANT] in {t.name for t in cluster.config.tenants}
    # Reinvocation (IfNeeded) on the patched object changes nothing more.
    again = json.loads(case.body())
    again["request"]["object"] = patched
    response = review.review(
        wire.decode_review(json.dumps(again).encode()),
        view=cluster.view,
        config=cluster.config,
        phase="mutate",
    )
    assert response.allowed
    assert response.patch == ()


def test_fraction_is_written_in_canonical_form(cluster: cases.Cluster) -> None:
    (case,) = [c for c in CASES if c.name == "mutate-pod-fraction"]
    body = json.loads(case.response.read_text())
    ops = json.loads(base64.b64decode(body["response"]["patch"]))
    patched = apply_patch(json.loads(case.body())["request"]["object"], ops)
    assert patched["metadata"]["annotations"][ANN_GPU_FRACTION] == "0.25"
    # Annotations the webhook does not own are left exactly as sent.
    assert patched["metadata"]["annotations"]["example.com/owner~team"] == "cv"


def test_every_case_has_an_expected_answer() -> None:
    for case in CASES:
        wanted = case.error if case.phase == "malformed" else case.response
        assert wanted.exists(), f"{case.name}: run python -m tests.wire.admission.regenerate"
    assert {case.phase for case in CASES} == {"malformed", "mutate", "validate"}
