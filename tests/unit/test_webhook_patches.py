"""JSON Patch building: pointer escaping, missing-map creation, idempotence, encoding."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from webhook import patches
from webhook.patches import PatchOp


@pytest.mark.parametrize(
    ("token", "want"),
    [
        ("fairshare.io/tenant", "fairshare.io~1tenant"),
        ("a~b", "a~0b"),
        ("~/", "~0~1"),
        # ~ is escaped first: "~1" in a key must come out as "~01", not as "/".
        ("a~1", "a~01"),
        ("a/~b", "a~1~0b"),
        ("", ""),
        ("plain", "plain"),
    ],
    ids=["slash", "tilde", "tilde-then-slash", "literal-tilde-one", "mixed", "empty", "plain"],
)
def test_escape_pointer(token: str, want: str) -> None:
    assert patches.escape_pointer(token) == want


def test_pointer_joins_escaped_tokens() -> None:
    got = patches.pointer("metadata", "annotations", "fairshare.io/gpu-fraction")
    assert got == "/metadata/annotations/fairshare.io~1gpu-fraction"


T = "fairshare.io/tenant"


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        (
            {"metadata": {"labels": {"app": "x"}}},
            [PatchOp("add", "/metadata/labels/fairshare.io~1tenant", "nlp")],
        ),
        ({"metadata": {"name": "p"}}, [PatchOp("add", "/metadata/labels", {T: "nlp"})]),
        ({"metadata": {"labels": None}}, [PatchOp("add", "/metadata/labels", {T: "nlp"})]),
        (
            {"metadata": {"labels": {}}},
            [PatchOp("add", "/metadata/labels/fairshare.io~1tenant", "nlp")],
        ),
        ({}, [PatchOp("add", "/metadata", {"labels": {T: "nlp"}})]),
        # add on an existing member replaces it (RFC 6902 §4.1)
        (
            {"metadata": {"labels": {T: "old"}}},
            [PatchOp("add", "/metadata/labels/fairshare.io~1tenant", "nlp")],
        ),
        # already right: no op, so reinvocation changes nothing
        ({"metadata": {"labels": {T: "nlp"}}}, []),
    ],
    ids=[
        "labels-exist",
        "labels-missing",
        "labels-null",
        "labels-empty",
        "no-metadata",
        "replaces",
        "idempotent",
    ],
)
def test_set_label(pod: dict[str, Any], want: list[PatchOp]) -> None:
    assert list(patches.set_label(pod, T, "nlp")) == want


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        (
            {"metadata": {"annotations": {"a": "1"}}},
            [PatchOp("add", "/metadata/annotations/fairshare.io~1gpu-fraction", "0.25")],
        ),
        (
            {"metadata": {"labels": {}}},
            [PatchOp("add", "/metadata/annotations", {"fairshare.io/gpu-fraction": "0.25"})],
        ),
        ({"metadata": {"annotations": {"fairshare.io/gpu-fraction": "0.25"}}}, []),
    ],
    ids=["annotations-exist", "annotations-missing", "idempotent"],
)
def test_set_annotation(pod: dict[str, Any], want: list[PatchOp]) -> None:
    assert list(patches.set_annotation(pod, "fairshare.io/gpu-fraction", "0.25")) == want


def test_builder_creates_a_missing_map_once_then_adds_under_it() -> None:
    pod: dict[str, Any] = {"metadata": {}}
    builder = patches.PatchBuilder(pod)
    builder.set_entry(("metadata", "labels"), "a", "1")
    builder.set_entry(("metadata", "labels"), "b/c", "2")
    builder.set_entry(("metadata", "labels"), "a", "1")  # already set by this patch: no op
    assert builder.ops == (
        PatchOp("add", "/metadata/labels", {"a": "1"}),
        PatchOp("add", "/metadata/labels/b~1c", "2"),
    )
    assert pod == {"metadata": {}}  # the object as sent is never modified


def test_builder_creates_nested_missing_maps_from_the_deepest_existing_one() -> None:
    builder = patches.PatchBuilder({"spec": {}})
    builder.set_entry(("spec", "x", "y"), "k", "v")
    builder.set_entry(("spec", "x", "z"), "k", "w")
    assert builder.ops == (
        PatchOp("add", "/spec/x", {"y": {"k": "v"}}),
        PatchOp("add", "/spec/x/z", {"k": "w"}),
    )


def test_set_field_adds_a_scalar() -> None:
    builder = patches.PatchBuilder({"spec": {"schedulerName": "default-scheduler"}})
    builder.set_field(("spec", "schedulerName"), "fairshare")
    assert builder.ops == (PatchOp("add", "/spec/schedulerName", "fairshare"),)


@pytest.mark.parametrize(
    ("op", "want"),
    [
        (patches.add("/a", 1), {"op": "add", "path": "/a", "value": 1}),
        (patches.replace("/a", None), {"op": "replace", "path": "/a", "value": None}),
        (patches.remove("/a"), {"op": "remove", "path": "/a"}),
    ],
    ids=["add", "replace-null", "remove"],
)
def test_op_json(op: PatchOp, want: dict[str, Any]) -> None:
    assert op.as_json() == want


def test_encode_patch_is_base64_of_compact_utf8_json() -> None:
    ops = [patches.add("/metadata/labels", {"team": "é"}), patches.remove("/x")]
    raw = base64.b64decode(patches.encode_patch(ops), validate=True)
    assert raw == '[{"op":"add","path":"/metadata/labels","value":{"team":"é"}},'.encode() + (
        b'{"op":"remove","path":"/x"}]'
    )
    assert json.loads(raw)[0]["path"] == "/metadata/labels"


def test_encode_empty_patch() -> None:
    assert base64.b64decode(patches.encode_patch([])) == b"[]"
