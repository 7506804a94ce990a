"""tools/e2e/cluster.py restart_component with real processes: a component that exits
during startup (as kube-apiserver does when a post-start hook fails) is started again, a
bounded number of times; one that keeps exiting is reported with its log."""

from __future__ import annotations

import importlib.util
import json
import signal
import socket
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for a control-plane component: exits with status 1 while its counter file
# says it has failed fewer than `fails` times, then serves GET /healthz -> "ok" (the
# health check cluster.py uses for kwok) until killed.
FAKE = textwrap.dedent(
    """
    import http.server, sys
    from pathlib import Path
    counter, fails, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    if n < fails:
        print(f"start {n + 1}: post-start hook failed", flush=True)
        sys.exit(1)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def _cluster_py() -> Any:
    name = "fairshare_e2e_cluster"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "e2e" / "cluster.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _setup(tmp_path: Path, fails: int) -> tuple[Any, Any, Path]:
    cluster = _cluster_py()
    paths = cluster.Paths(tmp_path)
    script = tmp_path / "fake_component.py"
    script.write_text(FAKE)
    counter = tmp_path / "starts"
    argv = [sys.executable, str(script), str(counter), str(fails), str(_free_port())]
    dead_pid = 2**22 + 1  # above the kernel's largest pid: the old process is gone
    state = {"components": {"kwok": {"pid": dead_pid, "port": int(argv[-1]), "argv": argv}}}
    cluster.save_state(paths, state)
    return cluster, paths, counter


def _kill(cluster: Any, paths: Any) -> None:
    state = json.loads(paths.state_file.read_text())
    pid = state["components"]["kwok"]["pid"]
    if cluster.pid_alive(pid):
        cluster.os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("fails", [0, 1, 2])
def test_a_component_that_exits_during_startup_is_started_again(tmp_path: Path, fails: int) -> None:
    cluster, paths, counter = _setup(tmp_path, fails)
    try:
        cluster.restart_component(paths, "kwok")
        state = json.loads(paths.state_file.read_text())
        assert cluster.pid_alive(state["components"]["kwok"]["pid"])  # the recorded pid runs
        assert int(counter.read_text()) == fails + 1  # started once per failure, plus one
        assert cluster.check_health("kwok", state["components"]["kwok"]["port"], None)[0]
    finally:
        _kill(cluster, paths)


def test_a_component_that_keeps_exiting_is_reported_with_its_log(tmp_path: Path) -> None:
    cluster, paths, counter = _setup(tmp_path, fails=cluster_attempts())
    try:
        with pytest.raises(cluster.ClusterError, match="kwok exited during startup") as err:
            cluster.restart_component(paths, "kwok")
        assert int(counter.read_text()) == cluster.RESTART_ATTEMPTS  # bounded, not forever
        assert f"start {cluster.RESTART_ATTEMPTS}: post-start hook failed" in str(err.value)
    finally:
        _kill(cluster, paths)


def cluster_attempts() -> int:
    return int(_cluster_py().RESTART_ATTEMPTS)
