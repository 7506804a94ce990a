"""`fairshare status` / `explain` and the extender's /status page on the real control plane.

Two tenants on one 4-GPU kwok node. Tenant A (limit 3 GPUs) runs two 1-GPU pods; tenant B
has three 1-GPU pods behind a Kubernetes scheduling gate (pending, listed, but not
waiting: kube-scheduler does not try them, so they hold nobody back) and two runnable
1-GPU pods. A's third pod a-3 and B's two runnable pods become runnable at the same
moment (they select a node label that is added only then), and a-3 (of a higher
priority) is tried first: the fair allocation is half the GPUs each, a-3 would put A at
0.75 while B waits with pods that fit, so the fair-share gate refuses it (its
FailedScheduling event). B's two pods then fill the node, and a-3 stays pending for want
of a GPU, no longer held (B has nothing left that could run). A's fourth pod is denied by
the webhook (3 counted, a-3 included, + 1 > 3).

The CLI runs as a subprocess with the e2e kubeconfig, as a user would run it; the page is
opened in headless Chromium (Debian's `chromium`, driven by Playwright), which must show
the numbers the CLI prints. Without Chromium the browser part skips (the rest has run),
except under CI (`CI` set), where `make install` installs it (tools/install-chromium.sh)
and a missing browser is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import (
    CONFIG_HEAD,
    GPU,
    PAUSE_IMAGE,
    POOL,
    Cluster,
    FairshareDev,
    cluster_module,
    in_ci,
    unique,
    wait_event,
    wait_for,
    wait_pod,
)

pytestmark = pytest.mark.e2e

HOLD = "fairshare-e2e/hold"
OPEN = "fairshare-e2e/open"


def gpu_pod(
    name: str,
    pool: str,
    *,
    gated: bool = False,
    on_open: bool = False,
    priority_class: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": PAUSE_IMAGE,
                "resources": {"limits": {"cpu": "100m", "memory": "128Mi", GPU: "1"}},
            }
        ],
        "nodeSelector": {POOL: pool},
        "terminationGracePeriodSeconds": 0,
    }
    if gated:
        spec["schedulingGates"] = [{"name": HOLD}]
    if on_open:  # runnable only once the node has the OPEN label
        spec["nodeSelector"][OPEN] = "yes"
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def run_cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairshare_cli", *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def cli_json(kubeconfig: Path, *args: str) -> dict[str, Any]:
    out = run_cli(kubeconfig, *args, "-o", "json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def tenant_of(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in report["tenants"] if t["name"] == name)


def gpu_row(tenant: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in tenant["resources"] if r["resource"] == GPU)


@pytest.fixture
async def scene(
    fairshare: FairshareDev,
    api: client.ApiClient,
    make_gpu_node: Callable[..., Awaitable[client.V1Node]],
    tenant_namespace: Callable[[str], Awaitable[str]],
) -> AsyncIterator[dict[str, Any]]:
    # A fresh extender: no pending pods left over from other tests in its queue.
    await asyncio.to_thread(fairshare.restart_extender)
    node = unique("status")
    await make_gpu_node(node, gpus=4, cpu="16", memory="64Gi", labels={POOL: node})
    ta, tb = unique("ta"), unique("tb")
    await fairshare.set_config(
        api,
        CONFIG_HEAD
        + f"tenants:\n- name: {ta}\n  limit:\n    {GPU}: '3'\n- name: {tb}\n"
        + "  guaranteed:\n    nvidia.com/gpu: '1'\n",
    )
    na, nb = await tenant_namespace(ta), await tenant_namespace(tb)
    core = client.CoreV1Api(api)
    # a-3 goes first in kube-scheduler's queue; it never preempts (with preemption it
    # would evict a pod of B's once the node is full).
    first = unique("status-first")
    await client.SchedulingV1Api(api).create_priority_class(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": first},
            "value": 1000,
            "preemptionPolicy": "Never",
        }
    )
    try:
        for i in (1, 2, 3):
            await core.create_namespaced_pod(nb, gpu_pod(f"b-{i}", node, gated=True))
        for i in (1, 2):
            await core.create_namespaced_pod(na, gpu_pod(f"a-{i}", node))
            await wait_pod(api, na, f"a-{i}", lambda p: bool(p.spec.node_name), what="bound")
        await asyncio.sleep(0.5)  # the extender accounts the bind a moment after the API shows it
        # No node has the OPEN label yet: none of these can run, and the gated b-1..b-3
        # never count as waiting, so nothing is held back yet.
        await core.patch_node(node, {"metadata": {"labels": {OPEN: None}}})
        for i in (4, 5):
            await core.create_namespaced_pod(nb, gpu_pod(f"b-{i}", node, on_open=True))
        await core.create_namespaced_pod(
            na, gpu_pod("a-3", node, on_open=True, priority_class=first)
        )
        for ns, name in ((nb, "b-4"), (nb, "b-5"), (na, "a-3")):
            await wait_event(api, ns, involved_name=name, reason="FailedScheduling")
        # Past kube-scheduler's first backoff (1 s): the label moves all three to the
        # active queue together, where a-3 comes first by priority.
        await asyncio.sleep(2.5)
        await core.patch_node(node, {"metadata": {"labels": {OPEN: "yes"}}})
        refused = await wait_event(
            api, na, involved_name="a-3", reason="FailedScheduling", contains="above its fair share"
        )
        for i in (4, 5):
            await wait_pod(api, nb, f"b-{i}", lambda p: bool(p.spec.node_name), what="bound")
        await asyncio.sleep(0.5)  # the extender accounts the binds
        with pytest.raises(ApiException) as denied:
            await core.create_namespaced_pod(na, gpu_pod("a-4", node))
        assert denied.value.status == 403
        yield {
            "node": node,
            "a": ta,
            "b": tb,
            "na": na,
            "nb": nb,
            "kubeconfig": fairshare.cluster.kubeconfig,
            "kubectl": fairshare.cluster.kubectl_path,
            "refused": refused.message,
            "denied": json.loads(denied.value.body)["message"],
            "dev": fairshare,
        }
    finally:
        await client.SchedulingV1Api(api).delete_priority_class(first)


# For the docs (docs/status.md): FAIRSHARE_STATUS_CAPTURE=DIR writes the CLI's text output and a
# screenshot of the page there.
CAPTURE = os.environ.get("FAIRSHARE_STATUS_CAPTURE", "")


def capture(name: str, text: str) -> None:
    if CAPTURE:
        (Path(CAPTURE) / name).write_text(text)


HELD = "tenant {a} above its fair share (0.75 > 0.50) while {b} waits"
FULL = f"Insufficient {GPU} (free 0, requested 1)"


async def test_status_explain_and_page_agree_on_the_cluster(
    scene: dict[str, Any], tmp_path: Path
) -> None:
    kc, a, b, na, nb, node = (scene[k] for k in ("kubeconfig", "a", "b", "na", "nb", "node"))
    # The gate refused a-3 while B's two runnable pods waited (kube-scheduler's event).
    assert HELD.format(a=a, b=b) in scene["refused"], scene["refused"]
    # Now B's pods hold the other half of the node: a-3 waits for a GPU, not for the
    # gate; B's gated pods are pending too (and no longer fit either).
    full = f"{node}: {FULL}"

    # -- status ------------------------------------------------------------------------
    data = await asyncio.to_thread(cli_json, kc, "status")
    assert data["cluster"]["gpus"] == 4, "another test's GPU node is still in the cluster"
    ta, tb = tenant_of(data, a), tenant_of(data, b)
    assert ta["pods"] == {"running": 2, "pending": 1, "held": 0}
    assert tb["pods"] == {"running": 2, "pending": 3, "held": 0}
    assert (ta["dominantShare"], ta["fairShare"]) == (0.5, 0.5)
    assert (tb["dominantShare"], tb["fairShare"]) == (0.5, 0.5)
    assert gpu_row(ta) == {
        "resource": GPU,
        "used": "2",
        "guaranteed": None,
        "limit": "3",
        "quotaUsed": "3",
    }
    # The webhook counts B's bound pods and its three gated ones.
    assert gpu_row(tb) == {
        "resource": GPU,
        "used": "2",
        "guaranteed": "1",
        "limit": None,
        "quotaUsed": "5",
    }
    assert ta["namespaces"] == [na] and tb["namespaces"] == [nb]
    assert data["heldPods"] == []
    gated = f"has spec.schedulingGates (not scheduled yet); {full}"
    assert sorted((p["pod"], p["reason"], p["fitsNodes"]) for p in data["pendingPods"]) == [
        (f"{na}/a-3", full, 0),
        *((f"{nb}/b-{i}", gated, 0) for i in (1, 2, 3)),
    ]
    c = data["cluster"]
    assert (c["gpusAllocated"], c["gpuAllocationRatio"]) == (4, 1.0)
    (n,) = [x for x in data["nodes"] if x["name"] == node]
    assert [d["holders"] for d in n["devices"]] == [{a: 1.0}, {a: 1.0}, {b: 1.0}, {b: 1.0}]

    text = await asyncio.to_thread(run_cli, kc, "status")
    assert text.returncode == 0, text.stderr
    assert (
        f"TENANT {a}  weight 1  dominant share 0.5000  fair share 0.5000  "
        "pods: 2 running, 1 pending, 0 held by the gate"
    ) in text.stdout
    assert (
        f"TENANT {b}  weight 1  dominant share 0.5000  fair share 0.5000  "
        "pods: 2 running, 3 pending, 0 held by the gate"
    ) in text.stdout
    assert "HELD BY THE GATE" not in text.stdout
    assert f"  {na}/a-3: {full}\n" in text.stdout
    assert "GPUs 4/4 allocated (100.0%)" in text.stdout
    capture("status.txt", text.stdout)

    # The same as a kubectl plugin (the `kubectl-fairshare` console script on the PATH).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    plugin = await asyncio.to_thread(
        subprocess.run,
        [scene["kubectl"], "fairshare", "status", "--kubeconfig", str(kc), "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert plugin.returncode == 0, plugin.stderr
    report = json.loads(plugin.stdout)
    assert (tenant_of(report, a)["pods"], tenant_of(report, b)["pods"]) == (ta["pods"], tb["pods"])

    # -- explain: the pending pod, and the denied one from a file --------------------------
    ex = await asyncio.to_thread(cli_json, kc, "explain", f"{na}/a-3")
    assert ex["tenant"] == a and ex["webhook"]["allowed"] is True
    (quota,) = [q for q in ex["webhook"]["quota"] if q["resource"] == GPU]
    assert (quota["used"], quota["requested"], quota["limit"], quota["headroom"]) == (
        "2",
        "1",
        "3",
        "1",
    )
    assert ex["extender"]["verdict"] == "pending: no node fits now"
    assert ex["extender"]["fitsNodes"] == 0
    # Still above its fair share after it, but B has no pod that could run: not held.
    assert ex["extender"]["gate"] == {
        "applies": True,
        "allowed": True,
        "currentShare": 0.5,
        "shareAfter": 0.75,
        "fairShare": 0.5,
        "waitingFor": None,
        "reason": "",
    }
    nodes = ex["extender"]["nodes"]
    assert {"node": node, "fits": False, "reason": FULL, "unresolvable": False} in nodes

    manifest = tmp_path / "a-4.yaml"
    manifest.write_text(yaml.safe_dump(gpu_pod("a-4", node)))
    ex4 = await asyncio.to_thread(cli_json, kc, "explain", "-f", str(manifest), "-n", na)
    assert ex4["webhook"]["allowed"] is False
    assert (
        f"tenant {a} would exceed its {GPU} limit: 3 used + 1 requested > 3"
        in (ex4["webhook"]["message"])
    )
    assert ex4["webhook"]["message"] in scene["denied"]  # what the API answered the create
    text4 = await asyncio.to_thread(run_cli, kc, "explain", "-f", str(manifest), "-n", na)
    assert "WEBHOOK (admission now): denied" in text4.stdout
    capture("explain-denied.txt", text4.stdout)
    text3 = await asyncio.to_thread(run_cli, kc, "explain", f"{na}/a-3")
    assert "EXTENDER (scheduling now): pending: no node fits now\n" in text3.stdout
    assert (
        "  gate: current share 0.5000, after this pod 0.7500, fair share 0.5000\n" in text3.stdout
    )
    capture("explain-pending.txt", text3.stdout)

    # -- the extender's page, in Chromium ---------------------------------------------------
    dev = scene["dev"]
    url = dev.handles.url("extender", "/status")

    async def page_caught_up() -> bool:
        ctx = dev.handles.client_context("extender")
        _, body = await asyncio.to_thread(cluster_module().http_get, url + ".json", ctx)
        page = json.loads(body)
        return bool(
            tenant_of(page, a)["pods"] == ta["pods"] and tenant_of(page, b)["pods"] == tb["pods"]
        )

    await wait_for(page_caught_up, timeout=30, what="the extender's page to show B's binds")
    await asyncio.to_thread(check_page_in_chromium, url, a=a, b=b, na=na, reason=full)


def chromium_path() -> str:
    """Debian's chromium; skip without it, but fail under CI, where it can be installed."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        why = "Debian's chromium is not installed (`make install` runs tools/install-chromium.sh)"
        if in_ci():
            pytest.fail(f"{why}; CI is set, so the status page's browser test fails", pytrace=False)
        pytest.skip(why)
    return path


