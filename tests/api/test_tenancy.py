"""A cluster shared by two projects: who sees and acts on what, quotas, the audit log.

One service for the module (uvicorn in a thread, the executor on the module's local
Ray, ``fifo``), set up as an admin does it with ``hetsched projects create`` and
``hetsched users create``: project ``vision`` (alice and carol; at most 1 device, priority
5, 300 bytes of uploads) and project ``nlp`` (bob).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from api.accounts import ProjectRecord
from api.app import create_app
from api.cli import main
from api.core.db import now
from api.core.migrate import upgrade
from api.execution.scheduling import apply_quotas
from api.services import ClusterHandle
from hetsched import AsyncClient, Client, Forbidden, NotFound
from scheduler.policy.decide import decide
from scheduler.policy.types import JobDemand
from tests.api.conftest import make_settings
from tests.support import JOBS, TERMINAL, make_cluster, uvicorn_thread, wait_for

ADMIN = "admin-secret"
TINY = {"model": "gpt-tiny", "global_batch": 8, "max_devices": 1}
MISSING = "job: no job with id '0123456789ab'"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def cli(url: str, token: str, *argv: str) -> tuple[int, str]:
    """``hetsched ARGV... --url URL`` with ``token`` as HETSCHED_API_TOKEN: code and stdout."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setenv("HETSCHED_API_TOKEN", token)
        code = main([*argv, "--url", url])
    return code, out.getvalue()


@pytest.fixture(scope="module")
def service(
    warm_cluster: ClusterHandle,
    cache_dir: Path,
    steady_margin: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Path]]:
    """The shared service, on the warm workers the modules before it left (``warm_cluster``)
    and the session's profile cache."""
    data_dir = tmp_path_factory.mktemp("tenancy")
    settings = make_settings(data_dir, cache_dir=cache_dir, policy="fifo", api_token=ADMIN)
    with uvicorn_thread(create_app(settings, cluster=warm_cluster)) as url:
        yield url, data_dir


@pytest.fixture(scope="module")
def team(service: tuple[str, Path]) -> dict[str, httpx.Client]:
    """A client per user, each with the token ``hetsched users create`` printed for them."""
    url, _ = service
    for argv in (
        ("projects", "create", "vision", "--max-devices", "1", "--max-priority", "5"),
        ("projects", "set", "vision", "--storage-bytes", "300"),
        ("projects", "add", "nlp", "--weight", "2"),  # `add`: the same as `create`
    ):
        assert cli(url, ADMIN, *argv)[0] == 0
    clients = {"admin": httpx.Client(base_url=url, headers=bearer(ADMIN), timeout=60)}
    for name, project in (("alice", "vision"), ("carol", "vision"), ("bob", "nlp")):
        code, out = cli(url, ADMIN, "users", "create", name, "--project", project)
        assert code == 0 and f"user {name} in {project}" in out
        token = out.strip().splitlines()[-1]
        clients[name] = httpx.Client(base_url=url, headers=bearer(token), timeout=60)
    clients["nobody"] = httpx.Client(base_url=url, timeout=60)
    return clients


