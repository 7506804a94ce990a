"""Golden wire tests for the kube-scheduler extender (extender/v1, PascalCase, no json tags).

``tests/wire/extender/`` holds, for every verb, the request as kube-scheduler sends it
(``*_request.json``: ``Pod`` without kind/apiVersion, the unused one of ``Nodes`` /
``NodeNames`` as ``null``, ``NodeList`` as ``{"metadata": {}, "items": [...]}``) and the
answer we must give (``*_response.json``), over the cluster in ``state.json`` (a v1
``List`` loaded with ``fairshare.state.objects.load_state_file``) and ``CONFIG`` below.

The cluster: gpu-1 (4 A100), gpu-2 (4 A100, ``GpuUnhealthy=True``: out of service), gpu-3
(8 H100), cpu-1 (no GPU): 12 GPUs in service. research (guaranteed 6 GPUs) holds 9.5 GPUs,
prod (weight 2, guaranteed 2) holds 1 and waits for 1 + 4 + 4 more. Fair allocation (both
start at their guarantees, 6 and 2; progressive filling gives prod, the lower weighted
share, the 4 GPUs left): research 6/12 = 0.5. So research-nb-1 (0.5 GPU) is gated:
10/12 = 0.83 > 0.5, and prod has a pod that fits now.

Requests are written by hand (review them like code). Responses are regenerated with::

    .venv/bin/python -m tests.wire.test_extender_wire --regenerate

and their diffs reviewed like code (multidict's ``gen_pickles.py`` habit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare.config.loading import config_from_mapping
from fairshare.placement import node_rank
from fairshare.state import objects

GOLDEN = Path(__file__).parent / "extender"

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {
                "name": "prod",
                "namespaces": ["prod"],
                "weight": 2,
                "guaranteed": {"nvidia.com/gpu": "2"},
            },
            {"name": "research", "guaranteed": {"nvidia.com/gpu": "6"}},
        ],
    }
)

FILTER_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]


def load(name: str) -> Any:
    return json.loads((GOLDEN / name).read_text(encoding="utf-8"))


def answer(verb: str, body: bytes | dict[str, Any]) -> Any:
    """Run one verb as the HTTP adapter will: decode, call the pure function, encode."""
    loaded = objects.load_state_file(GOLDEN / "state.json", CONFIG)
    # The adapter judges fair shares over the pending queue (the tracker's).
    view = Snapshot.of(
        loaded.state, pending=loaded.pending, namespace_labels=loaded.namespace_labels
    )
    if verb in ("filter", "filter-pick"):
        args = wire.decode_extender_args(body)
        pick = verb == "filter-pick"
        return verbs.filter_result(args, view, CONFIG, pick=pick).encode()
    if verb == "prioritize":
        names, scores = verbs.prioritize_scores(wire.decode_extender_args(body), view, CONFIG)
        return wire.encode_scores(names, scores)
    if verb == "preempt":
        args = wire.decode_preemption_args(body)
        return verbs.preempt_result(args, view, CONFIG).encode()
    if verb == "bind":
        args = wire.decode_binding_args(body)
        plan = verbs.bind_plan(args, view)
        return {"result": plan.result(), "binding": plan.binding}
    raise ValueError(verb)


# (request file, verb, response files)
CASES = [
    ("filter_nodenames_request.json", "filter", "filter_nodenames_response.json"),
    ("filter_nodes_request.json", "filter", "filter_nodes_response.json"),
    ("filter_gated_request.json", "filter", "filter_gated_response.json"),
    ("filter_pick_request.json", "filter-pick", "filter_pick_response.json"),
    ("prioritize_request.json", "prioritize", "prioritize_response.json"),
    ("preempt_request.json", "preempt", "preempt_response.json"),
    ("bind_request.json", "bind", "bind_response.json"),
]
IDS = [
    "filter-nodenames",
    "filter-nodes",
    "filter-gated",
    "filter-pick",
    "prioritize",
    "preempt",
    "bind",
]


def _expected(verb: str, response: str) -> Any:
    if verb == "bind":
        return {"result": load(response), "binding": load("bind_binding.json")}
    return load(response)


@pytest.mark.parametrize(("request_file", "verb", "response"), CASES, ids=IDS)
def test_golden_answer(request_file, verb, response):
    raw = (GOLDEN / request_file).read_bytes()
    assert answer(verb, raw) == _expected(verb, response)


def _lower_envelope(body: dict[str, Any]) -> dict[str, Any]:
    """Lower-case the extender's own keys (not those of the Pod/Node API objects inside)."""
    out = {k.lower(): v for k, v in body.items()}
    meta = out.get("nodenametometavictims")
    if meta:
        out["nodenametometavictims"] = {
            node: {
                "pods": [{k.lower(): v for k, v in p.items()} for p in victims["Pods"]],
                "numpdbviolations": victims["NumPDBViolations"],
            }
            for node, victims in meta.items()
        }
    return out


