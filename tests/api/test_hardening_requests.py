"""Requests that could hurt the service: other sites, re-bound names, huge or odd bodies.

Each test is a defect found by pushing the service as a hostile web page or a
careless client would; each failed before the fix (issue 19).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from api.app import create_app
from api.core.db import make_engine
from api.core.guards import HostPolicy, hostname
from api.core.settings import DEFAULT_CLUSTER
from api.services import ClusterHandle, Profiler, dry_run
from api.store import JobStore
from scheduler.hardware.cluster import load_cluster
from scheduler.models.presets import get_preset
from tests.api.conftest import make_settings

JOBS = "/api/v1/jobs"
DATASETS = "/api/v1/datasets"
EVIL = {"origin": "http://evil.example"}


def _one_line(response: Any, prefix: str) -> str:
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and detail.startswith(prefix), detail
    return detail


def test_a_foreign_host_name_is_refused(offline: TestClient) -> None:
    """DNS rebinding: a page on evil.example re-binds its name to 127.0.0.1 and reads the
    API with ``Host: evil.example``."""
    response = offline.get(JOBS, headers={"host": "evil.example"})
    assert response.status_code == 400
    assert "'evil.example' is not a name this service answers to" in _one_line(response, "host:")
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "testserver"):
        assert offline.get(JOBS, headers={"host": host}).status_code == 200, host


def test_allowed_hosts_add_names_and_a_wildcard_bind_takes_ip_literals() -> None:
    policy = HostPolicy(bound="127.0.0.1", extra=("hetsched.lab", ".corp.example"))
    assert policy.allows("hetsched.lab") and policy.allows("gpu.corp.example")
    assert not policy.allows("evil.example") and not policy.allows("10.0.0.5")
    everywhere = HostPolicy(bound="0.0.0.0")
    assert everywhere.allows("10.0.0.5") and everywhere.allows(hostname("[fe80::1]:80"))
    assert not everywhere.allows("evil.example")
    assert make_settings(Path("x"), allowed_hosts="a.lab, b.lab").allowed_hosts == [
        "a.lab",
        "b.lab",
    ]


def test_another_site_cannot_stop_a_job_or_create_a_file(
    offline: TestClient, tmp_path: Path
) -> None:
    """A text/plain POST needs no CORS preflight; the browser still sends its Origin."""
    job = offline.post(JOBS, json={"steps": 5, "global_batch": 4}).json()
    stop = offline.post(
        f"{JOBS}/{job['id']}/stop", content=b"x", headers={**EVIL, "content-type": "text/plain"}
    )
    assert stop.status_code == 403
    _one_line(stop, "origin: a cross-site request from 'http://evil.example'")
    upload = offline.post(DATASETS, params={"name": "evil.txt"}, content=b"hello", headers=EVIL)
    assert upload.status_code == 403 and not (tmp_path / "evil.txt").exists()
    assert offline.delete(f"{JOBS}/{job['id']}", headers={"origin": "null"}).status_code == 403
    assert offline.get(f"{JOBS}/{job['id']}").json()["state"] == "PENDING"
    # The dashboard, served from this origin, still stops jobs.
    same = offline.post(f"{JOBS}/{job['id']}/stop", headers={"origin": "http://testserver"})
    assert same.status_code == 200 and same.json()["state"] == "STOPPED"


def test_a_json_route_takes_only_json(offline: TestClient) -> None:
    for headers in ({"content-type": "text/plain"}, {"content-type": ""}):
        response = offline.post(JOBS, content=b'{"steps": 2}', headers=headers)
        assert response.status_code == 415, headers
        _one_line(response, "content-type:")
    assert offline.get(JOBS).json()["count"] == 0
    charset = {"content-type": "application/json; charset=utf-8"}
    assert offline.post(JOBS, content=b'{"steps": 2}', headers=charset).status_code == 201


def test_a_json_body_over_the_limit_is_413(app_client: Callable[..., TestClient]) -> None:
    with app_client(max_json_bytes=4096) as client:
        big = b'{"name": "' + b"x" * 5000 + b'"}'
        declared = client.post(JOBS, content=big, headers={"content-type": "application/json"})
        assert declared.status_code == 413
        _one_line(declared, "body: 5,012 bytes exceed the JSON limit of 4,096 bytes")
        streamed = client.post(  # chunked: no Content-Length to refuse it by
            JOBS,
            content=iter([big[:3000], big[3000:]]),
            headers={"content-type": "application/json"},
        )
        assert streamed.status_code == 413
        _one_line(streamed, "body: more than the JSON limit")


def _call(app: Any, scope: dict[str, Any]) -> tuple[int, int]:
    """One raw ASGI request with a long body: (status, body messages read)."""
    reads = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1  # 64 KiB a read, ending after 6.4 MB so an unguarded app finishes
        return {"type": "http.request", "body": b"[" * 65536, "more_body": reads < 100}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], reads


def test_an_anonymous_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """With a token set, a 300 MB body without credentials was read and parsed first."""
    app = create_app(make_settings(tmp_path, api_token="s3cret", start_ray=False, executor=False))
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", b"application/json"),
        (b"content-length", str(300 << 20).encode()),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": JOBS,
        "raw_path": JOBS.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    assert _call(app, scope) == (401, 0)
    wrong = {**scope, "headers": [*headers, (b"authorization", b"Bearer nope")]}
    assert _call(app, wrong) == (401, 0)
    right = {**scope, "headers": [*headers, (b"authorization", b"Bearer s3cret")]}
    assert _call(app, right) == (413, 0)  # the declared size alone refuses it


def test_a_bad_model_reference_is_a_422_naming_the_field(offline: TestClient) -> None:
    """A NUL byte or a name longer than a directory entry reached the file system (500)."""
    for path in ("/api/v1/plans", JOBS):
        for model in ("hf:a\x00b", "hf:" + "a" * 300, "gpt\x00tiny"):
            response = offline.post(path, json={"model": model})
            assert response.status_code == 422, (path, model)
            detail = _one_line(response, "model:")
            assert "control characters" in detail or "at most 255 characters" in detail


def test_a_deeply_nested_json_upload_is_a_422(offline: TestClient) -> None:
    """json's decoder raised RecursionError (500) on a sidecar or tokenizer of deep lists."""
    nested = b"[" * 100_000 + b"]" * 100_000
    for name in ("deep.bin.json", "deep.tokenizer.json"):
        response = offline.post(DATASETS, params={"name": name}, content=nested)
        assert response.status_code == 422
        _one_line(response, f"{name}: JSON nested too deeply")


