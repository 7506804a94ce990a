"""Which pending pods count as waiting, and on which nodes they could run now.

The predicate follows kube-scheduler's NodeAffinity and TaintToleration filters; the gate
test shows the issue's case: a tenant whose only pending pod can run nowhere (or is
gated, or belongs to another scheduler) does not hold another tenant back.
"""

from __future__ import annotations

from typing import Any

import pytest

from fairshare import eligibility, gate
from fairshare.config.loading import config_from_mapping
from fairshare.eligibility import NodeConstraints, parse_node_constraints
from fairshare.state import objects
from tests.unit.test_state_objects import node, pod, state_with

LABELS = {"zone": "a", "gpu": "a100", "cores": "64", "bad-int": "64k"}


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def _expr(key: str, op: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": op}
    if values:
        out["values"] = list(values)
    return out


def _terms(*exprs: dict[str, Any]) -> dict[str, Any]:
    return _affinity({"matchExpressions": list(exprs)})


AFFINITY_CASES = [
    # (spec, allowed on node "n1" labelled LABELS)
    ({}, True),
    ({"nodeSelector": {"zone": "a"}}, True),
    ({"nodeSelector": {"zone": "nowhere"}}, False),
    ({"nodeSelector": {"zone": "a", "gpu": "h100"}}, False),
    (_terms(_expr("zone", "In", "b", "a")), True),
    (_terms(_expr("zone", "In", "b")), False),
    (_terms(_expr("rack", "In", "r1")), False),  # In needs the label
    (_terms(_expr("zone", "NotIn", "b")), True),
    (_terms(_expr("zone", "NotIn", "a")), False),
    (_terms(_expr("rack", "NotIn", "r1")), True),  # NotIn holds without the label
    (_terms(_expr("zone", "Exists")), True),
    (_terms(_expr("rack", "Exists")), False),
    (_terms(_expr("rack", "DoesNotExist")), True),
    (_terms(_expr("zone", "DoesNotExist")), False),
    (_terms(_expr("cores", "Gt", "32")), True),
    (_terms(_expr("cores", "Gt", "64")), False),  # strictly greater
    (_terms(_expr("cores", "Lt", "128")), True),
    (_terms(_expr("cores", "Lt", "+64")), False),  # Go's ParseInt takes a sign
    (_terms(_expr("bad-int", "Gt", "1")), False),  # the label is no integer
    (_terms(_expr("rack", "Lt", "1")), False),  # nor present
    # Requirements of one term are ANDed; terms are ORed.
    (_terms(_expr("zone", "In", "a"), _expr("gpu", "In", "h100")), False),
    (
        _affinity(
            {"matchExpressions": [_expr("gpu", "In", "h100")]},
            {"matchExpressions": [_expr("zone", "In", "a")]},
        ),
        True,
    ),
    # An empty term matches nothing; so does a required affinity without terms.
    (_affinity({}), False),
    (_affinity(), False),
    (_affinity({}, {"matchExpressions": [_expr("zone", "Exists")]}), True),
    # An unparsable requirement voids its term only.
    (_terms(_expr("cores", "Gt", "many")), False),
    (_terms(_expr("zone", "Near", "a")), False),
    (_terms(_expr("zone", "In")), False),
    (_terms(_expr("zone", "Exists", "a")), False),
    (
        _affinity(
            {"matchExpressions": [_expr("cores", "Gt", "x")]},
            {"matchExpressions": [_expr("zone", "Exists")]},
        ),
        True,
    ),
    # matchFields: metadata.name, In/NotIn with one value.
    (_affinity({"matchFields": [_expr("metadata.name", "In", "n1")]}), True),
    (_affinity({"matchFields": [_expr("metadata.name", "In", "n2")]}), False),
    (_affinity({"matchFields": [_expr("metadata.name", "NotIn", "n2")]}), True),
    (_affinity({"matchFields": [_expr("metadata.name", "In", "n1", "n2")]}), False),
    (_affinity({"matchFields": [_expr("metadata.uid", "In", "x")]}), False),
    (_affinity({"matchFields": [_expr("metadata.uid", "NotIn", "x")]}), True),
    (
        _affinity(
            {
                "matchExpressions": [_expr("zone", "In", "a")],
                "matchFields": [_expr("metadata.name", "In", "n2")],
            }
        ),
        False,
    ),
    # nodeSelector and affinity must both pass.
    ({"nodeSelector": {"zone": "b"}, **_terms(_expr("zone", "Exists"))}, False),
    # Shapes the API server would refuse match no node, and raise nothing.
    ({"nodeSelector": ["zone"]}, False),
    ({"affinity": {"nodeAffinity": "yes"}}, False),
    ({"tolerations": {"key": "x"}}, False),
    # Preferred affinity and pod affinity do not restrict.
    (
        {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "preference": {"matchExpressions": [_expr("x", "Exists")]}}
                    ]
                }
            }
        },
        True,
    ),
]