@pytest.mark.parametrize(("request_file", "verb", "response"), CASES, ids=IDS)
def test_lower_case_requests_are_accepted(request_file, verb, response):
    # Go's encoding/json matches keys case-insensitively (k/k TestCompatibility lowers
    # the whole document); our decoder must accept what kube-scheduler would.
    lowered = _lower_envelope(load(request_file))
    assert answer(verb, lowered) == _expected(verb, response)


def test_requests_have_kube_scheduler_s_exact_keys():
    for name, keys in [
        ("filter_nodenames_request.json", ["Pod", "Nodes", "NodeNames"]),
        ("filter_nodes_request.json", ["Pod", "Nodes", "NodeNames"]),
        ("preempt_request.json", ["Pod", "NodeNameToVictims", "NodeNameToMetaVictims"]),
        ("bind_request.json", ["PodName", "PodNamespace", "PodUID", "Node"]),
    ]:
        assert list(load(name)) == keys, name
    assert load("filter_nodenames_request.json")["Nodes"] is None
    assert load("filter_nodes_request.json")["NodeNames"] is None
    assert set(load("filter_nodes_request.json")["Nodes"]) == {"metadata", "items"}
    assert "kind" not in load("filter_nodes_request.json")["Pod"]


@pytest.mark.parametrize(
    "response",
    [
        "filter_nodenames_response.json",
        "filter_nodes_response.json",
        "filter_gated_response.json",
        "filter_pick_response.json",
    ],
    ids=["nodenames", "nodes", "gated", "pick"],
)
def test_filter_responses_are_pascal_case_with_every_field(response):
    assert list(load(response)) == FILTER_KEYS


def test_both_filter_forms_agree():
    by_names = load("filter_nodenames_response.json")
    by_nodes = load("filter_nodes_response.json")
    assert by_names["Nodes"] is None and by_nodes["NodeNames"] is None
    assert by_names["NodeNames"] == [n["metadata"]["name"] for n in by_nodes["Nodes"]["items"]]
    assert by_nodes["Nodes"]["metadata"] == {}
    for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
        assert by_names[key] == by_nodes[key]
    # The unhealthy node is unresolvable for a GPU pod.
    assert by_names["FailedAndUnresolvableNodes"]["gpu-2"].startswith("GPU unhealthy: ")


def test_gated_response_carries_the_gate_reason():
    gated = load("filter_gated_response.json")
    assert gated["NodeNames"] == []
    assert gated["FailedNodes"]["gpu-1"] == (
        "tenant research above its fair share (0.83 > 0.50) while prod waits"
    )


def _scores(request_file: str) -> dict[str, int]:
    """What prioritize answers for the request's pod and candidates."""
    body = answer("prioritize", (GOLDEN / request_file).read_bytes())
    return {item["Host"]: item["Score"] for item in body}


def test_pick_in_filter_keeps_only_the_node_prioritize_scores_highest():
    # prod-etl-1 (CPU only) passes gpu-1, gpu-2 and gpu-3; prioritize scores gpu-3 highest.
    raw = (GOLDEN / "filter_pick_request.json").read_bytes()
    assert answer("filter", raw)["NodeNames"] == ["gpu-1", "gpu-2", "gpu-3"]
    scores = _scores("filter_pick_request.json")
    best = [n for n, s in scores.items() if s == max(scores.values())]
    assert len(best) == 1
    picked = answer("filter-pick", raw)
    assert picked["NodeNames"] == best
    # The others are omitted, not failed: kube-scheduler drops them from the feasible set.
    assert picked["FailedNodes"] == {} and picked["FailedAndUnresolvableNodes"] == {}


