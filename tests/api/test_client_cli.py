"""``hetsched submit|jobs|status|stop`` against a live uvicorn on a free port."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn

from api.app import create_app
from api.cli import main
from api.core.settings import Settings
from tests.support import free_port


@pytest.fixture
def server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings_factory: Callable[..., Settings]
) -> Iterator[str]:
    """An offline control plane (no Ray, no executor) requiring a token."""
    settings = settings_factory(tmp_path, start_ray=False, executor=False, api_token="tok")
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not instance.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    monkeypatch.setenv("HETSCHED_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HETSCHED_API_TOKEN", "tok")
    yield f"http://127.0.0.1:{port}"
    instance.should_exit = True
    thread.join(10)


def test_submit_list_status_stop(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "submit",
                "--name",
                "demo",
                "--global-batch",
                "8",
                "--steps",
                "4",
                "--submission-id",
                "k1",
                "--json",
            ]
        )
        == 0
    )
    job = json.loads(capsys.readouterr().out)
    assert job["state"] == "PENDING" and job["spec"]["global_batch"] == 8

    assert main(["submit", "--name", "demo", "--submission-id", "k1"]) == 0
    assert capsys.readouterr().out.strip() == f"submitted job {job['id']} (demo): PENDING"

    assert main(["jobs"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ID", "NAME", "STATE", "STEPS", "LOSS", "SAMPLES/S", "MESSAGE"]
    assert table[1].split()[:4] == [job["id"], "demo", "PENDING", "0/4"]

    assert main(["status", job["id"]]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"job {job['id']} (demo): PENDING")
    assert "global batch 8, strategy auto" in out

    assert main(["stop", job["id"]]) == 0
    assert "STOPPED" in capsys.readouterr().out
    assert main(["jobs", "--state", "STOPPED", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 1


def test_errors_are_one_line_with_exit_2(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["status", "doesnotexist"]) == 2
    assert capsys.readouterr().err.strip() == (
        "hetsched: error: 404: job: no job with id 'doesnotexist'"
    )
    assert main(["submit", "--global-batch", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hetsched: error: 422: global_batch:") and "\n" not in err
    monkeypatch.delenv("HETSCHED_API_TOKEN")
    assert main(["submit"]) == 2
    assert "401: authorization" in capsys.readouterr().err


def test_connection_refused_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["jobs", "--url", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"hetsched: error: cannot reach the control plane at {url} "
        "(is `hetsched serve` running? set --url or HETSCHED_URL)"
    ]
