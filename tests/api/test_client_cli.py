"""The CLI's service commands (``submit``, ``jobs``, ``status``, ``logs``, ``wait``, ``stop``,
``delete``, ``cluster``, ``schedule``, ``datasets``, ``upload``, ``export --url``): against an
offline uvicorn in this process for what needs no training, and the session's real
``hetsched serve`` (shared with the client's tests) for the rest."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.cli import main
from tests.api.conftest import (
    SERVICE_TOKEN,
    TRAINED_STEPS,
    ThreadedService,
    Trained,
    make_settings,
    run_cli,
)
from tests.support import REPO, Serve, clean_env, free_port


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An offline control plane (no Ray, no executor) requiring a token."""
    settings = make_settings(tmp_path, start_ray=False, executor=False, api_token="tok")
    service = ThreadedService(settings).start().wait_up()
    monkeypatch.setenv("HETSCHED_URL", service.url)
    monkeypatch.setenv("HETSCHED_API_TOKEN", "tok")
    monkeypatch.delenv("HETSCHED_TOKEN", raising=False)
    yield service.url
    service.stop()


@pytest.fixture
def live(live_service: Serve, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session's ``hetsched serve``, its token in ``HETSCHED_TOKEN`` (a user's)."""
    monkeypatch.setenv("HETSCHED_URL", live_service.url)
    monkeypatch.setenv("HETSCHED_TOKEN", SERVICE_TOKEN)
    monkeypatch.delenv("HETSCHED_API_TOKEN", raising=False)
    return live_service.url


def test_submit_list_status_stop(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["submit", "--name", "demo", "--global-batch", "8", "--steps", "4"]
    assert main([*argv, "--submission-id", "k1", "--priority", "2.5", "--no-replan", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert job["state"] == "PENDING" and job["spec"]["global_batch"] == 8
    assert (job["spec"]["priority"], job["spec"]["replan"]) == (2.5, False)
    assert job["spec"]["max_failures"] == 3, "fields not given are the server's defaults"

    assert main([*argv, "--submission-id", "k1", "--priority", "2.5", "--no-replan"]) == 0
    assert capsys.readouterr().out.strip() == f"submitted job {job['id']} (demo): PENDING"
    # The same key with another spec is refused in one line, not answered with the old job.
    assert main(["submit", "--name", "demo", "--submission-id", "k1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "submission_id" in err and job["id"] in err

    assert main(["jobs"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ID", "NAME", "STATE", "STEPS", "LOSS", "SAMPLES/S", "MESSAGE"]
    assert table[1].split()[:4] == [job["id"], "demo", "PENDING", "0/4"]

    assert main(["status", job["id"]]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"job {job['id']} (demo): PENDING")
    assert "global batch 8, strategy auto" in out and "0/4 steps done" in out

    assert main(["stop", job["id"]]) == 0
    assert "STOPPED" in capsys.readouterr().out
    assert main(["jobs", "--state", "STOPPED", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 1
    assert main(["wait", job["id"]]) == 1, "a stopped job did not succeed"
    assert capsys.readouterr().out.startswith(f"job {job['id']} (demo): STOPPED")
    assert main(["delete", job["id"]]) == 0
    assert capsys.readouterr().out == f"job {job['id']} deleted\n"


def test_every_job_field_reaches_the_spec(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    fields = [
        "--min-devices", "2", "--max-devices", "3", "--checkpoint-every", "5",
        "--val-every", "0", "--max-failures", "1", "--init-from", "abc123@4",
    ]  # fmt: skip
    assert main(["submit", *fields, "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)["spec"]
    assert {k: spec[k] for k in ("min_devices", "max_devices", "checkpoint_every")} == {
        "min_devices": 2,
        "max_devices": 3,
        "checkpoint_every": 5,
    }
    assert (spec["val_every"], spec["max_failures"], spec["init_from"]) == (0, 1, "abc123@4")
    assert spec["replan"] is None


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
    assert main(["wait", "abc", "--timeout", "0"]) == 2
    assert capsys.readouterr().err == "hetsched: error: --timeout: must be > 0 seconds, got 0\n"
    monkeypatch.delenv("HETSCHED_API_TOKEN")
    assert main(["submit"]) == 2
    assert "401: authorization" in capsys.readouterr().err


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["submit", "--global-batch", "many"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "hetsched: error: submit: argument --global-batch: invalid int value: 'many' "
        "(see hetsched submit --help)\n"
    )


def test_connection_refused_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["jobs", "--url", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"hetsched: error: cannot reach the control plane at {url} "
        "(is `hetsched serve` running? set --url or HETSCHED_URL)"
    ]


def test_a_closed_pipe_ends_quietly() -> None:
    """``hetsched gpus | head -n 0``: the reader is gone before the first line."""
    result = subprocess.run(
        ["bash", "-c", f"'{sys.executable}' -m api.cli gpus | head -n 0; exit ${{PIPESTATUS[0]}}"],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stderr == ""
    assert result.returncode == 141


def test_logs_wait_and_status_of_a_finished_job(
    live: str, trained_job: Trained, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = trained_job.job.id
    code, out, _ = run_cli(capsys, "logs", job_id)
    lines = out.splitlines()
    assert code == 0 and len(lines) == len([e for e in trained_job.events if hasattr(e, "level")])
    assert " INFO    SUCCEEDED" in lines[-1]
    assert run_cli(capsys, "logs", "-f", job_id)[1] == out, "following an ended job: its log"
    code, out, _ = run_cli(capsys, "wait", job_id, "--timeout", "30")
    assert (code, out.split(":")[0]) == (0, f"job {job_id} (trained)")
    assert "SUCCEEDED" in out
    out = run_cli(capsys, "status", job_id)[1]
    assert f"{TRAINED_STEPS}/{TRAINED_STEPS} steps done" in out


def test_submit_wait_exits_1_when_the_job_fails(
    live: str, trained_job: Trained, capsys: pytest.CaptureFixture[str]
) -> None:
    """Step 0 of the trained job has no checkpoint (steps 1 and 3 do): the job fails when
    it starts."""
    source = f"{trained_job.job.id}@0"
    code, out, _ = run_cli(
        capsys, "submit", "--wait", "--global-batch", "8", "--steps", "2", "--init-from", source
    )
    assert code == 1, out
    assert out.splitlines()[0].startswith("submitted job ")
    assert out.splitlines()[-1].endswith(
        " (job): FAILED: checkpoint: no complete checkpoint at step 0; have 1, 3"
    )


def test_cluster_schedule_upload_and_datasets(
    live: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "cluster")
    assert code == 0 and out.splitlines()[1].split()[:4] == [
        "DEVICE",
        "TYPE",
        "MEMORY",
        "STATUS",
    ]
    assert run_cli(capsys, "schedule")[1].startswith("policy fifo, a round every ")
    notes = tmp_path / "notes.txt"
    notes.write_text("hello world, " * 200)
    code, out, _ = run_cli(capsys, "upload", str(notes), "--name", "cli-notes.txt")
    assert (code, out) == (0, "uploaded cli-notes.txt (bytes, 2,600 bytes, 2,600 tokens)\n")
    code, _, err = run_cli(capsys, "upload", str(notes), "--name", "cli-notes.txt")
    assert (code, err) == (
        2,
        "hetsched: error: 409: name: 'cli-notes.txt' exists; uploads never replace a file\n",
    )
    assert "cli-notes.txt (bytes, 2,600 bytes" in run_cli(capsys, "datasets")[1]
    code, _, err = run_cli(capsys, "upload", str(tmp_path / "absent.txt"))
    assert code == 2 and err.startswith("hetsched: error: upload: cannot read ")


def test_export_downloads_the_checkpoint_from_the_service(
    live: str, trained_job: Trained, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = trained_job.job.id
    out_dir = tmp_path / "hf"
    code, out, err = run_cli(capsys, "export", f"{job_id}@1", "-o", str(out_dir), "--url", live)
    assert code == 0, err
    assert (
        out == f"exported job {job_id} (step 1) from {live} to {out_dir}: config.json, "
        "model.safetensors\n"
    )
    assert json.loads((out_dir / "config.json").read_text())["model_type"] == "gpt2"
    code, _, err = run_cli(
        capsys, "export", f"{job_id}@2", "-o", str(tmp_path / "x"), "--url", live
    )
    assert (code, err) == (
        2,
        f"hetsched: error: 404: step: job {job_id} has no checkpoint 2; kept: 1, 3\n",
    )
