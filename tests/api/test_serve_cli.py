"""``hetsched serve`` refuses bad flags with one line and exit 2, before starting anything."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from api.cli import main
from api.commands.serve import check_exposure
from tests.support import SERVE_START_S, Serve


def test_bad_cluster_spec_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text("nodes:\n  - name: a\n    devices: [{type: Z80-1GB}]\n")
    assert main(["serve", "--cluster", str(spec), "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hetsched: error: nodes[0].devices[0].type: unknown GPU type 'Z80-1GB'")
    assert "\n" not in err


def test_port_in_use_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port), "--data-dir", str(tmp_path)]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .startswith(f"hetsched: error: --port: cannot listen on 127.0.0.1:{port}")
    )


def test_bad_port_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "70000", "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "hetsched: error: port: Input should be less than or equal to 65535"
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "my-host.example"])
def test_network_host_without_token_is_refused(
    host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HETSCHED_API_TOKEN", raising=False)
    assert main(["serve", "--host", host, "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hetsched: error: --host: {host} is reachable from the network")
    assert "--insecure-no-token" in err and err.count("\n") == 1
    assert not (tmp_path / "hetsched.db").exists()  # refused before anything started


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_host_needs_no_token(host: str) -> None:
    check_exposure(host, token=None, insecure_no_token=False)


def test_token_or_explicit_flag_opens_the_network() -> None:
    check_exposure("0.0.0.0", token="s3cret", insecure_no_token=False)
    check_exposure("0.0.0.0", token=None, insecure_no_token=True)


def test_insecure_flag_gets_past_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HETSCHED_API_TOKEN", raising=False)
    with socket.socket() as busy:  # stop at the next check (port in use), before serving
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["serve", "--host", "0.0.0.0", "--port", str(port), "--insecure-no-token"]
        assert main([*argv, "--data-dir", str(tmp_path)]) == 2
    assert "cannot listen on 0.0.0.0" in capsys.readouterr().err


def test_the_dashboard_answers_as_soon_as_its_address_is_printed(tmp_path: Path) -> None:
    """A user opens the address the moment it appears, before the cluster has settled: it
    must answer then, not refuse the connection while the database and Ray start."""
    service = Serve(tmp_path / "data", "--num-cpus", "2")
    try:
        deadline = time.monotonic() + SERVE_START_S
        while "dashboard at" not in (said := service.log.read_text(errors="replace")):
            assert service.process.poll() is None, service.tail()
            assert time.monotonic() < deadline, service.tail()
            time.sleep(0.02)
        assert f"hetsched: dashboard at {service.url}/" in said
        assert httpx.get(f"{service.url}/", timeout=10).status_code == 200
    finally:
        assert service.stop() in (0, -signal.SIGTERM), service.tail()  # uvicorn re-raises it
    # stopped while its workers were still warming: a stop, not a fault to warn of
    assert "could not warm" not in service.log.read_text(errors="replace")
