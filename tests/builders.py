"""Test builders for Kubernetes objects (after k/k's st.MakePod and kueue's wrappers)."""

from __future__ import annotations

from typing import Any


class PodBuilder:
    """``make_pod("p").ns("a").req(cpu="1", gpu=1).ann(...).obj()``."""

    def __init__(self, name: str) -> None:
        self._pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": []},
        }

    def ns(self, namespace: str) -> PodBuilder:
        self._pod["metadata"]["namespace"] = namespace
        return self

    def ann(self, **annotations: str) -> PodBuilder:
        anns = self._pod["metadata"].setdefault("annotations", {})
        anns.update({k.replace("__", "/").replace("_", "-"): v for k, v in annotations.items()})
        return self

    def annotations(self, mapping: dict[str, str]) -> PodBuilder:
        self._pod["metadata"].setdefault("annotations", {}).update(mapping)
        return self

    @staticmethod
    def _resources(
        requests: dict[str, Any] | None, limits: dict[str, Any] | None
    ) -> dict[str, Any]:
        res: dict[str, Any] = {}
        if requests:
            res["requests"] = {k: str(v) for k, v in requests.items()}
        if limits:
            res["limits"] = {k: str(v) for k, v in limits.items()}
        return res

    def container(
        self,
        name: str = "",
        *,
        requests: dict[str, Any] | None = None,
        limits: dict[str, Any] | None = None,
    ) -> PodBuilder:
        c = {"name": name or f"c{len(self._pod['spec']['containers'])}"}
        c["resources"] = self._resources(requests, limits)  # type: ignore[assignment]
        self._pod["spec"]["containers"].append(c)
        return self

    def init(
        self,
        name: str = "",
        *,
        requests: dict[str, Any] | None = None,
        limits: dict[str, Any] | None = None,
        sidecar: bool = False,
    ) -> PodBuilder:
        inits = self._pod["spec"].setdefault("initContainers", [])
        c: dict[str, Any] = {"name": name or f"i{len(inits)}"}
        c["resources"] = self._resources(requests, limits)
        if sidecar:
            c["restartPolicy"] = "Always"
        inits.append(c)
        return self

    def req(self, gpu: Any = None, **requests: Any) -> PodBuilder:
        reqs = {k.replace("_", "-"): v for k, v in requests.items()}
        if gpu is not None:
            reqs["nvidia.com/gpu"] = gpu
        return self.container(requests=reqs)

    def overhead(self, **amounts: str) -> PodBuilder:
        self._pod["spec"]["overhead"] = dict(amounts)
        return self

    def pvc(self, claim: str) -> PodBuilder:
        vols = self._pod["spec"].setdefault("volumes", [])
        vols.append({"name": claim, "persistentVolumeClaim": {"claimName": claim}})
        return self

    def obj(self) -> dict[str, Any]:
        return self._pod


def make_pod(name: str = "pod") -> PodBuilder:
    return PodBuilder(name)
