"""Admission in a tree of tenants: a pod is checked against its tenant's limit and every
ancestor's, with the usage of the ancestor's whole subtree; the denial names the level."""

from __future__ import annotations

from fractions import Fraction as F

from fairshare.config.loading import config_from_mapping
from fairshare.limits import Insufficient
from fairshare.resources import CPU, GPU
from tests.builders import make_pod
from tests.unit.test_webhook_review import gpu_pod, make_request
from webhook import review
from webhook.view import StaticView

HEAD = {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig"}
TREE = config_from_mapping(
    {
        **HEAD,
        "tenants": [
            {"name": "ml", "limit": {CPU: "4", GPU: "4"}},
            {"name": "vision", "parent": "ml", "limit": {GPU: "3"}},
            {"name": "a1", "parent": "vision", "namespaces": ["a1"]},
            {"name": "a2", "parent": "ml", "namespaces": ["a2"]},
            {"name": "b", "namespaces": ["b1"]},
        ],
    }
)


def cpu_pod(ns: str, name: str) -> dict[str, object]:
    return make_pod(name).ns(ns).req(cpu="1").obj()


def test_the_organisation_limit_counts_its_whole_subtree():
    # The example: ml (A) limited to 4 CPUs, a1 and a2 create 1-CPU pods in turn.
    usage: dict[str, dict[str, F]] = {}
    admitted: dict[str, int] = {"a1": 0, "a2": 0, "b": 0}
    denials: list[str] = []
    for i in range(6):
        for ns in ("a1", "a2", "b1"):
            tenant = "b" if ns == "b1" else ns
            view = StaticView(usage=usage, namespaces={t: (t,) for t in admitted})
            response = review.review(
                make_request(cpu_pod(ns, f"{ns}-{i}")), view=view, config=TREE, phase="validate"
            )
            if response.allowed:
                admitted[tenant] += 1
                row = usage.setdefault(tenant, {})
                row[CPU] = row.get(CPU, F(0)) + 1
            else:
                denials.append(response.status.message if response.status else "")
    assert admitted == {"a1": 2, "a2": 2, "b": 6}
    assert len(denials) == 8
    assert denials[0] == (
        "organisation ml would exceed its cpu limit: 4 used + 1 requested > 4 (namespaces: a1, a2)"
    )


def test_each_level_is_named_and_structured():
    view = StaticView(
        usage={"a1": {GPU: F(3)}, "a2": {GPU: F(1)}},
        namespaces={"a1": ("a1",), "a2": ("a2",)},
    )
    verdict = review.judge(
        make_request(gpu_pod("a1", gpu=1)), view=view, config=TREE, phase="validate"
    )
    assert verdict.reasons == (
        Insufficient("vision", GPU, F(3), F(1), F(3), ("a1",), "team"),
        Insufficient("ml", GPU, F(4), F(1), F(4), ("a1", "a2"), "organisation"),
    )
    assert verdict.response.status is not None
    assert verdict.response.status.message == (
        "team vision would exceed its nvidia.com/gpu limit: 3 used + 1 requested > 3 "
        "(namespaces: a1); organisation ml would exceed its nvidia.com/gpu limit: "
        "4 used + 1 requested > 4 (namespaces: a1, a2)"
    )
    # a2 is directly under ml: only ml's limit applies, and 1 + 1 <= 4.
    ok = review.judge(
        make_request(gpu_pod("a2", gpu=1)),
        view=StaticView(usage={"a2": {GPU: F(1)}}, namespaces={"a2": ("a2",)}),
        config=TREE,
        phase="validate",
    )
    assert ok.response.allowed


def test_near_an_ancestors_limit_warns_naming_it():
    view = StaticView(usage={"a2": {GPU: F(3)}}, namespaces={"a2": ("a2",)})
    verdict = review.judge(
        make_request(gpu_pod("a1", gpu=1)), view=view, config=TREE, phase="validate"
    )
    assert "organisation ml is at 100% of its nvidia.com/gpu limit (4 of 4)" in (
        verdict.response.warnings or ()
    )