def check_page_in_chromium(url: str, *, a: str, b: str, na: str, reason: str) -> None:
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page(
                ignore_https_errors=True, viewport={"width": 1200, "height": 900}
            )
            resp = page.goto(url)
            assert resp is not None and resp.status == 200
            card = page.locator(f"#tenant-{a}")
            assert card.locator(".running").inner_text() == "2"
            assert card.locator(".pending").inner_text() == "1"
            assert card.locator(".held-count").inner_text() == "0"
            assert card.locator(".share").inner_text() == "0.5000"
            assert card.locator(".fair-share").inner_text() == "0.5000"
            card_b = page.locator(f"#tenant-{b}")
            assert card_b.locator(".running").inner_text() == "2"
            assert card_b.locator(".pending").inner_text() == "3"
            assert card_b.locator(".share").inner_text() == "0.5000"
            assert page.locator("#gpus-allocated").inner_text() == "4"
            assert page.locator("#gpus").inner_text() == "4"
            assert page.locator("#held").inner_text() == "none"
            rows = page.locator("#pending tr").all_inner_texts()
            assert any(f"{na}/a-3" in r and reason in r for r in rows), rows
            if CAPTURE:
                page.screenshot(path=str(Path(CAPTURE) / "status-page.png"), full_page=True)
        finally:
            browser.close()


