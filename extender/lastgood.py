"""The extender's leader records the config in force in the ConfigMap ``<name>-last-good``
(plain YAML under ``config.yaml``, annotated ``fairshare.io/recorded-at``), once the
first list is in and after each reload that changed it. ``fairshare status`` and
``explain`` read it when the config ConfigMap holds an invalid config. RBAC: the extender
may update only this ConfigMap.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from kubernetes_asyncio import client

import serving
from extender.leader import write_configmap
from fairshare.config.loading import LAST_GOOD_SUFFIX, dump_config
from fairshare.config.reloading import CONFIG_KEY
from fairshare.config.schema import FairShareConfig
from fairshare.errors import FairshareError

log = logging.getLogger("fairshare.extender.lastgood")

PERIOD: Final = 5.0
"""Seconds between two looks at the config in force."""
ANN_RECORDED: Final = "fairshare.io/recorded-at"


def last_good_body(namespace: str, name: str, config: FairShareConfig) -> dict[str, Any]:
    """The ConfigMap that records ``config`` as the last good one of ``namespace/name``."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name + LAST_GOOD_SUFFIX,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "fairshare"},
            "annotations": {ANN_RECORDED: stamp},
        },
        "data": {CONFIG_KEY: dump_config(config)},
    }


class LastGoodRecorder:
    """Writes the config in force while leading (module docstring)."""

    def __init__(
        self,
        *,
        api_client: Any,
        ref: tuple[str, str],
        config: Callable[[], FairShareConfig],
        synced: asyncio.Event,
        is_leader: Callable[[], bool],
    ) -> None:

        self.core: Any = client.CoreV1Api(api_client)
        self.namespace, self.name = ref
        self.config, self.synced, self.is_leader = config, synced, is_leader
        self._written: FairShareConfig | None = None

    def background(self) -> Callable[[Any], AsyncIterator[None]]:
        return serving.background_task(self.run, "record-last-good-config")

    async def run(self) -> None:
        await self.synced.wait()
        while True:
            if self.is_leader():
                with contextlib.suppress(Exception):
                    await self.record()
            else:
                self._written = None  # a new term writes again
            await asyncio.sleep(PERIOD)

    async def record(self) -> bool:
        """Write the config in force if it is not the one last written; True if written."""
        config = self.config()
        if config is self._written:
            return False
        name = self.name + LAST_GOOD_SUFFIX
        body = last_good_body(self.namespace, self.name, config)
        try:
            written = await write_configmap(self.core, body, key=CONFIG_KEY)
        except FairshareError as exc:
            log.warning("recording the config in force: %s", exc)
            return False
        if not written:
            self._written = config
            return False
        self._written = config
        log.info("recorded the config in force in ConfigMap %s/%s", self.namespace, name)
        return True
