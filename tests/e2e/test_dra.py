"""DRA on the real control plane: resource.k8s.io/v1 ResourceClaims count as GPUs.

* the apiserver (v1.36) serves resource.k8s.io/v1; claims and templates written there read
  back with the GPU counts `fairshare.dra` computes;
* the usage tracker the webhook uses, fed by real list + watch of Pods, Namespaces and
  ResourceClaims, counts a pod's 2-GPU claim against its tenant, and `check_claim` refuses
  a claim that would take the tenant over its limit;
* through the webhook itself: the dev webhook validates resource.k8s.io/v1 resourceclaims
  (webhook/review.py, the DRA rule of tools/e2e/dev.py), and a claim that takes the tenant
  over its GPU limit is refused by the API with 403 Forbidden and fairshare's message.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from fractions import Fraction
from typing import Any

import pytest
from kubernetes_asyncio import client

from fairshare import dra
from fairshare.config.loading import parse_config
from fairshare.resources import GPU
from fairshare.state import informers, sources
from fairshare.state.usage import UsageTracker

from .conftest import (
    CONFIG_HEAD,
    PAUSE_IMAGE,
    Cluster,
    FairshareDev,
    TenantNamespace,
    dev_module,
    unique,
    wait_for,
)

pytestmark = pytest.mark.e2e


def claim_manifest(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": dra.KIND_CLAIM,
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": dra.GPU_DEVICE_CLASS, "count": gpus},
                    }
                ]
            }
        },
    }


def template_manifest(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": dra.KIND_TEMPLATE,
        "metadata": {"name": name},
        "spec": {"spec": claim_manifest(name, gpus)["spec"]},
    }


def pod_with_claim(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "main", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "terminationGracePeriodSeconds": 0,
        },
    }


async def raw(call: Awaitable[Any]) -> dict[str, Any]:
    resp = await call
    try:
        assert resp.status < 300, (resp.status, await resp.read())
        data: dict[str, Any] = json.loads(await resp.read())
    finally:
        resp.release()
    return data


async def test_apiserver_serves_resource_v1_and_claims_read_back(
    api: client.ApiClient, cluster: Cluster, namespace: str
):
    served = cluster.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name").stdout
    assert "resourceclaims.resource.k8s.io" in served.split()
    v1 = client.ResourceV1Api(api)
    made = await raw(
        v1.create_namespaced_resource_claim(
            namespace, claim_manifest("two", 2), _preload_content=False
        )
    )
    assert made["apiVersion"] == dra.API_VERSION
    assert dra.claim_gpus(made) == 2
    tmpl = await raw(
        v1.create_namespaced_resource_claim_template(
            namespace, template_manifest("four", 4), _preload_content=False
        )
    )
    assert dra.claim_gpus(tmpl) == dra.template_gpus(tmpl) == 4


async def test_pod_claim_counts_two_gpus_against_the_tenant_limit(
    api: client.ApiClient,
    cluster: Cluster,
    fairshare: FairshareDev,
    tenant_namespace: TenantNamespace,
):
    tenant = unique("dra")
    text = CONFIG_HEAD + f'tenants:\n- name: {tenant}\n  limit:\n    {GPU}: "4"\n'
    config = parse_config(text)
    await fairshare.set_config(api, text)
    ns = await tenant_namespace(tenant)
    usage = UsageTracker(lambda: config)

    async def factory() -> Any:
        return await informers.make_api_client(str(cluster.kubeconfig))

    source = sources.ApiSource(factory, kinds=("Namespace", "Pod", sources.RESOURCE_CLAIM))
    await source.start(usage)
    try:
        await wait_for(source.ready.wait, timeout=30, what="the watches to sync")
        v1 = client.ResourceV1Api(api)
        await raw(
            v1.create_namespaced_resource_claim(ns, claim_manifest("c2", 2), _preload_content=False)
        )
        await client.CoreV1Api(api).create_namespaced_pod(ns, pod_with_claim("uses-c2", "c2"))

        async def counted() -> bool:
            return usage.tenant_usage(tenant).get(GPU) == 2 and usage.has_pod(ns, "uses-c2")

        await wait_for(counted, timeout=30, what="the claim's 2 GPUs in the tenant's usage")
        limit = config.tenant(tenant).limit_for(GPU)  # type: ignore[union-attr]
        current = usage.tenant_usage(tenant)
        assert dra.check_claim(claim_manifest("c2b", 2), usage=current, limit=limit) is None
        short = dra.check_claim(
            claim_manifest("c3", 3),
            usage=current,
            limit=limit,
            tenant=tenant,
            namespaces=usage.tenant_namespaces(tenant),
        )
        assert short == dra.Insufficient(tenant, GPU, Fraction(2), Fraction(3), Fraction(4), (ns,))
    finally:
        await source.stop()


async def _limited_tenant(
    api: client.ApiClient, fairshare: FairshareDev, tenant_namespace: TenantNamespace
) -> tuple[str, str]:
    """A tenant limited to 4 GPUs and its namespace, once the dev webhook is known to
    validate claims (tools/e2e/dev.py's DRA rule: no skip, it is always registered)."""
    dev = dev_module()
    hooks = await client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
        dev.WEBHOOK_NAME
    )
    resources = {r for w in hooks.webhooks for rule in (w.rules or []) for r in rule.resources}
    assert {"resourceclaims", "resourceclaimtemplates"} <= resources, resources
    tenant = unique("drw")
    await fairshare.set_config(
        api, CONFIG_HEAD + f'tenants:\n- name: {tenant}\n  limit:\n    {GPU}: "4"\n'
    )
    return tenant, await tenant_namespace(tenant)


