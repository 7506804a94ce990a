"""The command line: config validation exit codes and messages, plots, python -m."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from fairshare_cli import main as cli
from tests.gotools import skip_or_fail

GOOD = textwrap.dedent(
    """
    apiVersion: fairshare.io/v1alpha1
    kind: FairShareConfig
    tenants:
    - {name: vision, namespaces: [vision], weight: 1}
    - {name: nlp, namespaces: [nlp], weight: 2, guaranteed: {nvidia.com/gpu: "4"}}
    """
)


def test_validate_good_config(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text(GOOD)
    assert cli.main(["config", "validate", str(f)]) == 0
    assert "valid (2 tenant(s): vision, nlp)" in capsys.readouterr().out


def test_validate_lists_every_error(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    bad = GOOD.replace("weight: 2", "weight: 0").replace('"4"', '"lots"')
    f.write_text(bad + "bogus: true\n")
    assert cli.main(["config", "validate", str(f)]) == 1
    err = capsys.readouterr().err
    assert "tenants[1].weight: must be > 0" in err
    assert "bogus" in err
    assert "lots" in err
    assert "Traceback" not in err


def test_validate_missing_file(tmp_path, capsys):
    assert cli.main(["config", "validate", str(tmp_path / "none.yaml")]) == 1
    assert "none.yaml" in capsys.readouterr().err


def test_example_config_validates(tmp_path, capsys):
    assert cli.main(["config", "example"]) == 0
    f = tmp_path / "example.yaml"
    f.write_text(capsys.readouterr().out)
    assert cli.main(["config", "validate", str(f)]) == 0


def test_demo_plot_is_a_png(tmp_path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # in [dev] too: only a bare `pip install -e .` lacks it
        skip_or_fail("the plot needs the [plot] extra (matplotlib)")
    png = tmp_path / "demo.png"
    assert cli.main(["simulate", "--demo", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_python_dash_m_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "fairshare_cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("fairshare ")


@pytest.mark.parametrize(
    "module",
    [
        "fairshare_cli.main",
        "fairshare.config.loading",
        "fairshare.fairness",
        "fairshare.placement",
        "fairshare.resources",
        "fairshare.simulator.openb",
        "fairshare.simulator.runner",
        "fairshare.state.cluster",
        "fairshare.tenancy",
        "_native",
    ],
)
def test_no_circular_imports(module):
    # Each module must import on its own in a fresh interpreter (aiohttp's check).
    subprocess.run([sys.executable, "-W", "error", "-c", f"import {module}"], check=True)


def test_shipped_configmap_config_is_valid():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "manifests" / "base" / "config.yaml"
    assert cli.main(["config", "validate", str(path)]) == 0


def test_client_certs_writes_the_control_plane_files(tmp_path, capsys):
    import yaml

    out = tmp_path / "cc"
    assert cli.main(["client-certs", "--out", str(out), "--node-dir", "/etc/k8s/fs/"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "admission-config.yaml",
        "admission-kubeconfig.yaml",
        "apiserver-client.crt",
        "apiserver-client.key",
        "client-ca.crt",
        "scheduler-client.crt",
        "scheduler-client.key",
    ]
    config = yaml.safe_load((out / "admission-config.yaml").read_text())
    for plugin in config["plugins"]:
        assert plugin["configuration"]["kubeConfigFile"] == "/etc/k8s/fs/admission-kubeconfig.yaml"
    (user,) = yaml.safe_load((out / "admission-kubeconfig.yaml").read_text())["users"]
    assert user["name"] == "fairshare-webhook.fairshare-system.svc"
    assert user["user"]["client-certificate"] == "/etc/k8s/fs/apiserver-client.crt"
    # --reuse keeps the CA; without it a new one is minted.
    ca = (out / "client-ca.crt").read_bytes()
    assert cli.main(["client-certs", "--out", str(out), "--reuse"]) == 0
    assert (out / "client-ca.crt").read_bytes() == ca
    assert cli.main(["client-certs", "--out", str(out)]) == 0
    assert (out / "client-ca.crt").read_bytes() != ca


def test_client_certs_bad_usage(tmp_path, capsys):
    assert cli.main(["client-certs", "--out", str(tmp_path / "x"), "--keep-existing"]) == 1
    assert "--keep-existing needs --secrets" in capsys.readouterr().err
    assert cli.main(["client-certs", "--out", str(tmp_path / "none"), "--reuse"]) == 1
    assert "missing" in capsys.readouterr().err


@pytest.mark.parametrize("server", ["webhook", "extender"])
def test_not_ready_after_must_be_positive(server, tmp_path, capsys):
    argv = [server, "--config", str(tmp_path / "c.yaml"), "--not-ready-after", "0"]
    assert cli.main(argv) == 1
    assert "--not-ready-after must be > 0 seconds" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], False), (["--pick-in-filter"], True), (["--lease", "ns/l", "--pick-in-filter"], True)],
)
def test_extender_passes_pick_in_filter_to_serve(argv, expected, tmp_path, monkeypatch):
    from extender import serve as ext_serve

    seen: dict[str, object] = {}

    async def fake_serve(**kwargs: object) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(ext_serve, "serve", fake_serve)
    assert cli.main(["extender", "--config", str(tmp_path / "c.yaml"), *argv]) == 0
    assert seen["pick_in_filter"] is expected
