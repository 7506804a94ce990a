"""Tenant quota decisions as ``Insufficient`` items, and the one place they become text."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction as F

import pytest

from fairshare.limits import Insufficient, NearLimit, QuotaDecision, check_quota
from fairshare.resources import CPU, GPU, MEMORY, PodDemand
from webhook.policies import quota

GI = 1024**3
NS = ("nlp-train", "nlp-serve")
SORTED_NS = ("nlp-serve", "nlp-train")


def near(after: F, limit: F, resource: str = GPU) -> NearLimit:
    return NearLimit("nlp", resource, after, limit)


def short(used: F, requested: F, limit: F, resource: str = GPU) -> Insufficient:
    return Insufficient("nlp", resource, used, requested, limit, SORTED_NS)


def check(
    demand: Mapping[str, F], usage: Mapping[str, F], limits: Mapping[str, F] | None
) -> QuotaDecision:
    return check_quota(
        tenant="nlp",
        demand=PodDemand(amounts=dict(demand)),
        usage=usage,
        limits=limits,
        namespaces=NS,
    )


@pytest.mark.parametrize(
    ("demand", "usage", "limits", "insufficient", "near"),
    [
        # 4 + 2 = 6 <= 12, 50 %: nothing to say
        ({GPU: F(2)}, {GPU: F(4)}, {GPU: F(12)}, (), ()),
        # 11 + 2 = 13 > 12
        (
            {GPU: F(2)}, {GPU: F(11)}, {GPU: F(12)},
            (Insufficient("nlp", GPU, F(11), F(2), F(12), SORTED_NS),), (),
        ),
        # 11 + 1 = 12: exactly the limit is allowed, and warned (100 % >= 90 %)
        ({GPU: F(1)}, {GPU: F(11)}, {GPU: F(12)}, (), (NearLimit("nlp", GPU, F(12), F(12)),)),
        # 10.5 + 0.25 = 10.75 < 10.8 = 90 % of 12: no warning
        ({GPU: F(1, 4)}, {GPU: F(21, 2)}, {GPU: F(12)}, (), ()),
        # 10.55 + 0.25 = 10.8 = 90 % of 12: warned
        ({GPU: F(1, 4)}, {GPU: F(211, 20)}, {GPU: F(12)}, (), (near(F(54, 5), F(12)),)),
        # fractions stay exact: 3/7 + 4/7 = 1 <= 1
        ({GPU: F(4, 7)}, {GPU: F(3, 7)}, {GPU: F(1)}, (), (NearLimit("nlp", GPU, F(1), F(1)),)),
        # two resources short, reported in sorted order (cpu before nvidia.com/gpu)
        (
            {GPU: F(2), CPU: F(8)}, {GPU: F(12), CPU: F(60)}, {GPU: F(12), CPU: F(64)},
            (
                Insufficient("nlp", CPU, F(60), F(8), F(64), SORTED_NS),
                Insufficient("nlp", GPU, F(12), F(2), F(12), SORTED_NS),
            ),
            (),
        ),
        # limit 0 means none at all
        ({GPU: F(1, 2)}, {}, {GPU: F(0)}, (short(F(0), F(1, 2), F(0)),), ()),
        # a resource the pod does not request is not checked, even when already over
        ({CPU: F(1)}, {GPU: F(20)}, {GPU: F(12)}, (), ()),
        # a resource missing from limit is unlimited
        ({MEMORY: F(999 * GI)}, {}, {GPU: F(12)}, (), ()),
        # no limit at all
        ({GPU: F(100)}, {GPU: F(100)}, None, (), ()),
    ],
    ids=[
        "fits", "over", "exactly-at-limit", "below-warn-ratio", "at-warn-ratio",
        "exact-sevenths", "two-resources-over", "zero-limit", "unrequested-resource-over",
        "unlimited-resource", "no-limit",
    ],
)  # fmt: skip
def test_check_quota(
    demand: Mapping[str, F],
    usage: Mapping[str, F],
    limits: Mapping[str, F] | None,
    insufficient: tuple[Insufficient, ...],
    near: tuple[NearLimit, ...],
) -> None:
    decision = check(demand, usage, limits)
    assert decision.insufficient == insufficient
    assert decision.near_limit == near
    assert decision.allowed == (not insufficient)


def test_namespaces_are_sorted_and_deduplicated() -> None:
    decision = check_quota(
        tenant="t",
        demand=PodDemand(amounts={GPU: F(1)}),
        usage={},
        limits={GPU: F(0)},
        namespaces=("b", "a", "b"),
    )
    assert decision.insufficient[0].namespaces == ("a", "b")


@pytest.mark.parametrize(
    ("items", "text"),
    [
        (
            [Insufficient("nlp", GPU, F(11), F(2), F(12), SORTED_NS)],
            "tenant nlp would exceed its nvidia.com/gpu limit: 11 used + 2 requested > 12 "
            "(namespaces: nlp-serve, nlp-train)",
        ),
        (
            [Insufficient("cv", GPU, F(15, 4), F(1, 2), F(4), ("cv",))],
            "tenant cv would exceed its nvidia.com/gpu limit: 3.75 used + 0.5 requested > 4 "
            "(namespaces: cv)",
        ),
        (
            [Insufficient("cv", GPU, F(3, 7), F(5, 7), F(1), ())],
            "tenant cv would exceed its nvidia.com/gpu limit: 3/7 used + 5/7 requested > 1 "
            "(namespaces: none)",
        ),
        (
            [
                Insufficient("nlp", CPU, F(125, 2), F(3, 2), F(64), ("a",)),
                Insufficient("nlp", MEMORY, F(60 * GI), F(8 * GI), F(64 * GI), ("a",)),
            ],
            "tenant nlp would exceed its cpu limit: 62500m used + 1500m requested > 64 "
            "(namespaces: a); tenant nlp would exceed its memory limit: 60Gi used + 8Gi "
            "requested > 64Gi (namespaces: a)",
        ),
    ],
    ids=["gpu", "gpu-fraction", "gpu-sevenths", "cpu-and-memory"],
)
def test_render_denial(items: list[Insufficient], text: str) -> None:
    assert quota.render_denial(items) == text


@pytest.mark.parametrize(
    ("item", "text"),
    [
        (near(F(12), F(12)), "tenant nlp is at 100% of its nvidia.com/gpu limit (12 of 12)"),
        # 11/12 = 91.67 %, rounded down
        (near(F(11), F(12)), "tenant nlp is at 91% of its nvidia.com/gpu limit (11 of 12)"),
        (
            near(F(58 * GI), F(64 * GI), MEMORY),
            "tenant nlp is at 90% of its memory limit (58Gi of 64Gi)",
        ),
    ],
    ids=["full", "rounded-down", "memory"],
)  # fmt: skip
def test_render_warning(item: NearLimit, text: str) -> None:
    assert quota.render_warning(item) == text
