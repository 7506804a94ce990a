"""ApiSource against the real control plane: list + watch of nodes, pods and the ConfigMap.

Each test starts its own ApiSource (a fresh ApiClient from the cluster's kubeconfig, closed
by ``stop``), waits for ``ready``, then changes the cluster with the fixtures' client and
waits, bounded, for the change to reach the sink.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from fairshare.config.loading import parse_config
from fairshare.config.reloading import ConfigHolder, ConfigMapSink
from fairshare.state.informers import make_api_client
from fairshare.state.sources import ApiSource, Sink, Store

from .conftest import GPU, Cluster, gpu_pod_manifest, unique, wait_for

pytestmark = pytest.mark.e2e

MakeNode = Callable[..., Awaitable[client.V1Node]]
HEAD = "apiVersion: fairshare.io/v1alpha1\nkind: FairShareConfig\n"


def config_text(weight: float) -> str:
    return HEAD + f"tenants:\n- name: team-a\n  namespaces: [a]\n  weight: {weight}\n"


@pytest.fixture
async def start_source(cluster: Cluster) -> AsyncIterator[Callable[..., Awaitable[ApiSource]]]:
    """`await start_source(sink, **ApiSource kwargs)`: started and ready; stopped afterwards."""
    started: list[ApiSource] = []

    async def start(sink: Sink, **kwargs: Any) -> ApiSource:
        source = ApiSource(lambda: make_api_client(str(cluster.kubeconfig)), **kwargs)
        started.append(source)
        await source.start(sink)
        await wait_for(_is_set(source), timeout=30, what="ApiSource ready")
        return source

    yield start
    for source in started:
        await source.stop()


def _is_set(source: ApiSource) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return source.ready.is_set()

    return probe


async def test_api_source_sees_new_node_and_pod_and_the_deleted_pod_goes(
    api: client.ApiClient, namespace: str, make_gpu_node: MakeNode, start_source: Any
):
    store = Store()
    await start_source(store, kinds=("Node", "Pod", "Namespace"))
    assert namespace in store.keys("Namespace")  # from the initial list

    node_name = unique("informer-node")
    await make_gpu_node(node_name, gpus=8, wait_ready=False)
    core = client.CoreV1Api(api)
    pod_name = unique("informer-pod")
    await core.create_namespaced_pod(namespace, gpu_pod_manifest(pod_name, 1, node=node_name))
    pod_key = f"{namespace}/{pod_name}"

    async def both_seen() -> bool:
        return store.get("Node", node_name) is not None and store.get("Pod", pod_key) is not None

    await wait_for(both_seen, timeout=30, what="the new node and pod in the store")
    node = store.get("Node", node_name)
    pod = store.get("Pod", pod_key)
    assert node is not None and pod is not None
    # Raw API JSON: camelCase keys, kind filled in, never client models.
    assert node["kind"] == "Node" and node["status"]["allocatable"][GPU] == "8"
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 0
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": node_name}

    await core.delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)

    async def pod_gone() -> bool:
        return store.get("Pod", pod_key) is None

    await wait_for(pod_gone, timeout=30, what=f"pod {pod_key} to leave the store")
    assert store.get("Node", node_name) is not None


async def test_configmap_watch_reloads_and_keeps_the_last_good_config(
    api: client.ApiClient, namespace: str, start_source: Any
):
    core = client.CoreV1Api(api)
    name = "fairshare-config"
    body = {"metadata": {"name": name}, "data": {"config.yaml": config_text(2)}}
    await core.create_namespaced_config_map(namespace, body)
    holder = ConfigHolder(parse_config(config_text(1)))
    errors: list[int] = []
    sink = ConfigMapSink(holder, namespace=namespace, name=name, on_error=lambda: errors.append(1))
    await start_source(sink, kinds=(), configmap=(namespace, name))
    assert holder.current.tenants[0].weight == 2  # applied from the initial list

    async def replace(text: str) -> None:
        await core.patch_namespaced_config_map(name, namespace, {"data": {"config.yaml": text}})

    await replace(config_text(0))  # invalid: tenants[0].weight must be > 0

    async def refused() -> bool:
        return bool(errors)

    await wait_for(refused, timeout=30, what="the invalid update to be refused")
    assert holder.current.tenants[0].weight == 2
    assert sink.last_error is not None and "tenants[0].weight" in sink.last_error

    await replace(config_text(5))

    async def reloaded() -> bool:
        return holder.current.tenants[0].weight == 5

    await wait_for(reloaded, timeout=30, what="the valid update to be swapped in")
    assert holder.version == 3
