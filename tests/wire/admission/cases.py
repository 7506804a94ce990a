"""Load the golden admission cases and run them through the webhook core.

A case is ``<phase>-<what>.request.json`` (or ``.request.txt`` for a body that is not
JSON), where ``<phase>`` is ``mutate``, ``validate`` or ``malformed``. Its expected answer
is ``<name>.response.json`` (the AdmissionReview response body), or for ``malformed``
cases ``<name>.error.txt`` (the ``WireFormatError`` text the adapter sends with HTTP 400).
A mutate answer with a patch also has ``<name>.patch.json``: the decoded patch, readable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from fairshare import quantities
from fairshare.config.loading import config_from_mapping
from fairshare.config.schema import FairShareConfig
from fairshare.errors import WireFormatError
from webhook import review, wire
from webhook.policies.config_guard import ConfigMapRef
from webhook.view import StaticView

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Case:
    """One golden request and where its expected answers live."""

    name: str
    request: Path

    @property
    def phase(self) -> str:
        return self.name.split("-", 1)[0]

    @property
    def response(self) -> Path:
        return HERE / f"{self.name}.response.json"

    @property
    def error(self) -> Path:
        return HERE / f"{self.name}.error.txt"

    @property
    def patch(self) -> Path:
        return HERE / f"{self.name}.patch.json"

    def body(self) -> bytes:
        return self.request.read_bytes()


@dataclass(frozen=True)
class Cluster:
    """What the golden requests are judged against."""

    config: FairShareConfig
    view: StaticView
    config_map: ConfigMapRef


def all_cases() -> list[Case]:
    """Every golden case, sorted by name."""
    found = [Case(path.name.split(".request.")[0], path) for path in HERE.glob("*.request.*")]
    return sorted(found, key=lambda case: case.name)


def _amounts(raw: dict[str, str]) -> dict[str, Fraction]:
    return {name: quantities.parse_quantity(text) for name, text in raw.items()}


def load_cluster() -> Cluster:
    """``cluster.json`` as a config, a ``StaticView`` and the ConfigMap reference."""
    doc = json.loads((HERE / "cluster.json").read_text())
    view = StaticView(
        labels=doc["namespaceLabels"],
        usage={tenant: _amounts(raw) for tenant, raw in doc["tenantUsage"].items()},
        namespaces={tenant: tuple(ns) for tenant, ns in doc["tenantNamespaces"].items()},
        device_memory=quantities.parse_bytes(doc["deviceMemory"]),
    )
    ref = ConfigMapRef(doc["configMap"]["namespace"], doc["configMap"]["name"])
    return Cluster(config_from_mapping(doc["config"]), view, ref)


def answer(case: Case, cluster: Cluster) -> dict[str, Any] | str:
    """The response body the webhook core gives for ``case``, or the decode error text."""
    try:
        request = wire.decode_review(case.body())
    except WireFormatError as exc:
        return str(exc)
    phase: review.Phase = "mutate" if case.phase == "mutate" else "validate"
    response = review.review(
        request,
        view=cluster.view,
        config=cluster.config,
        phase=phase,
        config_map=cluster.config_map,
    )
    # Through JSON and back, as it goes on the wire.
    body: dict[str, Any] = json.loads(json.dumps(wire.encode_response(request.uid, response)))
    return body