def _refusal(exc: client.ApiException) -> str:
    """The message of the API's refusal, which must be fairshare's policy refusal: 403
    (a webhook crash or a malformed answer comes back 500 or 400, names and all)."""
    status = json.loads(exc.body)
    assert (exc.status, status.get("code")) == (403, 403), status
    message = str(status.get("message", ""))
    assert message.startswith('admission webhook "pods.fairshare.io" denied the request: '), message
    return message


async def _claim_names(api: client.ApiClient, ns: str) -> list[str]:
    claims = await client.ResourceV1Api(api).list_namespaced_resource_claim(ns)
    return sorted(c.metadata.name for c in claims.items)


async def test_webhook_refuses_a_claim_over_the_limit(
    api: client.ApiClient, fairshare: FairshareDev, tenant_namespace: TenantNamespace
):
    tenant, ns = await _limited_tenant(api, fairshare, tenant_namespace)
    v1 = client.ResourceV1Api(api)
    with pytest.raises(client.ApiException) as refused:
        await v1.create_namespaced_resource_claim(ns, claim_manifest("c5", 5))
    denial = f"tenant {tenant} would exceed its {GPU} limit: 0 used + 5 requested > 4"
    message = _refusal(refused.value)
    assert f"{denial} (namespaces: {ns})" in message, message
    # A claim within the limit is admitted; the refused one was never created.
    await v1.create_namespaced_resource_claim(ns, claim_manifest("c2", 2))
    assert await _claim_names(api, ns) == ["c2"]


async def test_webhook_counts_an_admitted_claim_once(
    api: client.ApiClient, fairshare: FairshareDev, tenant_namespace: TenantNamespace
):
    tenant, ns = await _limited_tenant(api, fairshare, tenant_namespace)
    v1 = client.ResourceV1Api(api)
    await v1.create_namespaced_resource_claim(ns, claim_manifest("c2", 2))
    await v1.create_namespaced_resource_claim(ns, claim_manifest("c2b", 2))  # 2 + 2 <= 4
    assert await _claim_names(api, ns) == ["c2", "c2b"]
    with pytest.raises(client.ApiException) as refused:
        await v1.create_namespaced_resource_claim(ns, claim_manifest("c1", 1))
    denial = f"tenant {tenant} would exceed its {GPU} limit: 4 used + 1 requested > 4"
    message = _refusal(refused.value)
    assert f"{denial} (namespaces: {ns})" in message, message