@pytest.mark.parametrize(("spec", "allowed"), AFFINITY_CASES)
def test_node_selector_and_required_affinity(spec, allowed):
    constraints = parse_node_constraints(spec)
    assert constraints.allows("n1", LABELS, ()) is allowed
    # The explanation's twin agrees: a reason exactly when the node is refused.
    assert (constraints.why_not("n1", LABELS, ()) == "") is allowed


NO_SCHEDULE = ("dedicated", "gpu", "NoSchedule")
NO_EXECUTE = ("dedicated", "gpu", "NoExecute")
PREFER = ("dedicated", "gpu", "PreferNoSchedule")

TAINT_CASES = [
    # (taints, tolerations, allowed)
    ([], [], True),
    ([NO_SCHEDULE], [], False),
    ([NO_EXECUTE], [], False),
    ([PREFER], [], True),  # only lowers the score
    ([NO_SCHEDULE], [{"key": "dedicated", "operator": "Equal", "value": "gpu"}], True),
    ([NO_SCHEDULE], [{"key": "dedicated", "value": "gpu"}], True),  # "" means Equal
    ([NO_SCHEDULE], [{"key": "dedicated", "operator": "Equal", "value": "cpu"}], False),
    ([NO_SCHEDULE], [{"key": "dedicated", "operator": "Exists"}], True),
    ([NO_SCHEDULE], [{"key": "other", "operator": "Exists"}], False),
    ([NO_SCHEDULE], [{"operator": "Exists"}], True),  # empty key + Exists: every taint
    ([NO_SCHEDULE, NO_EXECUTE], [{"operator": "Exists"}], True),
    ([NO_SCHEDULE], [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}], True),
    ([NO_SCHEDULE], [{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}], False),
    # Every blocking taint needs a toleration.
    (
        [NO_SCHEDULE, ("gpu-broken", "", "NoExecute")],
        [{"key": "dedicated", "operator": "Exists"}],
        False,
    ),
    (
        [NO_SCHEDULE, ("gpu-broken", "", "NoExecute")],
        [{"key": "dedicated", "operator": "Exists"}, {"key": "gpu-broken", "operator": "Exists"}],
        True,
    ),
    # Comparison operators are behind a feature gate that is off by default.
    ([("tier", "5", "NoSchedule")], [{"key": "tier", "operator": "Gt", "value": "3"}], False),
]


@pytest.mark.parametrize(("taints", "tolerations", "allowed"), TAINT_CASES)
def test_taints_and_tolerations(taints, tolerations, allowed):
    constraints = parse_node_constraints({"tolerations": tolerations})
    assert constraints.allows("n1", LABELS, taints) is allowed
    why = constraints.why_not("n1", LABELS, taints)
    assert (why == "") is allowed
    assert allowed or why.startswith("node had untolerated taint {")


WAITING_CASES = [
    # (spec, served schedulers, waiting)
    ({}, {"default-scheduler"}, True),
    ({"schedulerName": "default-scheduler"}, {"default-scheduler"}, True),
    ({"schedulerName": "fairshare-scheduler"}, {"default-scheduler"}, False),
    ({"schedulerName": "fairshare-scheduler"}, {"fairshare-scheduler"}, True),
    ({}, {"fairshare-scheduler"}, False),
    ({"schedulingGates": [{"name": "hold"}]}, {"default-scheduler"}, False),
    ({"schedulingGates": []}, {"default-scheduler"}, True),
]


@pytest.mark.parametrize(("spec", "served", "waiting"), WAITING_CASES)
def test_waiting(spec, served, waiting):
    assert eligibility.is_waiting(spec, served) is waiting


def test_served_schedulers_follow_the_config():
    assert eligibility.served_schedulers(None) == {"default-scheduler"}
    assert eligibility.served_schedulers("fairshare-scheduler") == {"fairshare-scheduler"}