async def test_bad_input_is_one_line_and_exit_1(
    fairshare: FairshareDev, cluster: Cluster, tmp_path: Path
) -> None:
    kc = cluster.kubeconfig
    unreachable = tmp_path / "kubeconfig"
    doc = yaml.safe_load(kc.read_text())
    for entry in doc["clusters"]:
        entry["cluster"]["server"] = "https://127.0.0.1:1"
    unreachable.write_text(yaml.safe_dump(doc))
    cases = [
        ((kc, "explain", "default/no-such-pod"), "error: pod default/no-such-pod not found"),
        (
            (kc, "status", "--config-name", "no-such-config"),
            "error: fairshare is not installed in this cluster: ConfigMap "
            "fairshare-system/no-such-config not found",
        ),
        (
            (unreachable, "status"),
            "error: cannot reach the Kubernetes API at https://127.0.0.1:1",
        ),
        (
            (unreachable, "explain", "default/x"),
            "error: cannot reach the Kubernetes API at https://127.0.0.1:1",
        ),
    ]
    for (config, *args), start in cases:
        out = await asyncio.to_thread(run_cli, config, *args)
        assert out.returncode == 1, (args, out.stdout, out.stderr)
        assert out.stderr.startswith(start), out.stderr
        assert out.stderr.count("\n") == 1 and out.stdout == "", out.stderr


async def test_watch_redraws_until_interrupted(fairshare: FairshareDev, cluster: Cluster) -> None:
    """`status --watch 1 -o json` prints a report per round until Ctrl-C, then exits 0."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairshare_cli", "status", "--watch", "1", "-o", "json",
        "--kubeconfig", str(cluster.kubeconfig),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    reports = 0
    try:
        while reports < 2:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
            assert line, "status --watch ended by itself"
            reports += line.startswith(b'  "kind": "FairshareStatus"')
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err
