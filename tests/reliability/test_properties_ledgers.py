"""Property tests of the two ledgers (issue 8, part 2).

* Reservation ledger (``webhook.reservations``): under any interleaving of admit
  (check-then-reserve through ``ReservingView``, as ``review.admit`` does), watch (the
  informer releases a reservation as the pod appears), delete, retry and expire, a tenant
  never holds more than its limit, and the per-tenant totals equal the sum of the live
  entries.
* Device ledger (``ClusterState.bind/unbind``): random binds of well-formed device
  choices (from ``choose_devices``), unbinds and node removals keep every device within
  [0, 1000] milli-GPU, and unbinding restores the devices exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fairshare.resources import GPU, ResourceIndex
from fairshare.state.cluster import MILLI_GPU, ClusterState, StateError
from tests.reliability.conftest import FUZZ_CASES
from webhook.reservations import PodKey, ReservationLedger, ReservingView, pod_key

TENANTS = ("a", "b")
LIMIT = {"a": {GPU: Fraction(4), "cpu": Fraction(8)}, "b": {GPU: Fraction(2)}}
TTL = 30.0
STATEFUL = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class Watched:
    """The informer's view: usage of the pods it has seen, by tenant."""

    def __init__(self) -> None:
        self.pods: dict[PodKey, tuple[str, dict[str, Fraction]]] = {}

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        return {}

    def tenant_usage(self, tenant: str) -> Mapping[str, Fraction]:
        out: dict[str, Fraction] = {}
        for owner, amounts in self.pods.values():
            if owner == tenant:
                for k, v in amounts.items():
                    out[k] = out.get(k, Fraction(0)) + v
        return out

    def tenant_namespaces(self, tenant: str) -> Sequence[str]:
        return (tenant,)

    def max_device_memory(self) -> int | None:
        return None


def _sum(items: list[Mapping[str, Fraction]]) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for amounts in items:
        for k, v in amounts.items():
            out[k] = out.get(k, Fraction(0)) + v
    return {k: v for k, v in out.items() if v}


# Zero amounts included, and fractions no float holds exactly (1/3 GPU, 7/10 CPU).
amounts_st = st.fixed_dictionaries(
    {GPU: st.fractions(min_value=0, max_value=3, max_denominator=12)},
    optional={"cpu": st.fractions(min_value=0, max_value=6, max_denominator=10)},
)