def test_unconstrained_pods_share_one_object():
    assert parse_node_constraints({}) is eligibility.UNCONSTRAINED
    assert parse_node_constraints({"nodeSelector": {}}) is eligibility.UNCONSTRAINED
    assert parse_node_constraints(_affinity()) is eligibility.NOWHERE


# -- the state keeps what the predicate reads -------------------------------------------


def test_state_keeps_blocking_taints_and_caches_eligible_rows():
    tainted = node("t", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
    soft = node("s", taints=[{"key": "spot", "effect": "PreferNoSchedule"}])
    st = state_with(node("a"), tainted, soft)
    assert st.nodes[st.node_index["t"]].taints == (NO_SCHEDULE,)
    assert st.nodes[st.node_index["s"]].taints == ()
    plain = eligibility.UNCONSTRAINED
    assert st.eligible_rows(plain) == (st.node_index["a"], st.node_index["s"])
    tolerant = parse_node_constraints({"tolerations": [{"operator": "Exists"}]})
    assert st.eligible_rows(tolerant) is None  # every row
    cached = st.eligible_rows(plain)
    # A status update (same labels and taints) keeps the cache; a taint change does not.
    objects.apply_node(st, tainted, CONFIG)
    assert st.eligible_rows(plain) is cached
    objects.apply_node(st, node("t"), CONFIG)
    assert st.eligible_rows(plain) is None
    # Nor does a label change, for a pod that selects by labels.
    zone = parse_node_constraints({"nodeSelector": {"zone": "b"}})
    assert st.eligible_rows(zone) == ()
    relabelled = node("s")
    relabelled["metadata"]["labels"]["zone"] = "b"
    objects.apply_node(st, relabelled, CONFIG)
    assert st.eligible_rows(zone) == (st.node_index["s"],)


def test_slim_pod_keeps_what_the_predicate_reads():
    p = pod("p", phase="Pending")
    p["spec"].update(
        {
            "nodeSelector": {"zone": "a"},
            "tolerations": [{"operator": "Exists"}],
            "schedulingGates": [{"name": "hold"}],
            "schedulerName": "fairshare-scheduler",
            **_terms(_expr("zone", "In", "a")),
        }
    )
    p["spec"]["affinity"]["podAntiAffinity"] = {"x": 1}
    slim = objects.slim_pod(p)
    for config in (CONFIG, SCHEDULER_CONFIG):
        full = objects.pod_request(p, config=config, tenant="a", index=INDEX)
        again = objects.pod_request(slim, config=config, tenant="a", index=INDEX)
        assert (full.constraints, full.waiting) == (again.constraints, again.waiting)
    assert "podAntiAffinity" not in slim["spec"]["affinity"]


# -- the gate -------------------------------------------------------------------------------

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
)
SCHEDULER_CONFIG = CONFIG.model_copy(update={"scheduler_name": "fairshare-scheduler"})
INDEX = state_with(config=CONFIG).index


def _pending(name: str, ns: str, gpu: int, **spec: Any) -> dict[str, Any]:
    p = pod(name, ns=ns, gpu=gpu, phase="Pending")
    p["spec"].update(spec)
    return p


B_BLOCKED = {
    "node-selector": {"nodeSelector": {"zone": "nowhere"}},
    "affinity": _terms(_expr("zone", "In", "nowhere")),
    "taint": {},  # the only node with room is tainted, b does not tolerate it
    "scheduling-gate": {"schedulingGates": [{"name": "hold"}]},
    "other-scheduler": {"schedulerName": "someone-else"},
}


@pytest.mark.parametrize("why", list(B_BLOCKED))
def test_a_tenant_whose_pod_cannot_run_now_does_not_hold_others_back(why):
    """Two nodes of 4 GPUs; a holds n1's 4, b nothing; b's one pending pod wants 4 GPUs.
    The fair share of each is 1/2 (b's demand counts, waiting or not), so a's 5th GPU
    takes it above (5/8 = 0.62 > 0.50). If b's pod could run now (on n2), the gate holds
    a back; if it cannot (selector, affinity, taint, scheduling gate, another scheduler's
    pod), a's pod goes ahead: no capacity stays idle for a pod that is not waiting."""
    taints = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}] if why == "taint" else []
    st = state_with(node("n1"), node("n2", taints=taints), config=CONFIG)
    for k in range(4):
        objects.apply_pod(st, pod(f"a{k}", ns="a", gpu=1, node_name="n1"), CONFIG, "a")
    a_next = objects.pod_request(_pending("a4", "a", 1), config=CONFIG, tenant="a", index=st.index)
    # The same pod, able to run: for the taint case, one that tolerates it.
    ok_spec = (
        {"tolerations": [{"key": "dedicated", "operator": "Exists"}]} if why == "taint" else {}
    )
    b_ok = objects.pod_request(
        _pending("b0", "b", 4, **ok_spec), config=CONFIG, tenant="b", index=st.index
    )
    b_blocked = objects.pod_request(
        _pending("b0", "b", 4, **B_BLOCKED[why]), config=CONFIG, tenant="b", index=st.index
    )

    held = gate.check_fair_gate(st, config=CONFIG, req=a_next, pending=[b_ok, a_next])
    assert held is not None and not held.allowed
    assert "tenant a above its fair share (0.62 > 0.50)" in held.reason

    passed = gate.check_fair_gate(st, config=CONFIG, req=a_next, pending=[b_blocked, a_next])
    assert passed is not None and passed.allowed, passed


