"""Preemption respects fair shares: a high-priority pod displaces its own tenant's
lower-priority pods first, and another tenant's only while that tenant is above its fair
share (never below its guarantee, never below its fair share while the preemptor's tenant
rises above its own); the policy is configurable (``preemption``), at every level of a
tenant tree."""

from __future__ import annotations

from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.state import objects
from tests.extender_side import Side
from tests.unit.test_state_objects import node, pod, state_with


def config(**preemption: str) -> FairShareConfig:
    body: dict[str, Any] = {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [
            {"name": "a", "namespaces": ["a"]},
            {"name": "b", "namespaces": ["b"]},
        ],
    }
    if preemption:
        body["preemption"] = preemption
    return config_from_mapping(body)


def prio_pod(
    name: str, ns: str, where: str | None, priority: int, created: str, gpu: int = 1
) -> dict[str, Any]:
    p = pod(name, ns=ns, gpu=gpu, node_name=where, phase="Running" if where else "Pending")
    p["spec"]["priority"] = priority
    p["metadata"]["creationTimestamp"] = created
    return p


def cluster(layout: dict[str, list[tuple[str, str]]], cfg: FairShareConfig):
    """Two 4-GPU nodes; ``layout`` node -> [(pod name, tenant)], every pod at priority 10."""
    st = state_with(node("n1", gpus=4), node("n2", gpus=4), config=cfg)
    pods: dict[str, dict[str, Any]] = {}
    for where, entries in layout.items():
        for k, (name, tenant) in enumerate(entries):
            p = prio_pod(name, tenant, where, 10, f"2026-12-06T10:00:0{k}Z")
            objects.apply_pod(st, p, cfg, tenant)
            pods[objects.pod_uid(p)] = objects.slim_pod(p)
    return st, pods


def preempt(
    st, pods, cfg, victims: dict[str, list[str]], *, tenant: str = "a", pending=(), gpu: int = 1
):
    preemptor = prio_pod("hi", tenant, None, 1000, "2026-12-06T11:00:00Z", gpu)
    args = wire.decode_preemption_args(
        {
            "Pod": preemptor,
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                n: {"Pods": [{"UID": f"uid-{u}"} for u in uids], "NumPDBViolations": 0}
                for n, uids in victims.items()
            },
        }
    )
    view = Snapshot.of(st, pending=list(pending))
    judged = verbs.preempt_answer(args, view, cfg, pods)
    out = judged.result.encode()
    notes = [judged.note] if judged.note else []
    got = {
        n: sorted(p["UID"].removeprefix("uid-") for p in v["Pods"])
        for n, v in out["NodeNameToMetaVictims"].items()
    }
    return got, notes


SEPARATE = {"n1": [(f"a{k}", "a") for k in range(4)], "n2": [(f"b{k}", "b") for k in range(4)]}
MIXED = {
    "n1": [("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b")],
    "n2": [("a2", "a"), ("a3", "a"), ("b2", "b"), ("b3", "b")],
}


def test_both_at_fair_share_the_preemptor_takes_its_own_pod() -> None:
    """kube-scheduler proposes one pod on each node; b's (at its fair share) is refused."""
    cfg = config()
    st, pods = cluster(SEPARATE, cfg)
    got, notes = preempt(st, pods, cfg, {"n1": ["a3"], "n2": ["b3"]})
    assert got == {"n1": ["a3"]}
    assert len(notes) == 1 and "tenant b is not above its fair share" in notes[0]


def test_on_a_mixed_node_the_own_tenants_pod_replaces_the_other_tenants() -> None:
    """kube-scheduler picked b's newest pod on each node; fairshare answers a's newest pod
    on that node instead (the same GPU), so b keeps its fair share."""
    cfg = config()
    st, pods = cluster(MIXED, cfg)
    got, _ = preempt(st, pods, cfg, {"n1": ["b1"], "n2": ["b3"]})
    assert got == {"n1": ["a1"], "n2": ["a3"]}


def test_a_tenant_above_its_fair_share_loses_pods_to_another() -> None:
    """b holds 6 of 8 GPUs and a asks for more than 2: b is above its fair share (4)."""
    cfg = config()
    layout = {"n1": [("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b")],
              "n2": [(f"b{k}", "b") for k in range(2, 6)]}  # fmt: skip
    st, pods = cluster(layout, cfg)
    pending = [verbs.request_for(prio_pod(f"w{k}", "a", None, 10, "x"), state=st, config=cfg,
                                 namespace_labels={}) for k in range(3)]  # fmt: skip
    got, notes = preempt(st, pods, cfg, {"n2": ["b5"]}, pending=pending)
    assert got == {"n2": ["b5"]} and notes == []


