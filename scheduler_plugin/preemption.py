"""Preemption veto: never evict a tenant below its ``guaranteed`` amounts.

Pure: no network, no clock. Must not import aiohttp, kubernetes_asyncio or
prometheus_client.

Rule, per candidate node (kube-scheduler picks one node, so nodes are judged one by one):
walk the proposed victims in the order the scheduler sent them; a victim of tenant t is
kept when, on every resource column r that the victim holds (``row[r] > 0``) and that t
guarantees, t's usage after evicting it and the victims of t already kept is still at
least ``guaranteed[r]``:

    usage_t[r] - Σ kept_t[r] - victim[r] + (preemptor[r] if preemptor is in t) >= guaranteed_t[r]

Otherwise the victim is dropped. The preemptor's own demand counts for its tenant, so a
tenant may replace its own pods. Victims whose tenant has no guarantee, and pods the state
does not know (a tenant cannot be told), are kept: the veto only protects guarantees it
can prove. Resources that the victim does not hold cannot fall by evicting it, so a
tenant already under its guarantee on CPU can still lose a GPU-only pod if its GPU
usage stays at or above the GPU guarantee.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

EPS = 1e-9


@dataclass(frozen=True)
class Victim:
    """A proposed victim: its UID, tenant (None if unknown) and kernel row."""

    uid: str
    tenant: str | None
    row: tuple[float, ...]


def protect_guaranteed(
    victims: Sequence[Victim],
    *,
    usage: Mapping[str, Sequence[float]],
    guaranteed: Mapping[str, Mapping[int, float]],
    preemptor_tenant: str | None,
    preemptor_row: Sequence[float],
) -> tuple[str, ...]:
    """UIDs of the victims that may be evicted on one node (see the module docstring)."""
    taken: dict[str, list[float]] = {}
    kept: list[str] = []
    for v in victims:
        floor = guaranteed.get(v.tenant or "") if v.tenant is not None else None
        if not floor:
            kept.append(v.uid)
            continue
        assert v.tenant is not None
        have = usage.get(v.tenant, ())
        gone = taken.setdefault(v.tenant, [0.0] * len(v.row))
        ok = True
        for col, minimum in floor.items():
            if col >= len(v.row) or v.row[col] <= 0:
                continue
            after = (have[col] if col < len(have) else 0.0) - gone[col] - v.row[col]
            if v.tenant == preemptor_tenant and col < len(preemptor_row):
                after += preemptor_row[col]
            if after < minimum - EPS * max(1.0, minimum):
                ok = False
                break
        if ok:
            for k, x in enumerate(v.row):
                gone[k] += x
            kept.append(v.uid)
    return tuple(kept)
