"""ApiSource against the real control plane: list + watch of nodes, pods and the ConfigMap.

Each test starts its own ApiSource (a fresh ApiClient from the cluster's kubeconfig, closed
by ``stop``), waits for ``ready``, then changes the cluster with the fixtures' client and
waits, bounded, for the change to reach the sink.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from fairshare.config.loading import parse_config
from fairshare.config.reloading import ConfigHolder, ConfigMapSink
from fairshare.state.informers import make_api_client
from fairshare.state.sources import ApiSource, Sink, Store
from tests.gotools import skip_or_fail

from .conftest import (
    GPU,
    STATE_DIR,
    Cluster,
    MakeNode,
    cluster_module,
    gpu_pod_manifest,
    unique,
    wait_for,
)

pytestmark = pytest.mark.e2e

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


async def test_an_expired_watch_gets_410_from_the_apiserver_and_relists_exactly(
    api: client.ApiClient, cluster: Cluster, namespace: str
):
    """A client whose resourceVersion expired while it was away (older than the
    apiserver's watch cache) gets 410 Gone from the real apiserver; the Reflector relists
    and the store then holds exactly the API's pods: the one deleted while it was away is
    gone, the one created is there, nothing twice. A later change arrives by watch."""
    import asyncio

    from fairshare.state import informers

    if not cluster.managed:
        skip_or_fail("restarts kube-apiserver: needs the local control plane, not a kind cluster")
    core = client.CoreV1Api(api)
    names = [unique("rv") for _ in range(3)]
    for name in names:
        await core.create_namespaced_pod(namespace, gpu_pod_manifest(name, 0))

    class Counting(Store):
        def __init__(self) -> None:
            super().__init__()
            self.resyncs = 0

        def on_resync(self, kind: str, objects: list[dict[str, Any]]) -> None:
            self.resyncs += 1
            super().on_resync(kind, objects)

    store = Counting()
    api_client = await make_api_client(str(cluster.kubeconfig))
    list_fn, real_watch = informers.api_calls(api_client, "Pod", namespace=namespace)
    away = asyncio.Event()  # a network outage between the client and the apiserver
    seen_errors: list[Any] = []  # exceptions, and ERROR events (how a cached watch says 410)

    async def watch_fn(rv: str, timeout: int) -> AsyncIterator[Mapping[str, Any]]:
        if away.is_set():
            raise ConnectionResetError("partitioned from the apiserver")
        try:
            async for event in real_watch(rv, timeout):
                if away.is_set():
                    raise ConnectionResetError("partitioned from the apiserver")
                if event.get("type") == "ERROR":
                    seen_errors.append(event["object"])
                yield event
        except Exception as exc:
            seen_errors.append(exc)
            raise

    async def no_backoff(_delay: float) -> None:
        await asyncio.sleep(0.05)

    reflector = informers.Reflector(
        "Pod",
        list_fn=list_fn,
        watch_fn=watch_fn,
        sink=store,
        watch_timeout_seconds=1,  # the watch comes back often, so the outage is noticed
        sleep=no_backoff,
    )
    task = asyncio.create_task(reflector.run())
    try:
        await wait_for(lambda: _true(reflector.synced.is_set()), timeout=30, what="the first list")
        assert sorted(k.split("/")[1] for k in store.keys("Pod")) == sorted(names)
        away.set()
        await wait_for(
            lambda: _true(reflector.failing_since is not None), timeout=10, what="the outage"
        )
        # While away: one pod deleted, then kube-apiserver restarts, so its new watch
        # cache begins after the client's resourceVersion (what a long partition or an
        # etcd compaction leaves a client with), then one pod created.
        await core.delete_namespaced_pod(names[0], namespace, grace_period_seconds=0)
        stale_rv = reflector.resource_version
        await asyncio.to_thread(
            cluster_module().restart_component,
            cluster_module().Paths(STATE_DIR),
            "kube-apiserver",
        )
        late = unique("rv-late")
        await wait_for(
            lambda: _created(core, namespace, late), timeout=60, what="the apiserver back"
        )
        assert reflector.resource_version == stale_rv
        away.clear()

        await wait_for(lambda: _true(store.resyncs >= 2), timeout=30, what="a relist")
        gone = [
            e
            for e in seen_errors
            if (isinstance(e, dict) and e.get("code") == 410)
            or (isinstance(e, BaseException) and informers.is_gone(e))
        ]
        assert gone, f"the apiserver did not answer 410 Gone: {seen_errors!r}"
        assert reflector.lists == 2
        listed = (await core.list_namespaced_pod(namespace)).items
        want = {f"{namespace}/{p.metadata.name}" for p in listed}
        assert set(store.keys("Pod")) == want
        assert len(store.keys("Pod")) == len(want)  # nothing twice
        assert f"{namespace}/{names[0]}" not in want and f"{namespace}/{late}" in want

        # The watch resumed from the relist's resourceVersion.
        after = unique("rv-after")
        await core.create_namespaced_pod(namespace, gpu_pod_manifest(after, 0))
        await wait_for(
            lambda: _true(store.get("Pod", f"{namespace}/{after}") is not None),
            timeout=30,
            what="a pod created after the relist",
        )
        assert reflector.lists == 2, "the watch should not have needed another relist"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api_client.close()


async def _true(value: bool) -> bool:
    return value


async def _created(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        await core.create_namespaced_pod(namespace, gpu_pod_manifest(name, 0))
    except (OSError, aiohttp.ClientError, TimeoutError):
        return False
    except ApiException as exc:
        if exc.status == 409:
            return True
        if exc.status >= 500:
            return False
        raise
    return True