def test_pick_in_filter_takes_one_of_the_best_levels_in_the_fixed_node_order():
    # gpu-3 and cpu-1 both score 8 in prioritize and sit on the same of the 30 choice
    # levels; the tie goes to the node first in the fixed random order (node_rank):
    # gpu-3, though cpu-1 lists later and has the higher unrounded score.
    raw = (GOLDEN / "prioritize_request.json").read_bytes()
    scores = _scores("prioritize_request.json")
    assert scores["gpu-3"] == scores["cpu-1"] == max(scores.values())
    assert node_rank("gpu-3") < node_rank("cpu-1")
    assert answer("filter-pick", raw)["NodeNames"] == ["gpu-3"]


@pytest.mark.parametrize(
    ("request_file", "response"),
    [
        ("filter_nodenames_request.json", "filter_nodenames_response.json"),
        ("filter_nodes_request.json", "filter_nodes_response.json"),
        ("filter_gated_request.json", "filter_gated_response.json"),
    ],
    ids=["nodenames", "nodes", "gated"],
)
def test_pick_in_filter_leaves_one_or_no_passing_node_unchanged(request_file, response):
    assert answer("filter-pick", (GOLDEN / request_file).read_bytes()) == load(response)


def test_prioritize_response_is_a_bare_array_of_int_scores():
    body = load("prioritize_response.json")
    assert isinstance(body, list)
    for item in body:
        assert list(item) == ["Host", "Score"]
        assert type(item["Score"]) is int
        assert wire.MIN_EXTENDER_PRIORITY <= item["Score"] <= wire.MAX_EXTENDER_PRIORITY
    # Integers are written without a decimal point (Go's int64 decoder refuses 7.0).
    text = (GOLDEN / "prioritize_response.json").read_text()
    assert "." not in text.replace("gpu-", "").replace("cpu-", "")


def test_preempt_response_is_by_uid_and_drops_emptied_nodes():
    body = load("preempt_response.json")
    assert list(body) == ["NodeNameToMetaVictims"]
    for victims in body["NodeNameToMetaVictims"].values():
        assert list(victims) == ["Pods", "NumPDBViolations"]
        assert all(list(p) == ["UID"] for p in victims["Pods"])
    # research holds 9.5 GPUs with 6 guaranteed: research-train-0 (4 GPUs) would leave
    # 5.5, so gpu-3 loses its only victim and is dropped.
    assert set(body["NodeNameToMetaVictims"]) == {"gpu-1"}


def test_bind_response_and_binding_body():
    assert load("bind_response.json") == {"Error": ""}
    binding = load("bind_binding.json")
    assert list(binding) == ["apiVersion", "kind", "metadata", "target"]
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"}
    # research-nb-0 holds half of device 2: best fit puts the other half there.
    # It joins research-nb-0's shared GPU (bound before groups: named after its slot).
    assert binding["metadata"]["annotations"] == {
        "fairshare.io/gpu-devices": "2:500",
        "fairshare.io/gpu-group": "slot-2e816b93d693",
    }


def regenerate() -> None:
    """Rewrite every ``*_response.json`` (and the Binding body) from the current code."""
    for request_file, verb, response in CASES:
        got = answer(verb, (GOLDEN / request_file).read_bytes())
        outputs = {response: got}
        if verb == "bind":
            outputs = {response: got["result"], "bind_binding.json": got["binding"]}
        for name, value in outputs.items():
            text = json.dumps(value, indent=2, ensure_ascii=False) + "\n"
            (GOLDEN / name).write_text(text, encoding="utf-8")
            print(f"wrote {GOLDEN / name}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit("usage: python -m tests.wire.test_extender_wire --regenerate")
    regenerate()
