"""The job store's schema migrates on start (and with ``hetsched db``); a database made by
the previous schema keeps its rows. What is not about SQLite's own files runs on SQLite and
on a real PostgreSQL server (``db_url``).

``PREVIOUS_SCHEMA`` is the DDL ``Base.metadata.create_all`` produced before
migrations existed (SQLite's own record of it, frozen here): a user's
existing ``.hetsched/hetsched.db`` looks exactly like this.
"""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from api.app import create_app
from api.core.db import Base, make_engine
from api.core.migrate import BASELINE, current_revision, head_revision, revisions, upgrade
from api.schemas.jobs import JobCreate
from api.states import JobState
from api.store import JobStore
from tests.api.conftest import make_settings, run_cli
from tests.support import REPO

PREVIOUS_SCHEMA = """
CREATE TABLE jobs (
	id VARCHAR(32) NOT NULL,
	seq BIGINT NOT NULL,
	name VARCHAR(100) NOT NULL,
	model_name VARCHAR(100) NOT NULL,
	submission_id VARCHAR(128),
	spec_json TEXT NOT NULL,
	state VARCHAR(16) NOT NULL,
	message TEXT NOT NULL,
	devices_json TEXT NOT NULL,
	plan_json TEXT,
	steps INTEGER NOT NULL,
	global_batch INTEGER NOT NULL,
	steps_done INTEGER NOT NULL,
	last_loss FLOAT,
	predicted_step_s FLOAT,
	measured_step_s FLOAT,
	stop_requested BOOLEAN NOT NULL,
	created_at DATETIME NOT NULL,
	started_at DATETIME,
	ended_at DATETIME,
	PRIMARY KEY (id),
	UNIQUE (submission_id)
);
CREATE INDEX ix_jobs_state ON jobs (state);
CREATE INDEX ix_jobs_seq ON jobs (seq);
CREATE TABLE profiles (
	id INTEGER NOT NULL,
	"key" VARCHAR(400) NOT NULL,
	model VARCHAR(100) NOT NULL,
	cluster VARCHAR(200) NOT NULL,
	source VARCHAR(16) NOT NULL,
	profile_json TEXT NOT NULL,
	created_at DATETIME NOT NULL,
	PRIMARY KEY (id),
	UNIQUE ("key")
);
CREATE TABLE job_steps (
	job_id VARCHAR(32) NOT NULL,
	step INTEGER NOT NULL,
	loss FLOAT NOT NULL,
	step_s FLOAT NOT NULL,
	samples_per_s FLOAT NOT NULL,
	devices_json TEXT NOT NULL,
	time DATETIME NOT NULL,
	PRIMARY KEY (job_id, step),
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE
);
CREATE TABLE job_logs (
	id INTEGER NOT NULL,
	job_id VARCHAR(32) NOT NULL,
	time DATETIME NOT NULL,
	level VARCHAR(8) NOT NULL,
	message TEXT NOT NULL,
	PRIMARY KEY (id),
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE
);
CREATE INDEX ix_job_logs_job_id ON job_logs (job_id);
"""

SPEC = {
    "model": "gpt-tiny",
    "global_batch": 8,
    "strategy": "dp",
    "devices": None,
    "name": "old",
    "dataset": "default",
    "steps": 2,
    "optimizer": {"lr": 0.003, "weight_decay": 0.0},
    "seed": 0,
    "submission_id": "before-migrations",
}
PLAN = {
    "strategy": "dp",
    "global_batch": 8,
    "predicted_step_s": 0.5,
    "predicted_samples_per_s": 16.0,
    "compute_s": 0.4,
    "comm_s": 0.1,
    "devices": [
        {
            "id": "node-a/0",
            "samples": 8,
            "micro_batch": 8,
            "accum_steps": 1,
            "busy_s": 0.4,
            "peak_bytes": 1000,
            "layers": None,
        }
    ],
    "excluded": [],
    "baselines": {},
}