class ReservationMachine(RuleBasedStateMachine):
    keys = Bundle("keys")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = ReservationLedger(ttl=TTL)
        self.watched = Watched()
        self.now = 0.0
        self.live: dict[PodKey, tuple[str, dict[str, Fraction], float]] = {}
        self.serial = 0

    def _admit(self, key: PodKey, tenant: str, amounts: dict[str, Fraction]) -> bool:
        # What review.admit does: expire, view = watched + reservations except this key's
        # own (a retry), check every limited resource, reserve without awaiting.
        self.ledger.expire(self.now)
        self._model_expire()
        view = ReservingView(self.watched, self.ledger, exclude=key)
        usage = view.tenant_usage(tenant)
        for name, limit in LIMIT[tenant].items():
            if usage.get(name, Fraction(0)) + amounts.get(name, Fraction(0)) > limit:
                return False
        self.ledger.reserve(key=key, tenant=tenant, amounts=amounts, now=self.now)
        self.live[key] = (tenant, dict(amounts), self.now + TTL)
        return True

    def _model_expire(self) -> None:
        for key in [k for k, (_, _, exp) in self.live.items() if exp <= self.now]:
            del self.live[key]

    @rule(target=keys, tenant=st.sampled_from(TENANTS), amounts=amounts_st)
    def create(self, tenant: str, amounts: dict[str, Fraction]) -> PodKey:
        self.serial += 1
        key = pod_key(tenant, f"p{self.serial}")
        FUZZ_CASES["property/reservation-ops"] += 1
        self._admit(key, tenant, amounts)
        return key

    @rule(key=keys, amounts=amounts_st)
    def retry(self, key: PodKey, amounts: dict[str, Fraction]) -> None:
        if key in self.watched.pods:
            return
        tenant = key.split("/")[0]
        FUZZ_CASES["property/reservation-ops"] += 1
        if not self._admit(key, tenant, amounts) and key in self.live:
            pass  # a refused retry leaves the earlier reservation as it was

    @rule(key=keys)
    def watch(self, key: PodKey) -> None:
        held = self.ledger.release(key)
        FUZZ_CASES["property/reservation-ops"] += 1
        model = self.live.pop(key, None)
        assert (held is None) == (model is None)
        if held is not None:
            self.watched.pods[key] = (held.tenant, dict(held.amounts))

    @rule(key=keys)
    def delete(self, key: PodKey) -> None:
        FUZZ_CASES["property/reservation-ops"] += 1
        self.watched.pods.pop(key, None)

    @rule(dt=st.floats(min_value=0, max_value=TTL * 1.5, allow_nan=False))
    def tick(self, dt: float) -> None:
        FUZZ_CASES["property/reservation-ops"] += 1
        self.now += dt
        dropped = self.ledger.expire(self.now)
        before = set(self.live)
        self._model_expire()
        assert {r.key for r in dropped} == before - set(self.live)

    @invariant()
    def never_over_the_limit(self) -> None:
        for tenant in TENANTS:
            watched = self.watched.tenant_usage(tenant)
            reserved = self.ledger.reserved(tenant)
            for name, limit in LIMIT[tenant].items():
                total = watched.get(name, Fraction(0)) + reserved.get(name, Fraction(0))
                assert total <= limit, (tenant, name, total, limit)

    @invariant()
    def totals_are_the_sum_of_live_entries(self) -> None:
        assert len(self.ledger) == len(self.live)
        for tenant in TENANTS:
            want = _sum([amounts for t, amounts, _ in self.live.values() if t == tenant])
            assert dict(self.ledger.reserved(tenant)) == want
        assert set(self.ledger.tenants()) <= set(TENANTS)


TestReservationLedger = ReservationMachine.TestCase
TestReservationLedger.settings = STATEFUL


# --------------------------------------------------------------------------- devices

INDEX = ResourceIndex((GPU, "cpu", "memory"))
EXACT = {
    float(f): f
    for f in (
        *map(Fraction, (1000, 500, 250, 100, 50, 750, 150)),  # fractionStep 0.05 multiples
        *(Fraction(1000, 3), Fraction(2000, 3), Fraction(1000, 7), Fraction(3000, 7)),
        Fraction(MILLI_GPU * 10240, 81559),  # a memory request over the device's memory
    )
}
"""Shares of a device in milli-GPU (a third of a GPU, MIG sevenths, 10 GiB of an 80 GiB
device): floats that hold exactly and floats that do not, each with the rational it
stands for."""
FRACTIONS = list(EXACT)


def _held(state: ClusterState, node: str, dev: int) -> Fraction:
    """What the bound pods hold on one device, exactly (the model's side: summed from the
    rationals the shares stand for, never recovered from the ledger's floats; a rest such
    as 1000 - 1000/3 - 10240000/81559 has a denominator of 244,677, which no float-to-
    rational rounding with a bound below it recovers)."""
    return sum(
        (EXACT[m] for p in state.pods.values() if p.node == node for k, m in p.devices if k == dev),
        Fraction(0),
    )


def _devices_ok(state: ClusterState) -> None:
    for i in range(state.n_nodes):
        for v in state.node_devices(i):
            assert v == -1.0 or 0.0 <= v <= MILLI_GPU, state.node_devices(i)


