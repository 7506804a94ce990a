"""fairshare's HAMi annotations against HAMi's own Go code, on every run, without Go.

tests/wire/hami/golden-<version>.json holds what HAMi's encoders and decoders
(``pkg/device``, ``pkg/util/nodelock`` at the pinned version and commit) returned once for
fairshare's annotations and for HAMi's own (made by tools/hami/golden.py, which builds
tools/hami/golden/main.go against a HAMi source tree). Here fairshare's encoder and
decoder (extender/hami.py) are compared with those answers:

* the pod annotation fairshare writes now is the one HAMi decoded, HAMi read each
  container's devices from it, and HAMi's encoder writes the same text for those devices;
* the node register HAMi's plugins write (JSON since v2.8, the 9-field list before) and odd
  register texts read as HAMi reads them, refused where HAMi refuses them;
* the node lock: fairshare writes what HAMi's key generator writes, and reads a lock as
  HAMi's ParseNodeLock does (offsets, fractional seconds, the old time-only form).

When extender/hami.py changes what it writes, the first test says so: rerun
tools/hami/golden.py to have HAMi's code decode the new text. The live check with the Go
helper (test_hami_go_decoders.py) runs in addition where HAMi can be fetched.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from extender import hami
from extender.hami import HamiDevice, HamiFormatError
from fairshare.state.objects import hami_device_count

from .test_hami_go_decoders import HAMI_PSEUDO, HAMI_TAG

FIXTURE = Path(__file__).resolve().parents[1] / "wire" / "hami" / f"golden-{HAMI_TAG}.json"
GOLDEN: dict[str, Any] = json.loads(FIXTURE.read_text())
REGEN = "rerun `python tools/hami/golden.py --hami-git HAMI/.git` to have HAMi decode it"

# Register texts HAMi reads (silently making a 0 of a field it cannot parse) that fairshare
# refuses instead, since HAMi's own plugins never write them (strconv.Itoa numbers).
FAIRSHARE_STRICTER = {
    "legacy, non-numeric devmem": "HAMi reads devmem 'x' as 0 MiB; fairshare refuses",
}
# Where fairshare differs from HAMi and should not (strict: a fix makes these fail here).
KNOWN_BUGS: dict[str, str] = {}
"""Register texts fairshare reads differently from HAMi, by case name (none now: a count
given as a string, a negative index and the legacy health TRUE were, until fixed)."""


def by_name(section: str) -> dict[str, dict[str, Any]]:
    return {case["name"]: case for case in GOLDEN[section]}


def test_the_fixture_is_the_pinned_hami() -> None:
    meta = GOLDEN["hami"]
    assert meta["module"] == "github.com/Project-HAMi/HAMi"
    assert meta["version"] == HAMI_TAG
    # The commit the module proxy's pseudo-version of the tag names.
    assert meta["commit"].startswith(HAMI_PSEUDO.rsplit("-", 1)[1])
    assert len(meta["commit"]) == 40
    assert {s for s in GOLDEN if GOLDEN[s] == []} == set()  # every section has cases


def _containers(case: dict[str, Any]) -> list[list[tuple[str, int, int]]]:
    return [[(d["uuid"], d["usedmem"], d["usedcores"]) for d in c] for c in case["containers"]]


@pytest.mark.parametrize("spec", GOLDEN["pod_specs"], ids=lambda s: s["name"])
def test_hami_decodes_the_pod_devices_fairshare_writes(spec: dict[str, Any]) -> None:
    case = by_name("pods")[spec["name"]]
    per = hami.container_devices(
        spec["spec"], [tuple(d) for d in spec["devices"]], share_container=spec["share_container"]
    )
    ours = hami.encode_pod_devices(per)
    assert ours == case["annotation"], f"fairshare now writes {ours!r}: {REGEN}"
    assert case["error"] == ""
    # HAMi reads each container's devices as fairshare meant them, in container order
    # (init containers first); the closing ';' of the last gives one more, empty, entry.
    want = [[(u, hami.DEVICE_TYPE, m, c) for u, m, c in devs] for devs in per]
    got = [
        [(d["uuid"], d["type"], d["usedmem"], d["usedcores"]) for d in c] for c in case["decoded"]
    ]
    assert got == [*want, []]
    # HAMi's encoder writes the same text for those devices, under the annotation
    # fairshare writes them to (the one HAMi's NVIDIA device reads).
    assert _containers(case) == per
    assert case["encoded"] == {hami.ANN_TO_ALLOCATE: hami.encode_pod_devices(per)}
    assert hami.binding_annotations("n", ours, now=0)[hami.ANN_TO_ALLOCATE] == ours


def _fields(d: HamiDevice) -> tuple[str, int, int, int, int, str, bool]:
    return (d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.health)


def _hami_fields(d: dict[str, Any]) -> tuple[str, int, int, int, int, str, bool]:
    """A Go DeviceInfo as JSON (zero values omitted)."""
    return (
        d.get("id", ""), d.get("index", 0), d.get("count", 0), d.get("devmem", 0),
        d.get("devcore", 0), d.get("type", ""), d.get("health", False),
    )  # fmt: skip


@pytest.mark.parametrize("case", GOLDEN["devices"], ids=lambda c: c["name"])
@pytest.mark.parametrize("form", ["json", "legacy"])
def test_fairshare_reads_the_registers_hamis_plugins_write(case: dict[str, Any], form: str) -> None:
    text = case[form]
    want = sorted((_hami_fields(d) for d in case["devices"]), key=lambda f: f[1])
    if form == "legacy" and not want:
        # An empty 9-field list is "" (no ':'): HAMi's decoder refuses it, so does ours.
        assert text == ""
        with pytest.raises(HamiFormatError):
            hami.parse_register(text)
        return
    assert [_fields(d) for d in hami.parse_register(text)] == want
    assert hami_device_count({hami.ANN_REGISTER: text}) == len(want)


def _register_cases() -> list[Any]:
    return [
        pytest.param(
            c,
            id=c["name"],
            marks=[pytest.mark.xfail(reason=KNOWN_BUGS[c["name"]], strict=True)]
            if c["name"] in KNOWN_BUGS
            else [],
        )
        for c in GOLDEN["registers"]
    ]


@pytest.mark.parametrize("case", _register_cases())
def test_register_texts_read_as_hami_reads_them(case: dict[str, Any]) -> None:
    """HAMi v2.9's NVIDIA device reads the JSON form; older plugins wrote the list form.
    Where HAMi reads devices from a text, fairshare reads the same ones (7-field list
    entries carry no index: HAMi reads 0 for each, fairshare their position, the index the
    old plugins gave them); where HAMi reads none or refuses, so does fairshare."""
    text = case["text"]
    if case["json_error"] == "":
        theirs = case["json"] or []
    elif case["legacy_error"] == "" and case["legacy"]:
        theirs = case["legacy"]
        for k, entry in enumerate(text.split(":")[: len(theirs)]):
            if entry.count(",") == 6:
                assert theirs[k].get("index", 0) == 0
                theirs[k] = {**theirs[k], "index": k}
    else:
        theirs = []
    if not theirs or case["name"] in FAIRSHARE_STRICTER:
        try:
            ours = hami.parse_register(text)
        except HamiFormatError:
            return
        assert ours == [], f"HAMi reads no device from {text!r}; fairshare read {ours}"
        return
    want = sorted((_hami_fields(d) for d in theirs), key=lambda f: f[1])
    assert [_fields(d) for d in hami.parse_register(text)] == want


@pytest.mark.parametrize("case", GOLDEN["locks"], ids=lambda c: c["name"])
def test_node_locks_read_as_hamis_parse_node_lock(case: dict[str, Any]) -> None:
    if case["error"]:
        with pytest.raises(HamiFormatError):
            hami.parse_lock(case["text"])
        return
    when, ns, name = hami.parse_lock(case["text"])
    assert (math.floor(when), ns, name) == (case["unix"], case["namespace"], case["pod"])


@pytest.mark.parametrize("case", GOLDEN["lock_keys"], ids=lambda c: c["value"])
def test_fairshare_writes_the_lock_hami_writes(case: dict[str, Any]) -> None:
    assert hami.lock_value(case["unix"], case["namespace"], case["name"]) == case["value"]
