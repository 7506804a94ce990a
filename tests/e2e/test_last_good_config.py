"""``fairshare status`` / ``explain`` on the last good config when the ConfigMap holds an
invalid one (the config guard bypassed): the extender's leader records the config in force
in ConfigMap ``fairshare-config-last-good``, the CLI shows the cluster on it and warns."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import BASE_CONFIG, CONFIG_HEAD, FairshareDev, dev_module, unique, wait_for

pytestmark = pytest.mark.e2e

GUARD = "config.fairshare.io"


def run_cli(fairshare: FairshareDev, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "fairshare_cli",
            *args,
            "--kubeconfig",
            str(fairshare.cluster.kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def last_good_text(api: client.ApiClient) -> str | None:
    dev = dev_module()
    try:
        cm = await client.CoreV1Api(api).read_namespaced_config_map(
            f"{dev.CONFIGMAP}-last-good", dev.SYSTEM_NAMESPACE
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    data: dict[str, Any] = cm.data or {}
    return data.get(dev.CONFIG_KEY)


async def test_status_and_explain_show_the_last_good_config_with_a_warning(
    api: client.ApiClient, fairshare: FairshareDev, tmp_path: Path
) -> None:
    dev = dev_module()
    a, b = unique("lg-a"), unique("lg-b")
    await fairshare.set_config(
        api, CONFIG_HEAD + f"tenants:\n- name: {a}\n  weight: 3\n- name: {b}\n"
    )

    async def recorded() -> bool:
        text = await last_good_text(api)
        return text is not None and a in text and b in text

    await wait_for(recorded, timeout=20, what="the leader to record the config in force")

    # The config guard bypassed: an invalid config lands in the ConfigMap.
    admission = client.AdmissionregistrationV1Api(api)
    vwc = await admission.read_validating_webhook_configuration(dev.WEBHOOK_NAME)
    saved = vwc.webhooks
    vwc.webhooks = [w for w in saved if w.name != GUARD]
    await admission.replace_validating_webhook_configuration(dev.WEBHOOK_NAME, vwc)
    bad = CONFIG_HEAD + f"tenants:\n- name: {a}\n  weight: -1\n"
    try:
        await asyncio.sleep(1)  # kube-apiserver's webhook configuration cache
        await client.CoreV1Api(api).patch_namespaced_config_map(
            dev.CONFIGMAP, dev.SYSTEM_NAMESPACE, {"data": {dev.CONFIG_KEY: bad}}
        )
    finally:
        vwc = await admission.read_validating_webhook_configuration(dev.WEBHOOK_NAME)
        vwc.webhooks = saved
        await admission.replace_validating_webhook_configuration(dev.WEBHOOK_NAME, vwc)
    try:
        out = await asyncio.to_thread(run_cli, fairshare, "status", "-o", "json")
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        (warning,) = data["warnings"]
        assert "holds an invalid config" in warning and "tenants[0].weight" in warning
        assert "fairshare-config-last-good" in warning
        weights = {t["name"]: t["weight"] for t in data["tenants"]}
        assert weights[a] == 3 and b in weights  # the last good config, not the bad one
        text = await asyncio.to_thread(run_cli, fairshare, "status")
        assert text.stdout.startswith("WARNING: ConfigMap fairshare-system/fairshare-config")
        pod = tmp_path / "pod.yaml"
        pod.write_text(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: probe, namespace: default}\n"
            "spec:\n  containers:\n  - {name: main, image: registry.k8s.io/pause:3.10}\n",
            encoding="utf-8",
        )
        explain = await asyncio.to_thread(run_cli, fairshare, "explain", "-f", str(pod))
        assert explain.returncode == 0, explain.stderr
        assert explain.stdout.startswith("WARNING: ConfigMap fairshare-system/fairshare-config")
        # The last good record was not replaced by the invalid config.
        assert a in (await last_good_text(api) or "") and "weight: -1" not in (
            await last_good_text(api) or ""
        )
    finally:
        await fairshare.set_config(api, BASE_CONFIG)
