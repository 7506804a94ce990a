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
usage stays at or above the GPU guarantee. In a tree of tenants the same rule holds at
every level: the victim's tenant and each of its ancestors (usage over the subtree).
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
    ancestors: Mapping[str, Sequence[str]] | None = None,
) -> tuple[str, ...]:
    """UIDs of the victims that may be evicted on one node (see the module docstring).

    In a tree of tenants, ``ancestors`` maps a tenant to its parent, grandparent, ...;
    each of them is a level whose guarantee is protected too, with ``usage`` of the level
    being its whole subtree's (the preemptor counts for every level it belongs to).
    """
    up = ancestors or {}
    taken: dict[str, list[float]] = {}
    kept: list[str] = []
    pre_levels = (
        () if preemptor_tenant is None else (preemptor_tenant, *up.get(preemptor_tenant, ()))
    )
    for v in victims:
        if v.tenant is None:
            kept.append(v.uid)
            continue
        levels = [lv for lv in (v.tenant, *up.get(v.tenant, ())) if guaranteed.get(lv)]
        ok = True
        for level in levels:
            floor = guaranteed[level]
            have = usage.get(level, ())
            gone = taken.get(level, [0.0] * len(v.row))
            for col, minimum in floor.items():
                if col >= len(v.row) or v.row[col] <= 0:
                    continue
                after = (have[col] if col < len(have) else 0.0) - gone[col] - v.row[col]
                if level in pre_levels and col < len(preemptor_row):
                    after += preemptor_row[col]
                if after < minimum - EPS * max(1.0, minimum):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            for level in levels:
                gone = taken.setdefault(level, [0.0] * len(v.row))
                for k, x in enumerate(v.row):
                    gone[k] += x
            kept.append(v.uid)
    return tuple(kept)
