"""The API docs (Swagger UI at ``/docs``, ReDoc at ``/redoc``), served offline.

FastAPI's built-in pages load their scripts and styles from a CDN, so on an
air-gapped GPU cluster the dashboard's "API docs" link showed a blank page.
Here both pages take their assets from ``/static/docs``, the Swagger UI and
ReDoc builds shipped by the ``fastapi-offline`` package (MIT; Swagger UI 5,
which renders OpenAPI 3.1), and nothing else: Swagger UI's online validator
badge is off and ReDoc does not fetch Google Fonts.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS_URL = "/static/docs"
FAVICON_URL = "/static/favicon.svg"


def assets_dir() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


def add_docs(app: FastAPI, *, openapi_url: str) -> None:
    """``/docs`` and ``/redoc`` with assets from this server; call before mounting ``/static``."""
    router = APIRouter(include_in_schema=False)

    @router.get("/docs")
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=FAVICON_URL,
            swagger_ui_parameters={"validatorUrl": None},
        )

    @router.get("/redoc")
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=FAVICON_URL,
            with_google_fonts=False,
        )

    app.include_router(router)
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
