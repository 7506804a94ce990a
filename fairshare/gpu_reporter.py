"""``fairshare gpu-reporter``: the reservation pod's container reports the GPU it was given.

It merge-patches its own pod with ``run.ai/reserve_for_gpu_index: <UUID>``, the UUID read
from ``NVIDIA_VISIBLE_DEVICES`` or else from NVML (which must then show exactly one
device), and sleeps until SIGTERM, holding the GPU. When it cannot tell the UUID it fails
with the reason; the pod then never reports, and the extender surfaces that.
"""

from __future__ import annotations

import asyncio
import ctypes
import re
import signal
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from fairshare.errors import FairshareError

ANN_RESERVED_UUID: Final = "run.ai/reserve_for_gpu_index"
ENV_VISIBLE: Final = "NVIDIA_VISIBLE_DEVICES"
_UUID: Final = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")

__all__ = ["ANN_RESERVED_UUID", "ReporterError", "nvml_uuids", "report_patch", "run", "visible_gpu"]


class ReporterError(FairshareError):
    """The container's GPU cannot be told (the message says why)."""


def nvml_uuids() -> list[str]:
    """UUIDs of the devices NVML shows this container; ``ReporterError`` without NVML."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        raise ReporterError(
            f"{ENV_VISIBLE} names no GPU UUID and NVML (libnvidia-ml.so.1) is not available "
            f"in this container ({exc}); run it with the NVIDIA runtime"
        ) from exc
    if lib.nvmlInit_v2() != 0:
        raise ReporterError("nvmlInit failed: no GPU is visible to this container")
    try:
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            raise ReporterError("nvmlDeviceGetCount failed")
        out = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                raise ReporterError(f"nvmlDeviceGetHandleByIndex({i}) failed")
            buf = ctypes.create_string_buffer(96)
            if lib.nvmlDeviceGetUUID(handle, buf, 96) != 0:
                raise ReporterError(f"nvmlDeviceGetUUID({i}) failed")
            out.append(buf.value.decode())
        return out
    finally:
        lib.nvmlShutdown()


def visible_gpu(env: Mapping[str, str], nvml: Callable[[], list[str]] = nvml_uuids) -> str:
    """The one GPU UUID this container was given; ``ReporterError`` otherwise."""
    raw = env.get(ENV_VISIBLE)
    value = (raw or "").strip()
    if value in ("void", "none"):
        raise ReporterError(f"{ENV_VISIBLE}={value}: this container was given no GPU")
    entries = [e.strip() for e in value.split(",") if e.strip()] if value else []
    if entries and value != "all":
        if len(entries) != 1:
            raise ReporterError(
                f"{ENV_VISIBLE}={value}: {len(entries)} devices; a reservation holds exactly "
                "one (request nvidia.com/gpu: 1)"
            )
        if _UUID.match(entries[0]):
            return entries[0]
        if not entries[0].isdigit():
            raise ReporterError(f"{ENV_VISIBLE}={value}: neither a GPU UUID nor an index")
    uuids = nvml()
    if len(uuids) != 1:
        shown = f"{ENV_VISIBLE}={value}" if raw is not None else f"{ENV_VISIBLE} unset"
        raise ReporterError(f"{shown} and NVML shows {len(uuids)} devices; exactly one is needed")
    return uuids[0]


def report_patch(uuid: str) -> dict[str, Any]:
    """The merge patch the reporter applies to its own pod."""
    return {"metadata": {"annotations": {ANN_RESERVED_UUID: uuid}}}


async def run(
    env: Mapping[str, str],
    patch: Callable[[str, str, dict[str, Any]], Awaitable[None]],
    *,
    stop: asyncio.Event | None = None,
    nvml: Callable[[], list[str]] = nvml_uuids,
) -> str:
    """Report the GPU on the pod ``POD_NAMESPACE/POD_NAME`` with ``patch(ns, name, body)``,
    then wait for ``stop`` (SIGTERM/SIGINT when not given). Returns the UUID."""
    name, namespace = env.get("POD_NAME", ""), env.get("POD_NAMESPACE", "")
    if not name or not namespace:
        raise ReporterError("POD_NAME and POD_NAMESPACE must be set (downward API)")
    uuid = visible_gpu(env, nvml)
    await patch(namespace, name, report_patch(uuid))
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    return uuid
