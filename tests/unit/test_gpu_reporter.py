"""`fairshare gpu-reporter` with the environment a device plugin gives a container."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from fairshare import gpu_reporter
from fairshare.gpu_reporter import ReporterError, visible_gpu
from fairshare_cli import main as cli

UUID = "GPU-8f3c2a51-1b7e-4c9d-a2f0-6e5d4c3b2a10"
POD = {"POD_NAME": "gpu-reservation-n1-abcde", "POD_NAMESPACE": "fairshare-reservation"}


def no_nvml() -> list[str]:
    raise ReporterError("NVML (libnvidia-ml.so.1) is not available")


def test_the_device_plugins_uuid_is_reported_and_the_reporter_waits():
    patches: list[tuple[str, str, dict[str, Any]]] = []

    async def patch(ns: str, name: str, body: dict[str, Any]) -> None:
        patches.append((ns, name, body))

    async def scenario() -> str:
        stop = asyncio.Event()
        task = asyncio.create_task(
            gpu_reporter.run(
                {**POD, "NVIDIA_VISIBLE_DEVICES": UUID}, patch, stop=stop, nvml=no_nvml
            )
        )
        for _ in range(100):
            if patches:
                break
            await asyncio.sleep(0.01)
        assert not task.done()  # holds the GPU until told to stop
        stop.set()
        return await task

    assert asyncio.run(scenario()) == UUID
    assert patches == [
        (
            "fairshare-reservation",
            "gpu-reservation-n1-abcde",
            {"metadata": {"annotations": {"run.ai/reserve_for_gpu_index": UUID}}},
        )
    ]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (f"{UUID},GPU-0000", "2 devices; a reservation holds exactly one"),
        ("void", "was given no GPU"),
        ("none", "was given no GPU"),
        ("all", "NVML (libnvidia-ml.so.1) is not available"),
        (None, "NVML (libnvidia-ml.so.1) is not available"),
        ("0", "NVML (libnvidia-ml.so.1) is not available"),
        ("/var/run/nvidia-container-devices", "neither a GPU UUID nor an index"),
    ],
)
def test_anything_but_one_known_gpu_is_a_clear_error(value, problem):
    env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
    with pytest.raises(ReporterError, match=re.escape(problem)):
        visible_gpu(env, no_nvml)


def test_indexes_and_all_are_resolved_through_nvml_when_it_is_there():
    assert visible_gpu({"NVIDIA_VISIBLE_DEVICES": "3"}, lambda: [UUID]) == UUID
    assert visible_gpu({}, lambda: [UUID]) == UUID
    with pytest.raises(ReporterError, match="NVML shows 2 devices"):
        visible_gpu({"NVIDIA_VISIBLE_DEVICES": "all"}, lambda: [UUID, UUID])


def test_without_nvml_in_this_process_the_real_loader_says_so(monkeypatch):
    monkeypatch.setattr("ctypes.CDLL", lambda name: (_ for _ in ()).throw(OSError("not found")))
    with pytest.raises(ReporterError, match=r"NVML .*not available"):
        visible_gpu({"NVIDIA_VISIBLE_DEVICES": "all"})


def test_the_cli_fails_clearly_without_the_downward_api(monkeypatch, capsys):
    for key in ("POD_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", UUID)

    async def fake_client(kubeconfig: str | None) -> Any:
        from kubernetes_asyncio import client

        return client.ApiClient(client.Configuration())

    monkeypatch.setattr("fairshare.state.informers.make_api_client", fake_client)
    assert cli.main(["gpu-reporter"]) == 1
    assert "POD_NAME and POD_NAMESPACE must be set" in capsys.readouterr().err
