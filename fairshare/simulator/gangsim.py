"""Gangs in the simulator: jobs of ``size`` identical pods replayed under three policies:
``ours`` (the extender's gang path), ``per-pod`` (each pod alone; a partly placed job
holds its GPUs idle) and ``gang-fifo`` (all or nothing, no fairness). A job runs
``duration`` seconds once all its pods run. ``Replay.result``: GPU-seconds held by
incomplete jobs, job waits, and per tenant GPU-seconds held against its fair allocation.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

from fairshare import gangs, history, pipeline
from fairshare.config.schema import FairShareConfig
from fairshare.gate import GateDecision, GroupFits
from fairshare.placement import PodRequest
from fairshare.simulator.engine import Outcome, Simulation, requests_pod
from fairshare.simulator.failures import (
    RECOVERIES,
    FailureModel,
    Fault,
    FaultProcess,
    Recovery,
    fleet_gpus,
)
from fairshare.state.cluster import BoundPod

GangPolicy = Literal["ours", "per-pod", "gang-fifo"]
QueueKey = tuple[str | None, int, tuple[tuple[str, str], ...]]
"""A kind of waiting job: tenant, pods asked at once (1 placed pod by pod), requests."""
GANG_POLICIES: tuple[GangPolicy, ...] = ("ours", "per-pod", "gang-fifo")


@dataclass(frozen=True)
class Job:
    """One gang: ``size`` pods of ``requests`` each, in namespace ``namespace``."""

    name: str
    namespace: str
    arrival: float
    duration: float
    size: int
    requests: tuple[tuple[str, str], ...] = (("nvidia.com/gpu", "1"),)


@dataclass(frozen=True)
class Node:
    name: str
    allocatable: tuple[tuple[str, Fraction], ...]
    labels: tuple[tuple[str, str], ...] = ()


@dataclass
class JobRecord:
    job: Job
    tenant: str | None
    uids: tuple[str, ...]
    gpus_each: float
    placed: int = 0
    start: float | None = None
    end: float | None = None
    index: int = -1  # in the replay's jobs, by arrival
    order: int = -1  # its place in the queue (the arrival index, or later once sent back)
    first_start: float | None = None
    done: bool = False
    restarts: int = 0
    finish_seq: int = -1  # the seq of its live finish event (a lost run's is stale)
    broken: bool = False  # members lost, the others holding their GPUs (member recovery)


@dataclass
class TenantFigures:
    jobs: int = 0
    started: int = 0
    waits: list[float] = field(default_factory=list)
    gpu_seconds: float = 0.0
    fair_gpu_seconds: float = 0.0
    incomplete_gpu_seconds: float = 0.0
    lost_gpu_seconds: float = 0.0
    broken_gpu_seconds: float = 0.0
    restarts: int = 0
    jcts: list[float] = field(default_factory=list)


@dataclass
class ReplayResult:
    policy: GangPolicy
    start: float
    end: float
    gpus: float
    incomplete_gpu_seconds: float
    busy_gpu_seconds: float
    idle_while_waiting_gpu_seconds: float
    """Free GPUs, up to the GPUs the waiting jobs still ask for, integrated over time."""
    tenants: dict[str, TenantFigures]
    not_started: int
    stuck_gpus: float = 0.0
    """GPUs held at the last event by jobs that never start (held for ever)."""
    lost_gpu_seconds: float = 0.0
    """Work lost to faults: the GPUs of each job a fault stopped × how long it had run."""
    broken_gpu_seconds: float = 0.0
    """GPUs held by the surviving members of broken gangs, integrated over time."""
    out_gpu_seconds: float = 0.0
    """GPUs out of service (failed, under repair), integrated over time."""
    faults: int = 0
    fatal_faults: int = 0
    restarts: int = 0
    unfinished: int = 0
    """Jobs not finished when the run ended (``until``)."""


@dataclass
class GangSimulation(Simulation):
    """The simulation with the gate's reading of the queue kept short.

    With the fair allocation given, the gate reads the pending queue only to learn which
    tenants below the judged one have a pod waiting that fits now
    (``gate.fitting_pending``), a question answered per tenant and shape: the first waiting pod
    of each tenant and shape, in creation order (``gate_queue``), gives the same answer as
    the whole queue, which on a saturated replay holds thousands of pods."""

    _firsts: dict[tuple[str | None, object, bool, int], dict[str, tuple[int, PodRequest]]] = field(
        default_factory=dict, init=False
    )
    group_rule: gangs.waiting.Rule = "pod"
    """How a waiting group counts at the gate (``gangs.waiting``): the policy ``ours`` sets it."""
    members: dict[str, tuple[gangs.GroupKey, tuple[str, ...]]] = field(
        default_factory=dict, init=False
    )
    """Pod uid -> its group and all the group's uids (``Replay`` fills it)."""
    min_counts: dict[gangs.GroupKey, int] = field(default_factory=dict, init=False)
    """A group's ``min_count`` when it is not all its pods (none in a replayed trace)."""

    def _key(self, req: PodRequest) -> tuple[str | None, object, bool, int]:
        # with groups counted whole, groups of another size answer differently
        held = self.members.get(req.uid) if self.group_rule != "pod" else None
        return (req.tenant, req.shape, req.waiting, len(held[1]) if held else 0)

    def group_fits(self) -> GroupFits | None:
        """The gate's ``groups`` argument for the current state (``gangs.waiting``)."""
        if self.group_rule == "pod":
            return None
        lookup = gangs.waiting.lookup_over(
            self.members,
            self.pending,
            self.state.pods,
            lambda key, uid: self.min_counts.get(key, len(self.members[uid][1])),
        )
        return gangs.waiting.group_fits(
            self.config, lookup, fair=self.fair_shares(), rule=self.group_rule
        )

    def submit(self, req: PodRequest) -> Outcome:
        out = super().submit(req)
        if out.status == "pending":
            self._firsts.setdefault(self._key(req), {})[req.uid] = (self.created[req.uid], req)
        return out

    def requeue(self, uid: str, *, keep_position: bool, reason: str = "lost") -> BoundPod | None:
        bound = super().requeue(uid, keep_position=keep_position, reason=reason)
        if bound is not None:
            req = self.pods[uid]
            held = self._firsts.setdefault(self._key(req), {})
            held[uid] = (self.created[uid], req)
            if keep_position:
                self._firsts[self._key(req)] = dict(sorted(held.items(), key=lambda kv: kv[1][0]))
        return bound

    def _forget(self, uid: str) -> None:
        req = self.pods[uid]
        held = self._firsts.get(self._key(req))
        if held is not None:
            held.pop(uid, None)

    def bind(self, uid: str, plan: pipeline.Plan) -> Outcome:
        out = super().bind(uid, plan)
        self._forget(uid)
        return out

    def fail(self, uid: str) -> None:
        super().fail(uid)
        self._forget(uid)

    def gate_queue(self) -> list[PodRequest]:
        """The first pending pod of each tenant and shape (and group size, when groups
        count whole), in creation order."""
        firsts = [next(iter(held.values())) for held in self._firsts.values() if held]
        return [req for _, req in sorted(firsts, key=lambda x: x[0])]

    def _gate(self, req: PodRequest) -> GateDecision | None:
        if req.tenant is None or self.policy != "ours":
            return None
        return pipeline.gate(
            self.state,
            config=self.config,
            req=req,
            pending=self.gate_queue(),
            fair=self.fair_shares(),
            groups=self.group_fits(),
        )


