"""The config in force, recorded for the CLI (``dump_config``, ``lastgood.last_good_body``)."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fairshare.config.loading import dump_config, dump_default_config, parse_config
from fairshare.config.schema import FairShareConfig
from scheduler_plugin.lastgood import ANN_RECORDED, last_good_body

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
