"""The config in force, recorded for the CLI (``dump_config``, ``lastgood.last_good_body``)."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.lastgood import ANN_RECORDED, last_good_body
from fairshare.config.loading import dump_config, dump_default_config, parse_config
from fairshare.config.schema import FairShareConfig

EXAMPLE = parse_config(dump_default_config(example_tenants=True))


@given(
    band=st.sampled_from([0.0, 0.1, 0.5]),
    hold=st.booleans(),
    others=st.sampled_from(["AboveFairShare", "Any", "Never"]),
    weight=st.sampled_from([0.5, 1.0, 2.5]),
)
@settings(max_examples=30, deadline=None)
def test_dump_config_reads_back_equal(band: float, hold: bool, others: str, weight: float) -> None:
    tenants = [t.model_copy(update={"weight": weight}) for t in EXAMPLE.tenants]
    config = EXAMPLE.model_copy(
        update={
            "yield_band": band,
            "hold_for_blocked_tenants": hold,
            "tenants": tuple(tenants),
            "preemption": EXAMPLE.preemption.model_copy(update={"other_tenants": others}),
        }
    )
    text = dump_config(config)
    assert parse_config(text) == config
    assert yaml.safe_load(text)["apiVersion"] == "fairshare.io/v1alpha1"


def test_the_default_config_dumps_to_its_header_only() -> None:
    assert yaml.safe_load(dump_config(FairShareConfig())) == {
        "apiVersion": "fairshare.io/v1alpha1",
        "kind": "FairShareConfig",
    }


def test_the_record_is_a_configmap_beside_the_config() -> None:
    body = last_good_body("fairshare-system", "fairshare-config", EXAMPLE)
    assert body["metadata"]["name"] == "fairshare-config-last-good"
    assert body["metadata"]["namespace"] == "fairshare-system"
    assert ANN_RECORDED in body["metadata"]["annotations"]
    assert parse_config(body["data"]["config.yaml"]) == EXAMPLE


class _Response:
    def __init__(self, status: int, body: dict[str, object]) -> None:
        self.status, self._body = status, body

    async def read(self) -> bytes:
        import json

        return json.dumps(self._body).encode()

    def release(self) -> None:
        return None


class FakeCore:
    """CoreV1Api's ConfigMap calls over one dict (what ``write_configmap`` uses)."""

    def __init__(self, fail_writes: bool = False) -> None:
        self.maps: dict[tuple[str, str], dict[str, object]] = {}
        self.calls: list[str] = []
        self.fail_writes = fail_writes

    async def read_namespaced_config_map(self, name, namespace, **_kw):
        self.calls.append("read")
        got = self.maps.get((namespace, name))
        return _Response(404, {}) if got is None else _Response(200, got)

    async def create_namespaced_config_map(self, namespace, body, **_kw):
        self.calls.append("create")
        if self.fail_writes:
            return _Response(403, {"message": "forbidden"})
        self.maps[(namespace, body["metadata"]["name"])] = {
            **body, "metadata": {**body["metadata"], "resourceVersion": "1"}
        }  # fmt: skip
        return _Response(201, body)

    async def replace_namespaced_config_map(self, name, namespace, body, **_kw):
        self.calls.append(f"replace@{body['metadata'].get('resourceVersion')}")
        self.maps[(namespace, name)] = body
        return _Response(200, body)


async def test_write_configmap_creates_replaces_over_the_version_read_and_skips_the_same() -> None:
    import pytest as _pytest

    from extender.leader import write_configmap
    from fairshare.errors import FairshareError

    core = FakeCore()
    body = last_good_body("ns", "cfg", EXAMPLE)
    assert await write_configmap(core, body, key="config.yaml") is True
    again = last_good_body("ns", "cfg", EXAMPLE)
    assert await write_configmap(core, again, key="config.yaml") is False  # same text
    other = last_good_body("ns", "cfg", FairShareConfig())
    assert await write_configmap(core, other, key="config.yaml") is True
    assert core.calls == ["read", "create", "read", "read", "replace@1"]
    with _pytest.raises(FairshareError, match="writing ConfigMap ns/x: HTTP 403: forbidden"):
        await write_configmap(
            FakeCore(fail_writes=True),
            {"metadata": {"name": "x", "namespace": "ns"}, "data": {"k": "v"}},
            key="k",
        )
