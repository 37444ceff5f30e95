"""The dashboard: one HTML page and its static assets, served by the app itself.

Everything the page needs (HTML, CSS, ES modules, the favicon) lives under
``api/static/`` and is served from ``/static``; nothing comes from a CDN, so
the dashboard works on an air-gapped cluster. The page is a small client-side
app that reads the REST API under ``/api/v1``; the server answers ``/`` and
``/jobs/{job_id}`` with the same HTML so a job page can be bookmarked and
reloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from api.states import TERMINAL_STATES, JobState

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
INDEX_HTML = STATIC_DIR / "index.html"

# Revalidate on every load (a 304 when unchanged) so an upgraded server never
# runs against stale scripts cached from the previous version.
NO_CACHE = {"Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False, tags=["dashboard"])


def render_page() -> str:
    """``index.html`` with the job states of api/states.py filled in: the page's scripts
    read them from there (static/js/states.js) instead of keeping their own list."""
    states = {"states": list(JobState), "terminal": sorted(TERMINAL_STATES)}
    options = "".join(f"<option>{s}</option>" for s in JobState)
    return (
        INDEX_HTML.read_text()
        .replace("{{job_states}}", json.dumps(states))
        .replace("{{job_state_options}}", options)
    )


@router.get("/")
def index() -> HTMLResponse:
    """The dashboard's overview: cluster, submit form, jobs."""
    return HTMLResponse(render_page(), headers=NO_CACHE)


@router.get("/jobs/{job_id}")
def job_page(job_id: str) -> HTMLResponse:
    """A job's page; the script reads the id from the URL and asks the API for the job."""
    return HTMLResponse(render_page(), headers=NO_CACHE)


class _RevalidatedStaticFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope):  # type: ignore[no-untyped-def]
        response = await super().get_response(path, scope)
        response.headers.update(NO_CACHE)
        return response


def mount_static(app: FastAPI) -> None:
    """Serve ``api/static/`` at ``/static`` (the dashboard's CSS, scripts and icon)."""
    app.mount("/static", _RevalidatedStaticFiles(directory=STATIC_DIR), name="static")


def add_dashboard(app: FastAPI) -> None:
    """Add the dashboard to ``app``: its page routes and its static files.

    After the API routers: its routes are outside ``/api/v1`` and hidden from the
    OpenAPI schema.
    """
    app.include_router(router)
    mount_static(app)