class _SlowDevices(Profiler):
    """The real profiler, its measurement held until the test lets it finish."""

    def __init__(self, release: threading.Event, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = release

    def measure(self, model: Any, device_ids: list[str], *, refresh: bool = False) -> Any:
        assert self.release.wait(30)
        cluster = self.handle.cluster
        assert cluster is not None
        from scheduler.cost.profile import analytic_profile

        profile = analytic_profile(cluster.subset(device_ids), model, simulated=True)
        self.store.save_profile(
            key="k",
            model=model.name,
            cluster=cluster.name,
            source="measured",
            profile=profile.to_dict(),
        )
        return profile


def test_a_first_dry_run_answers_from_the_catalogue_while_the_devices_are_measured(
    tmp_path: Path,
) -> None:
    """``POST /plans`` measured inside the request (over 10 s for a new model)."""
    cluster = load_cluster(DEFAULT_CLUSTER)
    handle = ClusterHandle(cluster=cluster, available=True)
    store = JobStore(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    release = threading.Event()
    profiler = _SlowDevices(release, store=store, handle=handle, cache_dir=tmp_path)
    ask = dict(
        handle=handle,
        profiler=profiler,
        model=get_preset("gpt-tiny"),
        device_ids=list(cluster.ids),
        global_batch=32,
        strategy="dp",
        busy=set(),
    )
    plan, source = dry_run(**ask)  # returns while the measurement waits
    assert source == "analytic"
    assert "being measured now, ask again" in plan.notes[-1]
    release.set()
    assert profiler._background is not None
    profiler._background.join(30)
    plan, source = dry_run(**ask)
    assert source == "measured" and not any("catalogue" in n for n in plan.notes)
    store.engine.dispose()
