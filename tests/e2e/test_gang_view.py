"""Pod groups in view on the real control plane: a group short of its PodGroup's
``minMember`` is told why it waits (a ``FairShareGang`` Event on its members), and
``fairshare status``/``explain`` (run as a user runs them), the extender's
``/status.json`` and its metrics show the same group and reason; the last member
arrives and the group runs."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from .conftest import (
    CONFIG_HEAD,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    dev_module,
    unique,
    wait_event,
    wait_for,
)
from .test_gangs import (  # noqa: F401 (podgroup_crd is a fixture)
    bound_names,
    create_podgroup,
    extender_sees,
    member,
    nodes_with_pool,
    open_nodes,
    podgroup_crd,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
async def fairshare(fairshare: FairshareDev) -> FairshareDev:
    """A freshly started extender (no plans or told reasons of earlier tests)."""
    await asyncio.to_thread(fairshare.restart_extender)
    return fairshare


def cli_json(kubeconfig: Path, *args: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "fairshare_cli", *args, "--kubeconfig", str(kubeconfig)]
    out = subprocess.run(
        [*argv, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def extender_metric(fairshare: FairshareDev, name: str, tenant: str) -> float | None:
    dev = dev_module()
    h = fairshare.handles
    ctx = ssl.create_default_context(cafile=h.ca("extender"))
    _, body = dev.cluster_module().http_get(h.url("extender", "/metrics"), ctx)
    for line in body.splitlines():
        if line.startswith(f'{name}{{tenant="{tenant}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.usefixtures("podgroup_crd")
async def test_a_short_gang_is_told_and_shown_then_runs(
    api: client.ApiClient,
    make_gpu_node: MakeNode,
    tenant_namespace: TenantNamespace,
    fairshare: FairshareDev,
):
    t = unique("gv")
    await fairshare.set_config(api, CONFIG_HEAD + f"tenants:\n- name: {t}\n")
    ns = await tenant_namespace(t)
    pool = unique("gangpool")
    nodes = await nodes_with_pool(make_gpu_node, pool)
    await create_podgroup(api, ns, "job", 3)
    core = client.CoreV1Api(api)
    for i in range(2):
        await core.create_namespaced_pod(ns, member(f"m-{i}", "job", pool))
    await extender_sees(fairshare, {f"{ns}/m-{i}" for i in range(2)})
    await open_nodes(api, nodes)

    short = f"gang {ns}/job has 2 of its 3 members; it holds nothing until all exist"
    for i in range(2):
        event = await wait_event(
            api, ns, involved_name=f"m-{i}", reason="FairShareGang", contains=short
        )
        assert event.type == "Warning"
        assert "Create the missing members" in event.message

    kc = fairshare.cluster.kubeconfig
    status = await asyncio.to_thread(cli_json, kc, "status")
    (row,) = [g for g in status["gangs"] if g["group"] == f"{ns}/job"]
    assert row == {
        "group": f"{ns}/job",
        "tenant": t,
        "minCount": 3,
        "minCountFrom": "PodGroup",
        "members": 2,
        "bound": 0,
        "state": "waiting",
        "reason": short,
        "heldGpus": 0.0,
        "actionable": True,
    }

    async def listed_with_group() -> bool:
        # once kube-scheduler has written the group's refusal as its verdict on the pod
        data = await asyncio.to_thread(cli_json, kc, "status")
        reasons = [p["reason"] for p in data["pendingPods"] if p["pod"] == f"{ns}/m-0"]
        return reasons == [f"waits with its group: {short}"]

    await wait_for(listed_with_group, timeout=30, what="m-0 pending with its group")
    explained = await asyncio.to_thread(cli_json, kc, "explain", f"{ns}/m-0")
    assert explained["extender"]["verdict"] == f"waits with its group: {short}"

    page = await asyncio.to_thread(fairshare.extender_status)
    assert [g["reason"] for g in page["gangs"] if g["group"] == f"{ns}/job"] == [short]

    async def counted() -> bool:
        got = await asyncio.to_thread(
            extender_metric, fairshare, "fairshare_tenant_gangs_waiting", t
        )
        return got == 1.0

    await wait_for(counted, timeout=45, what=f"fairshare_tenant_gangs_waiting of {t} at 1")

    # the last member arrives: the group runs whole, and says so
    await core.create_namespaced_pod(ns, member("m-2", "job", pool))

    async def runs() -> bool:
        return {f"m-{i}" for i in range(3)} <= await bound_names(api, ns)

    await wait_for(runs, timeout=60, what="the completed gang bound whole")
    status = await asyncio.to_thread(cli_json, kc, "status")
    (row,) = [g for g in status["gangs"] if g["group"] == f"{ns}/job"]
    assert (row["state"], row["bound"], row["reason"]) == ("running", 3, "")