def test_never_below_the_victims_fair_share_while_the_preemptor_rises_above_its_own() -> None:
    """a holds 3, b 5 of 8 GPUs (fair shares 4 and 4). A 1-GPU pod of a may take one of
    b's (b stays at 4). A 2-GPU pod of a would lift a to 5, above its 4, so b may not go
    below 4: of b3 and b4 only one may go, which leaves no room on n2: n2 is dropped."""
    cfg = config()
    layout = {"n1": [("a0", "a"), ("a1", "a"), ("a2", "a"), ("b0", "b")],
              "n2": [(f"b{k}", "b") for k in range(1, 5)]}  # fmt: skip
    st, pods = cluster(layout, cfg)
    got, _ = preempt(st, pods, cfg, {"n2": ["b4"]})
    assert got == {"n2": ["b4"]}
    got, notes = preempt(st, pods, cfg, {"n2": ["b3", "b4"]}, gpu=2)
    assert got == {}
    assert any("tenant b would fall below its fair share" in n for n in notes)
    # The same two victims for a 1-GPU pod: a stays within its fair share, both may go.
    got, _ = preempt(st, pods, cfg, {"n2": ["b3", "b4"]})
    assert got == {"n2": ["b3", "b4"]}


@pytest.mark.parametrize(
    ("policy", "allowed"),
    [
        ({"otherTenants": "Any"}, {"n1": ["a3"], "n2": ["b3"]}),  # kube-scheduler's choice
        ({"otherTenants": "Never"}, {"n1": ["a3"]}),
        ({"withinTenant": "Never"}, {}),  # own pods refused, b at its fair share: nothing
        ({"withinTenant": "Never", "otherTenants": "Any"}, {"n2": ["b3"]}),
    ],
    ids=["any", "never-across", "never-within", "never-within-any-across"],
)
def test_the_policy_is_configurable(policy: dict[str, str], allowed) -> None:
    cfg = config(**policy)
    st, pods = cluster(SEPARATE, cfg)
    got, _ = preempt(st, pods, cfg, {"n1": ["a3"], "n2": ["b3"]})
    assert got == allowed


def test_in_a_tree_a_sibling_under_the_same_parent_is_judged_below_the_parent() -> None:
    """a1 and a2 share parent org (one level); b is the other top tenant. org's subtree
    holds 4, b 4 (both at the top fair share): taking a2's pod for a1 moves a GPU inside
    org and is judged only at the leaves, where a2 is above its fair share."""
    cfg = config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [
                {"name": "org"},
                {"name": "a1", "namespaces": ["a1"], "parent": "org"},
                {"name": "a2", "namespaces": ["a2"], "parent": "org"},
                {"name": "b", "namespaces": ["b"]},
            ],
        }
    )
    layout = {"n1": [("x0", "a2"), ("x1", "a2"), ("x2", "a2"), ("x3", "a2")],
              "n2": [(f"b{k}", "b") for k in range(4)]}  # fmt: skip
    st, pods = cluster(layout, cfg)
    got, notes = preempt(st, pods, cfg, {"n1": ["x3"], "n2": ["b3"]}, tenant="a1")
    assert got == {"n1": ["x3"]}
    assert any("tenant b is not above its fair share" in n for n in notes)


async def test_the_adapter_counts_a_preemptor_its_watch_has_not_brought_yet() -> None:
    """kube-scheduler calls preempt as soon as its own filter plugins find no room: the
    extender may not have the pod yet. Its demand must still make the other tenant's
    full cluster an above-fair-share holding (seen on the local control plane)."""
    import json

    from extender import app as ext_app

    cfg = config()
    deps = ext_app.build_deps(config=lambda: cfg, ready=lambda: True)
    tr = Side.of(deps)
    tr.on_resync("Node", [node("n1", gpus=4), node("n2", gpus=4)])
    held = [
        prio_pod(f"b{k}", "b", "n1" if k < 4 else "n2", 10, f"2026-12-06T10:00:0{k}Z")
        for k in range(8)
    ]
    tr.on_resync("Pod", held)
    preemptor = prio_pod("hi", "a", None, 1000, "2026-12-06T11:00:00Z")
    body = {
        "Pod": preemptor,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {"n2": {"Pods": [{"UID": "uid-b7"}], "NumPDBViolations": 0}},
    }
    out = await ext_app._preempt(deps, json.dumps(body).encode())
    assert {n: [p["UID"] for p in v["Pods"]] for n, v in out["NodeNameToMetaVictims"].items()} == {
        "n2": ["uid-b7"]
    }