class DeviceMachine(RuleBasedStateMachine):
    pods = Bundle("pods")

    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState(INDEX)
        self.serial = 0
        self.names = 0
        self.gpus: dict[str, int] = {}

    @initialize(count=st.integers(1, 3), gpus=st.lists(st.integers(0, 8), min_size=3, max_size=3))
    def nodes(self, count: int, gpus: list[int]) -> None:
        for k in range(count):
            self.add_node(f"n{k}", gpus[k])

    def add_node(self, name: str, gpus: int) -> None:
        self.state.add_node(name, {GPU: Fraction(gpus), "cpu": Fraction(64)})
        self.gpus[name] = gpus

    @precondition(lambda self: len(self.gpus) < 4)
    @rule(gpus=st.integers(0, 8))
    def new_node(self, gpus: int) -> None:
        # A fresh name each time: len(gpus) + serial could repeat a live node's name,
        # which re-adds (resizes) that node instead of adding one.
        self.names += 1
        self.add_node(f"new{self.names}", gpus)

    @rule(
        target=pods,
        node=st.integers(0, 3),
        milli=st.sampled_from(FRACTIONS),
        count=st.integers(0, 4),  # 0: a pod without a GPU
        pick=st.sampled_from(["best", "first", "last"]),
    )
    def bind(self, node: int, milli: float, count: int, pick: str) -> str:
        FUZZ_CASES["property/device-ops"] += 1
        self.serial += 1
        uid = f"u{self.serial}"
        if not self.state.n_nodes:
            return uid
        i = node % self.state.n_nodes
        name = self.state.nodes[i].name
        devs = self.state.node_devices(i)
        if milli >= MILLI_GPU:
            fitting = [k for k, v in enumerate(devs) if v >= MILLI_GPU]
        else:
            count = min(count, 1)
            fitting = [k for k, v in enumerate(devs) if v >= milli]
        if pick == "best":
            fitting.sort(key=lambda k: devs[k])
        elif pick == "last":
            fitting.reverse()
        chosen = tuple((k, milli) for k in fitting[:count])
        if len(chosen) < count:
            return uid
        before = {k: _held(self.state, name, k) for k, _ in chosen}
        row = [sum(m for _, m in chosen), 1000.0, 0.0]
        self.state.bind(uid=uid, node=name, row=row, devices=chosen, tenant="t")
        after = self.state.node_devices(i)
        for k, m in chosen:
            # Shares are held exactly: the device keeps the float of its exact rest.
            assert after[k] == float(MILLI_GPU - before[k] - EXACT[m])
        return uid

    @rule(
        target=pods, node=st.integers(0, 3), dev=st.integers(0, 8), milli=st.sampled_from(FRACTIONS)
    )
    def bind_unchecked(self, node: int, dev: int, milli: float) -> str:
        # A device index or share the node cannot hold must be refused, not recorded.
        FUZZ_CASES["property/device-ops"] += 1
        self.serial += 1
        uid = f"x{self.serial}"
        if not self.state.n_nodes:
            return uid
        name = self.state.nodes[node % self.state.n_nodes].name
        with contextlib.suppress(StateError):
            self.state.bind(uid=uid, node=name, row=[milli, 0.0, 0.0], devices=[(dev, milli)])
        return uid

    @rule(uid=pods)
    def unbind(self, uid: str) -> None:
        FUZZ_CASES["property/device-ops"] += 1
        pod = self.state.pods.get(uid)
        if pod is None:
            assert self.state.unbind(uid) is None
            return
        i = self.state.node_index[pod.node]
        before = {k: _held(self.state, pod.node, k) for k, _ in pod.devices}
        self.state.unbind(uid)
        after = self.state.node_devices(i)
        for k, m in pod.devices:
            assert after[k] == float(MILLI_GPU - before[k] + EXACT[m])

    @precondition(lambda self: self.state.n_nodes > 0)
    @rule(node=st.integers(0, 3))
    def remove_node(self, node: int) -> None:
        FUZZ_CASES["property/device-ops"] += 1
        name = self.state.nodes[node % self.state.n_nodes].name
        gone = self.state.remove_node(name)
        assert all(p.node == name for p in gone)
        assert not any(p.node == name for p in self.state.pods.values())
        del self.gpus[name]

    @invariant()
    def devices_in_range(self) -> None:
        _devices_ok(self.state)

    @invariant()
    def devices_match_the_pods(self) -> None:
        # free share of each device == 1000 - what the bound pods hold on it
        for i, info in enumerate(self.state.nodes):
            held = [Fraction(0)] * self.state.max_dev
            for p in self.state.pods.values():
                if p.node == info.name:
                    for k, m in p.devices:
                        held[k] += EXACT[m]
            for k, v in enumerate(self.state.node_devices(i)):
                if k < self.gpus[info.name]:
                    assert v == float(MILLI_GPU - held[k])  # exact: no float residue
                else:
                    # An absent slot stays absent (-1). A pod bound to a device that
                    # vanished (the node came back with fewer GPUs) still holds it in its
                    # record: the pod is still running there, and unbinding it must not
                    # revive the slot.
                    assert v == -1.0

    def teardown(self) -> None:
        # Unbinding everything gives every device back exactly (no float residue).
        for uid in list(self.state.pods):
            self.state.unbind(uid)
        for i, info in enumerate(self.state.nodes):
            n = self.gpus[info.name]
            assert self.state.node_devices(i)[:n] == [MILLI_GPU] * n


