"""Which tenant a namespace belongs to when several could claim it (issue 31).

Two ``namespaceSelector``s that could match one namespace are refused at config
validation (the first in config order used to win silently); a namespace listed for one
tenant and labelled or selected for another stays the list's, and the resolution names
the tenants passed over so the webhook warns.
"""

from __future__ import annotations

from typing import Any

import pytest

from fairshare import tenancy
from fairshare.config.loading import config_from_mapping
from fairshare.errors import ConfigError
from webhook import review, wire
from webhook.view import StaticView

HEAD = {"apiVersion": "fairshare.io/v1alpha1", "kind": "FairShareConfig"}
TENANT_LABEL = "fairshare.io/tenant"


def errors_of(tenants: list[dict[str, Any]]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({**HEAD, "tenants": tenants})
    return [str(error) for error in info.value.errors]


@pytest.mark.parametrize(
    ("a", "b", "labels"),
    [
        # Disjoint keys: a namespace can carry both labels.
        ({"team": "a"}, {"env": "prod"}, "env=prod, team=a"),
        # One selector inside the other: every namespace b selects, a selects too.
        ({"team": "a"}, {"team": "a", "tier": "gold"}, "team=a, tier=gold"),
        # The very same selector.
        ({"team": "a"}, {"team": "a"}, "team=a"),
    ],
    ids=["disjoint-keys", "subset", "identical"],
)
def test_selectors_that_can_match_one_namespace_are_refused(
    a: dict[str, str], b: dict[str, str], labels: str
) -> None:
    errors = errors_of(
        [{"name": "a", "namespaceSelector": a}, {"name": "b", "namespaceSelector": b}]
    )
    assert errors == [
        f'tenants[1].namespaceSelector: can select the same namespaces as tenant "a" '
        f"(tenants[0]): a namespace labelled {labels} matches both; give both selectors one "
        "label key with different values"
    ]


def test_selectors_that_differ_on_a_key_are_accepted() -> None:
    config = config_from_mapping(
        {
            **HEAD,
            "tenants": [
                {"name": "a", "namespaceSelector": {"team": "a", "env": "prod"}},
                {"name": "b", "namespaceSelector": {"team": "b", "env": "prod"}},
                {"name": "c", "namespaceSelector": {"team": "a", "env": "dev"}},
            ],
        }
    )
    assert [t.name for t in config.tenants] == ["a", "b", "c"]


def test_a_selector_naming_a_namespace_another_tenant_lists_is_refused() -> None:
    errors = errors_of(
        [
            {"name": "a", "namespaces": ["shared"]},
            {"name": "b", "namespaceSelector": {"kubernetes.io/metadata.name": "shared"}},
        ]
    )
    assert errors == [
        "tenants[1].namespaceSelector.kubernetes.io/metadata.name: selects namespace "
        '"shared", which tenant "a" lists'
    ]


CONFIG = config_from_mapping(
    {
        **HEAD,
        "tenants": [
            {"name": "a", "namespaces": ["listed"], "limit": {"nvidia.com/gpu": "8"}},
            {"name": "b", "namespaceSelector": {"team": "b"}},
            {"name": "c"},
        ],
    }
)


@pytest.mark.parametrize(
    ("namespace", "labels", "tenant", "source", "passed_over", "warning"),
    [
        ("listed", {}, "a", "namespaces", (), None),
        (
            "listed",
            {TENANT_LABEL: "c"},
            "a",
            "namespaces",
            (("c", "label"),),
            "namespace listed is in tenant a (listed in its namespaces); its label "
            "fairshare.io/tenant=c is ignored",
        ),
        (
            "listed",
            {TENANT_LABEL: "c", "team": "b"},
            "a",
            "namespaces",
            (("c", "label"), ("b", "selector")),
            "namespace listed is in tenant a (listed in its namespaces); its label "
            "fairshare.io/tenant=c and the namespaceSelector of tenant b are ignored",
        ),
        (
            "other",
            {TENANT_LABEL: "c", "team": "b"},
            "c",
            "label",
            (("b", "selector"),),
            "namespace other is in tenant c (by its label fairshare.io/tenant); the "
            "namespaceSelector of tenant b is ignored",
        ),
        # The label naming the list's own tenant, or the selector's own: nothing passed over.
        ("listed", {TENANT_LABEL: "a"}, "a", "namespaces", (), None),
        ("other", {TENANT_LABEL: "b", "team": "b"}, "b", "label", (), None),
        ("other", {"team": "b"}, "b", "selector", (), None),
    ],
    ids=[
        "listed", "listed-and-labelled", "listed-labelled-and-selected", "labelled-and-selected",
        "label-agrees", "label-agrees-with-selector", "selected",
    ],
)  # fmt: skip
def test_the_list_wins_then_the_label_and_the_others_are_named(
    namespace: str,
    labels: dict[str, str],
    tenant: str,
    source: str,
    passed_over: tuple[tuple[str, str], ...],
    warning: str | None,
) -> None:
    got = tenancy.resolve_tenant(namespace, labels, CONFIG)
    assert (got.tenant, got.source, got.passed_over) == (tenant, source, passed_over)
    assert got.passed_over_warning(namespace) == warning
    assert got.warnings(namespace) == (() if warning is None else (warning,))


def test_the_webhook_warns_when_it_admits_a_pod_in_a_namespace_claimed_twice() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "listed"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    request = wire.AdmissionRequest.model_validate(
        {
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "listed",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": pod,
        }
    )
    view = StaticView(labels={"listed": {TENANT_LABEL: "c"}})
    response = review.review(request, view=view, config=CONFIG, phase="validate")
    assert response.allowed
    assert response.warnings == (
        "namespace listed is in tenant a (listed in its namespaces); its label "
        "fairshare.io/tenant=c is ignored",
    )
