"""GPUs that fail in the simulator (``fairshare.simulator.failures``, the Philly replay's
faults in ``gangsim.Replay`` and the single-pod ``failreplay.strike``), on clusters and
jobs written here: no trace, no network, fixed seeds."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from pathlib import Path

import hypothesis
import hypothesis.strategies as st
import pytest

from fairshare.simulator import failreplay, gangsim, philly
from fairshare.simulator.engine import Simulation, requests_pod
from fairshare.simulator.failures import (
    DEFAULT_FATAL,
    DEFAULT_RATE,
    HOUR,
    FailureModel,
    FailureModelError,
    Fault,
    FaultProcess,
)

GPU = "nvidia.com/gpu"


# -- the model and the process ---------------------------------------------------------


def test_default_rate_is_the_llama3_arithmetic():
    # 419 unexpected interruptions × 58.7 % GPU-related over 16,384 GPUs × 54 days
    assert pytest.approx(419 * 0.587 / (16384 * 54 * 24)) == DEFAULT_RATE
    assert pytest.approx(1.158e-5, rel=1e-3) == DEFAULT_RATE
    assert pytest.approx(0.680, abs=1e-3) == DEFAULT_FATAL


def test_fault_count_and_fatal_share_match_the_parameters():
    # 1,000 GPUs at 1e-3 faults per GPU-hour for 100,000 h: 100,000 faults expected
    # (Poisson, sd 316); the seed is fixed, so the count is one number that either is
    # within 2 % (6 sd) or is not, on every run.
    model = FailureModel(rate=1e-3, fatal=0.25, seed=7)
    gpus = [(f"n{i}", s) for i in range(125) for s in range(8)]
    faults = FaultProcess(model, gpus).until(100_000 * HOUR)
    expected = 1e-3 * len(gpus) * 100_000
    assert abs(len(faults) - expected) < 0.02 * expected
    fatal = sum(f.fatal for f in faults) / len(faults)
    assert abs(fatal - 0.25) < 0.01  # sd of the share ≈ 0.0014
    # every GPU is hit at about the same rate (each ≈ 100 faults; none at 0 or 300)
    per_gpu: dict[tuple[str, int], int] = {}
    for f in faults:
        per_gpu[(f.node, f.slot)] = per_gpu.get((f.node, f.slot), 0) + 1
    assert len(per_gpu) == len(gpus)
    assert max(per_gpu.values()) < 3 * min(per_gpu.values())


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**32), fatal=st.sampled_from([0.0, 1.0]))
def test_faults_are_deterministic_ordered_and_on_the_fleet(seed, fatal):
    model = FailureModel(rate=0.01, fatal=fatal, seed=seed)
    gpus = [("a", 0), ("a", 1), ("b", 0)]
    one = FaultProcess(model, gpus).until(1000 * HOUR)
    two = FaultProcess(model, gpus).until(1000 * HOUR)
    assert one == two
    assert all(x.time < y.time for x, y in itertools.pairwise(one))
    assert all((f.node, f.slot) in gpus and f.fatal == bool(fatal) for f in one)


def test_no_faults_at_rate_zero():
    assert FaultProcess(FailureModel(rate=0.0), [("a", 0)]).until(1e12) == []


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"rate": -1e-5}, "failure rate must be a finite number ≥ 0"),
        ({"rate": math.inf}, "failure rate"),
        ({"fatal": 1.5}, "fraction fatal must be between 0 and 1"),
        ({"fatal": -0.1}, "fraction fatal"),
        ({"repair_hours": -2}, "repair time must be ≥ 0"),
        ({"scope": "rack"}, "unknown failure scope 'rack'; choose from node, gpu"),
    ],
)
def test_bad_parameters_are_refused_with_their_name(kw, words):
    with pytest.raises(FailureModelError, match=words):
        FailureModel(**kw)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["philly", "--rate", "-1"], "failure rate must be a finite number ≥ 0"),
        (["philly", "--fatal", "2"], "fraction fatal must be between 0 and 1"),
        (["openb", "--scope", "rack"], "unknown failure scope 'rack'"),
        (["openb", "--variants", "member"], "unknown variant member; choose from"),
        (["philly", "--rate-scale", "-3"], "--rate-scale must be ≥ 0"),
        (["philly", "--policy", "per-pod"], "--policy: unknown 'per-pod'"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(argv, words, capsys):
    assert failreplay.main(argv) == 2
    err = capsys.readouterr().err
    assert words in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_the_command_refuses_an_unknown_option_with_its_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        failreplay.main(["philly", "--fault-rate", "1"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --fault-rate" in capsys.readouterr().err


# -- single pods: a fault kills exactly the pods on its GPU ----------------------------


def single_pods(n_pods: int, gpus: int = 4) -> Simulation:
    """One node of ``gpus`` GPUs, pods of one whole GPU each (tenant ``a``), pods
    ``p0``… submitted in order and placed while they fit."""
    cfg = philly.make_config(["a"])
    sim = Simulation(cfg)
    sim.add_node(
        "n0",
        {GPU: Fraction(gpus), "cpu": Fraction(64), "memory": Fraction(256 << 30)},
        {"nvidia.com/gpu.count": str(gpus)},
    )
    for k in range(n_pods):
        pod = requests_pod(name=f"p{k}", namespace="a", requests={GPU: "1", "cpu": "1"})
        sim.submit(sim.request_for(pod, uid=f"p{k}"))
    sim.run_until_stable()
    return sim


def slot_of(sim: Simulation, uid: str) -> int:
    return sim.state.pods[uid].devices[0][0]


def test_a_fault_kills_exactly_the_pods_on_its_gpu():
    sim = single_pods(4)
    victim = "p2"
    slot = slot_of(sim, victim)
    lost, uid = failreplay.strike(sim, Fault(0.0, "n0", slot, False), "gpu", keep_position=True)
    assert [p.uid for p in lost] == [victim]
    assert uid is None  # non-fatal: the GPU stays in service
    assert set(sim.state.pods) == {"p0", "p1", "p3"}
    assert list(sim.pending) == [victim]
    sim.run_until_stable()
    assert sim.state.pods[victim].devices[0][0] == slot  # the same GPU, free again


def test_a_fatal_fault_takes_its_gpu_or_its_node_and_repair_gives_it_back():
    sim = single_pods(3)
    g = sim.state.gpu_col
    full = sim.capacity()[g]
    slot = slot_of(sim, "p0")
    fair_before = sim.fair_shares()["a"].allocation[g]
    lost, uid = failreplay.strike(sim, Fault(0.0, "n0", slot, True), "gpu", keep_position=True)
    assert [p.uid for p in lost] == ["p0"] and uid is not None
    assert sim.capacity()[g] == full - 1000  # out of what the shares divide
    sim.run_until_stable()
    assert "p0" in sim.state.pods and slot_of(sim, "p0") != slot  # the 4th GPU
    # a second fault on the failed GPU finds it out of service
    assert failreplay.strike(sim, Fault(1.0, "n0", slot, True), "gpu", keep_position=True) == (
        [],
        None,
    )
    failreplay.repair(sim, uid)
    assert sim.capacity()[g] == full
    assert sim.fair_shares()["a"].allocation[g] == fair_before
    # node scope: every pod of the node is lost, the node is GPU-unhealthy, then back
    lost, uid = failreplay.strike(sim, Fault(2.0, "n0", 0, True), "node", keep_position=True)
    assert sorted(p.uid for p in lost) == ["p0", "p1", "p2"]
    assert sim.capacity()[g] == 0 and not sim.state.healthy[0]
    assert sim.run_until_stable() == 1 and not sim.state.pods.keys() - {uid}
    assert uid is not None
    failreplay.repair(sim, uid)
    assert sim.capacity()[g] == full and sim.state.healthy[0]
    sim.run_until_stable()
    assert sorted(sim.state.pods) == ["p0", "p1", "p2"]


@pytest.mark.parametrize(("keep", "gets_gpu"), [(True, "p1"), (False, "p4")])
def test_no_penalty_keeps_the_queue_place_without_it_the_back(keep, gets_gpu):
    # 4 GPUs, pods p0..p5: p0-p3 run, p4 and p5 wait. p1 is lost to a non-fatal fault:
    # with the rule it is first in the queue again and gets its GPU back; without it
    # it is behind p4 and p5, and p4 takes the GPU.
    sim = single_pods(6)
    failreplay.strike(sim, Fault(0.0, "n0", slot_of(sim, "p1"), False), "gpu", keep_position=keep)
    assert list(sim.pending) == (["p1", "p4", "p5"] if keep else ["p4", "p5", "p1"])
    sim.schedule_pass()
    assert gets_gpu in sim.state.pods
    assert sim.counters["a"].running == 4 and sim.counters["a"].pending == 2


# -- gangs: the Philly replay's faults --------------------------------------------------


def gang_replay(
    jobs: list[gangsim.Job],
    faults: list[Fault],
    *,
    recovery: str = "gang",
    no_penalty: bool = True,
    scope: str = "gpu",
    repair_hours: float = 2.0,
    nodes: int = 2,
) -> gangsim.Replay:
    cfg = philly.make_config(sorted({j.namespace for j in jobs}))
    return gangsim.Replay(
        cfg,
        philly.make_nodes(nodes, 4),
        jobs,
        "ours",
        failures=FailureModel(rate=0.0, repair_hours=repair_hours, scope=scope),  # type: ignore[arg-type]
        recovery=recovery,  # type: ignore[arg-type]
        no_penalty=no_penalty,
        scripted=faults,
    )


def job(name: str, tenant: str, arrival: float, hours: float, size: int) -> gangsim.Job:
    return gangsim.Job(name, tenant, arrival, hours * HOUR, size, philly._REQUESTS)


def test_whole_gang_recovery_requeues_every_member():
    # One job of 8 GPUs on 2 × 4: a fatal fault on one GPU at 1 h. Whole-gang recovery
    # queues all 8 members again; with 7 GPUs left the job waits for the repair (2 h)
    # and runs its 10 h again from 3 h: it ends at 13 h, 8 GPU-hours lost.
    r = gang_replay([job("big", "t", 0.0, 10, 8)], [Fault(1 * HOUR, "gpu-000", 0, True)])
    bound_at: dict[float, int] = {}

    def watch(now: float, done: int, total: int) -> None:
        bound_at[now] = sum(1 for u in r.sim.state.pods if u.startswith("t/"))

    r.progress = watch
    res = r.run()
    # (10 h: the lost run's own end, stale, passes by)
    assert bound_at == {0.0: 8, 1 * HOUR: 0, 3 * HOUR: 8, 10 * HOUR: 8, 13 * HOUR: 0}
    rec = r.records[0]
    assert rec.restarts == 1 and rec.end == pytest.approx(13 * HOUR)
    assert res.lost_gpu_seconds == pytest.approx(8 * HOUR)
    assert res.broken_gpu_seconds == 0
    assert res.out_gpu_seconds == pytest.approx(2 * HOUR)  # one GPU for the repair time
    assert res.faults == res.fatal_faults == res.restarts == 1


def test_whole_gang_recovery_moves_every_member_off_the_lost_gpu():
    # Non-fatal, and a free GPU elsewhere: all 4 members are unbound and the gang is
    # placed again at once (its 4 pods bound anew), so the run restarts at the fault.
    jobs = [job("a", "t", 0.0, 10, 4), job("b", "u", 0.0, 10, 3)]
    r = gang_replay(jobs, [Fault(1 * HOUR, "gpu-000", 0, False)])
    binds: list[str] = []
    orig = r.sim.state.bind

    def spy(**kw):  # type: ignore[no-untyped-def]
        binds.append(kw["uid"])
        return orig(**kw)

    r.sim.state.bind = spy  # type: ignore[method-assign]
    res = r.run()
    hit = next(rec for rec in r.records if rec.restarts)
    assert sum(rec.restarts for rec in r.records) == 1 == res.restarts
    assert all(binds.count(u) == 2 for u in hit.uids)  # every member bound twice
    other = next(rec for rec in r.records if rec is not hit)
    assert all(binds.count(u) == 1 for u in other.uids)
    assert hit.end == pytest.approx(11 * HOUR)


def test_without_gang_recovery_survivors_hold_their_gpus_until_the_member_is_back():
    # The same fault, member recovery: 7 members keep their GPUs, idle, while the lost
    # member waits 2 h for the repaired GPU: 14 GPU-hours held by a broken gang.
    r = gang_replay(
        [job("big", "t", 0.0, 10, 8)], [Fault(1 * HOUR, "gpu-000", 0, True)], recovery="member"
    )
    res = r.run()
    assert res.broken_gpu_seconds == pytest.approx(7 * 2 * HOUR)
    assert res.lost_gpu_seconds == pytest.approx(8 * HOUR)
    assert r.records[0].end == pytest.approx(13 * HOUR)


def test_gang_no_penalty_keeps_the_queue_place():
    # 1 node of 4 GPUs. Tenant t's job x (4 GPUs, 5 h) runs; y (4 GPUs) of t and z
    # (4 GPUs) of u wait, y first. A non-fatal fault stops x at 1 h: with the rule x
    # keeps its place ahead of y and z and runs again at once; without it x goes behind
    # them and runs last.
    jobs = [job("x", "t", 0.0, 5, 4), job("y", "t", 0.5, 1, 4), job("z", "u", 0.6, 1, 4)]
    fault = [Fault(1 * HOUR, "gpu-000", 0, False)]
    keep = gang_replay(jobs, fault, no_penalty=True, nodes=1)
    keep.run()
    back = gang_replay(jobs, fault, no_penalty=False, nodes=1)
    back.run()
    ends = {r.job.name: r.end for r in keep.records}
    assert ends["x"] == pytest.approx(6 * HOUR)  # restarted at 1 h
    ends_back = {r.job.name: r.end for r in back.records}
    assert ends_back["x"] == pytest.approx(8 * HOUR)  # after y and z: 3 h + 5 h
    assert ends_back["x"] > max(ends_back["y"], ends_back["z"])  # type: ignore[type-var]


def test_a_replay_with_failures_is_deterministic():
    jobs = [job(f"j{k}", f"t{k % 3}", k * 600.0, 3 + k % 5, 1 + k % 4) for k in range(30)]
    cfg = philly.make_config(sorted({j.namespace for j in jobs}))
    model = FailureModel(rate=0.02, fatal=0.5, repair_hours=1.0, seed=3)

    def once() -> tuple[float, float, int, list[float | None]]:
        r = gangsim.Replay(cfg, philly.make_nodes(2, 4), jobs, "ours", failures=model)
        res = r.run()
        return res.lost_gpu_seconds, res.out_gpu_seconds, res.faults, [x.end for x in r.records]

    first = once()
    assert first[2] > 0 and first == once()


# -- the command on small traces written here ------------------------------------------


def tiny_openb(folder: Path) -> Path:
    """Two nodes of 4 GPUs and 12 pods of one GPU (openb's CSV columns)."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"]
    nodes += [f"openb-node-{i:04d},32000,262144,4,V100M16" for i in range(2)]
    (folder / "openb_node_list_gpu_node.csv").write_text("\n".join(nodes) + "\n")
    pods = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    pods += [f"openb-pod-{k:04d},2000,8192,1,1000," for k in range(12)]
    (folder / "openb_pod_list_default.csv").write_text("\n".join(pods) + "\n")
    return folder


def test_openb_failure_replay_loses_work_and_repeats_itself(tmp_path, capsys):
    trace = tiny_openb(tmp_path / "openb")
    argv = ["openb", "--trace", str(trace), "--hours", "200", "--rate", "0.01"]
    argv += ["--fault-seed", "5", "--workers", "1", "--json", "--quiet"]
    assert failreplay.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert failreplay.main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    for doc in (first, again):
        for v in doc["variants"]:
            v.pop("seconds")
    assert first["variants"] == again["variants"]
    base, keep, back = first["variants"]
    assert [base["variant"], keep["variant"], back["variant"]] == list(failreplay.OPENB_VARIANTS)
    assert base["faults"] == base["lostGpuHours"] == base["outOfServiceGpuHours"] == 0
    # 8 GPUs × 0.01 × 200 h: about 16 faults; each fatal one takes a node for 24 h
    assert 5 <= keep["faults"] == back["faults"] <= 40
    assert keep["lostGpuHours"] > 0 and keep["outOfServiceGpuHours"] > 0
    assert keep["outOfServiceGpuHours"] <= keep["fatalFaults"] * 4 * 24


def test_philly_failure_replay_reports_every_variant(tmp_path, capsys):
    from tests.unit.test_simulator_gangs import write_trace

    rows = [(20 * 3600, k * 1800.0, 1 + k % 4) for k in range(12)]
    trace = write_trace(tmp_path / "philly", {"aa": rows, "bb": rows})
    argv = ["philly", "--trace", str(trace), "--nodes", "2", "--gpus-per-node", "4"]
    argv += ["--rate", "0.02", "--workers", "1", "--quiet"]
    assert failreplay.main(argv) == 0
    table = capsys.readouterr().out
    for name in failreplay.PHILLY_VARIANTS:
        assert f"| {name} |" in table
    assert "GPU-h held by broken gangs" in table and "JCT mean / p95 (h)" in table


def test_no_penalty_takes_the_lost_run_out_of_the_usage_history():
    # usageHistory with a 4 h half-life; one 8-GPU job of tenant t (alone, so both runs
    # place alike), stopped by a non-fatal fault at 1 h and run again to 11 h. With the
    # rule, t's history is lighter by exactly the lost hour's 8 GPUs as decayed to the
    # end: 8,000 milli-GPU × T ÷ ln 2 × (1 − 2^(−1/4)) × 2^(−10/4), T = 4 h.
    jobs = [job("big", "t", 0.0, 10, 8)]
    cfg = failreplay.history_config(["t", "u"], "4h")
    fault = [Fault(1 * HOUR, "gpu-000", 0, False)]
    model = FailureModel(rate=0.0, repair_hours=1.0, scope="gpu")
    runs = {}
    for keep in (True, False):
        r = gangsim.Replay(
            cfg, philly.make_nodes(2, 4), jobs, "ours", failures=model, no_penalty=keep,
            scripted=fault,
        )  # fmt: skip
        r.run()
        assert r.keeper is not None and r.records[0].end == pytest.approx(11 * HOUR)
        runs[keep] = r
    g = runs[True].sim.state.gpu_col
    t_half = 4 * HOUR
    expected = 8000 * t_half / math.log(2) * (1 - 2 ** (-1 / 4)) * 2 ** (-10 / 4)
    kept = runs[True].keeper.history.usage["t"][g]  # type: ignore[union-attr]
    charged = runs[False].keeper.history.usage["t"][g]  # type: ignore[union-attr]
    assert charged - kept == pytest.approx(expected, rel=1e-6)
    assert runs[True].refunded == pytest.approx(8 * HOUR)
    assert runs[False].refunded == 0
