"""The shipped artefact runs: the wheel, built as the Dockerfile builds it, in a clean venv.

Every other test imports fairshare from the editable install, where every module of the
checkout is importable whether the wheel would ship it or not. This test does what the
image build does, without Docker:

1. copy into an empty build context exactly what the Dockerfile's build stage ``COPY``s
   (so a package the Dockerfile forgets fails here too), minus what ``.dockerignore``
   keeps out (the checkout's in-place build products);
2. ``pip wheel --no-deps`` there (the Cython kernels compile, as in the image);
3. make a fresh virtual environment and install that wheel alone into it (its
   dependencies from the package index or pip's cache);
4. from a directory outside the checkout, run what the image runs: the compiled kernels
   and the command line (``fairshare_cli``, also as ``python -m fairshare_cli``) are the
   wheel's, ``fairshare webhook`` and ``fairshare extender`` start from a
   config file and a ``--state`` List with a certificate made by ``fairshare certs`` and
   answer ``/healthz`` and ``/readyz`` over HTTPS; ``fairshare reclaimer`` (it needs an
   API) starts against an unreachable API and answers ``/healthz`` (not ready).

It takes a minute or so (a compile and a venv); marked ``slow`` (``make test`` runs it).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# The host's in-place build products, which .dockerignore keeps out of the image context.
BUILD_PRODUCTS = ("__pycache__", "*.so", "*.c", "*.html", "*.egg-info", "build", ".venv")
START_WAIT = 120.0
"""Seconds a server gets to answer (a bound against hangs, not a speed check)."""


def build_stage_copies(dockerfile: str) -> list[tuple[list[str], str]]:
    """The ``COPY`` sources and destination of the Dockerfile's first stage."""
    copies: list[tuple[list[str], str]] = []
    stages = 0
    for raw in dockerfile.replace("\\\n", " ").splitlines():  # join continued lines
        words = shlex.split(raw, comments=True)
        if not words:
            continue
        op = words[0].upper()
        if op == "FROM":
            stages += 1
            if stages > 1:
                break
        elif op == "COPY" and not any(w.startswith("--from") for w in words[1:]):
            args = [w for w in words[1:] if not w.startswith("--")]
            copies.append((args[:-1], args[-1]))
    return copies


def test_build_stage_copies_parse() -> None:
    text = (
        "FROM python AS build\nWORKDIR /src\nCOPY a.toml b.py ./\nCOPY pkg ./pkg\n"
        "RUN pip wheel . \\\n  && true\nFROM python\nCOPY --from=build /wheels /wheels\n"
        "COPY late ./late\n"
    )
    assert build_stage_copies(text) == [(["a.toml", "b.py"], "./"), (["pkg"], "./pkg")]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "FAIRSHARE_NO_EXTENSIONS", "PYTHONHOME")
    }
    env.update(extra)
    return env


