"""The control plane's state under stress: one service per data directory, no job stuck
after a database stall, idempotent submissions in a strict queue order, checkpoint
downloads that are whole or refused, and a first job that starts at once.

The live tests share one real ``hetsched serve`` (its own process, as a user runs it),
with a short SQLite busy timeout and retry budget so that a stall of a few seconds
outlasts them; the others use the offline app or the job store alone.
"""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.core.db import make_engine
from api.execution.executor import Executor
from api.schemas.jobs import JobCreate
from api.states import JobState
from api.store import QUEUED, JobStore
from tests.api.conftest import make_settings
from tests.support import (
    JOBS,
    SERVE_START_S,
    TERMINAL,
    Serve,
    clean_env,
    serve_command,
    wait_for,
)

RETRY_S = 1.0
"""The live service's retry budget for a write (``HETSCHED_DB_RETRY_S``)."""
STALL_S = 4.0
"""How long the test's own connection holds the database: past the budget."""
TINY = {"model": "gpt-tiny", "global_batch": 8, "strategy": "dp"}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Serve]:
    """A freshly started ``hetsched serve`` (default policy), up, stopped after the module."""
    data_dir = tmp_path_factory.mktemp("hardening")
    env = clean_env(
        HETSCHED_CACHE_DIR=str(cache_dir),
        HETSCHED_DB_BUSY_TIMEOUT_S="0.2",
        HETSCHED_DB_RETRY_S=str(RETRY_S),
    )
    running = Serve(data_dir, "--num-cpus", "2", env=env)
    try:
        running.wait_up()
        yield running
    finally:
        running.stop()


def _started_after_s(job: dict) -> float:
    started, created = (datetime.fromisoformat(job[k]) for k in ("started_at", "created_at"))
    return (started - created).total_seconds()


def test_a_job_alone_on_an_idle_cluster_starts_at_once_on_every_device(service: Serve) -> None:
    """The first job on a fresh service used to sit in PENDING "queued" while the round
    profiled the whole cluster (32 s; 100 s on a loaded machine), with no reason given."""
    with service.client() as api:
        # Steps enough to be running still when the schedule is read (stopped below): 3
        # steps could end between the poll that saw RUNNING and that read, and the
        # schedule lists only live jobs.
        job = api.post(JOBS, json={**TINY, "name": "first", "steps": 1000}).json()
        seen = []
        running = wait_for(api, job["id"], lambda j: seen.append(j) or j["state"] == "RUNNING")
        rows = [r for r in api.get("/api/v1/schedule").json()["jobs"] if r["id"] == job["id"]]
    waiting = {j["message"] for j in seen if j["state"] == "PENDING"}
    assert waiting <= {QUEUED} | {m for m in waiting if m.startswith("waiting")}, waiting
    assert _started_after_s(running) < 10.0, "it started at once (it profiles once running)"
    (start,) = running["allocations"]
    assert sorted(start["devices"]) == ["node-a/0", "node-a/1", "node-b/0", "node-b/1"]
    assert start["reason"].startswith("alone on an idle cluster: all 4 devices")
    assert [r["status"] for r in rows] == ["running"], rows
    with service.client() as api:  # its devices go to the next test's job
        api.post(f"{JOBS}/{job['id']}/stop")
        wait_for(api, job["id"], lambda j: j["state"] in TERMINAL)


