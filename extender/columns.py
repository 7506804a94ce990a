"""A config swap that changes the resource columns, followed live by the cache: the first
read of ``Cache.state`` after it rebuilds the whole cache in a fresh one and takes over
its fields only once complete, so no verb sees old columns with the new config. Dropped
or reordered columns cut every row down exactly; a new column reads the pods again,
carrying over the binds assumed but not yet watched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fairshare import resources
from fairshare.config.schema import FairShareConfig
from fairshare.state import objects
from fairshare.state.cluster import BoundPod, ClusterState

Cache = Any
"""``extender.cache.Cache`` (which imports this module to follow a swap)."""


def follow(cache: Cache, config: FairShareConfig) -> None:
    """Make ``cache`` hold ``config``'s columns (and its DRA classes and capacity)."""
    if config.resource_names() == cache._state.index.names:
        before = cache._columns_of
        cache._columns_of = config
        cache._declare_capacity(config)
        moved = before is not None and (before.dra, before.mig) != (config.dra, config.mig)
        if moved and cache.claims.resource_slices:
            cache.recount_slices()  # other GPU classes: other DRA capacity
        return
    fresh = _rebuilt(cache, config)
    for f in dataclasses.fields(cache):
        setattr(cache, f.name, getattr(fresh, f.name))


def _rebind(state: ClusterState, held: BoundPod, row: Sequence[float]) -> None:
    state.bind(
        uid=held.uid,
        node=held.node,
        row=row,
        devices=held.devices,
        tenant=held.tenant,
        name=held.name,
        allow_overcommit=True,
        mig=held.mig,
        group=held.group,
    )


def _annotations(pod: dict[str, Any]) -> dict[str, Any]:
    ann = (pod.get("metadata") or {}).get("annotations")
    return ann if isinstance(ann, dict) else {}


def _rebuilt(old: Cache, config: FairShareConfig) -> Cache:
    fresh = type(old)(lambda: config, mix_every=old.mix_every, clock=old.clock)
    fresh.namespace_labels = {k: dict(v) for k, v in old.namespace_labels.items()}
    ledger, new_ledger = old.claims, fresh.claims
    new_ledger.resource_claims = dict(ledger.resource_claims)
    new_ledger.claim_objects = dict(ledger.claim_objects)
    new_ledger.claim_held = dict(ledger.claim_held)
    new_ledger.resource_slices = ledger.resource_slices
    new_ledger.device_classes = ledger.device_classes
    new_ledger.taint_rules = ledger.taint_rules
    fresh.recount_slices()  # no node known yet: only the counts
    fresh.on_resync("Node", list(old.nodes.values()))
    was, now = old._state, fresh._state
    if all(was.index.has(name) for name in now.index.names):
        _project(old, fresh)
    else:
        _replay(old, fresh)
    if new_ledger.claim_pods:
        new_ledger.recount_usage(fresh.state, fresh.writable)
    fresh.volumes.volume_claims = dict(old.volumes.volume_claims)
    fresh.volumes.recount(fresh.state, fresh.writable, config, fresh.namespace_labels)
    fresh._gone = old._gone
    fresh.reservations = dict(old.reservations)
    fresh.on_change = old.on_change
    for gid, shared in was.groups.items():
        if shared.closed:
            fresh.close_group(gid)
    fresh.config = old.config
    fresh._columns_of = config
    return fresh


def _project(old: Cache, fresh: Cache) -> None:
    was, now = old._state, fresh._state
    cols = [was.index.column(name) for name in now.index.names]

    def cut(row: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(row[c] for c in cols)

    for held in was.pods.values():
        if held.node in now.node_index:
            _rebind(now, held, cut(held.row))
    fresh.pods = dict(old.pods)
    fresh.held_room = set(old.held_room)
    fresh._group_of = dict(old._group_of)
    fresh.pending = {
        uid: dataclasses.replace(req, row=cut(req.row)) for uid, req in old.pending.items()
    }
    fresh.class_keys = dict(old.class_keys)  # (CPU amount, GPU shape): no column in it
    fresh.unreadable = {**old.unreadable, **fresh.unreadable}
    fresh.claims.claim_pods = dict(old.claims.claim_pods)
    fresh.claims.claim_users = {k: set(v) for k, v in old.claims.claim_users.items()}
    fresh.claims.carried = dict(old.claims.carried)
    fresh._memory_uids = set(old._memory_uids)


def _replay(old: Cache, fresh: Cache) -> None:
    pods = list(old.pods.values())
    bound = [p for p in pods if objects.is_bound(p)]
    # Annotated pods first: a guessed placement must not take a device they hold.
    bound.sort(key=lambda p: resources.ANN_GPU_DEVICES not in _annotations(p))
    fresh.on_resync("Pod", bound + [p for p in pods if not objects.is_bound(p)])
    was, now = old._state, fresh._state
    for uid, held in was.pods.items():
        # Assumed binds (accounted at bind, not yet reported by the watch) stay held.
        if uid in now.pods or uid not in old.pods or held.node not in now.node_index:
            continue
        _rebind(now, held, now.index.kernel_vector(was.index.amounts(held.row)))
        fresh.pending.pop(uid, None)
