"""Property: one tenant's pods that kube-scheduler can never place hold nobody's GPUs idle.

A small model of kube-scheduler drives the extender's real filter adapter
(``extender.app._filter``, through the cache a watch feeds): pods of random
tenants and sizes, some with a constraint only kube-scheduler checks (a required pod
affinity no pod satisfies: its plugins refuse every node, with v1.36's message), some
pinned to one node by a node selector (checked by both). Each *round* is one retry
interval: every pending pod is tried once, in creation order; kube-scheduler's own
plugins (pod affinity, node selector, GPUs free) pick the candidate nodes, fairshare's
filter decides among them, the pod binds to the first node left, and each rejection is
written back in the pod's ``PodScheduled`` condition as kube-scheduler writes it.

After at most ``ROUNDS`` rounds no GPU may stay idle while a pending pod could use it
(kube-scheduler could place it and some node has the GPUs free), unless the gate refused
that pod naming a tenant whose waiting pod kube-scheduler could place and that fits now.
Before fairshare read kube-scheduler's verdicts this failed at once: the tenant with
unplaceable pods was "waiting" forever and every other tenant above its fair share was
held while its GPUs stayed idle.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender import app as ext_app
from fairshare.config.loading import config_from_mapping
from fairshare.state import objects
from tests.unit.test_state_objects import node, pod

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUNDS = 6
TENANTS = ("a", "b", "c")
AFFINITY_REASON = "node(s) didn't match pod affinity rules"


@dataclass(frozen=True)
class Spec:
    tenant: str
    gpus: int
    unplaceable: bool
    """A required pod affinity nothing satisfies (kube-scheduler's InterPodAffinity)."""
    pinned: int | None
    """Node index of a nodeSelector on kubernetes.io/hostname, or None."""


specs = st.builds(
    Spec,
    tenant=st.sampled_from(TENANTS),
    gpus=st.integers(min_value=0, max_value=3),
    unplaceable=st.booleans(),
    pinned=st.one_of(st.none(), st.integers(min_value=0, max_value=2)),
)


def fit_error(n_nodes: int, reasons: list[str]) -> str:
    """``FitError.Error()`` of kube-scheduler v1.36: a sorted ``<count> <reason>``
    histogram, then the PostFilter messages (DRA's, then preemption's), as the local
    control plane writes them."""
    counts: dict[str, int] = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    hist = ", ".join(sorted(f"{v} {k}" for k, v in counts.items()))
    return (
        f"0/{n_nodes} nodes are available: {hist}. no new claims to deallocate, "
        f"preemption: 0/{n_nodes} nodes are "
        f"available: {n_nodes} Preemption is not helpful for scheduling."
    )


def with_verdict(obj: dict[str, Any], message: str) -> dict[str, Any]:
    out = json.loads(json.dumps(obj))
    out["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": message},
        ],
    }  # fmt: skip
    return out


