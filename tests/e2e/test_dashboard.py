"""The dashboard in a real headless Chromium, against the real control plane.

Starts ``hetsched serve`` (embedded default: local Ray running the bundled
simulated cluster, SQLite in a temporary data directory) on a free port,
drives Debian's Chromium through Playwright, submits a job from the form,
and watches the job page follow it to SUCCEEDED with its charts drawn, all
without reloading the page. Every request the page makes must go to the
control plane itself: the dashboard works with no internet access.

Screenshots land in ``tests/e2e/artifacts/`` (git-ignored). Chromium is
``/usr/bin/chromium`` or ``$HETSCHED_CHROMIUM``; when it is missing the test
fails and says so, it does not skip.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serving

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = Path(os.environ.get("HETSCHED_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
STEPS = 8
GLOBAL_BATCH = 16
# Two of the four simulated GPUs, on different nodes, ticked in the form: profiling
# paces every device to its GPU, so leaving out the slowest (T4) halves it, and
# fewer actors start faster on a small machine.
DEVICES = ("node-a/0", "node-b/0")
# About 60 s end to end on an idle 2-core machine; the limit leaves room for a
# machine shared with other work, and a broken dashboard fails long before it.
JOB_DONE_MS = 180_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``hetsched serve`` in a subprocess; yields its base URL once the cluster is up."""
    with serving(tmp_path_factory.mktemp("hetsched-data"), "--num-cpus", "2") as service:
        yield service.url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.is_file():
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: install Debian's chromium package "
            "(apt-get install chromium) or set HETSCHED_CHROMIUM; the browser test "
            "does not download browsers"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def test_submit_from_the_form_and_watch_the_job_finish(browser: Any, server: str) -> None:
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page_errors: list[str] = []
    foreign: list[str] = []
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    page.on("console", lambda msg: page_errors.append(msg.text) if msg.type == "error" else None)
    page.on("request", lambda req: None if req.url.startswith(server) else foreign.append(req.url))

    # The overview: every simulated device of the bundled cluster, the form's choices.
    page.goto(f"{server}/")
    expect(page.locator("#cluster-table tbody tr[data-device]")).to_have_count(4)
    expect(page.locator("#cluster-table")).to_contain_text("A100-80GB")
    expect(page.locator("#f-model option[value='gpt-tiny']")).to_have_count(1)

    # A bad value: the API's 422 shows as one line next to the form; no navigation.
    page.fill("#f-name", "e2e-dashboard")
    page.select_option("#f-model", "gpt-tiny")
    page.select_option("#f-strategy", "dp")
    page.fill("#f-global-batch", "0")
    page.fill("#f-steps", str(STEPS))
    page.click("#submit-btn")
    error = page.locator("#form-error")
    expect(error).to_contain_text("global_batch")
    assert "\n" not in error.inner_text().strip()
    assert page.url == f"{server}/"

    # A good job: the page moves to the job and follows it live.
    page.fill("#f-global-batch", str(GLOBAL_BATCH))
    for device in DEVICES:
        page.check(f"#f-devices input[value='{device}']")
    page.click("#submit-btn")
    page.wait_for_url(re.compile(r".*/jobs/[^/]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("#job-name")).to_have_text("e2e-dashboard")
    # The job profiles its devices first, so its charts start empty ...
    expect(page.locator("#loss-chart")).to_have_attribute("data-points", "0")
    # ... and fill in as steps come, on the same page: record every redraw.
    page.evaluate("""() => {
        window.__points = [];
        const chart = document.getElementById("loss-chart");
        new MutationObserver(() => window.__points.push(Number(chart.dataset.points)))
            .observe(chart, {attributes: true, attributeFilter: ["data-points"]});
    }""")
    expect(page.locator("#job-state")).to_have_text("SUCCEEDED", timeout=JOB_DONE_MS)
    drawn = page.evaluate("window.__points")  # undefined if the page had reloaded
    assert drawn and drawn[-1] == STEPS and drawn == sorted(drawn), drawn

    # The page agrees with the API.
    job = httpx.get(f"{server}/api/v1/jobs/{job_id}", timeout=5).json()
    metrics = httpx.get(f"{server}/api/v1/jobs/{job_id}/metrics", timeout=5).json()
    assert job["state"] == "SUCCEEDED" and job["steps_done"] == STEPS
    assert sorted(job["spec"]["devices"]) == sorted(DEVICES)
    assert {d["id"] for d in job["plan"]["devices"]} <= set(DEVICES)
    assert metrics["count"] == STEPS
    expect(page.locator("#job-progress .progress-label")).to_contain_text(
        f"{STEPS} / {STEPS} steps"
    )

    # Loss and throughput charts: one point per step.
    for chart in ("#loss-chart", "#throughput-chart"):
        expect(page.locator(chart)).to_have_attribute("data-points", str(STEPS))
        expect(page.locator(f"{chart} circle.point")).to_have_count(STEPS)
        assert page.locator(f"{chart} path.series").get_attribute("d").count("L") == STEPS - 1

    # The plan: one row per planned device, samples adding up to the global batch.
    rows = page.locator("#plan-view tbody tr[data-device]")
    assert rows.count() == len(job["plan"]["devices"]) >= 1
    samples = [int(t) for t in page.locator("#plan-view tbody td:nth-child(4)").all_inner_texts()]
    assert sum(samples) == GLOBAL_BATCH
    assert page.locator("#plan-view .share-micro").count() >= 1
    expect(page.locator("#t-measured")).not_to_have_text("–")
    expect(page.locator("#t-even")).not_to_have_text("–")
    expect(page.locator("#steptime-view .hbar")).not_to_have_count(0)
    expect(page.locator("#device-time-view .hbar")).not_to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "dashboard-job.png"), full_page=True)

    # Back on the overview, the job is listed as finished.
    page.click("a.back")
    row = page.locator(f"#jobs-table tr[data-job='{job_id}']")
    expect(row.locator(".badge")).to_have_text("SUCCEEDED")
    expect(row).to_contain_text(f"{STEPS} / {STEPS} steps")
    page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)

    assert not foreign, f"the dashboard fetched from outside the control plane: {foreign}"
    assert not [e for e in page_errors if "422" not in e], page_errors
