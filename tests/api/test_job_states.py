"""Job states are defined once (api/states.py): store, API and dashboard all use that list."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.testclient import TestClient

from api.routes.dashboard import STATIC_DIR
from api.states import TERMINAL_STATES, JobState
from api.store import JobStore

JOBS = "/api/v1/jobs"


def test_dashboard_page_carries_the_servers_states(offline: TestClient) -> None:
    for page in ("/", "/jobs/abc123"):
        html = offline.get(page).text
        rendered = re.search(
            r'<script type="application/json" id="job-states">(.*?)</script>', html
        )
        assert rendered is not None, page
        states = json.loads(rendered.group(1))
        assert states == {"states": list(JobState), "terminal": sorted(TERMINAL_STATES)}
        assert "{{" not in html
        filter_options = re.findall(r"<option>([A-Z]+)</option>", html)
        assert filter_options == list(JobState)


def test_dashboard_scripts_keep_no_list_of_their_own() -> None:
    for script in Path(STATIC_DIR, "js").glob("*.js"):
        text = script.read_text()
        for state in JobState:
            assert f'"{state}"' not in text, f"{script.name} spells out {state}"


def test_api_documents_and_offers_the_same_states(offline: TestClient) -> None:
    document = offline.get("/api/v1/openapi.json").json()
    assert document["components"]["schemas"]["JobState"]["enum"] == list(JobState)
    options = offline.get("/api/v1/options").json()
    assert options["job_states"] == list(JobState)
    assert set(options["terminal_states"]) == TERMINAL_STATES


def test_store_hands_back_the_enum(offline: TestClient) -> None:
    job = offline.post(JOBS, json={"steps": 1}).json()
    store: JobStore = offline.app.state.hetsched.store  # type: ignore[attr-defined]
    record = store.get(job["id"])
    assert record is not None and record.state is JobState.PENDING and not record.terminal
    offline.post(f"{JOBS}/{job['id']}/stop")
    stopped = store.get(job["id"])
    assert stopped is not None and stopped.state is JobState.STOPPED and stopped.terminal
    assert offline.get(JOBS, params={"state": "STOPPED"}).json()["count"] == 1