def _run(argv: list[str | Path], cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
        check=False, **kw,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"{shlex.join(str(a) for a in argv)} exited {proc.returncode}\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the clean venv's bin directory, a working directory outside the checkout)."""
    base = tmp_path_factory.mktemp("wheel")
    context = base / "context"
    context.mkdir()
    copies = build_stage_copies((ROOT / "Dockerfile").read_text())
    assert copies, "the Dockerfile's build stage copies nothing"
    for sources, dest in copies:  # Docker's rules: a directory's contents go to dest
        target = context / dest
        for src in sources:
            path = ROOT / src
            if path.is_dir():
                ignore = shutil.ignore_patterns(*BUILD_PRODUCTS)
                shutil.copytree(path, target, ignore=ignore, dirs_exist_ok=True)
            else:
                into = target / path.name if dest.endswith("/") else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into)
    wheels = base / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, context], base)
    (wheel,) = wheels.glob("fairshare-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", venv], base)
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel], base)
    work = base / "run"
    work.mkdir()
    yield venv / "bin", work


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, ctx: ssl.SSLContext | None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _serve_and_probe(
    argv: list[str | Path], cwd: Path, base_url: str, ctx: ssl.SSLContext | None
) -> dict[str, tuple[int, str]]:
    """Start a server, wait until ``/healthz`` answers, return ``/healthz`` and ``/readyz``."""
    log = cwd / f"{Path(str(argv[1])).name}-{_free_port()}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(a) for a in argv], cwd=cwd, env=_clean_env(), stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_WAIT
        answers: dict[str, tuple[int, str]] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                answers["/healthz"] = _get(base_url + "/healthz", ctx)
                break
            except (OSError, ssl.SSLError):
                time.sleep(0.3)
        assert answers, f"{argv[1]} never answered /healthz:\n{log.read_text()[-4000:]}"
        if ctx is not None:  # the servers are ready once their (file) state is read
            while time.monotonic() < deadline:
                answers["/readyz"] = _get(base_url + "/readyz", ctx)
                if answers["/readyz"][0] == 200:
                    break
                time.sleep(0.3)
        else:
            answers["/readyz"] = _get(base_url + "/readyz", ctx)
        return answers
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_wheel_runs_the_servers_from_a_clean_venv(shipped: tuple[Path, Path]) -> None:
    bin_dir, work = shipped
    py = bin_dir / "python"
    where = _run(
        [py, "-c", "import json, _native, fairshare, fairshare_cli; print(json.dumps("
         "[_native.IMPLEMENTATION, _native.__file__, fairshare.__file__,"
         " fairshare_cli.__file__]))"],
        work,
    )  # fmt: skip
    impl, native_file, fairshare_file, cli_file = json.loads(where.stdout)
    assert impl == "c", "the wheel's compiled kernels were not imported"
    site = str(bin_dir.parent)
    assert native_file.startswith(site) and fairshare_file.startswith(site)
    assert cli_file.startswith(site), "the wheel does not ship the command line"
    version = _run([py, "-m", "fairshare_cli", "--version"], work).stdout
    assert version.startswith("fairshare "), version

    fs = bin_dir / "fairshare"
    config = work / "config.yaml"
    config.write_text(_run([fs, "config", "example"], work).stdout)
    _run([fs, "config", "validate", config], work)
    state = work / "state.json"
    state.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": []}))
    certs = work / "certs"
    _run([fs, "certs", "--service", "fairshare", "--namespace", "test", "--out", certs,
          "--ip", "127.0.0.1"], work)  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    for command in ("webhook", "extender"):
        port = _free_port()
        argv: list[str | Path] = [
            fs, command, "--config", config, "--state", state, "--host", "127.0.0.1",
            "--port", str(port), "--tls-cert", certs / "tls.crt", "--tls-key", certs / "tls.key",
        ]  # fmt: skip
        answers = _serve_and_probe(argv, work, f"https://127.0.0.1:{port}", ctx)
        assert answers["/healthz"][0] == 200, (command, answers)
        assert answers["/readyz"][0] == 200, (command, answers)

    # The reclaimer needs an API; pointed at one that is not there it still starts and
    # serves its probes (plain HTTP: it serves only /metrics and the probes).
    api_port = _free_port()
    kubeconfig = work / "kubeconfig.json"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "none",
        "clusters": [{"name": "none", "cluster": {"server": f"https://127.0.0.1:{api_port}"}}],
        "users": [{"name": "none", "user": {"token": "none"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
    }))  # fmt: skip
    port = _free_port()
    argv = [fs, "reclaimer", "--config", config, "--kubeconfig", kubeconfig,
            "--host", "127.0.0.1", "--port", str(port), "--interval", "1"]  # fmt: skip
    answers = _serve_and_probe(argv, work, f"http://127.0.0.1:{port}", None)
    assert answers["/healthz"][0] == 200, answers
    assert answers["/readyz"][0] == 503, answers
