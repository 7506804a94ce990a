"""Handoff ``hami``, the adapter around the Binding of a GPU pod to a node with
``hami.io/node-nvidia-register``: read the Node, take its node lock (a merge patch with
the Node's ``resourceVersion``; another live pod's lock younger than 5 minutes refuses
the bind, and kube-scheduler retries it) and add HAMi's device annotations to the
Binding. HAMi's device plugin releases the lock once it allocated; a bind that fails
after taking it releases it here. Other nodes are left alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes_asyncio import client as k8s_client

from extender import hami, verbs
from extender.leader import call_raw
from fairshare import quantities
from fairshare.config.schema import FairShareConfig
from fairshare.resources import ANN_GPU_CONTAINER, ANN_GPU_MEMORY

log = logging.getLogger("fairshare.extender.hami")
_client: Any = k8s_client


class HamiHooks:
    """``BindHooks`` of handoff ``hami`` (see the module docstring)."""

    def __init__(
        self,
        *,
        api_client: Any,
        pods: Mapping[str, Mapping[str, Any]],
        config: Callable[[], FairShareConfig],
    ) -> None:
        self.core = _client.CoreV1Api(api_client)
        self.pods = pods
        """The cache's known pods (read only)."""
        self.config = config
        self.locked: dict[str, str] = {}
        """pod uid -> node whose lock this process took for it (released on failure)."""

    async def before_binding(self, plan: verbs.BindPlan) -> verbs.BindPlan | str:
        if self.config().gpu_sharing.handoff != "hami" or not plan.devices:
            return plan
        status, node = await call_raw(self.core.read_node(plan.node, _preload_content=False))
        if status != 200:
            return f"reading node {plan.node}: HTTP {status}"
        meta = node.get("metadata") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        if hami.ANN_REGISTER not in annotations:
            return plan
        try:
            register = hami.parse_register(annotations[hami.ANN_REGISTER])
        except hami.HamiFormatError as exc:
            return f"node {plan.node}: {exc}"
        pod = self.pods.get(plan.uid) or {}
        spec = pod.get("spec") or {}
        share = plan.group != ""
        memory = None
        pod_ann = (pod.get("metadata") or {}).get("annotations") or {}
        if share and ANN_GPU_MEMORY in pod_ann:
            memory = int(quantities.parse_quantity(pod_ann[ANN_GPU_MEMORY]))
        devices = hami.device_shares(register, plan.devices, memory=memory)
        if isinstance(devices, str):
            return f"node {plan.node}: {devices}"
        index = 0
        if share and ANN_GPU_CONTAINER in pod_ann:
            names = [c.get("name") for c in spec.get("containers") or []]
            index = (
                names.index(pod_ann[ANN_GPU_CONTAINER])
                if pod_ann[ANN_GPU_CONTAINER] in names
                else 0
            )
        per_container = hami.container_devices(
            spec, devices, share_container=index if share else None
        )
        if not share and sum(map(len, per_container[len(spec.get("initContainers") or []) :])) == 0:
            return plan  # no container asks for nvidia.com/gpu itself
        err = await self._lock(plan, node)
        if err:
            return err
        extra = hami.binding_annotations(
            plan.node, hami.encode_pod_devices(per_container), now=time.time()
        )
        annotations_out = {**plan.annotations, **extra}
        body = verbs.binding_body(
            name=plan.name,
            namespace=plan.namespace,
            uid=plan.uid,
            node=plan.node,
            annotations=annotations_out,
        )
        return replace(plan, annotations=annotations_out, binding=body)

    async def _lock(self, plan: verbs.BindPlan, node: Mapping[str, Any]) -> str:
        meta = node.get("metadata") or {}
        current = (meta.get("annotations") or {}).get(hami.ANN_LOCK)
        now = time.time()
        holder = hami.lock_holder(current, now=now, namespace=plan.namespace, name=plan.name)
        if holder is not None and holder != "?":
            ns, name = holder.split("/", 1)
            status, _ = await call_raw(
                self.core.read_namespaced_pod(name, ns, _preload_content=False)
            )
            if status != 404:
                return (
                    f"node {plan.node} is locked by HAMi for pod {holder} ({current}); "
                    "one GPU allocation per node at a time"
                )
        elif holder == "?":
            return f"node {plan.node} is locked by HAMi ({current})"
        body = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {hami.ANN_LOCK: hami.lock_value(now, plan.namespace, plan.name)},
            }
        }
        status, data = await call_raw(self.core.patch_node(plan.node, body, _preload_content=False))
        if status == 409:
            return f"node {plan.node} changed while taking HAMi's lock; retry"
        if not 200 <= status < 300:
            return f"taking HAMi's lock on {plan.node}: HTTP {status} {data.get('message', '')}"
        self.locked[plan.uid] = plan.node
        return ""

    def after_binding(self, plan: verbs.BindPlan, started: float) -> None:
        self.locked.pop(plan.uid, None)

    async def binding_failed(self, plan: verbs.BindPlan) -> None:
        node = self.locked.pop(plan.uid, None)
        if node is None:
            return
        body = {"metadata": {"annotations": {hami.ANN_LOCK: None}}}
        status, _ = await call_raw(self.core.patch_node(node, body, _preload_content=False))
        if not 200 <= status < 300:
            log.warning("releasing HAMi's lock on %s: HTTP %s", node, status)
