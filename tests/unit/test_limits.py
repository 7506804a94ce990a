"""A tenant's limits up the tenant tree (``fairshare.limits.check_limits``): the items
level by level, each level over its whole subtree's usage."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction as F

from fairshare.limits import Insufficient, NearLimit, check_limits
from fairshare.resources import CPU, GPU, PodDemand, sum_amounts
from tests.unit.test_webhook_hierarchy import TREE

USAGE = {"a1": {GPU: F(2), CPU: F(1)}, "a2": {GPU: F(1)}}
NAMESPACES = {"a1": ("a1",), "a2": ("a2", "a2-x")}


def usage(members: Sequence[str]) -> dict[str, F]:
    return sum_amounts(USAGE.get(m, {}) for m in members)


def namespaces(members: Sequence[str]) -> list[str]:
    return [ns for m in members for ns in NAMESPACES.get(m, ())]


def test_every_level_counts_its_subtree_tenant_first() -> None:
    got = check_limits(TREE, "a1", PodDemand({GPU: F(2)}), usage, namespaces=namespaces)
    assert got.insufficient == (
        Insufficient("vision", GPU, F(2), F(2), F(3), ("a1",), "team"),
        Insufficient("ml", GPU, F(3), F(2), F(4), ("a1", "a2", "a2-x"), "organisation"),
    )
    assert not got.allowed


def test_near_a_limit_warns_and_unlimited_levels_are_skipped() -> None:
    got = check_limits(TREE, "a1", PodDemand({CPU: F(3)}), usage)
    assert got.allowed and got.near_limit == (NearLimit("ml", CPU, F(4), F(4), "organisation"),)
    assert check_limits(TREE, "b", PodDemand({GPU: F(100)}), usage).allowed


def test_the_caller_may_give_the_limits() -> None:
    def limits(level: str) -> dict[str, F] | None:
        return {GPU: F(1)} if level == "a2" else None

    got = check_limits(TREE, "a2", PodDemand({GPU: F(1)}), usage, limits=limits)
    assert got.insufficient == (Insufficient("a2", GPU, F(1), F(1), F(1), (), "tenant"),)
