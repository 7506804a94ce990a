"""Differential test: the extender's HTTP verbs against the simulator, on random clusters.

Hypothesis draws a cluster (1-8 nodes of three GPU models with 0-8 GPUs each, CPU and
memory of several sizes, zone labels, a ``dedicated`` NoSchedule taint, a GPU-unhealthy
condition), 2-4 tenants (weights, GPU guarantees, CPU/GPU limits, sometimes a tree of
tenants), one of four scoring configs and the fairness knobs (``yieldBand``,
``holdForBlockedTenants``), and a pod sequence: 1-4 waves of 1-10 arriving pods (CPU-only,
whole GPUs, ``fairshare.io/gpu-fraction`` shares, ``fairshare.io/gpu-memory`` requests,
``fairshare.io/gpu-models`` restrictions, a zone or GPU-product ``nodeSelector``, a
toleration of the taint; zero and inexact amounts such as ``3333m`` and ``1/3``), a node
sometimes joining before a wave, each wave followed by scheduling until a pass binds
nothing, by up to 3 running pods finishing and a pending pod sometimes deleted, then a
last round of scheduling.

Size: 300 examples per run (under ``CI`` the profile is derandomized: the same 300 every
run). In the CI profile that is about 3,300 pods (11 per example on average, 28 at most)
on about 1,150 nodes (and 100 joining), about 7,300 scheduling attempts compared, 1,870
of them binds and 250 fair-share gate refusals; 16-19 s for this file on 2 cores
(``CI=1 .venv/bin/python -m pytest tests/reliability/test_differential_extender.py``;
the counts are printed in the fuzz summary). A failure is shrunk by hypothesis to a
small cluster and sequence and printed with its reproduction blob; the cases found so far
are pinned below (``FOUND``).

What it can and cannot catch. Both drivers place a pod through one pipeline
(``fairshare.pipeline``): fit, the fair-share gate, score and node choice, device choice
and plan are the same functions on both sides, over the same core (the fair and dominant
shares of ``fairshare.fairness``, ``fairshare.placement``'s filter, scorer and devices).
So the decisions cannot differ by construction, and comparing them checks the glue only.
A wrong rule inside the pipeline or the core (a fair share computed wrongly, a gate that
holds the wrong tenant, a score that fragments GPUs, a device or shared GPU chosen
wrongly) is made identically on both sides and passes here: the property tests of the
core (``test_properties_fairness``, ``test_properties_hierarchy``,
``test_properties_ledgers``), the unit tests of the stages (``tests/unit/test_pipeline.py``)
and the e2e tests judge those rules against what they should be. What this test still
catches is everything around the pipeline, where the two drivers differ: what each feeds
it (the extender's parsing of pods, nodes and namespaces as the informers deliver them,
its cache's bookkeeping: pending queue and order, usage, the ledger re-read from the
Binding's annotations, finished and deleted pods; its caches of fair shares and the
workload mix), how each splits the chain (the extender across kube-scheduler's filter,
prioritize and bind, the bind fitting and gating again on the node it is given; the
simulator in one call), the extender's one-pass kernel path for filter and prioritize
(``fit_rows``, ``Scorer.extender``) against the stages the simulator runs, the JSON of
kube-scheduler's extender protocol (filter, prioritize, bind, ``FailedNodes`` reasons,
the 0..10 score scale) and the simulator's own loop.

The same cluster and sequence go through two drivers:

* **extender**: the real aiohttp app (``extender.app.make_app``) behind an
  in-process HTTP server, fed through its tracker as the informers feed it (``on_resync``
  of namespaces and nodes, pod events: ``ADDED`` on creation, ``MODIFIED`` once bound and
  once finished, phase ``Succeeded``), called with kube-scheduler's extender v1
  JSON: ``/filter`` with ``NodeNames`` (the scheduler config is ``nodeCacheCapable``),
  ``/prioritize`` with the nodes filter passed, ``/bind``. The binder is replaced (as in
  ``tests/unit/test_extender_app.py``): it records the Binding plan and makes no API
  call; the bound pod then comes back as the watch would send it (``nodeName`` and the
  Binding's annotations), so the ledger is re-read from the annotations.
* **simulator**: ``fairshare.simulator.engine.Simulation`` (policy ``ours``): ``submit``,
  ``try_place`` pods in creation order until a pass places nothing (the runner's
  ``_settle``), ``complete``.

kube-scheduler is modelled as this test's own reading of NodeAffinity (the zone
``nodeSelector``) and TaintToleration (the ``dedicated`` taint): ``NodeNames`` carries
every node those admit. Its NodeResourcesFit is left out (the extender's filter judges
resources itself; sending it more nodes tests more).

What is compared. Before every pass: the pending queue (pods and order), each pending
pod's demand row and every tenant's fair share (float for float). Per scheduling attempt
(pods tried in creation order, one pass after another, as the simulator does):

1. **filter**: the set of ``NodeNames`` the extender passes equals the nodes the
   simulator's filter (``placement.filter_nodes`` on its state) fits among those
   kube-scheduler sends, when the simulator's gate lets the pod through. When the
   simulator holds the pod back at the gate (``last_reason``), the extender passes no
   node and names that same reason in ``FailedNodes`` for every fitting node.
2. **the choice**: kube-scheduler takes the highest ``/prioritize`` score and breaks
   ties at random, and the extender's scores are 0..10 integers, while the simulator
   (and the extender's own choice, ``--pick-in-filter``) ranks nodes by their [0, 1]
   score rounded to ``placement.CHOICE_LEVELS`` levels (exact for whole-GPU pods when no
   task class is model-restricted) with ties to a fixed hash order of names. So:
   (a) with ``--pick-in-filter`` the extender answers exactly the simulator's node;
   (b) the simulator's node has the highest prioritize score when the levels are exact
   (it is among kube-scheduler's tied candidates), else a score at most one below the
   highest (30 levels of the [0, 1] score are finer than prioritize's 11).
3. **bind** to that node: no ``Error``; the GPU devices (and shares) the extender's bind
   takes are the devices the simulator takes; afterwards the per-tenant usage, every
   node's free vector and every device's free share are equal in the two states
   (float for float: the same rows added in the same order).

Legitimate differences, by design, and what the test does about them:

* Admission: the simulator refuses a pod over its tenant's ``limit`` at ``submit`` (the
  webhook's job in a cluster). Such a pod is never created, so the extender never sees it.
* The workload mix FGD scores against: the simulator takes the trace's, the extender
  estimates it from the pods it has seen, rebuilt lazily. Before each pass the simulator
  is handed the extender's current mix, so both score against the same target.
* Ties: kube-scheduler's random choice among equal prioritize scores is not compared with
  one node (2b gives the set); the simulator's tie order is set to the extender's
  (``placement.node_rank`` of each name, the simulator's ``tie_rank``).
* GPU health: the simulator takes it as ``state.set_health`` (as its runner does for
  ``unhealthy`` nodes), the extender from the node condition; only the names compared.
* Nodes joining: the simulator's runner adds a trace's nodes before its pods, and
  ``Simulation.request_for`` counts a pending GPU-memory pod against the largest device
  it sees then; the extender re-counts pending pods when the largest device changes. So
  a node that joins mid-sequence brings no larger GPU than the cluster has (a pending
  pod's demand row is compared before every pass: a larger one fails that check).
* MIG: the simulator's ``add_node`` takes allocatable, labels and taints, not MIG slices
  (its traces have none), so no MIG nodes are drawn.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender import app as ext_app
from extender import verbs
from fairshare import quantities
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.placement import PodRequest, choice_levels, filter_nodes, node_rank
from fairshare.simulator.engine import Simulation
from tests.extender_side import Side
from tests.reliability.conftest import FUZZ_CASES, FUZZ_NOTES

# -- the cluster ------------------------------------------------------------------------

MODELS = {  # GPU feature discovery's product label -> its nvidia.com/gpu.memory (MiB)
    "NVIDIA-A100-SXM4-80GB": 81920,
    "NVIDIA-L4": 23034,
    "Tesla-T4": 15360,
}
ZONES = ("east", "west")
TAINT = {"key": "dedicated", "value": "batch", "effect": "NoSchedule"}
UNHEALTHY = {"type": "XidCriticalError", "status": "True", "reason": "Xid79"}
ANN_FRACTION = "fairshare.io/gpu-fraction"
ANN_MEMORY = "fairshare.io/gpu-memory"
ANN_MODELS = "fairshare.io/gpu-models"


@st.composite
def nodes(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 8))
    # Names in no sorted order, so neither side can lean on name order for ties.
    names = draw(st.permutations([f"node-{c}" for c in "qwertyuiop"[:count]]))
    return [draw(node_of(name)) for name in names]


@st.composite
def node_of(draw: st.DrawFn, name: str, largest: int | None = None) -> dict[str, Any]:
    """A node; ``largest``: of a GPU model with at most this much device memory (MiB),
    and without GPUs when that is 0."""
    fits = sorted(m for m, mib in MODELS.items() if largest is None or mib <= largest)
    model = draw(st.sampled_from(fits or sorted(MODELS)))
    gpus = draw(st.sampled_from([0, 1, 2, 4, 4, 8])) if fits else 0
    labels = {"topology.kubernetes.io/zone": draw(st.sampled_from(ZONES))}
    if gpus:
        labels["nvidia.com/gpu.product"] = model
        labels["nvidia.com/gpu.memory"] = str(MODELS[model])
        labels["nvidia.com/gpu.count"] = str(gpus)
    node: dict[str, Any] = {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "allocatable": {
                "cpu": draw(st.sampled_from(["4", "16", "64", "7500m"])),
                "memory": draw(st.sampled_from(["16Gi", "64Gi", "256Gi"])),
                "nvidia.com/gpu": str(gpus),
                "pods": "110",
            },
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    if draw(st.integers(0, 5)) == 0:
        node["spec"]["taints"] = [dict(TAINT)]
    if gpus and draw(st.integers(0, 7)) == 0:
        node["status"]["conditions"].append(dict(UNHEALTHY))
    return node


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(2, 4))
    tenants: list[dict[str, Any]] = []
    tree = n >= 3 and draw(st.booleans())
    if tree:  # an organisation over the first two teams, the others top-level
        tenants.append({"name": "org", "weight": draw(st.sampled_from([1, 2]))})
    for k in range(n):
        t: dict[str, Any] = {
            "name": f"t{k}",
            "namespaces": [f"t{k}"],
            "weight": draw(st.sampled_from([1, 1, 2, 3, 0.5])),
        }
        if tree and k < 2:
            t["parent"] = "org"
        # (A guarantee must fit the limit and a child's its parent's: none in the tree.)
        if not t.get("parent") and draw(st.integers(0, 3)) == 0:
            t["guaranteed"] = {"nvidia.com/gpu": draw(st.sampled_from(["1", "0.5", "2"]))}
        if draw(st.integers(0, 4)) == 0:
            resource = (
                "cpu" if "guaranteed" in t else draw(st.sampled_from(["nvidia.com/gpu", "cpu"]))
            )
            t["limit"] = {resource: draw(st.sampled_from(["0", "1", "2.5", "4"]))}
        tenants.append(t)
    scoring = draw(
        st.sampled_from(
            [
                {},  # the defaults: fragmentation 1, packing 0.02, health 1
                {"fragmentation": 0, "packing": 1, "fit": 1},
                {"spread": 1, "fairness": 1, "stranding": 1},
                {"fragmentation": 1, "fit": 0.5, "stranding": 0.5, "packing": 0},
            ]
        )
    )
    return {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": tenants,
        "scoring": scoring,
        "yieldBand": draw(st.sampled_from([0.0, 0.0, 0.2, 1.0])),
        "holdForBlockedTenants": draw(st.booleans()),
    }


@st.composite
def pod_spec(draw: st.DrawFn, tenants: Sequence[str]) -> dict[str, Any]:
    """A pod without identity (the sequence numbers them)."""
    kind = draw(st.sampled_from(["cpu", "whole", "whole", "fraction", "fraction", "memory"]))
    requests: dict[str, str] = {
        "cpu": draw(st.sampled_from(["0", "500m", "1", "2", "4", "3333m"])),
        "memory": draw(st.sampled_from(["0", "1Gi", "4Gi", "16Gi"])),
    }
    limits: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if kind == "whole":
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = draw(
            st.sampled_from(["1", "1", "2", "4"])
        )
    elif kind == "fraction":
        annotations[ANN_FRACTION] = draw(st.sampled_from(["0.25", "0.5", "0.3", "0.75", "1/3"]))
    elif kind == "memory":
        annotations[ANN_MEMORY] = draw(st.sampled_from(["4Gi", "10Gi", "20Gi"]))
    if kind != "cpu" and draw(st.integers(0, 4)) == 0:
        picked = draw(st.sets(st.sampled_from(sorted(MODELS)), min_size=1, max_size=2))
        annotations[ANN_MODELS] = ",".join(sorted(picked))
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"requests": requests, "limits": limits}}],
    }
    selector = draw(st.sampled_from(["", "", "", "", "zone", "product"]))
    if selector == "zone":
        spec["nodeSelector"] = {"topology.kubernetes.io/zone": draw(st.sampled_from(ZONES))}
    elif selector == "product":  # pins the GPU model as the annotation would
        spec["nodeSelector"] = {"nvidia.com/gpu.product": draw(st.sampled_from(sorted(MODELS)))}
    if draw(st.integers(0, 3)) == 0:
        spec["tolerations"] = [
            draw(
                st.sampled_from(
                    [
                        {"key": "dedicated", "operator": "Equal", "value": "batch"},
                        {"operator": "Exists"},
                        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},
                    ]
                )
            )
        ]
    return {
        "kind": "Pod",
        "metadata": {
            "namespace": draw(st.sampled_from(list(tenants))),
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


@dataclass
class Wave:
    """Nodes that join, pods that arrive; scheduling; then pods that finish (indexes into
    the running pods in creation order, modulo their number) and pending pods deleted
    (the same, into the pending pods)."""

    arrivals: list[dict[str, Any]]
    finish: list[int] = field(default_factory=list)
    delete: list[int] = field(default_factory=list)
    joins: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Case:
    config: dict[str, Any]
    nodes: list[dict[str, Any]]
    waves: list[Wave]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    config = draw(configs())
    cluster = draw(nodes())
    leaves = [t["name"] for t in config["tenants"] if t.get("namespaces")]
    waves: list[Wave] = []
    serial = 0
    for _ in range(draw(st.integers(1, 4))):
        pods = draw(st.lists(pod_spec(leaves), min_size=1, max_size=10))
        for p in pods:
            p["metadata"]["name"] = f"pod-{serial}"
            p["metadata"]["uid"] = f"uid-{serial:03d}"
            p["metadata"]["resourceVersion"] = str(100 + serial)
            serial += 1
        finish = draw(st.lists(st.integers(0, 50), max_size=3))
        delete = draw(st.lists(st.integers(0, 50), max_size=1))
        joins = []
        if waves and draw(st.integers(0, 4)) == 0:
            name = f"node-{'asdfghjkl'[len(waves)]}"
            joins.append(draw(node_of(name, largest=max(map(_device_mib, cluster)))))
        waves.append(Wave(pods, finish, delete, joins))
    return Case(config, cluster, waves)


def _device_mib(node: Mapping[str, Any]) -> int:
    return int(node["metadata"]["labels"].get("nvidia.com/gpu.memory", 0))


# -- kube-scheduler's own filters (this test's reading, for the subset drawn) -------------


def scheduler_admits(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """NodeAffinity (``nodeSelector``: every key with that value) and TaintToleration
    (a NoSchedule taint needs a toleration with a matching key, or an empty key and
    ``Exists``; an empty effect matches every effect) for the shapes drawn above."""
    labels = node["metadata"]["labels"]
    for key, value in (pod["spec"].get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    for taint in node["spec"].get("taints") or ():
        if taint["effect"] not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in pod["spec"].get("tolerations") or ()):
            return False
    return True


def _tolerates(tol: Mapping[str, str], taint: Mapping[str, str]) -> bool:
    if tol.get("effect") and tol["effect"] != taint["effect"]:
        return False
    if tol.get("operator") == "Exists":
        return not tol.get("key") or tol["key"] == taint["key"]
    return tol.get("key") == taint["key"] and tol.get("value", "") == taint.get("value", "")


# -- the drivers ---------------------------------------------------------------------------


@dataclass
class Run:
    config: FairShareConfig
    nodes: list[dict[str, Any]]
    client: TestClient[Any, Any]
    deps: ext_app.ExtenderDeps
    sim: Simulation
    plans: dict[str, verbs.BindPlan] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    attempts: int = 0
    seen: Counter[str] = field(default_factory=Counter)
    """What the comparisons covered (printed in the fuzz summary)."""

    @property
    def names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.nodes]

    async def post(self, path: str, body: Mapping[str, Any]) -> Any:
        r = await self.client.post(path, json=body)
        assert r.status == 200, (path, r.status, await r.text())
        return await r.json()

    # -- inputs to both sides --------------------------------------------------------

    def arrive(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        self.seen["pods"] += 1
        out = self.sim.submit(self.sim.request_for(pod, uid=uid))
        if out.status == "rejected":  # the webhook would refuse it: never created
            self.log.append(f"{uid} refused at admission: {out.reason}")
            self.seen["refused at admission"] += 1
            return
        self.pods[uid] = pod
        self.deps.sink.on_event("Pod", "ADDED", copy.deepcopy(pod))

    def finish(self, picks: Sequence[int]) -> None:
        for k in picks:
            running = sorted(self.sim.state.pods)
            if not running:
                return
            uid = running[k % len(running)]
            self.sim.complete(uid)
            done = copy.deepcopy(self.pods.pop(uid))
            done["status"]["phase"] = "Succeeded"
            self.deps.sink.on_event("Pod", "MODIFIED", done)
            self.log.append(f"{uid} finished")
            self.seen["finished"] += 1
        self.compare_states("after pods finished")

    def delete_pending(self, picks: Sequence[int]) -> None:
        for k in picks:
            pending = list(self.sim.pending)
            if not pending:
                return
            uid = pending[k % len(pending)]
            self.sim.fail(uid)  # the simulator's way to drop a pending pod
            self.deps.sink.on_event("Pod", "DELETED", copy.deepcopy(self.pods.pop(uid)))
            self.log.append(f"{uid} deleted while pending")
            self.seen["deleted while pending"] += 1

    def join(self, node: dict[str, Any]) -> None:
        add_sim_node(self.sim, node)
        self.nodes.append(node)
        self.deps.sink.on_event("Node", "ADDED", copy.deepcopy(node))
        self.log.append(f"{node['metadata']['name']} joined")
        self.seen["node joined"] += 1
        self.compare_states("after a node joined")

    # -- one scheduling attempt ----------------------------------------------------------

    async def attempt(self, uid: str) -> bool:
        """Try one pending pod on both sides; True if it was bound."""
        self.attempts += 1
        sim, pod = self.sim, self.pods[uid]
        req: PodRequest = sim.pods[uid]
        sent = [n["metadata"]["name"] for n in self.nodes if scheduler_admits(pod, n)]
        # The simulator's filter over the nodes kube-scheduler would send (before its
        # state changes): the call ``try_place`` makes.
        fits = filter_nodes(sim.state, req, explain=False).fits
        sim_fits = {sim.state.nodes[i].name for i in fits} & set(sent)
        ctx = f"pod {uid} ({_shape(pod)}), NodeNames {sent}"
        if not sent:
            # kube-scheduler finds no node itself and never calls the extender.
            assert sim.try_place(uid).status == "pending", ctx
            self.seen["no node admitted by kube-scheduler"] += 1
            return False
        args = {"Pod": pod, "Nodes": None, "NodeNames": sent}
        filtered = await self.post("/filter", args)
        passing = filtered["NodeNames"] or []
        failed: dict[str, str] = filtered["FailedNodes"] or {}
        out = sim.try_place(uid)
        if out.status != "running":
            reason = sim.last_reason.get(uid, "")
            assert passing == [], f"{ctx}: simulator holds it ({reason}), extender passes {passing}"
            if sim_fits and reason != "no node fits":
                gated = {n: failed.get(n) for n in sim_fits}
                assert gated == dict.fromkeys(sim_fits, reason), (
                    f"{ctx}: simulator gates with {reason!r}; extender FailedNodes {failed}"
                )
            self.log.append(f"{uid} waits: {reason}")
            self.seen["held: " + ("no fit" if reason == "no node fits" else "gate")] += 1
            return False
        chosen = out.node
        assert set(passing) == sim_fits, (
            f"{ctx}: extender filter passes {sorted(passing)}, simulator fits "
            f"{sorted(sim_fits)} (FailedNodes {failed}, "
            f"unresolvable {filtered['FailedAndUnresolvableNodes']})"
        )
        assert chosen in sim_fits, f"{ctx}: simulator chose {chosen}, outside {sorted(sim_fits)}"
        await self.check_choice(ctx, pod, req, sent, passing, chosen)
        bind = {"PodName": req.name, "PodNamespace": req.namespace, "PodUID": uid, "Node": chosen}
        result = await self.post("/bind", bind)
        assert result == {"Error": ""}, f"{ctx}: bind to {chosen} refused: {result}"
        plan = self.plans[uid]
        assert plan.node == chosen
        sim_devices = sim.state.pods[uid].devices
        assert tuple(plan.devices) == tuple(sim_devices), (
            f"{ctx} on {chosen}: extender took devices {plan.devices}, simulator {sim_devices}"
        )
        # The watch then reports the pod bound, with the Binding's annotations: the
        # extender re-reads its devices from them.
        bound = copy.deepcopy(pod)
        bound["spec"]["nodeName"] = chosen
        bound["metadata"]["annotations"].update(plan.annotations)
        bound["metadata"]["resourceVersion"] += "b"
        self.pods[uid] = bound
        self.deps.sink.on_event("Pod", "MODIFIED", copy.deepcopy(bound))
        self.compare_states(f"after binding {uid} to {chosen}")
        self.log.append(f"{uid} -> {chosen} {tuple(plan.devices)}")
        self.seen["bound"] += 1
        self.seen["bound: " + req.demand.gpu.source] += 1
        if plan.group:
            self.seen["bound: shared GPU"] += 1
        if len(sent) < len(self.nodes):
            self.seen["bound: node constraints"] += 1
        return True

    async def check_choice(
        self,
        ctx: str,
        pod: Mapping[str, Any],
        req: PodRequest,
        sent: list[str],
        passing: list[str],
        chosen: str,
    ) -> None:
        """2a and 2b of the module docstring."""
        args = {"Pod": pod, "Nodes": None, "NodeNames": sent}
        self.deps.pick_in_filter = True
        try:
            picked = (await self.post("/filter", args))["NodeNames"]
        finally:
            self.deps.pick_in_filter = False
        assert picked == [chosen], f"{ctx}: --pick-in-filter answers {picked}, simulator {chosen}"
        if len(passing) < 2:
            self.seen["choice: one feasible node"] += 1
            return  # kube-scheduler does not call prioritize with one feasible node
        prio = await self.post("/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passing})
        scores = {h["Host"]: h["Score"] for h in prio}
        assert sorted(scores) == sorted(passing), f"{ctx}: prioritize answered {prio}"
        assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values()), prio
        top = max(scores.values())
        exact = choice_levels(req, self.deps.cache.mix()) is None
        slack = 0 if exact else 1
        self.seen["choice: prioritize, " + ("exact" if exact else "rounded") + " levels"] += 1
        if exact and scores[chosen] == top and sum(v == top for v in scores.values()) > 1:
            self.seen["choice: kube-scheduler tie"] += 1
        assert scores[chosen] >= top - slack, (
            f"{ctx}: simulator chose {chosen} (prioritize {scores[chosen]}), kube-scheduler "
            f"would take one of {sorted(h for h, s in scores.items() if s == top)} ({top}); "
            f"levels {'exact' if exact else 'rounded'}"
        )

    # -- the pass loop -----------------------------------------------------------------

    async def settle(self) -> None:
        """Passes over the pending pods in creation order until one binds nothing."""
        while True:
            tracker, sim = Side.of(self.deps), self.sim
            assert list(tracker.pending) == list(sim.pending), (
                f"pending queues differ: extender {list(tracker.pending)}, "
                f"simulator {list(sim.pending)}"
            )
            for uid, req in tracker.pending.items():  # the demand the fair shares count
                assert req.row == sim.pods[uid].row, (
                    f"pending {uid}: extender counts {req.row}, simulator {sim.pods[uid].row}"
                )
            ext_fair = {t: f.share for t, f in tracker.fair_shares(self.config).items()}
            sim_fair = {t: f.share for t, f in sim.fair_shares().items()}
            assert ext_fair == sim_fair, (
                f"fair shares differ: extender {ext_fair}, simulator {sim_fair}"
            )
            mix = tracker.mix()
            if sim.mix is not mix:
                sim.mix = mix
                sim._ctx = None  # the simulator caches its score context per mix
            placed = False
            for uid in list(sim.pending):
                placed |= await self.attempt(uid)
            if not placed:
                return

    def compare_states(self, when: str) -> None:
        ext, sim = self.deps.cache.state, self.sim.state
        tenants = sorted(set(ext.tenant_usage) | set(sim.tenant_usage))
        for t in tenants:
            assert ext.usage_of(t) == sim.usage_of(t), (
                f"{when}: usage of {t}: extender {ext.index.amounts(ext.usage_of(t))}, "
                f"simulator {sim.index.amounts(sim.usage_of(t))}"
            )
        assert sorted(ext.pods) == sorted(sim.pods), when
        for name in self.names:
            i, j = ext.node_index[name], sim.node_index[name]
            r = ext.n_res
            assert list(ext.free[i * r : (i + 1) * r]) == list(sim.free[j * r : (j + 1) * r]), (
                f"{when}: free on {name} differs"
            )
            assert ext.node_devices(i) == sim.node_devices(j), (
                f"{when}: devices of {name}: extender {ext.node_devices(i)}, "
                f"simulator {sim.node_devices(j)}"
            )


def _shape(pod: Mapping[str, Any]) -> str:
    reqs = pod["spec"]["containers"][0]["resources"]["requests"]
    ann = {k.split("/")[1]: v for k, v in pod["metadata"]["annotations"].items()}
    extra = {k: v for k, v in pod["spec"].items() if k in ("nodeSelector", "tolerations")}
    return f"{pod['metadata']['namespace']} {reqs} {ann} {extra}".strip()


def simulation(config: FairShareConfig, node_objs: Sequence[Mapping[str, Any]]) -> Simulation:
    sim = Simulation(config)
    for n in node_objs:
        add_sim_node(sim, n)
    return sim


def add_sim_node(sim: Simulation, node: Mapping[str, Any]) -> None:
    """A Node object into the simulation, as its runner adds a scenario's nodes."""
    alloc = {
        k: quantities.parse_quantity(v)
        for k, v in node["status"]["allocatable"].items()
        if k != "pods"
    }
    name = node["metadata"]["name"]
    taints = [(t["key"], t["value"], t["effect"]) for t in node["spec"].get("taints", ())]
    sim.add_node(name, alloc, dict(node["metadata"]["labels"]), taints=taints)
    if any(c["type"] == UNHEALTHY["type"] for c in node["status"]["conditions"]):
        sim.state.set_health(name, False, "Xid79")
    sim.tie_rank = [node_rank(info.name) for info in sim.state.nodes]