def _previous_database(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(PREVIOUS_SCHEMA)
        db.execute(
            "INSERT INTO jobs VALUES (?, 1, 'old', 'gpt-tiny', 'before-migrations', ?, "
            "'SUCCEEDED', 'finished 2 steps', '[\"node-a/0\"]', ?, 2, 8, 2, 5.25, 0.5, 0.6, 0, "
            "'2026-11-01 10:00:00', '2026-11-01 10:00:01', '2026-11-01 10:00:05')",
            ("old000000001", json.dumps(SPEC), json.dumps(PLAN)),
        )
        db.execute(
            "INSERT INTO job_steps VALUES ('old000000001', 0, 5.5, 0.6, 13.3, ?, "
            "'2026-11-01 10:00:02')",
            (json.dumps([{"id": "node-a/0", "busy_s": 0.4, "wait_s": 0.1, "peak_bytes": 1000}]),),
        )
        db.execute(
            "INSERT INTO job_logs (job_id, time, level, message) VALUES "
            "('old000000001', '2026-11-01 10:00:05', 'INFO', 'SUCCEEDED: finished 2 steps')"
        )
        db.execute(
            "INSERT INTO profiles (key, model, cluster, source, profile_json, created_at) VALUES "
            "('local-sim:gpt-tiny', 'gpt-tiny', 'local-sim', 'measured', ?, '2026-11-01 09:59:00')",
            (json.dumps({"model": "gpt-tiny", "devices": [], "links": {}, "gradient_bytes": 1}),),
        )


def test_previous_schema_is_upgraded_on_start_and_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "hetsched.db"
    _previous_database(path)
    settings = make_settings(tmp_path, start_ray=False, executor=False)
    with TestClient(create_app(settings)) as client:
        job = client.get("/api/v1/jobs/old000000001").json()
        assert job["state"] == "SUCCEEDED" and job["steps_done"] == 2
        assert job["last_loss"] == 5.25 and job["plan"]["devices"][0]["samples"] == 8
        assert job["spec"]["submission_id"] == "before-migrations"
        steps = client.get("/api/v1/jobs/old000000001/metrics").json()["data"]
        assert [(s["step"], s["loss"], s["val_loss"]) for s in steps] == [(0, 5.5, None)]
        logs = client.get("/api/v1/jobs/old000000001/logs").json()["data"]
        assert [line["message"] for line in logs] == ["SUCCEEDED: finished 2 steps"]
        assert client.get("/api/v1/profiles").json()["count"] == 1
        # and the upgraded store takes new jobs
        assert client.post("/api/v1/jobs", json={"steps": 1}).status_code == 201
    engine = create_engine(f"sqlite:///{path}")
    assert current_revision(engine) == head_revision()


def test_migrations_build_exactly_the_models_tables(db_url: str) -> None:
    """A model change without its revision (or the reverse) fails here, on SQLite and on
    PostgreSQL (whose types and constraints SQLite would let pass)."""
    engine = make_engine(db_url)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert differences == []
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_baseline_revision_is_exactly_the_previous_schema(tmp_path: Path) -> None:
    """Revision 0001 builds what create_all made, so stamping an old database is sound."""
    upgrade(create_engine(f"sqlite:///{tmp_path / 'baseline.db'}"), BASELINE)
    _previous_database(tmp_path / "old.db")

    def schema(path: Path) -> set[str]:
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")
            return {" ".join(sql.split()) for (sql,) in rows if "alembic_version" not in sql}

    assert schema(tmp_path / "baseline.db") == schema(tmp_path / "old.db")


def test_starting_twice_is_a_no_op(db_url: str) -> None:
    make_engine(db_url).dispose()
    engine = make_engine(db_url)
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_the_store_keeps_what_a_job_records(db_url: str) -> None:
    """Every table's round trip through JobStore, as the executor and the API use it."""
    store = JobStore(make_engine(db_url))
    spec = JobCreate(name="pg", global_batch=8, steps=3, submission_id="once")
    job, created = store.create_job(
        name="pg", model_name="gpt-tiny", spec=spec, submission_id="once"
    )
    again, created_again = store.create_job(
        name="pg", model_name="gpt-tiny", spec=spec, submission_id="once"
    )
    assert (created, created_again, again.id) == (True, False, job.id)
    assert store.start(job.id, ["node-a/0"])
    for step, loss in ((0, 5.0), (1, 4.5), (1, 4.25)):  # a recovered step replaces its record
        store.add_step(
            job.id,
            step=step,
            loss=loss,
            step_s=0.5,
            samples_per_s=16.0,
            devices=[{"id": "node-a/0", "busy_s": 0.4, "wait_s": 0.1, "peak_bytes": 10**10}],
            measured_step_s=0.5,
            val_loss=None if step == 0 else 4.0,
        )
    store.log(job.id, "INFO", "x" * 10_000)  # a long message: TEXT, not VARCHAR
    store.add_event(job.id, kind="recovery", step=1, data={"lost": ["node-a/1"]})
    store.add_checkpoint(job.id, step=0, uri="file:///c/0", keep=[0])
    store.add_checkpoint(job.id, step=1, uri="file:///c/1", keep=[1])
    assert [(s.step, s.loss, s.val_loss) for s in store.steps(job.id)] == [
        (0, 5.0, None),
        (1, 4.25, 4.0),
    ]
    assert store.steps(job.id)[1].devices[0]["peak_bytes"] == 10**10
    assert [len(line.message) for line in store.logs(job.id)] == [10_000]
    assert [c.step for c in store.checkpoints(job.id)] == [1]
    assert store.events(job.id)[0].data == {"lost": ["node-a/1"]}
    running = store.get(job.id)
    assert running is not None and running.steps_done == 2 and running.last_loss == 4.25
    assert running.started_at is not None and running.started_at.utcoffset() is not None
    assert store.count_by_state()["RUNNING"] == 1
    assert store.finish(job.id, JobState.SUCCEEDED, "done")
    assert store.list_jobs(state=JobState.SUCCEEDED, limit=10, offset=0)[1] == 1
    assert store.delete(job.id)
    assert (store.get(job.id), store.steps(job.id), store.logs(job.id)) == (None, [], [])
    store.engine.dispose()


def test_db_command_shows_upgrades_and_downgrades_keeping_rows(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    previous = revisions()[-2]
    assert run_cli(capsys, "db", "upgrade", "--db", db_url)[1] == (
        f"upgraded from empty (no hetsched tables) to {head_revision()} (head)\n"
    )
    store = JobStore(create_engine(db_url))
    job, _ = store.create_job(
        name="kept", model_name="gpt-tiny", spec=JobCreate(steps=7), submission_id=None
    )
    assert run_cli(capsys, "db", "current", "--db", db_url)[1] == (
        f"database: {head_revision()} (head)\n"
    )
    code, out, _ = run_cli(capsys, "db", "downgrade", "--db", db_url)
    assert (code, out) == (
        0,
        f"downgraded from {head_revision()} (head) to {previous} (head is {head_revision()})\n",
    )
    assert run_cli(capsys, "db", "upgrade", "--db", db_url)[0] == 0
    kept = store.get(job.id)
    assert kept is not None and kept.spec.steps == 7
    store.engine.dispose()
    code, out, err = run_cli(capsys, "db", "downgrade", "nine", "--db", db_url)
    assert (code, out) == (2, "")
    assert err.startswith("hetsched: error: REV: unknown revision 'nine'; known: 0001, ")
    assert run_cli(capsys, "db", "downgrade", "base", "--db", db_url)[1].endswith(
        " to empty (no hetsched tables)\n"
    )


def test_db_current_on_a_missing_sqlite_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "db", "current", "--data-dir", str(tmp_path / "none"))
    assert code == 2
    assert (
        err == f"hetsched: error: db: no database at {tmp_path / 'none' / 'hetsched.db'}; "
        "give --db or --data-dir\n"
    )


def test_alembic_itself_runs_from_the_repository_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``alembic current`` used to fail with KeyError: 'connection'. Alembic configured
    as its command line is from the repository root (pyproject.toml's ``[tool.alembic]``)
    reads and migrates the service's database."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HETSCHED_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("HETSCHED_DB_URL", raising=False)
    printed = io.StringIO()
    config = Config(toml_file="pyproject.toml", stdout=printed)
    command.upgrade(config, "head")
    command.current(config)
    assert printed.getvalue().split() == [head_revision(), "(head)"]
    assert current_revision(create_engine(f"sqlite:///{tmp_path / 'hetsched.db'}")) == (
        head_revision()
    )
