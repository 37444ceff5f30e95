"""The policy charges a move what the service measured restarts to take."""

from __future__ import annotations

from pathlib import Path

from api.core.db import make_engine
from api.execution.scheduling import Demands
from api.schemas.jobs import JobCreate
from api.store import JobStore
from tests.api.conftest import make_settings
from tests.support import make_cluster


def test_a_jobs_restart_charge_is_the_median_of_its_recorded_recoveries(tmp_path: Path) -> None:
    store = JobStore(make_engine(make_settings(tmp_path).database_url))
    demands = Demands(store=store, data_dir=tmp_path)
    cluster = make_cluster(["A100-80GB"])
    recovered, fresh = (
        store.create_job(name=n, model_name="gpt-tiny", spec=JobCreate(), submission_id=None)[0]
        for n in ("recovered", "fresh")
    )

    def charge(job_id: str) -> float | None:
        job = store.get(job_id)
        assert job is not None
        return demands.demand(job, held=(), steps_done=0, cluster=cluster).restart_s

    assert charge(fresh.id) is None, "nothing recorded yet: the policy's constant"
    for seconds in (12.0, 40.0, 18.0):
        store.add_event(recovered.id, kind="recovery", step=1, data={"recover_s": seconds})
    store.add_event(recovered.id, kind="replan", step=2, data={"recover_s": 999.0})
    assert charge(recovered.id) == 18.0
    assert charge(fresh.id) == 18.0, "a job never restarted: the median over jobs that did"
