"""Hostile or malformed extender bodies: a ``WireFormatError`` (the adapter's 400) or a
well-formed answer, never another exception (which would be a 500)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare.errors import WireFormatError
from tests.unit.test_state_objects import CONFIG, node, state_with

STATE = state_with(node("a"), node("b", gpus=0))

HOSTILE_PODS = [
    ({"spec": []}, r"\.spec: expected an object"),
    ({"spec": {"containers": [1]}}, r"spec\.containers\[0\]: expected an object"),
    ({"spec": {"initContainers": [None]}}, r"initContainers\[0\]: expected an object, got null"),
    ({"spec": {"containers": [{"resources": []}]}}, "resources: expected an object"),
    ({"spec": {"containers": [{"resources": {"requests": {"cpu": {}}}}]}}, "expected a quantity"),
    ({"spec": {"containers": [{"resources": {"limits": {"cpu": True}}}]}}, "got boolean"),
    ({"spec": {"overhead": {"cpu": []}}}, r"overhead\[cpu\]: expected a quantity"),
    ({"spec": {"volumes": 3}}, "volumes: expected an array"),
    ({"metadata": []}, r"\.metadata: expected an object"),
    ({"metadata": {"uid": 7}}, r"metadata\.uid: expected a string"),
    ({"metadata": {"annotations": {"fairshare.io/gpu-fraction": 0.5}}}, "expected a string"),
]


@pytest.mark.parametrize(
    ("pod", "message"),
    HOSTILE_PODS,
    ids=[
        "spec-array",
        "container-number",
        "init-null",
        "resources-array",
        "quantity-object",
        "quantity-bool",
        "overhead",
        "volumes",
        "metadata-array",
        "uid-number",
        "annotation-number",
    ],
)
@pytest.mark.parametrize("verb", ["filter", "preempt"])
def test_hostile_pod_shapes_are_wire_format_errors(pod, message, verb):
    with pytest.raises(WireFormatError, match=message):
        if verb == "filter":
            wire.decode_extender_args({"Pod": pod, "NodeNames": ["a"]})
        else:
            wire.decode_preemption_args(
                {
                    "Pod": {},
                    "NodeNameToVictims": {"a": {"Pods": [pod]}},
                    "NodeNameToMetaVictims": None,
                }
            )


@pytest.mark.parametrize(
    ("requests", "annotations"),
    [
        ({"nvidia.com/gpu": "1e9999"}, {}),  # a valid quantity no float holds
        ({"nvidia.com/gpu": "0.5"}, {}),  # whole devices only
        ({"cpu": "abc"}, {}),
        ({}, {"fairshare.io/gpu-fraction": "7"}),
        ({}, {"fairshare.io/gpu-memory": "-1Gi"}),
    ],
    ids=[
        "huge",
        "fractional-device-count",
        "bad-quantity",
        "fraction-above-one",
        "negative-memory",
    ],
)
def test_unreadable_demands_are_answers_not_crashes(requests, annotations):
    pod = {
        "metadata": {"name": "p", "namespace": "prod", "uid": "u", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]},
    }
    args = wire.decode_extender_args({"Pod": pod, "NodeNames": ["a", "b"]})
    out = verbs.filter_result(args, Snapshot.of(STATE, pending=[]), CONFIG).encode()
    assert out["NodeNames"] == [] and set(out["FailedAndUnresolvableNodes"]) == {"a", "b"}
    assert wire.encode_scores(*verbs.prioritize_scores(args, Snapshot.of(STATE), CONFIG)) == [
        {"Host": "a", "Score": 0},
        {"Host": "b", "Score": 0},
    ]
    pre = wire.decode_preemption_args(
        {"Pod": pod, "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "x"}]}}}
    )
    assert verbs.preempt_result(pre, Snapshot.of(STATE), CONFIG).encode()[
        "NodeNameToMetaVictims"
    ] == {"a": {"Pods": [{"UID": "x"}], "NumPDBViolations": 0}}


hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(
    [
        "Pod",
        "pod",
        "Nodes",
        "NodeNames",
        "nodenames",
        "NodeNameToMetaVictims",
        "NodeNameToVictims",
        "x",
    ]
)
POD_KEYS = st.sampled_from(["metadata", "spec", "status"])
BODY = st.dictionaries(
    KEYS,
    JSON | st.dictionaries(POD_KEYS, JSON, max_size=3) | st.lists(st.sampled_from(["a", "b", "c"])),
    max_size=4,
)


def _run(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    for decode, run in [
        (
            wire.decode_extender_args,
            lambda a: verbs.filter_result(a, Snapshot.of(STATE, pending=[]), CONFIG).encode(),
        ),
        (
            wire.decode_extender_args,
            lambda a: wire.encode_scores(*verbs.prioritize_scores(a, Snapshot.of(STATE), CONFIG)),
        ),
        (
            wire.decode_preemption_args,
            lambda a: verbs.preempt_result(a, Snapshot.of(STATE), CONFIG).encode(),
        ),
    ]:
        try:
            args = decode(raw)
        except WireFormatError:
            continue
        json.dumps(run(args))  # the answer is JSON-serialisable


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(BODY)
def test_arbitrary_bodies_never_crash(body):
    _run(body)