def submit(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    response = client.post(JOBS, json={**TINY, **fields})
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def finished(team: dict[str, httpx.Client]) -> dict[str, Any]:
    """Alice's job of three steps, finished, with a checkpoint of each step."""
    job = submit(team["alice"], name="alice-1", steps=3, checkpoint_every=1)
    return wait_for(team["alice"], job["id"], lambda j: j["state"] == "SUCCEEDED")


@pytest.fixture(scope="module")
def busy(team: dict[str, httpx.Client]) -> Iterator[dict[str, Any]]:
    """A long job of alice's, running: vision holds its one device."""
    job = submit(team["alice"], name="alice-long", steps=100_000)
    yield wait_for(team["alice"], job["id"], lambda j: j["state"] == "RUNNING")
    team["alice"].post(f"{JOBS}/{job['id']}/stop")


def detail(response: httpx.Response) -> str:
    return str(response.json()["detail"])


def test_tokens_are_shown_once_and_reads_need_one(
    service: tuple[str, Path], team: dict[str, httpx.Client]
) -> None:
    url, _ = service
    code, out = cli(url, ADMIN, "users", "list")
    assert code == 0 and "alice" in out and "vision" in out and "active" in out
    assert "hs_" not in out  # the tokens were shown once, at `users create`
    me = team["alice"].get("/api/v1/users/me").json()
    assert me == {"name": "alice", "is_admin": False, "projects": ["vision"], "single_user": False}
    nobody = team["nobody"]
    for path in (JOBS, "/api/v1/schedule", "/api/v1/datasets", f"{JOBS}/0123456789ab/logs"):
        response = nobody.get(path)
        assert response.status_code == 401, path
        assert detail(response) == "authorization: send 'Authorization: Bearer <token>'"
    assert nobody.get("/api/v1/cluster").status_code == 200  # the cluster stays open
    code, out = cli(url, ADMIN, "users", "add", "dave", "--project", "nlp")
    dave = httpx.Client(base_url=url, headers=bearer(out.strip().splitlines()[-1]))
    assert dave.get(JOBS).status_code == 200
    assert cli(url, ADMIN, "users", "revoke", "dave") == (0, "user dave: token revoked\n")
    response = dave.get(JOBS)
    assert response.status_code == 401
    assert detail(response) == "authorization: the token of 'dave' was revoked"
    code, out = cli(url, team["alice"].headers["Authorization"][7:], "users", "list")
    assert code == 2  # and main printed the server's one line
    assert team["alice"].post("/api/v1/users", json={"name": "eve"}).status_code == 403


def test_another_projects_job_is_a_404_everywhere(
    team: dict[str, httpx.Client], finished: dict[str, Any]
) -> None:
    job_id = finished["id"]
    assert finished["owner"] == "alice" and finished["project"] == "vision"
    bob = team["bob"]
    for method, path in (
        ("GET", ""),
        ("GET", "/logs"),
        ("GET", "/metrics"),
        ("GET", "/checkpoints"),
        ("GET", "/checkpoints/2"),
        ("POST", "/stop"),
        ("DELETE", ""),
    ):
        theirs = bob.request(method, f"{JOBS}/{job_id}{path}")
        missing = bob.request(method, f"{JOBS}/0123456789ab{path}")
        assert theirs.status_code == missing.status_code == 404, (method, path)
        assert detail(theirs) == detail(missing).replace("0123456789ab", job_id)
    assert job_id not in [j["id"] for j in bob.get(JOBS).json()["data"]]
    theirs = bob.post(JOBS, json={**TINY, "init_from": f"{job_id}@2"})
    missing = bob.post(JOBS, json={**TINY, "init_from": "0123456789ab@2"})
    assert theirs.status_code == missing.status_code == 409
    assert detail(theirs) == f"init_from: no job {job_id!r}"
    other = bob.post(JOBS, json={**TINY, "project": "vision"})
    assert other.status_code == 409
    assert detail(other) == "project: 'vision' is not one of yours (nlp)"
    # carol shares alice's project: she reads the job and downloads its checkpoint
    carol = team["carol"]
    assert carol.get(f"{JOBS}/{job_id}").json()["owner"] == "alice"
    steps = [c["step"] for c in carol.get(f"{JOBS}/{job_id}/checkpoints").json()["data"]]
    assert 2 in steps
    download = carol.get(f"{JOBS}/{job_id}/checkpoints/2")
    assert download.status_code == 200 and download.content[:2] == b"\x1f\x8b"
    assert team["admin"].get(f"{JOBS}/{job_id}/metrics").json()["count"] == 3
    assert [j["id"] for j in carol.get(JOBS, params={"owner": "alice"}).json()["data"]] == [job_id]


def test_the_python_client_acts_as_a_user_and_sees_only_its_projects_jobs(
    service: tuple[str, Path], team: dict[str, httpx.Client], finished: dict[str, Any]
) -> None:
    url, _ = service
    with Client(url, token=ADMIN) as admin:
        made = admin.create_user("erin", projects=["nlp"])
        assert made.token.startswith("hs_") and made.projects == ["nlp"]
        assert "erin" in [u.name for u in admin.users()]
        assert {p.name for p in admin.projects()} >= {"vision", "nlp"}
    job_id = finished["id"]
    with Client(url, token=made.token) as erin:
        assert erin.me().name == "erin"
        assert [p.name for p in erin.projects()] == ["nlp"]
        assert job_id not in [j.id for j in erin.list().data]
        with pytest.raises(NotFound, match=f"job: no job with id '{job_id}'"):
            erin.get(job_id)
        with pytest.raises(Forbidden, match="authorization: admins only"):
            erin.users()
    with Client(url, token=team["alice"].headers["Authorization"][7:]) as alice:
        assert job_id in [j.id for j in alice.list().data]

    async def audited() -> set[tuple[str, str]]:
        async with AsyncClient(url, token=ADMIN) as admin:
            page = await admin.audit(action="user.add")
        return {(e.actor, e.target) for e in page.data}

    assert ("admin", "erin") in asyncio.run(audited())


def test_a_quota_holds_a_job_back_with_its_reason(
    team: dict[str, httpx.Client], busy: dict[str, Any]
) -> None:
    alice, bob = team["alice"], team["bob"]
    over = alice.post(JOBS, json={**TINY, "priority": 10})
    assert over.status_code == 422
    assert detail(over) == "priority: 10 is above project vision's max_priority 5"
    never = alice.post(JOBS, json={**TINY, "min_devices": 2, "max_devices": 2})
    assert never.status_code == 422
    assert detail(never) == (
        "min_devices: 2 device(s) are more than project vision's max_devices 1; "
        "the job could never start"
    )
    second = submit(alice, name="alice-2", steps=2)
    reason = "quota: project vision holds 1 of its 1 device(s) (max_devices); this job needs 1"
    job = wait_for(alice, second["id"], lambda j: reason in j["message"])
    assert job["state"] == "PENDING"
    schedule = alice.get("/api/v1/schedule").json()
    row = next(r for r in schedule["jobs"] if r["id"] == second["id"])
    assert row["status"] == "waiting" and row["reason"] == reason
    usage = {p["name"]: p for p in schedule["projects"]}
    assert set(usage) == {"vision"} and usage["vision"]["devices_held"] == 1
    assert usage["vision"]["queued"] >= 1
    # bob sees neither job, only that a device is held by another project
    theirs = bob.get("/api/v1/schedule").json()
    assert not {busy["id"], second["id"]} & {r["id"] for r in theirs["jobs"]}
    assert "another project" in theirs["devices"].values()
    assert alice.post(f"{JOBS}/{second['id']}/stop").json()["state"] == "STOPPED"


def test_a_checkpoint_another_job_starts_from_is_not_deleted(
    service: tuple[str, Path],
    team: dict[str, httpx.Client],
    finished: dict[str, Any],
    busy: dict[str, Any],
) -> None:
    _, data_dir = service
    alice, source = team["alice"], finished["id"]
    child = submit(alice, name="alice-child", steps=2, init_from=f"{source}@2")
    folder = data_dir / "checkpoints" / source
    assert folder.is_dir()
    refused = alice.delete(f"{JOBS}/{source}")
    assert refused.status_code == 409
    assert detail(refused) == (
        f"job: {source}'s checkpoints are still needed: job {child['id']} starts from them "
        "(init_from) and has not ended; delete it once that job ends"
    )
    assert alice.get(f"{JOBS}/{source}").status_code == 200 and folder.is_dir()
    alice.post(f"{JOBS}/{child['id']}/stop")
    assert alice.delete(f"{JOBS}/{source}").status_code == 200
    assert alice.get(f"{JOBS}/{source}").status_code == 404 and not folder.exists()


def test_uploads_belong_to_a_project_and_count_against_its_storage(
    team: dict[str, httpx.Client],
) -> None:
    alice, bob = team["alice"], team["bob"]
    datasets = "/api/v1/datasets"
    made = alice.post(datasets, params={"name": "notes.txt"}, content=b"hello " * 40)
    assert made.status_code == 201
    over = alice.post(datasets, params={"name": "more.txt"}, content=b"x" * 200)
    assert over.status_code == 413
    assert detail(over) == (
        "body: 200 bytes exceed the 60 bytes left of project vision's storage quota "
        "(240 of its storage_bytes 300 used); delete a dataset or ask an admin"
    )
    listed = {d["name"]: d for d in alice.get(datasets).json()["data"]}
    assert listed["notes.txt"]["owner"] == "alice"
    assert "notes.txt" not in {d["name"] for d in bob.get(datasets).json()["data"]}
    refused = bob.post(JOBS, json={**TINY, "dataset": "notes.txt"})
    assert refused.status_code == 409
    assert detail(refused) == "dataset: no file 'notes.txt' in the server's data directory"
    assert bob.delete(f"{datasets}/notes.txt").status_code == 404
    assert alice.delete(f"{datasets}/notes.txt").status_code == 200
    assert alice.post(datasets, params={"name": "more.txt"}, content=b"x" * 200).status_code == 201


def test_admins_do_everything_and_the_audit_log_says_who(
    team: dict[str, httpx.Client], finished: dict[str, Any]
) -> None:
    alice, bob, admin = team["alice"], team["bob"], team["admin"]
    device = admin.get("/api/v1/cluster").json()["nodes"][0]["devices"][0]["id"]
    fault = f"/api/v1/cluster/devices/{device}/slowdown"
    refused = alice.post(fault, json={"factor": 2})
    assert refused.status_code == 403 and detail(refused) == "authorization: admins only"
    assert alice.post("/api/v1/cluster/profile", json={}).status_code == 403
    assert alice.get("/api/v1/audit").status_code == 403
    assert admin.post(fault, json={"factor": 1}).status_code == 200
    theirs = submit(bob, name="bob-1", steps=100_000)
    assert admin.post(f"{JOBS}/{theirs['id']}/stop").status_code == 200
    wait_for(admin, theirs["id"], lambda j: j["state"] in TERMINAL)
    assert admin.delete(f"{JOBS}/{theirs['id']}").status_code == 200
    log = admin.get("/api/v1/audit", params={"limit": 1000}).json()["data"]
    seen = {(e["actor"], e["action"], e["target"]) for e in log}
    assert ("alice", "job.submit", finished["id"]) in seen
    assert ("bob", "job.submit", theirs["id"]) in seen
    assert ("admin", "job.stop", theirs["id"]) in seen
    assert ("admin", "job.delete", theirs["id"]) in seen
    assert ("admin", "device.slowdown", device) in seen
    assert ("admin", "user.add", "alice") in seen
    deletes = admin.get("/api/v1/audit", params={"action": "job.delete"}).json()["data"]
    assert {e["action"] for e in deletes} == {"job.delete"}


def test_single_user_mode_stays_and_a_proxys_header_is_trusted_only_when_set(
    tmp_path: Path,
) -> None:
    with TestClient(create_app(make_settings(tmp_path, start_ray=False, executor=False))) as c:
        assert c.get("/api/v1/users/me").json()["single_user"] is True
        refused = c.post("/api/v1/users", json={"name": "alice"})
        assert refused.status_code == 409 and "set HETSCHED_API_TOKEN" in detail(refused)
    settings = make_settings(
        tmp_path,
        start_ray=False,
        executor=False,
        api_token=ADMIN,
        identity_header="X-Forwarded-User",
    )
    with TestClient(create_app(settings)) as c:
        made = c.post("/api/v1/users", json={"name": "alice"}, headers=bearer(ADMIN))
        assert made.status_code == 201 and made.json()["token"].startswith("hs_")
        me = c.get("/api/v1/users/me", headers={"X-Forwarded-User": "alice"}).json()
        assert me["name"] == "alice" and me["projects"] == []
        stranger = c.get(JOBS, headers={"X-Forwarded-User": "mallory"})
        assert stranger.status_code == 401
        assert detail(stranger) == "authorization: wrong user 'mallory' in X-Forwarded-User"
        # the header passes the check before the body too; the route then names the user
        posted = c.post(JOBS, json=TINY, headers={"X-Forwarded-User": "mallory"})
        assert detail(posted) == detail(stranger)


def test_jobs_from_before_users_belong_to_the_admin_in_the_default_project(
    tmp_path: Path,
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    upgrade(engine, "0004")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO jobs (id, seq, name, model_name, spec_json, state, message, "
                "devices_json, steps_done, stop_requested, created_at) VALUES ('abc', 1, 'old', "
                "'gpt-tiny', '{}', 'SUCCEEDED', '', '[]', 0, 0, '2026-11-30 00:00:00')"
            )
        )
    upgrade(engine)
    with engine.connect() as connection:
        row = connection.execute(text("SELECT owner, project FROM jobs")).one()
        admin = connection.execute(text("SELECT is_admin FROM users WHERE name='admin'")).one()
    assert tuple(row) == ("admin", "default") and admin[0]


def quota(name: str, *, weight: float = 1.0, max_devices: int | None = None) -> ProjectRecord:
    return ProjectRecord(name=name, weight=weight, max_devices=max_devices, created_at=now())


def demand(name: str, *, held: tuple[str, ...] = (), min_devices: int = 1) -> JobDemand:
    return JobDemand(
        name=name,
        model="gpt2-medium",
        global_batch=256,
        steps_left=1000,
        held=held,
        min_devices=min_devices,
    )


def test_projects_share_the_cluster_by_weight_then_between_their_jobs() -> None:
    cluster = make_cluster(["A100-80GB"] * 8)
    jobs = [demand(n) for n in ("a1", "b1", "b2", "b3")]
    project_of = {"a1": "a", "b1": "b", "b2": "b", "b3": "b"}
    assert {len(d) for d in decide(cluster, jobs, policy="fair").devices.values()} == {2}
    projects = {"a": quota("a"), "b": quota("b")}
    kept, held_back = apply_quotas(jobs, project_of=project_of, projects=projects, held={})
    assert not held_back
    shared = decide(cluster, kept, policy="fair").devices
    theirs = sum(len(shared[b]) for b in ("b1", "b2", "b3"))
    assert len(shared["a1"]) == theirs == 4  # half the cluster each, as the weights say


def test_max_devices_lets_jobs_in_while_their_minimum_fits_and_caps_the_rest() -> None:
    jobs = [
        demand("run", held=("a/0",)),
        demand("first"),
        demand("second"),
        demand("big", min_devices=3),
    ]
    project_of = {"run": "a", "first": "a", "second": "a", "big": "b"}
    projects = {"a": quota("a", max_devices=2), "b": quota("b", max_devices=2)}
    kept, held_back = apply_quotas(jobs, project_of=project_of, projects=projects, held={"a": 1})
    assert held_back == {
        "second": "quota: project a holds 1 and jobs ahead of it start on 1 more of its 2 "
        "device(s) (max_devices); this job needs 1",
        "big": "quota: project b holds 0 of its 2 device(s) (max_devices); this job needs 3",
    }
    caps = {d.name: d.max_devices for d in kept}
    assert caps == {"run": 1, "first": 1}  # together at most the project's 2
