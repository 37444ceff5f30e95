"""The job record is typed end to end: the store parses spec and plan once."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api.core.settings import DEFAULT_CLUSTER
from api.schemas.jobs import JobCreate
from api.schemas.plans import OptimizerSpec
from api.store import JobStore
from scheduler.cost.profile import analytic_profile
from scheduler.hardware.cluster import load_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.plan import Plan
from scheduler.planning.planner import make_plan

JOBS = "/api/v1/jobs"


def test_store_hands_back_the_spec_model_and_the_plan(offline: TestClient) -> None:
    submitted = {"name": "typed", "global_batch": 8, "steps": 3, "optimizer": {"lr": 0.01}}
    job_id = offline.post(JOBS, json=submitted).json()["id"]
    store: JobStore = offline.app.state.hetsched.store  # type: ignore[attr-defined]
    record = store.get(job_id)
    assert record is not None and isinstance(record.spec, JobCreate)
    assert record.spec.optimizer == OptimizerSpec(lr=0.01)
    assert (record.spec.global_batch, record.spec.steps, record.spec.devices) == (8, 3, None)
    assert record.plan is None

    profile = analytic_profile(load_cluster(DEFAULT_CLUSTER), get_preset("gpt-tiny"))
    plan = make_plan(profile, 8, "dp")
    assert store.start(job_id, ["node-a/0", "node-a/1"])
    store.set_plan(job_id, plan, [d.id for d in plan.active])
    running = store.get(job_id)
    assert running is not None and isinstance(running.plan, Plan)
    assert running.plan == plan and running.predicted_step_s == plan.predicted_step_s
    shown = offline.get(f"{JOBS}/{job_id}").json()
    unset = (None, [])  # the API shows fields the plan document leaves out as null
    assert [{k: v for k, v in d.items() if v not in unset} for d in shown["plan"]["devices"]] == [
        {k: v for k, v in d.items() if v not in unset} for d in plan.to_dict()["devices"]
    ]
    assert shown["spec"]["optimizer"]["lr"] == 0.01


def test_a_started_job_is_never_seen_running_without_its_allocation(offline: TestClient) -> None:
    """A poll between the start and its allocation event used to show a RUNNING job with
    no allocation: both are one write now, and a job no longer pending gets neither."""
    store: JobStore = offline.app.state.hetsched.store  # type: ignore[attr-defined]
    started, stopped = (offline.post(JOBS, json={"name": n}).json()["id"] for n in ("a", "b"))
    allocation = {"policy": "fifo", "from": [], "to": ["node-a/0"], "reason": "r"}
    before = store.writes.value
    assert store.start(started, ["node-a/0"], allocation=allocation)
    assert store.writes.value == before + 1, "the state and its event in one transaction"
    shown = offline.get(f"{JOBS}/{started}").json()
    assert shown["state"] == "RUNNING"
    assert [a["devices"] for a in shown["allocations"]] == [["node-a/0"]]

    assert offline.post(f"{JOBS}/{stopped}/stop").status_code == 200
    assert not store.start(stopped, ["node-a/1"], allocation=allocation)
    assert offline.get(f"{JOBS}/{stopped}").json()["allocations"] == []
