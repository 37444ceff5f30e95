"""``hetsched serve`` refuses bad flags with one line and exit 2, before starting anything."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from api.cli import main


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
