"""Handoff "hami": HAMi's annotations as fairshare writes and reads them (pure)."""

from __future__ import annotations

import json

import pytest

from extender import hami
from extender.hami import HamiDevice, HamiFormatError

JSON_REGISTER = json.dumps(
    [
        {"id": "GPU-aaa", "count": 10, "devmem": 81920, "devcore": 100, "type": "NVIDIA-A100",
         "mode": "hami-core", "health": True},
        {"id": "GPU-bbb", "index": 1, "count": 10, "devmem": 81920, "devcore": 100,
         "type": "NVIDIA-A100", "numa": 1, "mode": "hami-core", "health": True},
    ]
)  # fmt: skip
LEGACY_REGISTER = (
    "GPU-aaa,10,81920,100,NVIDIA-A100,0,true:GPU-bbb,10,81920,100,NVIDIA-A100,1,false,1,hami-core:"
)


def test_both_register_formats_give_the_devices_by_index():
    want = [
        HamiDevice("GPU-aaa", 0, 10, 81920, 100, "NVIDIA-A100", True),
        HamiDevice("GPU-bbb", 1, 10, 81920, 100, "NVIDIA-A100", True),
    ]
    assert hami.parse_register(JSON_REGISTER) == want
    legacy = hami.parse_register(LEGACY_REGISTER)
    assert legacy[0] == want[0] and legacy[1].health is False and legacy[1].index == 1


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[{}]", "a device needs an id"),
        ("GPU-a,10,x,100,T,0,true:", "devmem"),
        ("GPU-a,10,1,100:", "4 fields, want 7 or 9"),
        ("nonsense", "neither JSON nor"),
        ("GPU-a,10,1,100,T,0,maybe:", "not a boolean"),
    ],
)
def test_a_bad_register_says_what_is_wrong(text, problem):
    with pytest.raises(HamiFormatError, match=problem):
        hami.parse_register(text)


def test_pod_devices_per_container_init_first_each_closed():
    spec = {
        "initContainers": [{"name": "fetch"}],
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            {"name": "side"},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        ],
    }
    devs = [("GPU-1", 81920, 100), ("GPU-2", 81920, 100), ("GPU-3", 81920, 100)]
    per = hami.container_devices(spec, devs)
    assert hami.encode_pod_devices(per) == (
        ";GPU-1,NVIDIA,81920,100:GPU-2,NVIDIA,81920,100:;;GPU-3,NVIDIA,81920,100:;"
    )
    share = hami.container_devices(spec, [("GPU-2", 20480, 0)], share_container=2)
    assert hami.encode_pod_devices(share) == ";;;GPU-2,NVIDIA,20480,0:;"


def test_shares_take_memory_by_fraction_or_request_and_no_core_limit():
    reg = hami.parse_register(JSON_REGISTER)
    assert hami.device_shares(reg, [(1, 250.0)], memory=None) == [("GPU-bbb", 20480, 0)]
    assert hami.device_shares(reg, [(0, 1000.0)], memory=None) == [("GPU-aaa", 81920, 100)]
    assert hami.device_shares(reg, [(0, 100.0)], memory=8 * 2**30) == [("GPU-aaa", 8192, 0)]
    assert "device index 5" in str(hami.device_shares(reg, [(5, 1000.0)], memory=None))


def test_binding_annotations_and_the_node_lock():
    ann = hami.binding_annotations("n1", "GPU-1,NVIDIA,10,0:;", now=1_700_000_000.7)
    assert ann == {
        "hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,10,0:;",
        "hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,10,0:;",
        "hami.io/vgpu-node": "n1",
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": "1700000000",
    }
    value = hami.lock_value(1_700_000_000, "lab", "p")
    assert value == "2023-11-14T22:13:20Z,lab,p"
    assert hami.parse_lock(value) == (1_700_000_000.0, "lab", "p")
    now = 1_700_000_060.0
    assert hami.lock_holder(value, now=now, namespace="lab", name="q") == "lab/p"
    assert hami.lock_holder(value, now=now, namespace="lab", name="p") is None  # ours
    assert hami.lock_holder(value, now=now + 300, namespace="lab", name="q") is None  # expired
    assert hami.lock_holder(None, now=now, namespace="lab", name="q") is None
