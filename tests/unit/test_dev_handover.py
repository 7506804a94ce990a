"""tools/e2e/dev.py pieces of the no-gap handover that need no cluster (issue 31, item 4):
certificates kept while valid (the registered caBundle stays right for a running webhook),
and the ConfigMap written without unregistering the pod webhooks."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fairshare import tls

DEV_PY = Path(__file__).resolve().parents[2] / "tools" / "e2e" / "dev.py"


@pytest.fixture(scope="module")
def dev() -> ModuleType:
    name = "fairshare_e2e_dev"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DEV_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_valid_certificates_are_kept_and_expiring_ones_replaced(dev: ModuleType, tmp_path: Path):
    layout = dev.Layout(tmp_path)
    dev.ensure_certs(layout, "webhook")
    ca = (layout.certs("webhook") / "ca.crt").read_bytes()
    dev.ensure_certs(layout, "webhook")
    assert (layout.certs("webhook") / "ca.crt").read_bytes() == ca, "a valid CA is kept"
    # A certificate that expires within a day is replaced (with a new CA).
    tls.write_certs(
        layout.certs("webhook"),
        service="fairshare-webhook",
        namespace="fairshare-system",
        ip_addresses=("127.0.0.1",),
        days=1,
        now=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1),
    )
    short = (layout.certs("webhook") / "ca.crt").read_bytes()
    dev.ensure_certs(layout, "webhook")
    assert (layout.certs("webhook") / "ca.crt").read_bytes() != short


class FakeKubectl:
    """kubectl that refuses the ConfigMap write while the config guard is registered."""

    def __init__(self, refusal: str) -> None:
        self.refusal = refusal
        self.calls: list[tuple[str, ...]] = []
        self.webhooks = [{"name": "pods.fairshare.io"}, {"name": "config.fairshare.io"}]

    def __call__(
        self, state: dict[str, Any], *args: str, input: str | None = None, check: bool = True
    ) -> Any:
        self.calls.append(args)
        if args[0] == "apply":
            if any(h["name"] == "config.fairshare.io" for h in self.webhooks):
                raise RuntimeError("unreachable in this fake")
            return _Proc(0, "")
        if args[:2] == ("get", "crd"):  # the PodGroup CRD is there already
            return _Proc(0, f"customresourcedefinition.apiextensions.k8s.io/{args[2]}")
        if args[:2] == ("get", "validatingwebhookconfiguration"):
            return _Proc(0, json.dumps({"webhooks": self.webhooks}))
        if args[0] == "patch":
            ops = json.loads(args[-1])
            index = int(ops[1]["path"].rsplit("/", 1)[1])
            assert self.webhooks[index]["name"] == ops[0]["value"]
            del self.webhooks[index]
            return _Proc(0, "")
        raise AssertionError(f"unexpected kubectl {args}")


class _Proc:
    def __init__(self, returncode: int, stdout: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, ""


def _patch(dev: ModuleType, monkeypatch: pytest.MonkeyPatch, fake: FakeKubectl) -> None:
    def refusing_apply(state: dict[str, Any], *objects: dict[str, Any]) -> None:
        try:
            fake(state, "apply")
        except RuntimeError:
            raise dev.DevError(f"kubectl apply: {fake.refusal}") from None

    monkeypatch.setattr(dev, "kubectl", fake)
    monkeypatch.setattr(dev, "apply", refusing_apply)


def test_a_dead_config_guard_alone_is_unregistered(dev: ModuleType, monkeypatch):
    fake = FakeKubectl(
        'Internal error occurred: failed calling webhook "config.fairshare.io": failed to '
        'call webhook: Post "https://127.0.0.1:40001/validate": connect: connection refused'
    )
    _patch(dev, monkeypatch, fake)
    dev.ensure_config_registered({}, "tenants: []\n")
    assert fake.webhooks == [{"name": "pods.fairshare.io"}], "the pod webhook stays"
    assert not any("delete" in call for call in fake.calls)


def test_a_live_guard_refusing_an_invalid_config_is_an_error(dev: ModuleType, monkeypatch):
    fake = FakeKubectl(
        'admission webhook "config.fairshare.io" denied the request: ConfigMap '
        "fairshare-system/fairshare-config key config.yaml is not a valid FairShareConfig"
    )
    _patch(dev, monkeypatch, fake)
    with pytest.raises(dev.DevError, match="not a valid FairShareConfig"):
        dev.ensure_config_registered({}, "tenants: [\n")
    assert len(fake.webhooks) == 2, "nothing unregistered"