TestDeviceLedger = DeviceMachine.TestCase
TestDeviceLedger.settings = STATEFUL

# A memory share of an 81,559-MiB device (denominator 81,559) beside a third of the same
# device leaves a rest of denominator 244,677. The ledger keeps that rest exactly; a model
# that recovered it from the device's float (limit_denominator(100_000)) was off by ~2e-10
# milli once a 500 followed (41.1133862193831 == 41.11338621921336 failed on three seeds
# in four). Pinned as the steps hypothesis found, since a state machine takes no @example.
MEMORY_SHARE = float(Fraction(MILLI_GPU * 10240, 81559))


@pytest.mark.parametrize(
    "order", [(1000 / 3, MEMORY_SHARE, 500.0), (MEMORY_SHARE, 1000 / 3, 500.0)]
)
def test_device_ledger_third_then_memory_share_then_half(order: tuple[float, ...]) -> None:
    machine = DeviceMachine()
    machine.nodes(count=1, gpus=[1, 0, 0])
    uids = [machine.bind(node=0, milli=m, count=1, pick="best") for m in order]
    machine.devices_in_range()
    machine.devices_match_the_pods()
    assert machine.state.node_devices(0)[0] == float(MILLI_GPU - sum(EXACT[m] for m in order))
    for uid in uids:
        machine.unbind(uid)
        machine.devices_match_the_pods()
    machine.teardown()


def fresh(gpus: int = 2) -> ClusterState:
    state = ClusterState(INDEX)
    state.add_node("n", {GPU: Fraction(gpus), "cpu": Fraction(8)})
    return state


def test_bind_refuses_the_same_device_twice():
    state = fresh()
    with pytest.raises(StateError):
        state.bind(uid="a", node="n", row=[1200.0, 0, 0], devices=[(0, 600.0), (0, 600.0)])
    _devices_ok(state)


def test_bind_refuses_a_negative_share():
    state = fresh()
    with pytest.raises(StateError):
        state.bind(uid="b", node="n", row=[0.0, 0, 0], devices=[(1, -500.0)])
    _devices_ok(state)


def test_shrinking_a_node_under_a_pod_does_not_leak_a_device():
    state = fresh(2)
    state.bind(uid="c", node="n", row=[1000.0, 0, 0], devices=[(1, 1000.0)])
    state.add_node("n", {GPU: Fraction(1), "cpu": Fraction(8)})
    state.unbind("c")
    assert state.node_devices(0)[:2] == [1000.0, -1.0]
    state.add_node("n", {GPU: Fraction(2), "cpu": Fraction(8)})
    assert state.node_devices(0)[:2] == [1000.0, 1000.0]


def test_unbind_restores_fractional_shares_exactly():
    state = fresh(1)
    state.bind(uid="p", node="n", row=[2000 / 7, 0, 0], devices=[(0, 2000 / 7)])
    state.bind(uid="q", node="n", row=[3000 / 7, 0, 0], devices=[(0, 3000 / 7)])
    state.unbind("p")
    state.unbind("q")
    assert state.node_devices(0)[0] == MILLI_GPU


def test_reserved_excluding_a_zero_amount_reservation():
    ledger = ReservationLedger(ttl=TTL)
    key = pod_key("a", "p")
    ledger.reserve(key=key, tenant="a", amounts={GPU: Fraction(0)}, now=0.0)
    assert dict(ledger.reserved("a", exclude=key)) == {}
