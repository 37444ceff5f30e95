"""The API docs work without internet access: every asset comes from the service itself."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

# src="…", href="…" and the OpenAPI document's url: '…' in the page's script
URL = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|\burl:\s*["']([^"']+)["']""")


def _urls(html: str) -> list[str]:
    return [a or b for a, b in URL.findall(html)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_page_loads_only_same_origin_assets(offline: TestClient, page: str) -> None:
    response = offline.get(page)
    assert response.status_code == 200
    html = response.text
    urls = _urls(html)
    assert any(u.endswith(".js") for u in urls), urls  # the page does load a script
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), f"{page} loads {url}"
        assert offline.get(url).status_code == 200, f"{page} needs {url}, which is missing"


def test_swagger_ui_asset_is_the_real_bundle(offline: TestClient) -> None:
    html = offline.get("/docs").text
    script = next(u for u in _urls(html) if u.endswith("swagger-ui-bundle.js"))
    body = offline.get(script)
    assert body.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert "SwaggerUIBundle" in body.text
    assert '"validatorUrl": null' in html  # no badge fetched from validator.swagger.io