def test_the_schedule_shows_a_job_as_it_starts_and_drops_it_as_it_ends(
    offline: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round starts a job (the store says RUNNING) before it publishes its decision: the
    schedule read in between used to leave the running job out, and to list an ended one
    until the next round."""
    state = offline.app.state.hetsched
    executor = Executor(
        store=state.store, handle=state.handle, profiler=state.profiler, settings=state.settings
    )
    monkeypatch.setattr(state, "executor", executor)
    job = offline.post(JOBS, json={**TINY, "name": "starting"}).json()
    devices = ["node-a/0", "node-b/0"]
    # What a round's start does, up to its publish (the executor's loop is not running).
    live = executor.ledger.admit(job["id"], devices, pinned=False)
    assert live is not None
    live.reason, live.rate = "the policy's reason", 12.5
    assert state.store.start(job["id"], devices)
    (row,) = offline.get("/api/v1/schedule").json()["jobs"]
    assert (row["id"], row["status"], sorted(row["held"])) == (job["id"], "running", devices)
    assert (row["reason"], row["samples_per_s"]) == ("the policy's reason", 12.5)
    assert state.store.finish(job["id"], JobState.SUCCEEDED, "done")
    executor._publish([], executor.live())  # the round that saw it running
    executor.ledger.remove(job["id"])
    assert offline.get("/api/v1/schedule").json()["jobs"] == []


def test_a_second_service_on_the_data_directory_refuses_to_start(service: Serve) -> None:
    """It used to resume every RUNNING job (two runners on one job) and overwrite, then
    delete, the first service's Ray process record."""
    data_dir = service.log.parent
    record = data_dir / "ray-processes.json"
    before = record.read_bytes()
    second = subprocess.run(
        serve_command(data_dir, "--port", "0", "--num-cpus", "1"),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=SERVE_START_S,
    )
    assert second.returncode == 2
    assert second.stderr.count("\n") == 1, second.stderr
    assert second.stderr.startswith(
        f"hetsched: error: --data-dir: another hetsched serve (pid {service.process.pid}) "
        f"is running on the data directory {data_dir.resolve()}"
    )
    assert record.read_bytes() == before, "the first service's Ray record is untouched"
    with service.client() as api:
        assert api.get("/healthz").json()["cluster"] == "available"


def _hold_database(db: Path, seconds: float, holding: threading.Event) -> None:
    """Another connection's exclusive transaction on the job store, for ``seconds``."""
    connection = sqlite3.connect(db, isolation_level=None, timeout=30)
    try:
        connection.execute("BEGIN EXCLUSIVE")
        holding.set()
        time.sleep(seconds)
        connection.execute("COMMIT")
    finally:
        connection.close()


def test_a_database_stall_past_the_retries_ends_the_job_with_its_steps_counted(
    service: Serve,
) -> None:
    """A write lock outlasting the store's retries fails the step write. The job used to
    stay RUNNING for good (its FAILED write failed too and the runner thread died: stop
    answered 200 and did nothing, DELETE 409). Now its final state lands once the lock
    goes, its reason counts the steps it really did, and it can be deleted."""
    with service.client() as api:
        job = api.post(JOBS, json={**TINY, "name": "stall", "steps": 200}).json()
        wait_for(api, job["id"], lambda j: j["steps_done"] >= 2)
        holding = threading.Event()
        holder = threading.Thread(
            target=_hold_database, args=(service.log.parent / "hetsched.db", STALL_S, holding)
        )
        holder.start()
        holding.wait(10)
        holder.join()
        ended = wait_for(api, job["id"], lambda j: j["state"] == "FAILED", 60)
        rows = api.get(f"{JOBS}/{job['id']}/metrics").json()["count"]
        assert ended["message"].startswith(f"failed after {ended['steps_done']} steps: database:")
        assert ended["steps_done"] == rows >= 2
        stop = api.post(f"{JOBS}/{job['id']}/stop")
        assert stop.status_code == 409
        assert api.delete(f"{JOBS}/{job['id']}").status_code == 200
    said = service.log.read_text()
    assert f"retrying for up to {RETRY_S:.0f} s" in said and "gave up after" in said


def test_stop_ends_a_running_job_that_no_runner_has(offline: TestClient) -> None:
    """A job left RUNNING in the store with no runner (one that died, or a service before
    this one): stop used to flag it and answer 200 with nothing acting on the flag."""
    store: JobStore = offline.app.state.hetsched.store
    job = offline.post(JOBS, json={**TINY, "steps": 50}).json()
    assert store.start(job["id"], ["node-a/0"])
    store.add_step(
        job["id"], step=6, loss=3.0, step_s=0.1, samples_per_s=80, devices=[], measured_step_s=0.1
    )
    stopped = offline.post(f"{JOBS}/{job['id']}/stop")
    assert stopped.status_code == 200
    assert stopped.json()["state"] == "STOPPED"
    assert stopped.json()["message"].startswith("stopped on request after 7 steps")
    assert offline.delete(f"{JOBS}/{job['id']}").status_code == 200


def test_a_reused_submission_id_with_another_spec_is_a_409(offline: TestClient) -> None:
    body = {**TINY, "steps": 3, "submission_id": "nightly-7"}
    first = offline.post(JOBS, json=body)
    same = offline.post(JOBS, json=body)
    other = offline.post(JOBS, json={**body, "steps": 99})
    assert (first.status_code, same.status_code, other.status_code) == (201, 200, 409)
    assert same.json()["id"] == first.json()["id"]
    detail = other.json()["detail"]
    assert detail == (
        f"submission_id: 'nightly-7' was used for job {first.json()['id']} with another spec "
        "(differs in steps); use a new submission_id"
    )
    assert offline.get(JOBS).json()["count"] == 1


def test_parallel_submissions_through_two_stores_get_distinct_increasing_places(
    tmp_path: Path,
) -> None:
    """20 submissions at once, from two stores on one database (as two services sharing
    it): every job has a place of its own in the queue, 1 to 20."""
    url = make_settings(tmp_path).database_url
    stores = [JobStore(make_engine(url)), JobStore(make_engine(url))]
    spec = JobCreate.model_validate(TINY)
    go = threading.Barrier(20)

    def submit(i: int) -> None:
        go.wait()
        stores[i % 2].create_job(name=f"j{i}", model_name="gpt-tiny", spec=spec, submission_id=None)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with sqlite3.connect(tmp_path / "hetsched.db") as db:
        places = [seq for (seq,) in db.execute("SELECT seq FROM jobs ORDER BY created_at")]
    assert sorted(places) == list(range(1, 21)), "distinct places, none skipped"
    queue = [j.id for j in stores[0].pending()]
    assert len(queue) == 20 and len(set(queue)) == 20


def _checkpoint(store: JobStore, root: Path, job_id: str, step: int) -> None:
    """A real checkpoint of gpt-tiny at ``step``, written and recorded as a job writes it."""
    from tests.workers.test_checkpoint_store import write_checkpoint
    from workers.checkpoint import CheckpointStore

    checkpoints = CheckpointStore(str(root / job_id))
    write_checkpoint(checkpoints, step)
    kept = checkpoints.prune(keep_last=2)
    store.add_checkpoint(job_id, step=step, uri=checkpoints.step_uri(step), keep=list(kept))


def test_a_checkpoint_download_is_whole_or_a_404_or_410_before_any_byte(
    offline: TestClient, tmp_path: Path
) -> None:
    """It used to be a 200 with an empty archive when the folder was gone."""
    state = offline.app.state.hetsched
    job = offline.post(JOBS, json={**TINY, "steps": 50}).json()
    root = Path(state.settings.checkpoint_root)
    for step in (4, 9, 14):
        _checkpoint(state.store, root, job["id"], step)
    url = f"{JOBS}/{job['id']}/checkpoints"
    assert [c["step"] for c in offline.get(url).json()["data"]] == [9, 14]

    never = offline.get(f"{url}/7")
    assert never.status_code == 404 and never.json()["detail"].endswith("kept: 9, 14")
    for path in sorted((root / job["id"] / "step-00000009").iterdir()):
        path.unlink()
    (root / job["id"] / "step-00000009").rmdir()
    gone = offline.get(f"{url}/9")
    assert gone.status_code == 410 and "is gone from storage" in gone.json()["detail"]
    assert gone.headers["content-type"] == "application/json"
    pruned = offline.get(f"{url}/4")
    assert pruned.status_code == 410 and "was pruned at" in pruned.json()["detail"]

    whole = offline.get(f"{url}/14")
    assert whole.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(whole.content), mode="r:gz") as tar:
        manifest = json.load(tar.extractfile(f"{job['id']}-step-00000014/manifest.json"))
        part = tar.getmember(f"{job['id']}-step-00000014/part-0000.safetensors")
    assert (
        manifest["step"] == 14 and part.size == manifest["files"]["part-0000.safetensors"]["bytes"]
    )


