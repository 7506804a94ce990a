"""Handoff "hami" on the real control plane, with a kwok node that looks like a HAMi node
(the `hami.io/node-nvidia-register` annotation, `nvidia.com/gpu` = GPUs x 10 replicas).
HAMi's device plugin is simulated: after each bind the test does what its Allocate does
(bind-phase success, the node lock released).

* a whole-GPU pod gets HAMi's annotations on its Binding (the register's UUID, all of its
  memory, 100 % of cores) and the node lock names it;
* while that lock is held, the next GPU pod is not bound (one allocation per node at a
  time); once the "plugin" released it, it is;
* a 0.25 pod asks for the nvidia.com/gpu: 1 replica and gets a quarter of a GPU's memory
  with no core limit.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kubernetes_asyncio import client

from .conftest import CONFIG_HEAD, FairshareDev, gpu_pod_manifest, unique, wait_for, wait_pod

REGISTER = "hami.io/node-nvidia-register"
LOCK = "hami.io/mutex.lock"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"


def register(node: str) -> str:
    return json.dumps(
        [
            {"id": f"GPU-{node}-0", "count": 10, "devmem": 81920, "devcore": 100,
             "type": "NVIDIA-A100", "mode": "hami-core", "health": True},
            {"id": f"GPU-{node}-1", "index": 1, "count": 10, "devmem": 81920, "devcore": 100,
             "type": "NVIDIA-A100", "mode": "hami-core", "health": True},
        ]
    )  # fmt: skip


async def allocate(api: client.ApiClient, ns: str, pod: str, node: str) -> None:
    """What HAMi's device plugin does once it allocated the pod's devices."""
    core = client.CoreV1Api(api)
    await core.patch_namespaced_pod(
        pod, ns, {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}
    )
    await core.patch_node(node, {"metadata": {"annotations": {LOCK: None}}})


async def test_hami_annotations_and_node_lock(
    fairshare: FairshareDev, api: client.ApiClient, namespace: str, make_gpu_node: Any
) -> None:
    await fairshare.set_config(api, CONFIG_HEAD + "gpuSharing:\n  handoff: hami\n")
    core = client.CoreV1Api(api)
    node = unique("hami")
    await make_gpu_node(node, gpus=20, annotations={REGISTER: register(node)})
    await core.create_namespaced_pod(namespace, gpu_pod_manifest("w", 1, node=node))
    w = await wait_pod(api, namespace, "w", lambda p: bool(p.spec.node_name), what="bound")
    ann = w.metadata.annotations
    slot = int(ann["fairshare.io/gpu-devices"].split(":")[0])
    assert ann[TO_ALLOCATE] == f"GPU-{node}-{slot},NVIDIA,81920,100:;"
    assert ann["hami.io/vgpu-devices-allocated"] == ann[TO_ALLOCATE]
    assert (ann["hami.io/vgpu-node"], ann["hami.io/bind-phase"]) == (node, "allocating")
    assert int(ann["hami.io/bind-time"]) > 0
    lock = (await core.read_node(node)).metadata.annotations[LOCK]
    assert lock.endswith(f",{namespace},w")

    # The lock is held: the next GPU pod waits, whatever kube-scheduler's retries.
    q = gpu_pod_manifest("q", 0, node=node, annotations={"fairshare.io/gpu-fraction": "0.25"})
    await core.create_namespaced_pod(namespace, q)
    q_pod = await core.read_namespaced_pod("q", namespace)
    limits = q_pod.spec.containers[0].resources.limits
    assert limits["nvidia.com/gpu"] == "1"
    await asyncio.sleep(4)
    assert not (await core.read_namespaced_pod("q", namespace)).spec.node_name

    await allocate(api, namespace, "w", node)
    q_pod = await wait_pod(api, namespace, "q", lambda p: bool(p.spec.node_name), what="bound")
    q_ann = q_pod.metadata.annotations
    q_slot = int(q_ann["fairshare.io/gpu-devices"].split(":")[0])
    assert q_slot != slot
    assert q_ann[TO_ALLOCATE] == f"GPU-{node}-{q_slot},NVIDIA,20480,0:;"

    async def locked_for_q() -> bool:
        value = (await core.read_node(node)).metadata.annotations.get(LOCK, "")
        return value.endswith(f",{namespace},q")

    await wait_for(locked_for_q, timeout=10, what="the node lock naming q")
    await allocate(api, namespace, "q", node)