def test_constraints_are_hashable_and_compare_by_value():
    one = parse_node_constraints({"nodeSelector": {"zone": "a"}, **_terms(_expr("x", "In", "1"))})
    two = parse_node_constraints({"nodeSelector": {"zone": "a"}, **_terms(_expr("x", "In", "1"))})
    assert one == two and hash(one) == hash(two)
    assert isinstance(one, NodeConstraints)


def test_a_contender_whose_only_fitting_pod_is_deep_in_its_queue_counts_as_waiting():
    """b's queue holds 8 shapes that fit no node (5-12 GPUs on 4-GPU nodes) before one
    that fits n2 (4 GPUs). The gate used to probe only the first 8 shapes, so b looked
    idle and a went above its fair share; every shape is probed now, and a is held."""
    st = state_with(node("n1"), node("n2"), config=CONFIG)
    for k in range(4):
        objects.apply_pod(st, pod(f"a{k}", ns="a", gpu=1, node_name="n1"), CONFIG, "a")
    a_next = objects.pod_request(_pending("a4", "a", 1), config=CONFIG, tenant="a", index=st.index)
    b_queue = [
        objects.pod_request(_pending(f"b{g}", "b", g), config=CONFIG, tenant="b", index=st.index)
        for g in (*range(5, 13), 4)
    ]
    assert len({gate.shape_key(p) for p in b_queue}) == 9
    assert gate.has_fitting_pending(st, "b", b_queue)
    held = gate.check_fair_gate(st, config=CONFIG, req=a_next, pending=[*b_queue, a_next])
    assert held is not None and not held.allowed, held


def test_a_shape_that_does_not_fit_is_probed_once_per_state(monkeypatch):
    """b and c each queue pods of one shape that fits nowhere (5 GPUs), twice: within
    one gate decision the fit of that shape is computed once, then remembered until room
    is given back."""
    three = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"name": t, "namespaces": [t]} for t in ("a", "b", "c")],
        }
    )
    st = state_with(node("n1"), node("n2"), config=three)
    for k in range(4):
        objects.apply_pod(st, pod(f"a{k}", ns="a", gpu=1, node_name="n1"), three, "a")
    a_next = objects.pod_request(_pending("a4", "a", 1), config=three, tenant="a", index=st.index)
    queue = [
        objects.pod_request(_pending(f"{t}{k}", t, 5), config=three, tenant=t, index=st.index)
        for t in ("b", "c")
        for k in range(2)
    ]
    probed: list[gate.ShapeKey] = []
    real = gate.cluster.pod_fits_somewhere

    def counting(state, p):
        probed.append(gate.shape_key(p))
        return real(state, p)

    monkeypatch.setattr(gate.cluster, "pod_fits_somewhere", counting)
    passed = gate.check_fair_gate(st, config=three, req=a_next, pending=[*queue, a_next])
    assert passed is not None and passed.allowed, passed  # neither b nor c can run now
    assert probed == [gate.shape_key(queue[0])]
    # The next decision remembers it, on the same state and after a bind (which only
    # takes room); room given back (an unbind) makes it probe the shape again.
    gate.check_fair_gate(st, config=three, req=a_next, pending=[*queue, a_next])
    objects.apply_pod(st, pod("c9", ns="c", gpu=1, node_name="n2"), three, "c")
    gate.check_fair_gate(st, config=three, req=a_next, pending=[*queue, a_next])
    assert len(probed) == 1
    st.unbind("uid-c9")
    gate.check_fair_gate(st, config=three, req=a_next, pending=[*queue, a_next])
    assert len(probed) == 2
