"""The job store's schema migrates on start; a database made by the previous schema keeps
its rows.

``PREVIOUS_SCHEMA`` is the DDL ``Base.metadata.create_all`` produced before
migrations existed (SQLite's own record of it, frozen here): a user's
existing ``.hetsched/hetsched.db`` looks exactly like this.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from api.app import create_app
from api.core.db import Base, make_engine
from api.core.migrate import BASELINE, current_revision, head_revision, upgrade
from tests.api.conftest import make_settings

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


def test_migrations_build_exactly_the_models_tables(tmp_path: Path) -> None:
    """A model change without its revision (or the reverse) fails here."""
    engine = make_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert differences == []
    assert current_revision(engine) == head_revision()


def test_baseline_revision_is_exactly_the_previous_schema(tmp_path: Path) -> None:
    """Revision 0001 builds what create_all made, so stamping an old database is sound."""
    upgrade(create_engine(f"sqlite:///{tmp_path / 'baseline.db'}"), BASELINE)
    _previous_database(tmp_path / "old.db")

    def schema(path: Path) -> set[str]:
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")
            return {" ".join(sql.split()) for (sql,) in rows if "alembic_version" not in sql}

    assert schema(tmp_path / "baseline.db") == schema(tmp_path / "old.db")


def test_starting_twice_is_a_no_op(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    make_engine(url).dispose()
    engine = make_engine(url)
    assert current_revision(engine) == head_revision()
