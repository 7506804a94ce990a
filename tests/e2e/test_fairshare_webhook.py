"""The real kube-apiserver calling the fairshare admission webhook over TLS.

Quotas across a tenant's namespaces (API, `kubectl --dry-run=server`, 50 parallel
creates), the mutating webhook's JSON patch as the apiserver applies it, and the
validating webhook guarding the ConfigMap.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    ANN_FRACTION,
    CONFIG_HEAD,
    GPU,
    PAUSE_IMAGE,
    TENANT_LABEL,
    Cluster,
    FairshareDev,
    TenantNamespace,
    dev_module,
    unique,
)

pytestmark = pytest.mark.e2e


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    """A pod asking for `gpus` whole GPUs, with no metadata.labels at all."""
    limits = {"cpu": "100m", "memory": "64Mi", GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": {"limits": limits}}]
        },
    }


def limited(tenant: str, gpus: int = 8) -> str:
    return CONFIG_HEAD + f'tenants:\n- name: {tenant}\n  limit:\n    {GPU}: "{gpus}"\n'


def denial(exc: ApiException) -> str:
    body = json.loads(exc.body)
    return str(body["message"])


async def test_quota_across_namespaces_api_and_kubectl_dry_run(
    api: client.ApiClient,
    cluster: Cluster,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    tenant = unique("quota")
    await fairshare.set_config(api, limited(tenant))
    ns1, ns2 = await tenant_namespace(tenant), await tenant_namespace(tenant)
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(ns1, gpu_pod("five", 5))
    await core.create_namespaced_pod(ns2, gpu_pod("two", 2))

    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(ns2, gpu_pod("two-more", 2))
    assert refused.value.status == 403
    namespaces = ", ".join(sorted((ns1, ns2)))
    ours = (
        f"tenant {tenant} would exceed its {GPU} limit: 7 used + 2 requested > 8 "
        f"(namespaces: {namespaces})"
    )
    message = denial(refused.value)
    assert message == f'admission webhook "pods.fairshare.io" denied the request: {ours}'

    # kubectl's server-side dry run goes through the same webhooks and gets the same answer.
    proc = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        ns2,
        "-f",
        "-",
        input=json.dumps(gpu_pod("two-more", 2)),
        check=False,
    )
    assert proc.returncode != 0
    # (The webhook's status carries code 403 but no reason, so kubectl does not print
    # "(Forbidden)".)
    assert message in proc.stderr

    # Dry runs reserve nothing: the one GPU left is still there, and then it is gone.
    ok = cluster.kubectl(
        "create", "--dry-run=server", "-n", ns1, "-f", "-", input=json.dumps(gpu_pod("one", 1))
    )
    assert "created (server dry run)" in ok.stdout
    await core.create_namespaced_pod(ns1, gpu_pod("one", 1))
    with pytest.raises(ApiException) as full:
        await core.create_namespaced_pod(ns1, gpu_pod("one-more", 1))
    assert "8 used + 1 requested > 8" in denial(full.value)
    pods = [p for ns in (ns1, ns2) for p in (await core.list_namespaced_pod(ns)).items]
    assert sorted(p.metadata.name for p in pods) == ["five", "one", "two"]


async def test_parallel_creates_never_exceed_the_limit(
    api: client.ApiClient, tenant_namespace: TenantNamespace, fairshare: FairshareDev
):
    tenant = unique("race")
    await fairshare.set_config(api, limited(tenant))
    namespaces = [await tenant_namespace(tenant), await tenant_namespace(tenant)]
    core = client.CoreV1Api(api)

    async def create(i: int) -> str:
        try:
            await core.create_namespaced_pod(namespaces[i % 2], gpu_pod(f"gpu-{i}", 1))
        except ApiException as exc:
            return f"{exc.status} {denial(exc)}"
        return "created"

    outcomes = await asyncio.gather(*(create(i) for i in range(50)))

    created = [o for o in outcomes if o == "created"]
    refused = [o for o in outcomes if o != "created"]
    assert len(created) == 8, outcomes
    assert all(o.startswith("403 ") and f"tenant {tenant} would exceed" in o for o in refused)
    pods = [p for ns in namespaces for p in (await core.list_namespaced_pod(ns)).items]
    assert len(pods) == 8
    assert sum(int(p.spec.containers[0].resources.limits[GPU]) for p in pods) == 8


async def test_the_apiserver_applies_the_mutating_patch(
    api: client.ApiClient, tenant_namespace: TenantNamespace, fairshare: FairshareDev
):
    tenant = unique("patch")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {tenant}\n")
    ns = await tenant_namespace(tenant)
    core = client.CoreV1Api(api)

    # No metadata.labels at all: the patch must create the map, not add under it.
    bare = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare", "annotations": {ANN_FRACTION: ".50"}},
        "spec": {"containers": [{"name": "main", "image": PAUSE_IMAGE}]},
    }
    await core.create_namespaced_pod(ns, bare)
    pod = await core.read_namespaced_pod("bare", ns)
    assert pod.metadata.labels == {TENANT_LABEL: tenant}
    assert pod.metadata.annotations[ANN_FRACTION] == "0.5"

    # Existing labels stay; "1/4" becomes "0.25".
    labelled = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "labelled",
            "labels": {"app": "demo"},
            "annotations": {ANN_FRACTION: "1/4"},
        },
        "spec": {"containers": [{"name": "main", "image": PAUSE_IMAGE}]},
    }
    await core.create_namespaced_pod(ns, labelled)
    pod = await core.read_namespaced_pod("labelled", ns)
    assert pod.metadata.labels == {"app": "demo", TENANT_LABEL: tenant}
    assert pod.metadata.annotations[ANN_FRACTION] == "0.25"

    # A label naming another tenant is refused.
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(
            ns, bare | {"metadata": {"name": "liar", "labels": {TENANT_LABEL: "someone-else"}}}
        )
    assert refused.value.status == 403
    assert f"{TENANT_LABEL}=someone-else does not match namespace {ns}" in denial(refused.value)


async def test_an_invalid_config_edit_is_refused_and_the_last_good_one_stays(
    api: client.ApiClient,
    cluster: Cluster,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    tenant = unique("guard")
    good = limited(tenant, gpus=2)
    await fairshare.set_config(api, good)
    ns = await tenant_namespace(tenant)
    dev = dev_module()
    reloads = {s: fairshare.metric(s, "fairshare_config_reloads_total") for s in dev.SERVERS}
    errors = {s: fairshare.metric(s, "fairshare_config_reload_errors_total") for s in dev.SERVERS}

    bad = CONFIG_HEAD + f"tenants:\n- name: {tenant}\n  weight: -1\n"
    patch = json.dumps({"data": {dev.CONFIG_KEY: bad}})
    proc = cluster.kubectl(
        "-n", dev.SYSTEM_NAMESPACE, "patch", "configmap", dev.CONFIGMAP, "-p", patch, check=False
    )
    assert proc.returncode != 0
    assert 'admission webhook "config.fairshare.io" denied the request' in proc.stderr
    assert "tenants[0].weight: must be > 0" in proc.stderr

    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as refused:
        await core.patch_namespaced_config_map(
            dev.CONFIGMAP, dev.SYSTEM_NAMESPACE, {"data": {dev.CONFIG_KEY: bad}}
        )
    assert refused.value.status == 400
    assert "tenants[0].weight: must be > 0" in denial(refused.value)

    # Nothing changed: the ConfigMap, the servers' config, and what the config enforces.
    assert await fairshare.current_config_text(api) == good
    await asyncio.sleep(1)
    for server in dev.SERVERS:
        assert fairshare.metric(server, "fairshare_config_reloads_total") == reloads[server]
        assert fairshare.metric(server, "fairshare_config_reload_errors_total") == errors[server]
    await core.create_namespaced_pod(ns, gpu_pod("two", 2))
    with pytest.raises(ApiException) as over:
        await core.create_namespaced_pod(ns, gpu_pod("three", 1))
    assert "2 used + 1 requested > 2" in denial(over.value)