async def drive(case: Case) -> Run:
    config = config_from_mapping(case.config)
    plans: dict[str, verbs.BindPlan] = {}

    async def binder(plan: verbs.BindPlan) -> None:  # no API call: record the Binding
        plans[plan.uid] = plan

    deps = ext_app.build_deps(config=lambda: config, ready=lambda: True, binder=binder)
    namespaces = [ns for t in case.config["tenants"] for ns in t.get("namespaces", ())]
    deps.sink.on_resync("Namespace", [{"metadata": {"name": ns}} for ns in namespaces])
    deps.sink.on_resync("Node", copy.deepcopy(case.nodes))
    deps.sink.on_resync("Pod", [])
    async with TestClient(TestServer(ext_app.make_app(deps))) as client:
        nodes = list(case.nodes)
        run = Run(config, nodes, client, deps, simulation(config, nodes), plans)
        run.compare_states("at start")
        for wave in case.waves:
            for node in wave.joins:
                run.join(node)
            for pod in wave.arrivals:
                run.arrive(pod)
            await run.settle()
            run.finish(wave.finish)
            run.delete_pending(wave.delete)
        await run.settle()
    return run


# -- what it found, pinned ---------------------------------------------------------------


def _node(name: str, gpus: int, model: str = "NVIDIA-A100-SXM4-80GB", **kw: Any) -> dict[str, Any]:
    labels = {"topology.kubernetes.io/zone": "east"}
    if gpus:
        labels |= {"nvidia.com/gpu.product": model, "nvidia.com/gpu.memory": str(MODELS[model])}
    node: dict[str, Any] = {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [dict(TAINT)]} if kw.get("tainted") else {},
        "status": {
            "allocatable": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    return node


def _pod(serial: int, ns: str, annotations: dict[str, str], gpu: str = "") -> dict[str, Any]:
    requests = {"cpu": "1", "memory": "1Gi"} | ({"nvidia.com/gpu": gpu} if gpu else {})
    limits = {"nvidia.com/gpu": gpu} if gpu else {}
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"pod-{serial}",
            "namespace": ns,
            "uid": f"uid-{serial:03d}",
            "resourceVersion": str(100 + serial),
            "annotations": annotations,
        },
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": requests, "limits": limits}}]
        },
        "status": {"phase": "Pending"},
    }