def place_gang(sim: GangSimulation, key: gangs.GroupKey, uids: Sequence[str], *, gate: bool) -> str:
    """Judge and plan the gang ``key`` of pending pods ``uids`` as the extender does, and
    bind every planned member; "" when it is placed, else why not."""
    gang = gangs.gang_from(key, len(uids), uids, pending=sim.pending, bound=sim.state.pods)
    if gate:
        decision = gangs.gang_gate(
            sim.state,
            sim.config,
            gang,
            pending=sim.gate_queue(),
            fair=sim.fair_shares(),
            groups=sim.group_fits(),
        )
        if decision is not None and not decision.allowed:
            return decision.reason
    rows = sim.state.eligible_rows(gang.waiting[0].constraints) if gang.waiting else None
    plan = gangs.plan_gang(sim.state, gang, rows=rows)
    if isinstance(plan, gangs.Refusal):
        return plan.reason
    for p in plan.placements:
        sim.bind_planned(p.uid, p.node, p.row, p.devices, mig=p.mig)
    return ""


class Replay:
    """One policy's replay of a list of jobs on a list of nodes; with ``failures``, the
    fleet's GPUs fail as the model says (``fairshare.simulator.failures``).

    A fault loses the pods on its GPU (the node's, when a fatal fault takes the node) and
    with them the work of their jobs: a job restarts from the beginning (no checkpoint).
    ``recovery="gang"``: every member of a job that lost one is queued again;
    ``"member"``: only the lost members are, the others keep their GPUs, idle, until the
    job is whole again (GPU-time held by broken gangs). ``no_penalty``: a lost job keeps
    its place in the queue; without it, it goes to the back."""

    def __init__(
        self,
        config: FairShareConfig,
        nodes: Sequence[Node],
        jobs: Sequence[Job],
        policy: GangPolicy,
        *,
        progress: Callable[[float, int, int], None] | None = None,
        group_rule: gangs.waiting.Rule = gangs.waiting.RULE,
        failures: FailureModel | None = None,
        recovery: Recovery = "gang",
        no_penalty: bool = True,
        scripted: Sequence[Fault] | None = None,
    ) -> None:
        if policy not in GANG_POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(GANG_POLICIES)}")
        if group_rule not in gangs.waiting.RULES:
            raise ValueError(
                f"unknown group rule {group_rule!r}; choose from {', '.join(gangs.waiting.RULES)}"
            )
        if recovery not in RECOVERIES:
            raise ValueError(f"unknown recovery {recovery!r}; choose from {', '.join(RECOVERIES)}")
        if failures is not None and policy == "per-pod":
            raise ValueError("failures are replayed under the gang policies (ours, gang-fifo)")
        self.policy: GangPolicy = policy
        self.sim = GangSimulation(config, policy="ours")
        self.sim.group_rule = group_rule if policy == "ours" else "pod"
        for n in nodes:
            self.sim.add_node(n.name, dict(n.allocatable), dict(n.labels))
        self.jobs = sorted(jobs, key=lambda j: j.arrival)
        self.progress = progress
        self.records: list[JobRecord] = []
        self.by_index: dict[int, JobRecord] = {}
        self.waiting: dict[int, JobRecord] = {}  # queue place -> record, in queue order
        self.tenants: dict[str, TenantFigures] = {}
        self.incomplete = 0.0
        self.busy = 0.0
        self.idle_waiting = 0.0
        self.queues: dict[QueueKey, list[int]] = {}  # waiting jobs by kind, queue order
        self._wanted = 0.0  # GPUs the waiting jobs still ask for
        self._partial: dict[str, float] = {}  # per tenant: GPUs held by incomplete jobs
        self._gcol = self.sim.state.gpu_col
        # failures
        self.failures = failures
        self.scripted = sorted(scripted or (), key=lambda f: f.time)
        """Faults given in advance (with ``failures`` for the scope and repair time),
        replayed instead of the model's fault process."""
        self.recovery: Recovery = recovery
        self.no_penalty = no_penalty
        self._job_of: dict[str, int] = {}  # pod uid -> job index
        self._broken: dict[str, float] = {}  # per tenant: GPUs held by broken gangs
        self._next_order = len(self.jobs)
        self.lost = self.broken = self.out = 0.0
        self.faults = self.fatal_faults = self.restarts = 0
        # usageHistory: the gate's weights follow the tenants' decayed usage, stepped
        # at every event as the scenario runner steps it
        self.keeper = (
            history.Keeper(config, self.sim.index.names)
            if config.usage_history is not None
            else None
        )
        self.refunded = 0.0  # GPU-seconds of lost work taken out of the history (no-penalty)

    # -- events ------------------------------------------------------------------------

    def _arrive(self, i: int) -> None:
        job = self.jobs[i]
        uids = tuple(f"{job.namespace}/{job.name}-{k}" for k in range(job.size))
        tenant: str | None = None
        gpus = 0.0
        group = gangs.GroupKey(job.namespace, job.name)
        for uid in uids:
            self.sim.members[uid] = (group, uids)
            self._job_of[uid] = i
        for k, uid in enumerate(uids):
            pod = requests_pod(
                name=f"{job.name}-{k}", namespace=job.namespace, requests=dict(job.requests)
            )
            meta = pod["metadata"]
            meta["labels"] = {gangs.POD_GROUP_LABEL: job.name}
            req = self.sim.request_for(pod, uid=uid)
            self.sim.submit(req)
            tenant = req.tenant
            gpus = req.row[self._gcol] / 1000.0
        rec = JobRecord(job, tenant, uids, gpus, index=i, order=i)
        self.records.append(rec)
        self.by_index[i] = rec
        self.waiting[i] = rec
        self.queues.setdefault(self._key(rec), []).append(i)
        self._wanted += gpus * job.size
        if tenant is not None:
            self.tenants.setdefault(tenant, TenantFigures()).jobs += 1

    def _finish(self, rec: JobRecord) -> None:
        for uid in rec.uids:
            self.sim.complete(uid)
            self.sim.members.pop(uid, None)
        rec.done = True

    # -- failures ----------------------------------------------------------------------

    def _fault(self, fault: Fault, now: float, running: dict[int, JobRecord]) -> str | None:
        """Apply ``fault``; the placeholder uid when it took something out of service."""
        assert self.failures is not None
        state = self.sim.state
        if state.out_of_service(fault.node, fault.slot):
            return None  # that GPU is already out of service: it cannot fail
        self.faults += 1
        self.fatal_faults += fault.fatal
        whole_node = fault.fatal and self.failures.scope == "node"
        hit: dict[int, list[str]] = {}
        for pod in state.pods_hit(fault.node, None if whole_node else fault.slot):
            hit.setdefault(self._job_of[pod.uid], []).append(pod.uid)
        for i, uids in sorted(hit.items()):
            self._lose(self.by_index[i], uids, now, running)
        if not fault.fatal:
            return None
        uid = state.take_out(fault.node, None if whole_node else fault.slot)
        self.sim._fair = None
        self.sim._ctx = None
        return uid

    def _repair(self, uid: str) -> None:
        self.sim.state.bring_back(uid)
        self.sim._fair = None
        self.sim._ctx = None

    def _lose(
        self, rec: JobRecord, lost: Sequence[str], now: float, running: dict[int, JobRecord]
    ) -> None:
        """Pods ``lost`` of job ``rec`` are gone: the job's run so far is lost, and its
        members are queued again as ``recovery`` says."""
        tenant = rec.tenant
        fig = self.tenants.get(tenant) if tenant is not None else None
        was_running = running.pop(rec.index, None) is not None
        if was_running:
            assert rec.start is not None
            work = rec.gpus_each * len(rec.uids) * (now - rec.start)
            if self.no_penalty and self.keeper is not None and tenant is not None:
                self._refund(tenant, rec, now - rec.start, now)
            self.lost += work
            rec.finish_seq = -1  # its finish event is stale
            rec.start = None
            rec.restarts += 1
            self.restarts += 1
            if fig is not None:
                fig.lost_gpu_seconds += work
                fig.restarts += 1
        bound = self.sim.state.pods
        if self.recovery == "gang":
            requeue = [u for u in rec.uids if u in bound]
        else:
            requeue = [u for u in lost if u in bound]
        for uid in requeue:
            self.sim.requeue(uid, keep_position=self.no_penalty, reason="lost to a GPU fault")
        gone = len(requeue) * rec.gpus_each
        self._wanted += gone
        if rec.broken and tenant is not None:
            self._broken[tenant] -= gone
        rec.placed -= len(requeue)
        if self.recovery == "member" and rec.placed > 0 and not rec.broken and tenant is not None:
            rec.broken = True
            self._broken[tenant] = self._broken.get(tenant, 0.0) + rec.placed * rec.gpus_each
        if rec.placed == 0:
            rec.broken = False
        if rec.order in self.waiting:
            return  # a broken gang already waiting for its lost members keeps its place
        if not self.no_penalty:
            rec.order = self._next_order
            self._next_order += 1
        self.waiting[rec.order] = rec
        bisect.insort(self.queues.setdefault(self._key(rec), []), rec.order)

    def _refund(self, tenant: str, rec: JobRecord, ran: float, now: float) -> None:
        """No-penalty: take the lost run out of the tenant's usage history, as the
        extender does (``History.forgive``, once per pod). The history was stepped to
        now; a run of row u over the last ``ran`` seconds had added
        u × T ÷ ln 2 × (1 − 2^(−ran ÷ T)) to it."""
        assert self.keeper is not None
        hist = self.keeper.history
        pods = self.sim.state.pods
        for uid in rec.uids:
            pod = pods.get(uid)
            if pod is not None:
                # one key per run: a pod lost again later is forgiven again
                hist.forgive(f"{uid}@{rec.restarts}", tenant, pod.row, now - ran, now)
        self.refunded += rec.gpus_each * len(rec.uids) * ran

    def _step_history(self, now: float) -> None:
        if self.keeper is None:
            return
        state = self.sim.state
        used = {t: list(u) for t, u in state.tenant_usage.items()}
        config = self.keeper.step(now, used, state.total_capacity(), self.sim.admitted)
        if config is not self.sim.config:
            self.sim.config = config
            self.sim._fair = None

    # -- placing -----------------------------------------------------------------------

    def _free_gpus(self) -> float:
        return self.sim.state.total_free()[self._gcol] / 1000.0

    def _key(self, rec: JobRecord) -> QueueKey:
        size = 1 if self.policy == "per-pod" else len(rec.uids)
        return (rec.tenant, size, rec.job.requests)

    def _pass(self, now: float) -> list[int]:
        """Try every waiting job once, in queue order; the jobs that started (their
        indexes).

        A job is not tried when one of the same tenant and size was refused since the
        last bind of the pass: nothing the decision reads has changed (the gate judges a
        tenant's request against the others' pending pods, the plan the free room), so
        it would be refused alike. Nor when the free GPUs cannot hold it (they only
        shrink during a pass). So the pass walks the jobs of each such kind (``queues``,
        in queue order) merged by queue place, and leaves a kind as soon as it is refused
        or too large, coming back to a refused kind, after the job being tried, once
        something was bound."""
        started: list[int] = []
        free = self._free_gpus()
        heap = [(q[0], key) for key, q in self.queues.items() if q]
        heapq.heapify(heap)
        refused: list[QueueKey] = []
        per_pod = self.policy == "per-pod"

        def resume(key: QueueKey, after: int) -> None:
            q = self.queues[key]
            k = bisect.bisect_right(q, after)
            if k < len(q):
                heapq.heappush(heap, (q[k], key))

        while heap and free >= 1e-9:
            i, key = heapq.heappop(heap)
            rec = self.waiting[i]
            bound = 0
            failed = False
            if per_pod:
                for uid in rec.uids[rec.placed :]:
                    if free + 1e-9 < rec.gpus_each:
                        break
                    if self.sim.try_place(uid).status != "running":
                        failed = True  # its other pods, and the kind's, would fail alike
                        break
                    rec.placed += 1
                    bound += 1
                    free -= rec.gpus_each
                    self._wanted -= rec.gpus_each
                    if rec.tenant is not None:
                        self._partial[rec.tenant] = (
                            self._partial.get(rec.tenant, 0.0) + rec.gpus_each
                        )
                if not bound and not failed:
                    continue  # too large for what is free: the kind is done this pass
            else:
                need = rec.gpus_each * (len(rec.uids) - rec.placed)
                if need > free + 1e-9:
                    continue  # cannot fit whole (plan_gang would refuse it): as above
                group = gangs.GroupKey(rec.job.namespace, rec.job.name)
                if place_gang(self.sim, group, rec.uids, gate=self.policy == "ours"):
                    failed = True
                else:
                    if rec.broken and rec.tenant is not None:
                        self._broken[rec.tenant] -= rec.placed * rec.gpus_each
                        rec.broken = False
                    bound = len(rec.uids) - rec.placed
                    rec.placed = len(rec.uids)
                    free -= need
                    self._wanted -= need
            if bound:
                for other in refused:
                    resume(other, i)
                refused.clear()
            if rec.placed == len(rec.uids):
                rec.start = now
                if rec.first_start is None:
                    rec.first_start = now
                del self.waiting[i]
                self.queues[key].remove(i)
                if per_pod and rec.tenant is not None:
                    self._partial[rec.tenant] -= rec.placed * rec.gpus_each
                started.append(rec.index)
            if failed:
                refused.append(key)
            else:
                resume(key, i)
        return started

    def _settle(self, now: float) -> list[int]:
        started: list[int] = []
        while True:
            got = self._pass(now)
            if not got:
                return started
            started.extend(got)

    # -- figures -----------------------------------------------------------------------

    def _account(self, dt: float) -> None:
        if dt <= 0:
            return
        state = self.sim.state
        g = self._gcol
        fair = self.sim.fair_shares()
        for t, fig in self.tenants.items():
            fig.gpu_seconds += state.usage_of(t)[g] / 1000.0 * dt
            if t in fair:
                fig.fair_gpu_seconds += fair[t].allocation[g] / 1000.0 * dt
        cap = self.sim.capacity()[g]
        free = state.total_free()[g] / 1000.0
        out = state.out_gpus()
        self.busy += (cap / 1000.0 - free) * dt  # the capacity in service less the free
        self.out += out * dt
        held = 0.0
        for t, gpus in self._partial.items():
            if gpus > 1e-9:
                held += gpus * dt
                self.tenants[t].incomplete_gpu_seconds += gpus * dt
        self.incomplete += held
        for t, gpus in self._broken.items():
            if gpus > 1e-9:
                self.broken += gpus * dt
                self.tenants[t].broken_gpu_seconds += gpus * dt
        wanted = self._wanted
        self.idle_waiting += min(free, wanted) * dt

    # -- the run -----------------------------------------------------------------------

    def run(self, *, horizon: float | None = None, until: float | None = None) -> ReplayResult:
        """Replay every job; the run ends when no event is left (with failures: when no
        job event is left and no waiting job can still get a repaired GPU). Jobs that
        never start (under ``per-pod``, partial gangs that hold each other's GPUs for
        ever) are counted, and what they hold is accounted until ``horizon`` when that is
        later (the trace's own end, say: without it a deadlock at the last event would
        show no GPU-hours held at all). ``until``: no event after it is replayed (a run
        whose faults stop its longest jobs again and again may never end otherwise)."""
        # (time, kind, seq, index); kinds: 0 a job ends, 1 a job arrives, 2 a fault,
        # 3 a repair (at one time: ends free room first, faults after arrivals).
        events: list[tuple[float, int, int, int]] = []
        for i, job in enumerate(self.jobs):
            heapq.heappush(events, (job.arrival, 1, i, i))
        seq = len(self.jobs)
        job_events = len(self.jobs)
        now = self.jobs[0].arrival if self.jobs else 0.0
        done = 0
        running: dict[int, JobRecord] = {}
        faults: dict[int, Fault] = {}
        repairs: dict[int, str] = {}
        process: FaultProcess | Iterator[Fault] | None = None
        if self.failures is not None and self.jobs:
            process = (
                iter(self.scripted)
                if self.scripted
                else FaultProcess(self.failures, fleet_gpus(self.sim.state), start=now)
            )
            first = next(process, None)
            if first is not None:
                faults[seq] = first
                heapq.heappush(events, (first.time, 2, seq, seq))
                seq += 1
        while events:
            if process is not None and not (job_events or (self.waiting and repairs)):
                break  # only faults and repairs left, and nothing waits for a repair
            t = events[0][0]
            if until is not None and t > until:
                self._account(until - now)
                now = until
                break
            self._account(t - now)
            now = t
            self._step_history(now)
            while events and events[0][0] == now:
                _, kind, s, i = heapq.heappop(events)
                if kind == 1:
                    job_events -= 1
                    self._arrive(i)
                elif kind == 0:
                    job_events -= 1
                    rec = self.by_index[i]
                    if rec.finish_seq != s:
                        continue  # the run this event ended was lost to a fault
                    self._finish(running.pop(i))
                    done += 1
                elif kind == 2:
                    assert process is not None and self.failures is not None
                    uid = self._fault(faults.pop(i), now, running)
                    if uid is not None:
                        repairs[seq] = uid
                        back = now + self.failures.repair_seconds
                        heapq.heappush(events, (back, 3, seq, seq))
                        seq += 1
                    nxt = next(process, None)
                    if nxt is not None:
                        faults[seq] = nxt
                        heapq.heappush(events, (nxt.time, 2, seq, seq))
                        seq += 1
                else:
                    self._repair(repairs.pop(i))
            for i in self._settle(now):
                rec = self.by_index[i]
                rec.end = now + rec.job.duration
                running[i] = rec
                heapq.heappush(events, (rec.end, 0, seq, i))
                rec.finish_seq = seq
                seq += 1
                job_events += 1
            if self.progress is not None:
                self.progress(now, done, len(self.jobs))
        stuck = sum(r.placed * r.gpus_each for r in self.waiting.values())
        if horizon is not None and horizon > now:
            self._account(horizon - now)
            now = horizon
        for rec in self.records:
            if rec.tenant is None:
                continue
            fig = self.tenants[rec.tenant]
            if rec.first_start is not None:
                fig.started += 1
                fig.waits.append(rec.first_start - rec.job.arrival)
            if rec.done and rec.end is not None:
                fig.jcts.append(rec.end - rec.job.arrival)
        return ReplayResult(
            policy=self.policy,
            start=self.jobs[0].arrival if self.jobs else 0.0,
            end=now,
            gpus=len(fleet_gpus(self.sim.state)),
            incomplete_gpu_seconds=self.incomplete,
            busy_gpu_seconds=self.busy,
            idle_while_waiting_gpu_seconds=self.idle_waiting,
            tenants=dict(sorted(self.tenants.items())),
            not_started=sum(1 for r in self.records if r.first_start is None),
            stuck_gpus=stuck,
            lost_gpu_seconds=self.lost,
            broken_gpu_seconds=self.broken,
            out_gpu_seconds=self.out,
            faults=self.faults,
            fatal_faults=self.fatal_faults,
            restarts=self.restarts,
            unfinished=sum(1 for r in self.records if not r.done)
            + len(self.jobs)
            - len(self.records),
        )
