"""Tenants in a tree on the real control plane: hierarchical DRF through kube-scheduler
and the extender, and an admission denial at the organisation level.

Organisations A and B (weight 1 each); A has teams a1 and a2, B one team b1. The teams
are the tenants whose namespaces are labelled (`tenant_namespace`); the organisations own
no namespace.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import CONFIG_HEAD, FairshareDev, unique
from .test_fairshare_scheduling import (
    OPEN,
    POOL,
    MakeNode,
    TenantNamespace,
    pod_manifest,
    wait_settled,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender (see test_fairshare_scheduling.fairshare: pending pods
    deleted by an earlier test must not count as contenders here)."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


def tree_config(org_a: str, org_b: str, a1: str, a2: str, b1: str, *, limit_a: str = "") -> str:
    limit = f'  limit: {{cpu: "{limit_a}"}}\n' if limit_a else ""
    return CONFIG_HEAD + (
        f"tenants:\n- name: {org_a}\n{limit}- name: {org_b}\n"
        f"- {{name: {a1}, parent: {org_a}}}\n"
        f"- {{name: {a2}, parent: {org_a}}}\n"
        f"- {{name: {b1}, parent: {org_b}}}\n"
    )


async def test_teams_share_their_organisations_half_through_the_scheduler(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    org_a, org_b = unique("org-a"), unique("org-b")
    teams = [unique("a1"), unique("a2"), unique("b1")]
    await fairshare.set_config(api, tree_config(org_a, org_b, *teams))
    node = unique("tree")
    await make_gpu_node(node, gpus=0, cpu="12", memory="64Gi", labels={POOL: node})
    namespaces = {t: await tenant_namespace(t) for t in teams}
    core = client.CoreV1Api(api)
    # Every pod selects a label the node does not have yet, so all 24 wait at once (the
    # gate holds a tenant back only for pods that could run now); then the node opens.
    selector = {POOL: node, OPEN: "yes"}
    for i in range(8):
        for t in teams:  # interleaved: a1, a2, b1, a1, ...
            pod = pod_manifest(f"{t}-{i}", node, cpu="1", memory="128Mi", node_selector=selector)
            await core.create_namespaced_pod(namespaces[t], pod)
    await asyncio.sleep(2)
    await core.patch_node(node, {"metadata": {"labels": {OPEN: "yes"}}})
    counts = await wait_settled(api, namespaces)
    # Flat DRF over the three teams would give 4/4/4.
    assert counts == {teams[0]: 3, teams[1]: 3, teams[2]: 6}


async def test_an_organisation_limit_is_enforced_at_admission(
    api: client.ApiClient,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    org_a, org_b = unique("org-a"), unique("org-b")
    a1, a2, b1 = unique("a1"), unique("a2"), unique("b1")
    await fairshare.set_config(api, tree_config(org_a, org_b, a1, a2, b1, limit_a="2"))
    ns1, ns2 = await tenant_namespace(a1), await tenant_namespace(a2)
    core = client.CoreV1Api(api)
    # Pods that select no node stay pending; pending pods count against the limit.
    nowhere = {POOL: unique("nowhere")}
    await core.create_namespaced_pod(ns1, pod_manifest("p0", "x", cpu="1", node_selector=nowhere))
    await core.create_namespaced_pod(ns2, pod_manifest("p0", "x", cpu="1", node_selector=nowhere))
    with pytest.raises(ApiException) as info:
        await core.create_namespaced_pod(
            ns2, pod_manifest("p1", "x", cpu="1", node_selector=nowhere)
        )
    assert info.value.status == 403
    body = json.loads(info.value.body)["message"]
    assert f"organisation {org_a} would exceed its cpu limit: 2 used + 1 requested > 2" in body
    assert f"(namespaces: {', '.join(sorted([ns1, ns2]))})" in body
