"""``SliceBook``: the GPU capacity of a cluster's ResourceSlices, kept up to date slice
event by slice event (only the changed slice's pool is recombined), for the extender's
cache and the webhook.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from fractions import Fraction
from typing import Any

from fairshare.dra.slices import (
    ClassShape,
    DeviceIndex,
    DeviceMatch,
    PoolCount,
    SliceCapacity,
    SliceCount,
    TaintSelector,
    combine_pool,
    count_slice,
    gpu_matches,
    taint_rule_selector,
    taint_rule_warning,
)


class SliceBook:
    """ResourceSlices, DeviceClasses and DeviceTaintRules as they come and go, and the
    ``SliceCapacity`` they give, kept per pool: a slice event counts that slice, combines
    its pool again and updates the totals of that pool's nodes and classes, nothing else
    (a full recount at 5,000 nodes costs 100 times that)."""

    def __init__(
        self,
        slices: dict[str, Any] | None = None,
        classes: dict[str, Any] | None = None,
        rules: dict[str, Any] | None = None,
    ) -> None:
        """``slices``, ``classes``, ``rules``: the caller's dicts of those objects by name
        (shared: the caller edits them, then calls ``recount``)."""
        self.slices: dict[str, Any] = {} if slices is None else slices
        self.classes: dict[str, Any] = {} if classes is None else classes
        self.rules: dict[str, Any] = {} if rules is None else rules
        self.capacity = SliceCapacity({})
        self._setting: tuple[tuple[str, ...], tuple[tuple[str, Fraction], ...]] | None = None
        self._matches: tuple[tuple[str, DeviceMatch], ...] = ()
        self._problems: dict[str, str] = {}
        self._rules: list[TaintSelector] = []
        self._warn_rules: list[TaintSelector] = []
        self._counts: dict[str, SliceCount] = {}
        self._pool_slices: dict[tuple[str, str], set[str]] = {}
        self._pools: dict[tuple[str, str], PoolCount] = {}
        self._node_pools: dict[str, set[tuple[str, str]]] = {}
        self._gpus: dict[str, int] = {}
        self._tainted: dict[str, int] = {}
        self._warned: dict[str, int] = {}
        self._unattributed = 0
        self._shape_refs: dict[str, dict[ClassShape, int]] = {}
        self._shapes: dict[str, tuple[ClassShape, ...]] = {}

    def recount(
        self,
        gpu_classes: Collection[str],
        mig_fractions: Mapping[str, Fraction],
        changed_slice: str | None = None,
    ) -> set[tuple[str, str]] | None:
        """Derive the capacity again after a change; ``changed_slice``: only that slice
        changed (its pool is combined again). Returns the pools whose devices changed,
        or None after a full recount (classes, rules or settings changed)."""
        setting = (tuple(sorted(gpu_classes)), tuple(sorted(mig_fractions.items())))
        if changed_slice is None or setting != self._setting:
            self._setting = setting
            self._matches, self._problems = gpu_matches(self.classes, gpu_classes)
            self._rules = [r for r in map(taint_rule_selector, self.rules.values()) if r]
            self._warn_rules = [r for r in map(taint_rule_warning, self.rules.values()) if r]
            self._counts = {n: count_slice(rs, self._matches) for n, rs in self.slices.items()}
            self._pool_slices = {}
            for name, c in self._counts.items():
                self._pool_slices.setdefault(c.pool, set()).add(name)
            self._pools, self._node_pools = {}, {}
            self._gpus, self._tainted, self._unattributed = {}, {}, 0
            self._warned = {}
            self._shape_refs, self._shapes = {}, {}
            for pool in list(self._pool_slices):
                self._combine(pool, mig_fractions)
            self._publish()
            return None
        touched: set[tuple[str, str]] = set()
        old = self._counts.pop(changed_slice, None)
        if old is not None:
            touched.add(old.pool)
            self._pool_slices.get(old.pool, set()).discard(changed_slice)
        rs = self.slices.get(changed_slice)
        if rs is not None:
            new = count_slice(rs, self._matches)
            self._counts[changed_slice] = new
            self._pool_slices.setdefault(new.pool, set()).add(changed_slice)
            touched.add(new.pool)
        changed = {pool for pool in touched if self._combine(pool, mig_fractions)}
        self._publish()
        return changed

    def _combine(self, pool: tuple[str, str], mig_fractions: Mapping[str, Fraction]) -> bool:
        """Combine ``pool`` again and move the totals; whether its devices changed."""
        before = self._pools.pop(pool, None)
        names = self._pool_slices.get(pool)
        got = None
        if names:
            got = combine_pool(
                (self._counts[n] for n in names), mig_fractions, self._rules, self._warn_rules
            )
            self._pools[pool] = got
        else:
            self._pool_slices.pop(pool, None)
        nodes: set[str] = set()
        for pc, sign in ((before, -1), (got, 1)):
            if pc is None:
                continue
            self._unattributed += sign * pc.unattributed
            for node in {*pc.live, *pc.dead}:
                nodes.add(node)
                held = self._node_pools.setdefault(node, set())
                if sign > 0:
                    held.add(pool)
                else:
                    held.discard(pool)
            for cls, shapes in pc.shapes.items():
                refs = self._shape_refs.setdefault(cls, {})
                for shape in shapes:
                    refs[shape] = refs.get(shape, 0) + sign
                    if refs[shape] <= 0:
                        del refs[shape]
                self._shapes[cls] = tuple(sorted(refs, key=repr))
                if not refs:
                    del self._shape_refs[cls], self._shapes[cls]
        for node in nodes:
            live: set[str] = set()
            dead: set[str] = set()
            warned: set[str] = set()
            for key in self._node_pools.get(node, ()):
                pc = self._pools[key]
                live |= pc.live.get(node, frozenset())
                dead |= pc.dead.get(node, frozenset())
                warned |= pc.warned.get(node, frozenset())
            self._gpus.pop(node, None)
            self._tainted.pop(node, None)
            self._warned.pop(node, None)
            if warned & live:
                self._warned[node] = len(warned & live)
            if live:
                self._gpus[node] = len(live)
            if dead - live:
                self._tainted[node] = len(dead - live)
            if not self._node_pools.get(node):
                self._node_pools.pop(node, None)
        return (before.devices if before else {}) != (got.devices if got else {})

    def _publish(self) -> None:
        self.capacity = SliceCapacity(
            dict(self._gpus),
            dict(self._tainted),
            self._unattributed,
            dict(self._problems),
            DeviceIndex(dict(self._pools)),
            dict(self._shapes),
            dict(self._warned),
        )
