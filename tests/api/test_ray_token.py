"""``hetsched serve --ray-address`` against a Ray cluster with token authentication.

A real ``ray start --head --block`` with ``RAY_AUTH_MODE=token`` runs for the
module, in its own temporary Ray directory (``RAY_TMPDIR``: other Ray
instances on the machine never see it) and with a private ``HOME`` (no
``~/.ray/auth_token`` of the user's is found). It is ended by its own
process tree, never ``ray stop``, which would stop every Ray on the machine.
The service runs as a user runs it, a subprocess; without the token, or with
a wrong one, it must stop at once with one line, not log ``InvalidAuthToken``
for ever.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from api.core.local_ray import terminate
from tests.support import Serve, free_port, serve_command

pytestmark = pytest.mark.slow
STARTUP_S = 120.0


def _base_env(root: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HETSCHED_", "RAY_")) and k != "TMPDIR"
    }
    env.update(HOME=str(root / "home"), RAY_TMPDIR=str(root))
    return env


@pytest.fixture(scope="module")
def ray_head() -> Iterator[dict[str, str]]:
    """A token-protected Ray head with the custom resource ``node-a``: its address,
    token and an environment without the token."""
    root = Path(tempfile.mkdtemp(prefix="hrt", dir="/tmp"))  # short: Ray's socket paths
    (root / "home").mkdir()
    token, port = secrets.token_hex(16), free_port()
    env = _base_env(root) | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    ray_cli = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray_cli, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1"]
        + ["--num-cpus=1", "--include-dashboard=false", "--resources", '{"node-a": 1}']
        + ["--disable-usage-stats", "--block"],
        env=env,
        stdout=(root / "head.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_S
        while b"Ray runtime started" not in (root / "head.log").read_bytes():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed:\n{(root / 'head.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield {"address": f"127.0.0.1:{port}", "token": token, "root": str(root)}
    finally:
        tree = [psutil.Process(head.pid), *psutil.Process(head.pid).children(recursive=True)]
        head.send_signal(signal.SIGTERM)  # --block: ray start stops its node's processes
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=30)
        terminate(tree)  # whatever it left
        shutil.rmtree(root, ignore_errors=True)


def _serve(ray_head: dict[str, str], tmp_path: Path, env: dict[str, str], *extra: str):
    command = serve_command(tmp_path / "data", "--ray-address", ray_head["address"], *extra)
    return [*command, "--port", str(free_port())], _base_env(Path(ray_head["root"])) | env


def _spec(tmp_path: Path, ray_node: str) -> str:
    path = tmp_path / "spec.yaml"
    spec = {"name": "two-types", "nodes": [{"name": "lab", "ray_node": ray_node, "devices": []}]}
    spec["nodes"][0]["devices"] = [{"type": "A100-80GB"}, {"type": "T4-16GB"}]
    path.write_text(json.dumps(spec))  # JSON is YAML
    return str(path)


def _refused(command: list[str], env: dict[str, str]) -> str:
    """What ``serve`` said when it refused to start; it must not have run on."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "InvalidAuthToken" not in done.stderr and "gcs_client" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_without_the_token_serve_says_in_one_line_what_is_missing(ray_head, tmp_path) -> None:
    line = _refused(*_serve(ray_head, tmp_path, {}))
    assert line.startswith("hetsched: error: ray-address: the Ray cluster at 127.0.0.1:")
    assert "requires token authentication and no token was found" in line
    assert "set RAY_AUTH_TOKEN" in line and "RAY_AUTH_TOKEN_PATH" in line


def test_a_wrong_token_is_named_as_refused(ray_head, tmp_path) -> None:
    line = _refused(*_serve(ray_head, tmp_path, {"RAY_AUTH_TOKEN": "not-the-token"}))
    assert "refused the token from RAY_AUTH_TOKEN" in line


def test_a_spec_naming_a_missing_ray_node_is_one_line(ray_head, tmp_path) -> None:
    token = {"RAY_AUTH_TOKEN": ray_head["token"]}
    line = _refused(*_serve(ray_head, tmp_path, token, "--cluster", _spec(tmp_path, "node-z")))
    assert "cluster: no live Ray node for lab (ray_node 'node-z')" in line
    assert "resources node-a" in line, "the live nodes are listed, with their custom resources"


def test_with_the_token_the_spec_runs_on_the_ray_node_it_names(ray_head, tmp_path) -> None:
    env = _base_env(Path(ray_head["root"])) | {"RAY_AUTH_TOKEN": ray_head["token"]}
    args = ["--ray-address", ray_head["address"], "--cluster", _spec(tmp_path, "node-a")]
    service = Serve(tmp_path / "data", *args, env=env)
    try:
        service.wait_up(timeout_s=STARTUP_S)
        with service.client() as api:
            cluster = api.get("/api/v1/cluster").json()
        assert cluster["available"] and cluster["simulated"], cluster["message"]
        assert cluster["ray_address"] == ray_head["address"]
        devices = [d for n in cluster["nodes"] for d in n["devices"]]
        assert [(d["id"], d["status"]) for d in devices] == [("lab/0", "idle"), ("lab/1", "idle")]
        assert "InvalidAuthToken" not in service.log.read_text(errors="replace")
    finally:
        service.stop()