def _config(limit_t1: dict[str, str] | None = None, **scoring: float) -> dict[str, Any]:
    t1: dict[str, Any] = {"name": "t1", "namespaces": ["t1"]}
    if limit_t1 is not None:
        t1["limit"] = limit_t1
    return {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "t0", "namespaces": ["t0"]}, t1],
        "scoring": scoring,
    }


FOUND = {
    # The simulator ignored taints and node selectors: it bound a pod without a
    # toleration to the only (tainted) node, where kube-scheduler sends no node at all.
    "taint": Case(_config(), [_node("node-q", 0, tainted=True)], [Wave([_pod(0, "t0", {})])]),
    # The simulator accounted a GPU-memory pod at its share of the largest device in the
    # cluster (4Gi of 80Gi: 0.05 GPU) on an L4 where its device holds 4Gi of 22.5Gi
    # (0.178 GPU): the tenant's usage and the node's GPU column fell behind the device.
    "gpu-memory": Case(
        _config(),
        [_node("node-w", 1, "NVIDIA-L4"), _node("node-r", 1)],
        [Wave([_pod(0, "t0", {ANN_MEMORY: "4Gi", ANN_MODELS: "NVIDIA-L4"})])],
    ),
    # With the fragmentation term weighted 0 the simulator gave a shared-GPU pod the
    # fullest device that holds it, the extender's bind FGD's device.
    "device-hint": Case(
        _config(fragmentation=0, packing=1, fit=1),
        [_node("node-q", 2)],
        [Wave([_pod(0, "t0", {ANN_FRACTION: "0.5"}), _pod(1, "t1", {ANN_FRACTION: "0.25"})])],
    ),
    # The simulator kept its cached fair allocation when a node joined (add_node reset
    # the score context only), until the next pod it admitted: with the wave's only pod
    # refused at admission, t0's fair share stayed that of the smaller cluster.
    "node-joins": Case(
        _config(limit_t1={"cpu": "0"}),
        [_node("node-q", 0)],
        [Wave([_pod(0, "t0", {})]), Wave([_pod(1, "t1", {})], joins=[_node("node-s", 0)])],
    ),
}


