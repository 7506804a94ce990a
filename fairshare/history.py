"""Fairness with memory: per-tenant usage history decayed with a half-life ``T`` (opt-in,
``usageHistory``; without it nothing here is called). Times are numbers the caller owns.

For each tenant and DRF column the history keeps resource-seconds, each second weighted by
``2^(-age/T)``, and the same for the capacity; ``advance`` integrates exactly over an
interval of constant usage (``H ← H·d + u·(1 - d)·T/ln 2``, ``d = 2^(-Δt/T)``). A
tenant's decayed usage share is ``U = max_r H[r] / C[r]`` over the columns of weight > 0
(a tenant with children holds its subtree's); its weighted share ``W`` is its weight over
the weights of its siblings with demand (itself included), times its parent's ``W``. A
tenant with ``U > W`` has its weight multiplied by ``max(minWeightFactor, W / (W + k·(U -
W)))`` at every level of a tree, and everything that reads tenant weights runs on the
adjusted ones (``adjusted_config``). docs/usage-history.md compares this with other
schedulers' fair-share history.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fairshare import recovery
from fairshare.config.schema import FairShareConfig, Tenant, UsageHistory

LN2 = math.log(2.0)


@dataclass
class History:
    """Decayed resource-seconds per tenant and of the capacity, at time ``at``.

    Rows are in the columns of ``resources`` (kernel units × seconds)."""

    half_life: float
    resources: tuple[str, ...]
    at: float | None = None
    usage: dict[str, list[float]] = field(default_factory=dict)
    capacity: list[float] = field(default_factory=list)
    forgiven: dict[str, float] = field(default_factory=dict)
    """Pod uid -> loss time of the runs already taken back out (``forgive``), so that a
    new leader reading this history back does not forgive them twice."""

    def __post_init__(self) -> None:
        if not self.half_life > 0:
            raise ValueError("half_life must be > 0")
        if not self.capacity:
            self.capacity = [0.0] * len(self.resources)

    def advance(
        self,
        now: float,
        used: Mapping[str, Sequence[float]],
        capacity: Sequence[float],
    ) -> None:
        """Account the interval since ``at`` with ``used`` and ``capacity`` constant over
        it (the first call only sets the clock). A clock that goes back is ignored."""
        if self.at is None or now <= self.at:
            self.at = now if self.at is None else max(self.at, now)
            return
        dt = now - self.at
        d = 0.5 ** (dt / self.half_life)
        gain = (1.0 - d) * self.half_life / LN2
        for row in self.usage.values():
            for k in range(len(row)):
                row[k] *= d
        for name, u in used.items():
            row = self.usage.setdefault(name, [0.0] * len(self.resources))
            for k, v in enumerate(u):
                row[k] += v * gain
        for k, v in enumerate(capacity):
            self.capacity[k] = self.capacity[k] * d + v * gain
        # Forget tenants whose history has decayed to nothing (a departed tenant).
        for name in [n for n, row in self.usage.items() if _faded(row, self.capacity)]:
            del self.usage[name]
        self.at = now

    def forgive(
        self, key: str, tenant: str, row: Sequence[float], start: float, end: float
    ) -> list[float]:
        """Take back out of ``tenant``'s history what holding ``row`` from ``start`` to
        ``end`` weighs now (``recovery.forgiven``), each column floored at 0; once per
        ``key`` (a pod uid). Returns what was taken. The capacity history is unchanged:
        the capacity was there."""
        if key in self.forgiven or self.at is None:
            return [0.0] * len(row)
        self.forgiven[key] = end
        have = self.usage.get(tenant)
        if have is None:
            return [0.0] * len(row)
        weigh = recovery.forgiven(row, start, end, self.at, self.half_life)
        taken = []
        for k, v in enumerate(weigh[: len(have)]):
            cut = min(have[k], max(0.0, v))
            have[k] -= cut
            taken.append(cut)
        return taken

    def prune_forgiven(self, keep: float) -> None:
        """Forget the forgiven runs lost more than ``keep`` seconds before ``at``."""
        if self.at is None:
            return
        at = self.at
        self.forgiven = {k: t for k, t in self.forgiven.items() if at - t <= keep}

    def usage_share(self, rows: Sequence[float], res_weights: Sequence[float]) -> float:
        """Dominant decayed share of ``rows`` over the resources with weight > 0."""
        best = 0.0
        for h, c, w in zip(rows, self.capacity, res_weights, strict=False):
            if w > 0 and c > 0:
                best = max(best, h / c)
        return best

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (``from_dict`` reads it back), keyed by resource name."""
        return {
            "halfLifeSeconds": self.half_life,
            "at": self.at,
            "capacity": dict(zip(self.resources, self.capacity, strict=True)),
            "tenants": {
                t: dict(zip(self.resources, row, strict=True))
                for t, row in sorted(self.usage.items())
            },
            **({"forgiven": dict(sorted(self.forgiven.items()))} if self.forgiven else {}),
        }

    @staticmethod
    def from_dict(
        data: Mapping[str, Any], *, half_life: float, resources: Sequence[str]
    ) -> History:
        """Read ``to_dict``'s form into the given columns (a resource no longer listed is
        dropped, a new one starts at 0). The configured half-life applies from now on."""
        h = History(half_life=half_life, resources=tuple(resources))
        at = data.get("at")
        h.at = float(at) if isinstance(at, int | float) else None
        cap = data.get("capacity") or {}
        h.capacity = [float(cap.get(r, 0.0)) for r in h.resources]
        for t, row in (data.get("tenants") or {}).items():
            h.usage[str(t)] = [float(row.get(r, 0.0)) for r in h.resources]
        done = data.get("forgiven")
        if isinstance(done, Mapping):
            h.forgiven = {
                str(k): float(v)
                for k, v in done.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
        return h


def _faded(row: Sequence[float], capacity: Sequence[float]) -> bool:
    """A history row below 1e-9 of the capacity history on every column."""
    return all(v <= 1e-9 * max(c, 1.0) for v, c in zip(row, capacity, strict=False))


@dataclass(frozen=True)
class TenantHistory:
    """How the history judges one tenant now."""

    usage_share: float  # U: decayed dominant usage share of the cluster
    weighted_share: float  # W: weight over the demanding tenants' (0 without demand)
    factor: float  # f: what its weight is multiplied by (1 = unchanged)


def subtree_rows(
    rows: Mapping[str, Sequence[float]], config: FairShareConfig, width: int
) -> dict[str, list[float]]:
    """Per tenant, its row plus its subtree's (tree configs); flat: the rows as they are."""
    out = {n: list(r) for n, r in rows.items()}
    if not config.is_hierarchical():
        return out
    for t in config.tenants:
        total = [0.0] * width
        for member in config.subtree(t.name):
            for k, v in enumerate(rows.get(member, ())):
                total[k] += v
        out[t.name] = total
    return out


def assess(
    history: History,
    config: FairShareConfig,
    demand: Mapping[str, Sequence[float]],
    *,
    policy: UsageHistory,
) -> dict[str, TenantHistory]:
    """Every tenant with history or demand: U, W and the factor on its weight."""
    width = len(history.resources)
    res_weights = config.resource_weights()
    want = subtree_rows(demand, config, width)
    used = subtree_rows(history.usage, config, width)
    weights = {t.name: float(t.weight) for t in config.all_tenants()}
    parents = {t.name: t.parent for t in config.all_tenants()}
    for name in list(want) + list(used):
        weights.setdefault(name, 1.0)
        parents.setdefault(name, None)
    demanding = {n for n, r in want.items() if any(v > 0 for v in r)}
    # W top-down: a tenant's share among its demanding siblings, times its parent's W.
    share: dict[str, float] = {}

    def weighted(name: str, seen: frozenset[str] = frozenset()) -> float:
        if name in share:
            return share[name]
        if name not in demanding:
            share[name] = 0.0
            return 0.0
        p = parents.get(name)
        if p is not None and (p not in weights or p in seen):
            p = None
        sibs = [n for n in demanding if parents.get(n) == p or (p is None and _top(n, parents))]
        total = sum(weights[n] for n in sibs)
        up = 1.0 if p is None else weighted(p, seen | {name})
        share[name] = up * weights[name] / total if total > 0 else 0.0
        return share[name]

    k = policy.strength
    floor = policy.min_weight_factor
    out: dict[str, TenantHistory] = {}
    for name in sorted(set(weights) & (set(used) | demanding)):
        u = history.usage_share(used.get(name, ()), res_weights)
        w = weighted(name)
        f = 1.0
        if w > 0 and u > w:
            f = max(floor, w / (w + k * (u - w)))
        out[name] = TenantHistory(u, w, f)
    return out


def _top(name: str, parents: Mapping[str, str | None]) -> bool:
    p = parents.get(name)
    return p is None or p not in parents


def weight_factors(assessed: Mapping[str, TenantHistory]) -> dict[str, float]:
    """The factors below 1 (the tenants whose weight the history lowers)."""
    return {n: a.factor for n, a in assessed.items() if a.factor < 1.0}


def adjusted_config(config: FairShareConfig, factors: Mapping[str, float]) -> FairShareConfig:
    """``config`` with each tenant's weight multiplied by its factor (the implicit default
    tenant is declared when its weight changes). The same object when nothing changes,
    so callers that cache on the config keep their caches."""
    changed = {n: f for n, f in factors.items() if f != 1.0 and config.tenant(n) is not None}
    if not changed:
        return config
    tenants: list[Tenant] = []
    for t in config.all_tenants():
        f = changed.get(t.name)
        if f is None and t not in config.tenants:
            continue  # the implicit default tenant stays implicit when unchanged
        tenants.append(t if f is None else t.model_copy(update={"weight": t.weight * f}))
    return config.model_copy(update={"tenants": tuple(tenants)})


HISTORY_CONFIGMAP: Final = "fairshare-usage-history"
"""The ConfigMap (in the config's namespace) the extender's leader keeps the history in."""
HISTORY_KEY: Final = "history.json"
"""Its data key: ``History.to_dict`` as JSON."""


def judge_recorded(
    config: FairShareConfig,
    data: Mapping[str, Any],
    *,
    now: float,
    demand: Mapping[str, Sequence[float]],
) -> tuple[FairShareConfig, dict[str, TenantHistory]]:
    """The config the extender decides with, from a recorded history (``to_dict``'s form,
    decayed from its time to ``now`` with no usage added, as a new leader starts) and the
    demand now: weights adjusted by the factors rounded to 1 % as the extender rounds
    them. ``config`` itself when ``usageHistory`` is off."""
    policy = config.usage_history
    if policy is None:
        return config, {}
    names = config.resource_names()
    h = History.from_dict(data, half_life=policy.half_life_seconds(), resources=names)
    if h.at is not None and now > h.at:
        h.advance(now, {}, [0.0] * len(names))
    assessed = assess(h, config, demand, policy=policy)
    factors = rounded_factors(assessed, policy.min_weight_factor)
    return adjusted_config(config, factors), assessed


def rounded_factors(assessed: Mapping[str, TenantHistory], floor: float) -> dict[str, float]:
    """The factors below 1 rounded to 1 % (the adjusted config, and the caches keyed on it,
    change only when a factor moves by that much), never below ``floor``."""
    return {
        n: max(floor, round(f, 2)) for n, f in weight_factors(assessed).items() if round(f, 2) < 1.0
    }


class Keeper:
    """The history of one config's tenants and the config it makes (``usageHistory`` on).

    ``step`` folds in the interval since the last step (usage and capacity constant over
    it), judges every tenant against ``demand`` and returns the config with the adjusted
    weights: the same object as long as the factors do not change."""

    def __init__(self, config: FairShareConfig, resources: Sequence[str]) -> None:
        policy = config.usage_history
        if policy is None:
            raise ValueError("usageHistory is not configured")
        self.base, self.policy = config, policy
        self.history = History(policy.half_life_seconds(), tuple(resources))
        self.assessed: dict[str, TenantHistory] = {}
        self.config = config
        self._factors: dict[str, float] = {}

    def step(
        self,
        now: float,
        used: Mapping[str, Sequence[float]],
        capacity: Sequence[float],
        demand: Mapping[str, Sequence[float]],
    ) -> FairShareConfig:
        self.history.advance(now, used, capacity)
        self.assessed = assess(self.history, self.base, demand, policy=self.policy)
        factors = weight_factors(self.assessed)
        if factors != self._factors:
            self._factors = factors
            self.config = adjusted_config(self.base, factors)
        return self.config
