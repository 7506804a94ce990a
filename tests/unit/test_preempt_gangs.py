"""The preempt verb takes a running pod group whole or not at all.

kube-scheduler evicts the victims of the one node it picks, and only pods on that node:
a group with a member on another node is never offered; a group all on the node is
offered with every member; a group the rules would split (the group as a whole below its
tenant's guarantee) is spared whole. Each test also answers with the group label removed
(per pod, as before) to show that the per-pod answer would have split the group.
"""

from __future__ import annotations

from typing import Any

from extender import verbs
from fairshare import gangs
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.state import objects
from tests.unit.test_preempt_fair_share import preempt, prio_pod
from tests.unit.test_state_objects import node, state_with


def config(b_guaranteed: int = 0) -> FairShareConfig:
    b: dict[str, Any] = {"name": "b", "namespaces": ["b"]}
    if b_guaranteed:
        b["guaranteed"] = {"nvidia.com/gpu": str(b_guaranteed)}
    return config_from_mapping(
        {
            "apiVersion": "fairshare.io/v1alpha1",
            "kind": "FairShareConfig",
            "tenants": [{"name": "a", "namespaces": ["a"]}, b],
        }
    )


def cluster(layout: dict[str, list[str]], cfg: FairShareConfig, *, grouped: bool = True):
    """Two 4-GPU nodes full of tenant b's 1-GPU pods; pods named g* are the members of
    pod group b/job (when ``grouped``)."""
    st = state_with(node("n1", gpus=4), node("n2", gpus=4), config=cfg)
    pods: dict[str, dict[str, Any]] = {}
    for where, names in layout.items():
        for k, name in enumerate(names):
            p = prio_pod(name, "b", where, 10, f"2026-12-06T10:00:0{k}Z")
            if grouped and name.startswith("g"):
                p["metadata"].setdefault("labels", {})[gangs.POD_GROUP_LABEL] = "job"
            objects.apply_pod(st, p, cfg, "b")
            pods[objects.pod_uid(p)] = objects.slim_pod(p)
    return st, pods


def pending_of_a(st, cfg) -> list:
    """Three more pods of a waiting: a's demand (4 with the preemptor) makes its fair
    share 4 of 8, so b (holding 8) is above its own."""
    return [
        verbs.request_for(prio_pod(f"w{k}", "a", None, 10, "x"), state=st, config=cfg,
                          namespace_labels={})
        for k in range(3)
    ]  # fmt: skip


def answer(layout, cfg, victims, *, grouped: bool = True, gpu: int = 1):
    st, pods = cluster(layout, cfg, grouped=grouped)
    return preempt(st, pods, cfg, victims, pending=pending_of_a(st, cfg), gpu=gpu)


SPREAD = {"n1": ["g0", "g1", "b2", "b3"], "n2": ["g2", "b4", "b5", "b6"]}
TOGETHER = {"n1": ["g0", "g1", "g2", "b3"], "n2": ["b4", "b5", "b6", "b7"]}


def test_a_group_with_a_member_on_another_node_is_not_offered() -> None:
    cfg = config()
    per_pod, _ = answer(SPREAD, cfg, {"n1": ["g1"], "n2": ["b6"]}, grouped=False)
    assert per_pod == {"n1": ["g1"], "n2": ["b6"]}  # one member of three
    got, notes = answer(SPREAD, cfg, {"n1": ["g1"], "n2": ["b6"]})
    assert got == {"n2": ["b6"]}
    assert any("pod group b/job on n1: it also runs on n2" in n for n in notes)


def test_other_victims_of_the_node_still_go_without_the_group() -> None:
    # n1's victims are g1 and b3; the preemptor needs one GPU: b3 alone makes room.
    got, _ = answer(SPREAD, config(), {"n1": ["g1", "b3"]})
    assert got == {"n1": ["b3"]}


def test_a_group_all_on_the_node_is_offered_with_every_member() -> None:
    cfg = config()
    per_pod, _ = answer(TOGETHER, cfg, {"n1": ["g2"]}, grouped=False)
    assert per_pod == {"n1": ["g2"]}
    got, _ = answer(TOGETHER, cfg, {"n1": ["g2"]})
    assert got == {"n1": ["g0", "g1", "g2"]}


def test_the_groups_guarantee_is_protected_as_a_whole() -> None:
    # b is guaranteed 6 and holds 8: one member may go (7), the whole group may not (5).
    # So the group is spared whole; b3 makes the room instead.
    cfg = config(b_guaranteed=6)
    per_pod, _ = answer(TOGETHER, cfg, {"n1": ["g2", "b3"]}, grouped=False)
    assert per_pod == {"n1": ["b3", "g2"]}  # one member of three, b stays at 6
    got, notes = answer(TOGETHER, cfg, {"n1": ["g2", "b3"]})
    assert got == {"n1": ["b3"]}
    assert any("pod group b/job on n1: a member may not go" in n for n in notes)
    got, _ = answer(TOGETHER, cfg, {"n1": ["g2"]})
    assert got == {}


def test_pods_outside_groups_are_judged_as_before() -> None:
    cfg = config()
    layout = {"n1": ["b0", "b1", "b2", "b3"], "n2": ["b4", "b5", "b6", "b7"]}
    a, _ = answer(layout, cfg, {"n1": ["b3"], "n2": ["b6", "b7"]})
    b, _ = answer(layout, cfg, {"n1": ["b3"], "n2": ["b6", "b7"]}, grouped=False)
    assert a == b == {"n1": ["b3"], "n2": ["b6", "b7"]}