OUTCOMES = {  # what each pinned case must get to (so it compares what it was found on)
    "taint": {"no node admitted by kube-scheduler": 2},  # two passes: the wave's, the last
    "gpu-memory": {"bound": 1, "bound: memory": 1, "choice: one feasible node": 1},
    "device-hint": {"bound": 2, "bound: fraction": 2, "bound: shared GPU": 2},
    "node-joins": {"bound": 1, "node joined": 1, "refused at admission": 1},
}


@pytest.mark.parametrize("name", list(FOUND))
def test_what_it_found_stays_found(name: str) -> None:
    run = asyncio.run(drive(FOUND[name]))
    assert {k: run.seen[k] for k in OUTCOMES[name]} == OUTCOMES[name], run.log


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_extender_over_http_decides_as_the_simulator(case: Case) -> None:
    run = asyncio.run(drive(case))
    FUZZ_CASES["property/differential-extender examples"] += 1
    FUZZ_CASES["property/differential-extender attempts"] += run.attempts
    for what, n in run.seen.items():
        FUZZ_NOTES[f"differential-extender {what}"] += n
    FUZZ_NOTES["differential-extender nodes"] += len(case.nodes)
    FUZZ_NOTES["differential-extender most pods in one example"] = max(
        FUZZ_NOTES["differential-extender most pods in one example"], run.seen["pods"]
    )


def test_the_generator_reaches_every_kind_of_decision() -> None:
    """The drawn cases bind every kind of pod, gate, refuse at admission, finish pods and
    tie in kube-scheduler's sense (so the differential test compares every branch, not
    only "nothing fits")."""
    seen: Counter[str] = Counter()

    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(case=cases())
    def collect(case: Case) -> None:
        run = asyncio.run(drive(case))
        seen.update(run.seen)
        seen["bound: several devices"] += sum(len(p.devices) > 1 for p in run.plans.values())

    collect()
    wanted = [
        "bound: none",
        "bound: device",
        "bound: several devices",
        "bound: fraction",
        "bound: memory",
        "bound: shared GPU",
        "bound: node constraints",
        "held: gate",
        "held: no fit",
        "refused at admission",
        "finished",
        "deleted while pending",
        "node joined",
        "choice: prioritize, exact levels",
        "choice: prioritize, rounded levels",
        "choice: kube-scheduler tie",
    ]
    assert [w for w in wanted if not seen[w]] == [], seen
