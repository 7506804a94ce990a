"""Extender wire decoding: Go's case-insensitive keys, Go's type strictness, clear errors."""

from __future__ import annotations

import pytest

from extender import wire
from fairshare.errors import WireFormatError

POD = {"metadata": {"name": "p", "namespace": "a", "uid": "u1"}, "spec": {"containers": []}}


@pytest.mark.parametrize(
    "body",
    [
        {"Pod": POD, "Nodes": None, "NodeNames": ["n1", "n2"]},
        {"pod": POD, "nodes": None, "nodenames": ["n1", "n2"]},
        {"POD": POD, "NODENAMES": ["n1", "n2"]},
        {"pOd": POD, "nodeNames": ["n1", "n2"], "Unknown": 1},
        b'{"Pod": {"metadata": {"name": "p", "namespace": "a", "uid": "u1"},'
        b' "spec": {"containers": []}}, "NodeNames": ["n1", "n2"]}',
    ],
    ids=["pascal", "lower", "upper", "mixed-with-unknown-key", "bytes"],
)
def test_extender_args_keys_match_case_insensitively(body):
    args = wire.decode_extender_args(body)
    assert args.pod == POD
    assert args.node_names == ("n1", "n2")
    assert args.nodes is None
    assert args.candidate_names() == ("n1", "n2")


def test_last_matching_key_wins_as_in_go():
    args = wire.decode_extender_args({"NodeNames": ["x"], "nodenames": ["y"], "Pod": POD})
    assert args.node_names == ("y",)


def test_nodes_form_keeps_raw_items():
    item = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}}}
    args = wire.decode_extender_args({"Pod": POD, "Nodes": {"metadata": {}, "Items": [item]}})
    assert args.nodes is not None and args.nodes.items == (item,)
    assert args.candidate_names() == ("n1",)
    assert args.node_names is None


MALFORMED = [
    (b"{not json", "ExtenderArgs: invalid JSON"),
    (b"[]", "expected a JSON object, got array"),
    (b'{"Pod": null, "NodeNames": []}', "Pod: expected an object, got null"),
    (b'{"NodeNames": []}', "Pod: expected an object, got null"),
    (b'{"Pod": "x"}', "Pod: expected an object, got string"),
    (b'{"Pod": {}, "NodeNames": "n1"}', "NodeNames: expected an array, got string"),
    (b'{"Pod": {}, "NodeNames": ["n1", 7]}', r"NodeNames\[1\]: expected a string, got number"),
    (b'{"Pod": {}, "Nodes": []}', "Nodes: expected an object, got array"),
    (b'{"Pod": {}, "Nodes": {"items": [{}]}}', r"Nodes.items\[0\].metadata.name"),
    (b'{"Pod": {}, "Nodes": {"items": [1]}}', r"Nodes.items\[0\]: expected an object"),
    (b'{"Pod": {}, "NodeNames": [NaN]}', "invalid JSON"),
    (b"\xff\xfe", "invalid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid JSON"),
]


@pytest.mark.parametrize(
    ("body", "message"),
    MALFORMED,
    ids=[
        "syntax",
        "array",
        "null-pod",
        "missing-pod",
        "string-pod",
        "names-not-array",
        "name-not-string",
        "nodes-not-object",
        "node-without-name",
        "node-not-object",
        "nan",
        "not-utf8",
        "deep-nesting",
    ],
)
def test_malformed_filter_bodies_raise_wire_format_error(body, message):
    with pytest.raises(WireFormatError, match=message):
        wire.decode_extender_args(body)


PREEMPT_MALFORMED = [
    (
        {"Pod": POD, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 1}]}}},
        "UID: expected a string",
    ),
    (
        {"Pod": POD, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": 1.0}}},
        "expected an integer",
    ),
    (
        {"Pod": POD, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": "1"}}},
        "expected an integer",
    ),
    (
        {"Pod": POD, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": True}}},
        "expected an integer",
    ),
    (
        {"Pod": POD, "NodeNameToMetaVictims": {"n": []}},
        r"NodeNameToMetaVictims\[n\]: expected an object",
    ),
    ({"Pod": POD, "NodeNameToVictims": {"n": {"Pods": ["x"]}}}, r"Pods\[0\]: expected an object"),
]


@pytest.mark.parametrize(
    ("body", "message"),
    PREEMPT_MALFORMED,
    ids=["uid-number", "pdb-float", "pdb-string", "pdb-bool", "victims-array", "victim-not-object"],
)
def test_malformed_preempt_bodies(body, message):
    with pytest.raises(WireFormatError, match=message):
        wire.decode_preemption_args(body)


def test_preempt_lowercase_and_both_forms():
    args = wire.decode_preemption_args(
        {
            "pod": POD,
            "nodenametovictims": {"n": {"pods": [POD], "numpdbviolations": 2}},
            "nodenametometavictims": None,
        }
    )
    assert args.meta_victims() == {"n": wire.MetaVictims(("u1",), 2)}
    # The legacy lowercase word "nodeToVictims" is a different word: not matched.
    legacy = wire.decode_preemption_args({"Pod": POD, "nodeToVictims": {"n": {}}})
    assert legacy.meta_victims() == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"PodNamespace": "a", "Node": "n"}, "PodName: required"),
        ({"PodName": "p", "PodNamespace": "a"}, "Node: required"),
        ({"PodName": "p", "PodNamespace": "a", "Node": 3}, "Node: expected a string"),
    ],
    ids=["no-name", "no-node", "node-number"],
)
def test_malformed_bind_bodies(body, message):
    with pytest.raises(WireFormatError, match=message):
        wire.decode_binding_args(body)


def test_bind_args_lowercase():
    args = wire.decode_binding_args(b'{"podname":"p","podnamespace":"a","poduid":"u","node":"n"}')
    assert args == wire.ExtenderBindingArgs("p", "a", "u", "n")


@pytest.mark.parametrize(
    "score", [7.5, 7.0, "7", True], ids=["float", "integral-float", "string", "bool"]
)
def test_host_priority_refuses_non_int_scores(score):
    # Go decodes Score into int64: 7.5, 7.0 and "7" are all decode errors there.
    with pytest.raises(TypeError, match="Score must be an int"):
        wire.HostPriority("n", score).encode()


def test_filter_result_shape_is_go_s():
    out = wire.ExtenderFilterResult(node_names=("a",), failed_nodes={"b": "x"}).encode()
    assert out == {
        "Nodes": None,
        "NodeNames": ["a"],
        "FailedNodes": {"b": "x"},
        "FailedAndUnresolvableNodes": None,
        "Error": "",
    }
    assert wire.ExtenderBindingResult("boom").encode() == {"Error": "boom"}
    assert wire.MAX_EXTENDER_PRIORITY == 10