def test_export_of_a_downloaded_and_unpacked_checkpoint_works(
    offline: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tar xzf JOB-step-00000014.tar.gz; hetsched export JOB-step-00000014/`` used to
    die with a ValueError traceback (the folder's name is not ``step-NNNNNNNN``)."""
    from tests.api.conftest import run_cli

    state = offline.app.state.hetsched
    job = offline.post(JOBS, json={**TINY, "steps": 50}).json()
    _checkpoint(state.store, Path(state.settings.checkpoint_root), job["id"], 14)
    download = offline.get(f"{JOBS}/{job['id']}/checkpoints/14")
    with tarfile.open(fileobj=io.BytesIO(download.content), mode="r:gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    folder = tmp_path / "unpacked" / f"{job['id']}-step-00000014"

    code, out, err = run_cli(capsys, "export", str(folder), "-o", str(tmp_path / "hf"))
    assert (code, err) == (0, "")
    assert (tmp_path / "hf" / "model.safetensors").is_file(), out

    part = folder / "part-0000.safetensors"
    part.write_bytes(part.read_bytes()[:100])
    code, _, err = run_cli(capsys, "export", str(folder), "-o", str(tmp_path / "hf2"))
    assert code == 2 and err.count("\n") == 1
    assert "cannot be exported: part-0000.safetensors has 100 bytes" in err
