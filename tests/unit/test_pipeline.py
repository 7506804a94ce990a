"""The placement pipeline's stages (``fairshare.pipeline``): the plan a chain of them
yields is what the simulator binds and what the extender's bind annotates, for pods of
whole GPUs, GPU fractions, GPU memory and MIG slices."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from extender import verbs, wire
from extender.snapshot import Snapshot
from fairshare import pipeline
from fairshare.config.loading import config_from_mapping
from fairshare.placement import (
    FilterResult,
    PodRequest,
    WorkloadMix,
    build_scorer,
    build_workload_mix,
    candidates,
    class_key,
    fgd_device,
    fgd_raw,
    node_rank,
    score_context,
)
from fairshare.resources import ANN_GPU_DEVICES, ANN_GPU_FRACTION, ANN_GPU_GROUP, ANN_GPU_MEMORY
from fairshare.simulator.engine import Simulation, requests_pod
from fairshare.state import objects
from fairshare.state.cluster import LABEL_GPU_MEMORY, LABEL_GPU_PRODUCT

CONFIG = config_from_mapping(
    {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
        "tenants": [{"name": "a", "namespaces": ["a"]}, {"name": "b", "namespaces": ["b"]}],
    }
)
GIB = 2**30


def _sim(*, mix: bool) -> Simulation:
    """Two GPU nodes (40 GiB and 80 GiB devices), a CPU node and a MIG node, some GPUs
    partly taken so that best fit, the fragmentation term's device and the shared GPUs
    all have something to decide."""
    sim = Simulation(CONFIG, policy="ours")
    host = {"cpu": Fraction(32), "memory": Fraction(256 * GIB)}
    sim.add_node("g40", host | {"nvidia.com/gpu": Fraction(4)}, {LABEL_GPU_MEMORY: "40960"})
    sim.add_node("g80", host | {"nvidia.com/gpu": Fraction(2)}, {LABEL_GPU_MEMORY: "81920"})
    sim.add_node("cpu", host, {})
    mig_node = {
        "metadata": {
            "name": "mig",
            "labels": {LABEL_GPU_PRODUCT: "A100", "nvidia.com/mig.strategy": "mixed"},
        },
        "spec": {},
        "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/mig-1g.10gb": "7"}},
    }
    objects.apply_node(sim.state, mig_node, CONFIG)
    sim.tie_rank = [node_rank(n.name) for n in sim.state.nodes]
    for k, frac in enumerate(("0.5", "0.25", "0.75")):  # shared GPUs already running
        uid = f"running-{k}"
        sim.submit(sim.request_for(_pod(uid, "b", fraction=frac), uid=uid))
        assert sim.try_place(uid).status == "running"
    if mix:
        cpu = sim.state.index.column("cpu")
        shapes = [_req(sim, f"m{k}", fraction=f) for k, f in enumerate(("0.5", "0.25"))]
        keys = [class_key(r, cpu_col=cpu) for r in shapes]
        sim.mix = build_workload_mix(keys, model_ids=sim.state.model_ids, coverage=1.0)
        sim._ctx = None
    return sim


def _pod(
    name: str, ns: str, *, gpus: int = 0, fraction: str = "", memory: str = "", mig: int = 0
) -> dict[str, Any]:
    requests = {"cpu": "1", "memory": "1Gi"}
    annotations: dict[str, str] = {}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    if mig:
        requests["nvidia.com/mig-1g.10gb"] = str(mig)
    if fraction:
        annotations[ANN_GPU_FRACTION] = fraction
    if memory:
        annotations[ANN_GPU_MEMORY] = memory
    return requests_pod(name=name, namespace=ns, requests=requests, annotations=annotations)


def _req(sim: Simulation, uid: str, **kind: Any) -> PodRequest:
    return sim.request_for(_pod(uid, "a", **kind), uid=uid)


def _chain(sim: Simulation, req: PodRequest, mix: WorkloadMix | None) -> pipeline.Plan:
    """The stages one after the other, as a reader of the module would chain them."""
    state = sim.state
    fr = pipeline.fit(state, req)
    assert fr.fits
    decision = pipeline.gate(state, config=CONFIG, req=req, pending=list(sim.pending.values()))
    assert decision is None or decision.allowed
    scorer = build_scorer(CONFIG.scoring.weights())
    ctx = score_context(state, mix)
    rank = [node_rank(n.name) for n in state.nodes].__getitem__  # the extender's order
    best, scored = pipeline.pick(state, req, fr.fits, scorer=scorer, ctx=ctx, rank=rank)
    assert best is not None and set(scored.scores) == set(fr.fits)
    choice = pipeline.device_choice(state, req, best, milli=fr.gpu_milli[best], mix=mix)
    assert isinstance(choice, pipeline.DeviceChoice)
    return pipeline.plan(state, req, best, choice)


KINDS = {
    "whole": {"gpus": 2},
    "fraction": {"fraction": "0.5"},
    "memory": {"memory": "20Gi"},
    "mig": {"mig": 1},
    "cpu": {},
}


@pytest.mark.parametrize("with_mix", [False, True], ids=["no mix", "mix"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_chain_is_what_the_extender_annotates_and_the_simulator_binds(
    kind: str, with_mix: bool
) -> None:
    sim = _sim(mix=with_mix)
    req = _req(sim, "p", **KINDS[kind])
    sim.submit(req)
    plan = _chain(sim, req, sim.mix)

    # The extender: its choice (``--pick-in-filter``) and its bind on that node.
    names = [n.name for n in sim.state.nodes]
    assert verbs.pick_best(sim.state, CONFIG, req, names, mix=sim.mix) == plan.node
    args = wire.ExtenderBindingArgs(req.name, req.namespace, req.uid, plan.node)
    bound = verbs.bind_plan(args, Snapshot.of(sim.state, pending=[req], mix=sim.mix))
    assert not bound.error
    assert (bound.node, bound.row, bound.devices, bound.mig) == (
        plan.node, plan.row, plan.devices, plan.mig,
    )  # fmt: skip
    assert (bound.group, bound.new_group) == (plan.group, plan.new_group)
    want = {ANN_GPU_DEVICES: objects.format_gpu_devices(plan.devices)} if plan.devices else {}
    if plan.group:
        want[ANN_GPU_GROUP] = plan.group
    assert dict(bound.annotations) == want

    # The simulator: the chain in one go, then the bind.
    assert sim.try_place(req.uid).node == plan.node
    held = sim.state.pods[req.uid]
    assert (held.node, held.row, held.devices, held.mig, held.group) == (
        plan.node, plan.row, plan.devices, plan.mig, plan.group,
    )  # fmt: skip


def test_each_kind_lands_as_its_kind_should() -> None:
    sim = _sim(mix=False)
    plans = {}
    for kind, shape in KINDS.items():
        req = _req(sim, kind, **shape)
        sim.submit(req)
        plans[kind] = _chain(sim, req, None)
    assert plans["mig"].node == "mig" and plans["mig"].mig == ("1g.10gb", 1)
    assert plans["mig"].devices == () and plans["mig"].group == ""
    assert [m for _, m in plans["whole"].devices] == [1000.0, 1000.0]
    frac = plans["fraction"]
    assert len(frac.devices) == 1 and frac.devices[0][1] == 500.0 and frac.group
    # A GPU-memory pod holds its share of the device of the node it lands on.
    mem = plans["memory"]
    share = 20 / (40 if mem.node == "g40" else 80)
    assert mem.devices[0][1] == pytest.approx(1000 * share)
    assert mem.row[sim.state.gpu_col] == pytest.approx(1000 * share)
    assert plans["cpu"].devices == () and plans["cpu"].row == sim.pods["cpu"].row


def test_a_fraction_joins_the_shared_gpu_the_fragmentation_term_proposes() -> None:
    sim = _sim(mix=True)
    req = _req(sim, "p", fraction="0.25")
    sim.submit(req)
    plan = _chain(sim, req, sim.mix)
    hint = pipeline.fragmentation_device(sim.state, req, plan.node_row, sim.mix)
    assert hint >= 0 and plan.devices == ((hint, 250.0),)
    at = sim.state.group_at(plan.node, hint)
    assert (plan.group, plan.new_group) == ((at, False) if at else (plan.group, True))
    # Without a mix (or under ``bestfit``): the fullest device that still holds it.
    plain = pipeline.device_choice(sim.state, req, plan.node_row, milli=250.0, mix=None)
    assert isinstance(plain, pipeline.DeviceChoice)
    devs = sim.state.node_devices(plan.node_row)
    fullest = min((v, k) for k, v in enumerate(devs) if v >= 250.0)[1]
    assert plain.devices == ((fullest, 250.0),)


def _first(_req: PodRequest, fr: FilterResult) -> int:
    return fr.fits[0]


def test_place_says_why_it_places_nothing() -> None:
    sim = _sim(mix=False)
    huge = _req(sim, "huge", gpus=8)
    sim.submit(huge)
    got = pipeline.place(sim.state, huge, None, judge=lambda _r: None, chooser=_first, mix=None)
    assert got == pipeline.Waiting(pipeline.NO_FIT)
    assert sim.try_place("huge").status == "pending"
    assert sim.last_reason["huge"] == pipeline.NO_FIT


def test_place_waits_with_the_gates_decision_and_the_simulator_records_its_reason() -> None:
    # One node of 4 GPUs; a holds 2 and asks 2 more while b waits with 2 that fit: the
    # fair allocation gives each 2, so a's pod waits for b's.
    sim = Simulation(CONFIG, policy="ours")
    sim.add_node(
        "n", {"cpu": Fraction(32), "memory": Fraction(256 * GIB), "nvidia.com/gpu": Fraction(4)}, {}
    )
    sim.submit(_req(sim, "a-run", gpus=2))
    assert sim.try_place("a-run").status == "running"
    sim.submit(sim.request_for(_pod("b-wait", "b", gpus=2), uid="b-wait"))
    more = _req(sim, "a-more", gpus=2)
    sim.submit(more)
    got = pipeline.place(sim.state, more, None, judge=sim._gate, chooser=_first, mix=None)
    assert isinstance(got, pipeline.Waiting) and got.gate is not None
    assert not got.gate.allowed and got.reason == got.gate.reason
    assert sim.try_place("a-more").status == "pending"
    assert sim.last_reason["a-more"] == got.reason
    # b's pod is not held, and lands where the chain puts it.
    b = sim.pods["b-wait"]
    placed = pipeline.place(sim.state, b, None, judge=sim._gate, chooser=_first, mix=None)
    assert isinstance(placed, pipeline.Plan)
    assert sim.try_place("b-wait").node == placed.node == "n"
    assert sim.state.pods["b-wait"].devices == placed.devices


def test_a_node_without_the_devices_is_refused_by_the_plan_stage() -> None:
    sim = _sim(mix=False)
    req = _req(sim, "p", gpus=2)
    cpu_row = sim.state.node_index["cpu"]
    assert pipeline.device_choice(sim.state, req, cpu_row, milli=1000.0, mix=None) == (
        "no 2 device(s) with room"
    )
    assert not pipeline.fit(sim.state, req, [cpu_row], explain=True).fits


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_device_hint_of_one_row_is_the_fragmentation_terms_over_every_row(kind: str) -> None:
    sim = _sim(mix=True)
    req = _req(sim, "p", **KINDS[kind])
    rows = list(range(sim.state.n_nodes))
    _, devices = fgd_raw(
        sim.state, req, candidates(sim.state, rows), score_context(sim.state, sim.mix)
    )
    assert devices is not None
    assert [fgd_device(sim.state, req, i, sim.mix) for i in rows] == list(devices)
    assert fgd_device(sim.state, req, 0, None) == -1
