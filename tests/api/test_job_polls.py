"""``GET /jobs/{id}`` as dashboards poll it: answered without a database read while
nothing changed, yet never a change late, never to someone it was not shown to."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from api.app import create_app
from api.core.settings import Settings
from api.schemas.jobs import JobCreate
from api.store import JobStore
from tests.api.conftest import make_settings
from tests.support import JOBS

ADMIN = "admin-secret"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def add_job(store: JobStore, project: str = "default") -> str:
    """A PENDING job, as ``POST /jobs`` stores it (no cluster is needed to read it)."""
    spec = JobCreate(model="gpt-tiny", global_batch=8, steps=10)
    job, _ = store.create_job(
        name="polled", model_name="gpt-tiny", spec=spec, submission_id=None, project=project
    )
    return job.id


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[TestClient, JobStore]]:
    settings: Settings = make_settings(tmp_path, start_ray=False, executor=False, api_token=ADMIN)
    with TestClient(create_app(settings)) as client:
        yield client, client.app.state.hetsched.store  # type: ignore[attr-defined]


def statements(store: JobStore) -> list[str]:
    """Every SQL statement the store's engine runs from now on."""
    seen: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def test_unchanged_polls_read_nothing_and_a_change_shows_at_once(
    service: tuple[TestClient, JobStore],
) -> None:
    client, store = service
    job_id = add_job(store)
    first = client.get(f"{JOBS}/{job_id}", headers=bearer(ADMIN))
    assert first.status_code == 200
    seen = statements(store)
    polls = [client.get(f"{JOBS}/{job_id}", headers=bearer(ADMIN)) for _ in range(20)]
    assert [p.content for p in polls] == [first.content] * 20
    assert seen == []  # twenty dashboards' polls, no read of the database

    store.add_event(job_id, kind="replan", step=3, data={"reason": "device 1 slowed"})
    events = client.get(f"{JOBS}/{job_id}", headers=bearer(ADMIN)).json()["events"]
    assert [e["step"] for e in events] == [3]
    client.post(f"{JOBS}/{job_id}/stop", headers=bearer(ADMIN))
    assert client.get(f"{JOBS}/{job_id}", headers=bearer(ADMIN)).json()["state"] == "STOPPED"

    metrics = client.get("/metrics").text
    polled = 'hetsched_http_requests_total{method="GET",route="/api/v1/jobs/{job_id}",status="200"}'
    assert any(
        line.startswith(polled) and float(line.split()[-1]) >= 23 for line in metrics.splitlines()
    ), "polls answered before routing are counted under their route"


def test_polls_that_come_together_after_a_write_share_one_read(
    service: tuple[TestClient, JobStore],
) -> None:
    client, store = service
    job_id = add_job(store)
    client.get(f"{JOBS}/{job_id}", headers=bearer(ADMIN))
    store.add_event(job_id, kind="replan", step=1, data={})  # as each training step writes
    seen = statements(store)

    async def fifty_polls() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as polls:
            url = f"{JOBS}/{job_id}"
            return await asyncio.gather(*(polls.get(url, headers=bearer(ADMIN)) for _ in range(50)))

    answers = asyncio.run(fifty_polls())
    assert {a.status_code for a in answers} == {200}
    assert all(len(a.json()["events"]) == 1 for a in answers)
    reads = [s for s in seen if s.lstrip().upper().startswith("SELECT") and "FROM jobs" in s]
    assert len(reads) == 1, f"{len(reads)} reads of the job for 50 polls after one write"


def test_a_cached_answer_is_only_ever_shown_to_whom_the_route_would_show_it(
    service: tuple[TestClient, JobStore],
) -> None:
    client, store = service
    admin = bearer(ADMIN)
    for project in ("vision", "nlp"):
        assert client.post("/api/v1/projects", json={"name": project}, headers=admin).is_success
    tokens = {}
    for name, project in (("alice", "vision"), ("bob", "nlp")):
        created = client.post(
            "/api/v1/users", json={"name": name, "projects": [project]}, headers=admin
        )
        tokens[name] = bearer(created.json()["token"])
    job_id = add_job(store, project="vision")
    url = f"{JOBS}/{job_id}"

    for _ in range(3):  # the second and third are answered from the cache
        assert client.get(url, headers=tokens["alice"]).status_code == 200
    assert client.get(url, headers=tokens["bob"]).status_code == 404  # another project's
    assert client.get(url).status_code == 401
    assert client.get(url, headers=bearer("not-a-token")).status_code == 401

    assert client.post("/api/v1/users/alice/revoke", headers=admin).status_code == 200
    refused = client.get(url, headers=tokens["alice"])
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


def test_after_a_write_a_poll_the_route_would_refuse_reads_no_job(
    service: tuple[TestClient, JobStore],
) -> None:
    """Polls after a write are answered before routing too, but only for callers the
    route would answer: one without a token (a 401) costs no read of the job."""
    client, store = service
    job_id = add_job(store)
    url = f"{JOBS}/{job_id}"
    assert client.get(url, headers=bearer(ADMIN)).status_code == 200
    store.add_event(job_id, kind="replan", step=1, data={})  # the answer above is stale now
    seen = statements(store)
    for headers in ({}, bearer("not-a-token")):
        assert client.get(url, headers=headers).status_code == 401
    assert [s for s in seen if "FROM jobs" in s] == []
    assert len(client.get(url, headers=bearer(ADMIN)).json()["events"]) == 1
    assert [s for s in seen if "FROM jobs" in s] != []  # read once the admin asked
