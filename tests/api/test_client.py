"""``hetsched.Client`` and ``AsyncClient`` against a real service (``hetsched serve`` in its
own process, shared with the CLI's tests): a job submitted, followed, waited for, its
metrics, checkpoints, download and export; typed errors; retries."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from api.schemas.jobs import LogLine, StepPublic
from api.states import JobState
from hetsched import (
    AsyncClient,
    Client,
    Conflict,
    ConnectionFailed,
    HetschedError,
    InvalidRequest,
    JobFailed,
    NotFound,
    Retry,
    Unauthorized,
    WaitTimeout,
)
from tests.api.conftest import (
    SERVICE_TOKEN,
    TRAINED_STEPS,
    ThreadedService,
    Trained,
    make_settings,
)
from tests.support import JOB_TIMEOUT_S, Serve, free_port


@pytest.fixture
def client(live_service: Serve) -> Iterator[Client]:
    with Client(live_service.url, token=SERVICE_TOKEN) as c:
        yield c


def test_follow_yields_log_lines_and_every_step_then_wait_returns_the_job(
    trained_job: Trained,
) -> None:
    job = trained_job.job
    assert job.state is JobState.SUCCEEDED and job.steps_done == TRAINED_STEPS
    steps = [e for e in trained_job.events if isinstance(e, StepPublic)]
    lines = [e.message for e in trained_job.events if isinstance(e, LogLine)]
    assert [s.step for s in steps] == list(range(TRAINED_STEPS))
    assert lines[-1].startswith("SUCCEEDED"), lines
    times = [e.time for e in trained_job.events]
    assert times == sorted(times), "follow yields in time order"
    # one numbering: the log's "step N" is the metrics' step N
    last = steps[-1]
    assert any(
        m.startswith(
            f"step {last.step} ({TRAINED_STEPS}/{TRAINED_STEPS} done): loss {last.loss:.4f}"
        )
        for m in lines
    ), lines


def test_metrics_checkpoints_download_and_export(
    client: Client, trained_job: Trained, tmp_path: Path
) -> None:
    job_id = trained_job.job.id
    metrics = client.metrics(job_id)
    assert [s.step for s in metrics] == list(range(TRAINED_STEPS))
    assert [s.step for s in client.metrics(job_id, since=2)] == [2, 3]
    assert metrics[1].val_loss is not None and metrics[0].val_loss is None
    try:
        frame = metrics.to_pandas()
    except HetschedError as exc:
        assert str(exc) == "metrics: to_pandas needs pandas (pip install pandas)"
    else:
        assert list(frame.index) == list(range(TRAINED_STEPS))
        assert frame.loc[3, "loss"] == metrics[3].loss
    kept = [c.step for c in client.checkpoints(job_id)]
    assert kept == [1, 3], "checkpoint ids are the step they follow, as the metrics number it"
    directory = client.download(job_id, 1, dest=tmp_path / "dl")
    assert directory == tmp_path / "dl" / "step-00000001"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["step"] == 1
    assert list((tmp_path / "dl").iterdir()) == [directory], "the archive is unpacked, then gone"
    written = client.export(job_id, tmp_path / "hf", dtype="bfloat16")
    assert sorted(p.name for p in written) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_errors_are_typed_and_carry_the_apis_line(client: Client, live_service: Serve) -> None:
    with pytest.raises(NotFound) as missing:
        client.get("nosuchjob")
    assert (missing.value.status, missing.value.detail) == (404, "job: no job with id 'nosuchjob'")
    with pytest.raises(InvalidRequest) as bad:
        client.submit(global_batch=0)
    assert bad.value.status == 422 and bad.value.detail.startswith("global_batch: ")
    with Client(live_service.url, token="wrong") as intruder, pytest.raises(Unauthorized):
        intruder.submit(steps=1)
    job = client.submit(name="long", global_batch=8, steps=100_000)
    with pytest.raises(HetschedError, match=f"^checkpoint: job {job.id} has no checkpoint yet"):
        client.download(job.id)
    with pytest.raises(Conflict, match="only STOPPED, SUCCEEDED or FAILED"):
        client.delete(job.id)
    with pytest.raises(
        WaitTimeout, match=f"^wait: job {job.id} is still (PENDING|RUNNING) after 0.3 s"
    ):
        client.wait(job.id, timeout_s=0.3, poll_s=0.1)
    stopping = client.stop(job.id)
    assert stopping.state is JobState.STOPPED or stopping.stop_requested
    with pytest.raises(JobFailed) as failed:
        client.wait(job.id, timeout_s=JOB_TIMEOUT_S, poll_s=0.2)
    assert failed.value.job.state is JobState.STOPPED
    assert client.delete(job.id) == f"job {job.id} deleted"


def test_a_submission_id_makes_a_retried_submit_one_job(client: Client) -> None:
    first = client.submit(name="once", steps=1, submission_id="client-test-once")
    again = client.submit({"name": "once", "steps": 1, "submission_id": "client-test-once"})
    assert again.id == first.id
    other = client.submit(name="twice", steps=1)
    assert other.id != first.id
    assert other.submission_id is not None and other.submission_id.startswith("client-")
    for job_id in (first.id, other.id):
        if not client.get(job_id).state.terminal:
            client.stop(job_id)


def test_the_service_as_a_whole(client: Client, trained_job: Trained) -> None:
    cluster = client.cluster()
    assert cluster.available and cluster.num_devices == len(
        [d for n in cluster.nodes for d in n.devices]
    )
    assert client.schedule().policy == "fifo"
    preview = client.plan(model="gpt-tiny", global_batch=8, strategy="dp")
    assert sum(d.samples for d in preview.plan.devices) == 8
    listed = client.list(state="SUCCEEDED")
    assert trained_job.job.id in [j.id for j in listed.data]


def test_async_client_answers_as_the_sync_one(live_service: Serve, trained_job: Trained) -> None:
    job_id = trained_job.job.id

    async def main() -> tuple[object, ...]:
        async with AsyncClient(live_service.url, token=SERVICE_TOKEN) as client:
            job = await client.wait(job_id, timeout_s=5)
            metrics = await client.metrics(job_id)
            events = [e async for e in client.follow(job_id)]
            with pytest.raises(NotFound):
                await client.get("nosuchjob")
            return job, metrics, events

    job, metrics, events = asyncio.run(main())
    assert job == trained_job.job
    assert metrics == [e for e in trained_job.events if isinstance(e, StepPublic)]
    assert [e for e in events if isinstance(e, LogLine)] == [
        e for e in trained_job.events if isinstance(e, LogLine)
    ]


def test_a_refused_connection_is_retried_until_the_service_is_up(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with Client(url, retry=Retry(attempts=1)) as once, pytest.raises(ConnectionFailed) as info:
        once.list()
    assert str(info.value) == (
        f"cannot reach the control plane at {url} "
        "(is `hetsched serve` running? set --url or HETSCHED_URL)"
    )
    late = ThreadedService(make_settings(tmp_path, start_ray=False, executor=False), port)
    late.start(delay_s=1.0)
    try:
        began = time.monotonic()
        with Client(url, retry=Retry(attempts=8, backoff_s=0.2)) as patient:
            assert patient.list().count == 0
        assert time.monotonic() - began >= 1.0
    finally:
        late.stop()


class _Busy(BaseHTTPRequestHandler):
    """Answers 503 (with Retry-After) to the first two GETs, then an empty job list."""

    answered = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).answered += 1
        busy = type(self).answered <= 2
        body = b'{"detail": "busy"}' if busy else b'{"data": [], "count": 0}'
        self.send_response(503 if busy else 200)
        if busy:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_503_is_retried_for_reads() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with Client(url, retry=Retry(attempts=3, backoff_s=0.05)) as client:
            assert client.list().count == 0
        assert _Busy.answered == 3
    finally:
        server.shutdown()


def test_the_dashboard_numbers_steps_as_the_api_does() -> None:
    """The job page's charts, events, "checkpoint of step N" and the schedule page show a
    step's own number (the metrics API's, the checkpoint id): none adds one to it. The
    one ``step + 1`` left is the next ``since`` to ask the metrics API for."""
    from api.routes.dashboard import STATIC_DIR

    shifted = [
        f"{path.name}: {line.strip()}"
        for path in sorted((STATIC_DIR / "js").glob("*.js"))
        for line in path.read_text().splitlines()
        if re.search(r"\bstep \+ 1\b", line) and "since" not in line
    ]
    assert shifted == []
    job_js = (STATIC_DIR / "js" / "job.js").read_text()
    assert "download checkpoint of step ${last.step}</a>" in job_js
