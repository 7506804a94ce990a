"""Quota for pod groups at admission, through the real kube-apiserver and the webhook.

A tenant limited to 8 GPUs creates a 5 × 2-GPU gang (a coscheduling PodGroup with
``minMember: 5``): every member is refused, naming the group, and no pod exists. A
4 × 2-GPU gang fits: its first member holds the room of the other three, so a stray pod
of the tenant is refused meanwhile, and the other members are admitted.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import CONFIG_HEAD, FairshareDev, TenantNamespace, dev_module, unique
from .test_gangs import create_podgroup, member, podgroup_crd  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e

NOWHERE = "nowhere"  # a pool no node has: admission only, nothing is scheduled


@pytest.fixture(autouse=True)
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started webhook (the code under test, and no groups of earlier tests)."""
    fairshare.handles = await asyncio.to_thread(dev_module().restart_webhook, fairshare.state_dir)
    return fairshare


async def create(core: client.CoreV1Api, ns: str, pod: dict[str, Any]) -> ApiException | None:
    try:
        await core.create_namespaced_pod(ns, pod)
    except ApiException as exc:
        return exc
    return None


def message(exc: ApiException | None) -> str:
    assert exc is not None and exc.status == 403, exc
    return str(json.loads(exc.body)["message"])


async def pod_names(core: client.CoreV1Api, ns: str) -> set[str]:
    return {p.metadata.name for p in (await core.list_namespaced_pod(ns)).items}


@pytest.mark.usefixtures("podgroup_crd")
async def test_a_gang_over_its_tenants_limit_is_refused_as_a_group(
    api: client.ApiClient, tenant_namespace: TenantNamespace, fairshare: FairshareDev
):
    t = unique("gq")
    await fairshare.set_config(
        api, CONFIG_HEAD + f"tenants:\n- name: {t}\n  limit: {{nvidia.com/gpu: '8'}}\n"
    )
    ns = await tenant_namespace(t)
    core = client.CoreV1Api(api)

    await create_podgroup(api, ns, "big", 5)
    refusals = [await create(core, ns, member(f"big-{i}", "big", NOWHERE)) for i in range(5)]
    for exc in refusals:
        assert message(exc) == (
            'admission webhook "pods.fairshare.io" denied the request: '
            f"gang {ns}/big (5 members × nvidia.com/gpu 2) would take tenant {t} over its "
            f"nvidia.com/gpu limit: 0 used + 10 for the group > 8 (namespaces: {ns}); "
            "no member of the group is admitted until all 5 fit"
        )
    assert await pod_names(core, ns) == set()

    # A gang that fits: its first member holds the room of the others.
    await create_podgroup(api, ns, "fits", 4)
    assert await create(core, ns, member("fits-0", "fits", NOWHERE)) is None
    stray = member("stray", "", NOWHERE, gpus=1)
    del stray["metadata"]["labels"]
    refused = message(await create(core, ns, stray))
    assert f"tenant {t} would exceed its nvidia.com/gpu limit: 8 used + 1 requested > 8" in refused
    for i in range(1, 4):
        assert await create(core, ns, member(f"fits-{i}", "fits", NOWHERE)) is None
    assert await pod_names(core, ns) == {f"fits-{i}" for i in range(4)}