class Model:
    """kube-scheduler's part: plugins, binding, conditions (see the module docstring)."""

    def __init__(self, gpus: list[int], weights: dict[str, int]) -> None:
        cfg = config_from_mapping(
            {
                "apiVersion": "fairshare.io/v1alpha1",
                "kind": "FairShareConfig",
                "tenants": [
                    {"name": t, "namespaces": [t], "weight": w} for t, w in weights.items()
                ],
            }
        )
        self.deps = ext_app.build_deps(config=lambda: cfg, ready=lambda: True)
        self.names = [f"n{k}" for k in range(len(gpus))]
        nodes = []
        for name, g in zip(self.names, gpus, strict=True):
            n = node(name, gpus=g)
            n["metadata"]["labels"]["kubernetes.io/hostname"] = name
            nodes.append(n)
        self.deps.sink.on_resync("Node", nodes)
        self.deps.sink.on_resync("Pod", [])
        self.pods: dict[str, dict[str, Any]] = {}
        self.specs: dict[str, Spec] = {}
        self.last_reason: dict[str, list[str]] = {}

    def create(self, k: int, spec: Spec) -> None:
        obj = pod(f"p{k}", ns=spec.tenant, gpu=spec.gpus or None, phase="Pending")
        obj["metadata"]["resourceVersion"] = "1"
        if spec.pinned is not None and spec.pinned < len(self.names):
            obj["spec"]["nodeSelector"] = {"kubernetes.io/hostname": self.names[spec.pinned]}
        uid = objects.pod_uid(obj)
        self.pods[uid], self.specs[uid] = obj, spec
        self.deps.sink.on_event("Pod", "ADDED", obj)

    def free(self, name: str) -> float:
        st_ = self.deps.cache.state
        i = st_.node_index[name]
        return st_.free[i * st_.n_res + st_.gpu_col] / 1000.0

    def plugins(self, uid: str) -> tuple[list[str], list[str]]:
        """(nodes kube-scheduler's plugins pass, the reasons of the others)."""
        spec, passing, reasons = self.specs[uid], [], []
        pinned = self.pods[uid]["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname")
        for name in self.names:
            if spec.unplaceable:
                reasons.append(AFFINITY_REASON)
            elif pinned is not None and name != pinned:
                reasons.append("node(s) didn't match Pod's node affinity/selector")
            elif self.free(name) < spec.gpus:
                reasons.append("Insufficient nvidia.com/gpu")
            else:
                passing.append(name)
        return passing, reasons

    def attempt(self, uid: str) -> None:
        obj = self.pods[uid]
        passing, reasons = self.plugins(uid)
        if passing:
            body = json.dumps({"Pod": obj, "NodeNames": passing}).encode()
            answer = asyncio.run(ext_app._filter(self.deps, body))
            chosen = list(answer.node_names or ())
            failed = dict(answer.failed_nodes or {})
            failed.update(answer.failed_and_unresolvable_nodes or {})
            if chosen:
                bound = json.loads(json.dumps(obj))
                bound["spec"]["nodeName"] = chosen[0]
                bound["status"] = {"phase": "Running"}
                del self.pods[uid]
                self.deps.sink.on_event("Pod", "MODIFIED", bound)
                return
            reasons += list(failed.values())
        self.last_reason[uid] = reasons
        updated = with_verdict(obj, fit_error(len(self.names), reasons))
        self.pods[uid] = updated
        self.deps.sink.on_event("Pod", "MODIFIED", updated)

    def round(self) -> None:
        for uid in sorted(self.pods, key=lambda u: int(u.removeprefix("uid-p"))):
            if uid in self.pods:
                self.attempt(uid)

    def could_run_now(self, uid: str) -> bool:
        """kube-scheduler's plugins pass some node for it (GPUs free there included)."""
        return bool(self.plugins(uid)[0])


@given(
    gpus=st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=3),  # 0: no GPU
    weights=st.fixed_dictionaries({t: st.integers(min_value=1, max_value=3) for t in TENANTS}),
    pods=st.lists(specs, min_size=1, max_size=18),
)
@SETTINGS
def test_no_gpu_idles_while_a_pod_could_use_it(gpus, weights, pods) -> None:
    model = Model(gpus, weights)
    for k, spec in enumerate(pods):
        model.create(k, spec)
    for _ in range(ROUNDS):
        model.round()
    for uid in list(model.pods):
        if not model.could_run_now(uid):
            continue
        # It could use idle GPUs: only the gate may keep it, for a tenant whose waiting
        # pod kube-scheduler could place now.
        reasons = model.last_reason.get(uid, [])
        gate = [r for r in reasons if "fair share" in r]
        assert gate, f"{uid} could run ({model.specs[uid]}) but was refused: {reasons}"
        waited_for = {r.rsplit(" while ", 1)[1].split(" ", 1)[0] for r in gate}
        assert any(
            model.specs[other].tenant in waited_for and model.could_run_now(other)
            for other in model.pods
            if other != uid
        ), f"{uid} held for {waited_for}, none of whose pods kube-scheduler could place"
