"""Client-certificate authentication on the real control plane (``--client-ca``).

`cluster.py` gives kube-apiserver an AdmissionConfiguration whose kubeconfig holds a
client certificate from a CA of its own (`client-ca`), and `dev.py` starts both servers
with ``--client-ca`` on that CA and gives kube-scheduler the matching `tlsConfig`
certificate. So every admission in this suite already goes through mutual TLS; this file
checks it explicitly: the control plane gets in, anyone else does not, and the probe and
scrape paths stay open.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from .conftest import (
    CONFIG_HEAD,
    POOL,
    FairshareDev,
    MakeNode,
    TenantNamespace,
    gpu_pod_manifest,
    unique,
    wait_pod,
)

pytestmark = pytest.mark.e2e


def call(url: str, ctx: ssl.SSLContext, body: dict[str, Any] | None = None) -> tuple[int, str]:
    """(status, body) of a GET (no body) or a JSON POST; HTTP errors are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def review(namespace: str) -> dict[str, Any]:
    obj = gpu_pod_manifest("probe", gpus=0)
    obj["metadata"]["namespace"] = namespace
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "4f7d1c1e-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "name": "probe",
            "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": obj,
            "dryRun": True,
        },
    }


def foreign_client_context(cafile: str, tmp: Path) -> ssl.SSLContext:
    """Trusts the server, presents a clientAuth certificate from a CA nobody trusts."""
    from fairshare import tls

    now = dt.datetime.now(dt.UTC)
    ca, ca_key = tls.make_ca("not-the-client-ca", days=1, now=now)
    cert, key = tls.make_client_cert(ca, ca_key, common_name="intruder", days=1, now=now)
    (tmp / "c.crt").write_bytes(cert)
    (tmp / "c.key").write_bytes(key)
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.load_cert_chain(tmp / "c.crt", tmp / "c.key")
    return ctx


async def test_only_the_control_plane_reaches_the_admission_paths_and_verbs(
    fairshare: FairshareDev,
    api: client.ApiClient,
    tenant_namespace: TenantNamespace,
    make_gpu_node: MakeNode,
    tmp_path: Path,
):
    h = fairshare.handles
    assert h.client_ca, "the local control plane should run the servers with --client-ca"
    await fairshare.set_config(api, CONFIG_HEAD + "tenants:\n- name: team-mtls\n")
    # The fixture's namespace came back with the tenant label the mutating webhook adds:
    # kube-apiserver got through with its client certificate.
    ns = await tenant_namespace("team-mtls")

    # The real kube-scheduler: a GPU pod is filtered and bound through the extender.
    node = unique("mtls-node")
    await make_gpu_node(node, gpus=2, labels={POOL: node})
    binds_before = await asyncio.to_thread(
        fairshare.metric, "extender", "fairshare_extender_requests_total"
    )
    pod = gpu_pod_manifest(unique("mtls"), gpus=1)
    pod["spec"]["nodeSelector"] = {POOL: node}
    await client.CoreV1Api(api).create_namespaced_pod(ns, pod)
    bound = await wait_pod(
        api,
        ns,
        pod["metadata"]["name"],
        lambda p: bool(p.spec.node_name),
        timeout=30,
        what="the pod to be bound through the extender",
    )
    assert bound.spec.node_name == node
    calls = await asyncio.to_thread(
        fairshare.metric, "extender", "fairshare_extender_requests_total"
    )
    assert calls > binds_before, "kube-scheduler never reached the extender"

    anonymous = {s: ssl.create_default_context(cafile=h.ca(s)) for s in ("webhook", "extender")}
    body = review(ns)
    filter_body = {"Pod": pod, "NodeNames": [node]}
    # No client certificate: 403 on the admission paths and the verbs ...
    for server, path, payload in (
        ("webhook", "/validate", body),
        ("webhook", "/mutate", body),
        ("extender", "/filter", filter_body),
        ("extender", "/prioritize", filter_body),
        ("extender", "/bind", {"PodName": "x", "PodNamespace": ns, "PodUID": "u", "Node": node}),
    ):
        status, text = await asyncio.to_thread(
            call, h.url(server, path), anonymous[server], payload
        )
        assert status == 403, (server, path, status, text)
        assert "client certificate required" in text
    # ... while probes and scrapes need none.
    for server in ("webhook", "extender"):
        for path in ("/healthz", "/readyz", "/metrics"):
            status, _ = await asyncio.to_thread(call, h.url(server, path), anonymous[server])
            assert status == 200, (server, path, status)

    # A client certificate from another CA fails the handshake itself.
    for server in ("webhook", "extender"):
        ctx = foreign_client_context(h.ca(server), tmp_path)
        with pytest.raises(OSError):
            await asyncio.to_thread(call, h.url(server, "/healthz"), ctx)

    # The control plane's own certificate (what kube-scheduler presents) is accepted.
    status, text = await asyncio.to_thread(
        call, h.url("webhook", "/validate"), h.client_context("webhook"), body
    )
    assert status == 200, text
    assert json.loads(text)["response"]["uid"] == body["request"]["uid"]
    status, text = await asyncio.to_thread(
        call, h.url("extender", "/filter"), h.client_context("extender"), filter_body
    )
    assert status == 200, text
    assert node in (json.loads(text).get("NodeNames") or [])


async def test_client_certs_command_writes_keeps_and_reuses_the_secrets(
    api: client.ApiClient, cluster: Any, tmp_path: Path
):
    """`fairshare client-certs --secrets` against the real apiserver: the Job's
    --keep-existing never replaces a client CA in use; --reuse stores files made
    before (the kind flow) over the existing Secrets."""
    import subprocess
    import sys

    core = client.CoreV1Api(api)
    ns = (
        await core.create_namespace({"metadata": {"generateName": "client-certs-"}})
    ).metadata.name

    def run(out: Path, *extra: str) -> str:
        argv = [sys.executable, "-m", "fairshare_cli", "client-certs", "--out", str(out)]
        argv += ["--secrets", ns, "--kubeconfig", str(cluster.kubeconfig), *extra]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    async def ca_in_secret() -> bytes:
        import base64

        secret = await core.read_namespaced_secret("fairshare-client-ca", ns)
        return base64.b64decode(secret.data["ca.crt"])

    try:
        first = tmp_path / "first"
        assert "fairshare-scheduler-client written" in run(first, "--keep-existing")
        assert await ca_in_secret() == (first / "client-ca.crt").read_bytes()
        kept = run(tmp_path / "second", "--keep-existing")
        assert "keeping the client CA" in kept
        assert not (tmp_path / "second").exists()
        assert await ca_in_secret() == (first / "client-ca.crt").read_bytes()
        other = tmp_path / "other"
        run(other)  # a new CA replaces the Secrets without --keep-existing
        assert await ca_in_secret() == (other / "client-ca.crt").read_bytes()
        run(first, "--reuse")
        assert await ca_in_secret() == (first / "client-ca.crt").read_bytes()
        for name in ("fairshare-apiserver-client", "fairshare-scheduler-client"):
            secret = await core.read_namespaced_secret(name, ns)
            assert secret.type == "kubernetes.io/tls"
            assert set(secret.data) == {"tls.crt", "tls.key", "ca.crt"}
    finally:
        await core.delete_namespace(ns)
