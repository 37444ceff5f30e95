"""Property-based fuzz of the OpenAPI document (schemathesis), with every check it has.

Not only "no 5xx": responses must match their documented schemas and status
codes, schema-valid requests must be accepted, invalid ones rejected, the
security the document declares must be enforced (and none declared when
the service needs none), and ``Allow`` must list the path's methods. Run
twice: without ``HETSCHED_API_TOKEN`` (the document declares no security)
and with one (mutating calls must refuse missing or wrong tokens).

In-process (ASGI) over a temporary database, with Ray and the executor off
so every operation answers quickly; handlers, validation and store are the
real ones. Deterministic and bounded: derandomized Hypothesis with a few
examples per operation. The live equivalent:

    schemathesis run --checks all http://127.0.0.1:8000/api/v1/openapi.json
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, reject, settings
from schemathesis.checks import CHECKS, load_all_checks

from api.app import build_state, create_app
from tests.api.conftest import make_settings

TOKEN = "fuzz-token"
load_all_checks()
ALL_CHECKS = CHECKS.get_all()


def _schema(token: str | None) -> Any:
    data_dir = Path(tempfile.mkdtemp(prefix="hetsched-fuzz-"))
    # Built at import, outside any fixture: removed when the test process exits.
    atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
    settings = make_settings(data_dir, start_ray=False, executor=False, api_token=token)
    app = create_app(settings)
    # The ASGI transport does not run the lifespan; build its state the same way.
    app.state.hetsched = build_state(settings)
    return schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)


open_schema = _schema(None)
token_schema = _schema(TOKEN)


MAX_FUZZ_GLOBAL_BATCH = 4096
"""The hybrid planner's time grows with the global batch (about 5 s at 100,000 on a
2-core machine, over schemathesis' 10 s timeout under load); that is the planner's
cost, reported separately, not the contract this test checks."""


def _skip_unstated_rule(case: schemathesis.Case) -> None:
    """``d_model % num_heads == 0`` (and ``num_heads % num_kv_heads == 0``) is documented
    in words; JSON Schema cannot divide, so a generated model that breaks it is not a
    schema-valid request. Nor can it compare two fields: ``min_devices <= max_devices``
    and no more than ``devices``."""
    body = case.body if isinstance(case.body, dict) else {}
    least, most, named = body.get("min_devices"), body.get("max_devices"), body.get("devices")
    if isinstance(least, int | float) and isinstance(most, int | float) and least > most:
        reject()
    if isinstance(least, int | float) and isinstance(named, list) and least > len(named):
        reject()
    batch = body.get("global_batch")
    if isinstance(batch, int | float) and batch > MAX_FUZZ_GLOBAL_BATCH:
        reject()
    model = body.get("model")
    if isinstance(model, dict):
        heads, d_model = model.get("num_heads"), model.get("d_model")
        numbers = isinstance(heads, int | float) and isinstance(d_model, int | float)
        if numbers and heads and d_model % heads:  # JSON's 110.0 is an integer too
            reject()
        kv = model.get("num_kv_heads")  # num_heads a multiple of it; gpt: equal or 0
        kv_numbers = isinstance(kv, int | float) and kv and isinstance(heads, int | float)
        if kv_numbers and (heads % kv or (model.get("family", "gpt") == "gpt" and kv != heads)):
            reject()


def _checks(case: schemathesis.Case) -> list[Any]:
    """Every check; but no schema can say that an uploaded file holds what its name says
    (a sidecar's JSON, token ids), so an upload's content may be refused though the
    request is schema-valid: only uploads of non-empty text must be accepted."""
    if case.method.upper() == "POST" and case.path.endswith("/datasets"):
        name = (case.query or {}).get("name", "")
        if not (isinstance(name, str) and name.endswith(".txt") and case.body):
            return [c for c in ALL_CHECKS if c.__name__ != "positive_data_acceptance"]
    return list(ALL_CHECKS)


FUZZ = settings(
    max_examples=10, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
)


@open_schema.parametrize()
@FUZZ
def test_contract_without_token(case: schemathesis.Case) -> None:
    _skip_unstated_rule(case)
    case.call_and_validate(checks=_checks(case))


@token_schema.parametrize()
@FUZZ
def test_contract_with_token(case: schemathesis.Case) -> None:
    _skip_unstated_rule(case)
    case.call_and_validate(checks=_checks(case), headers={"Authorization": f"Bearer {TOKEN}"})


def test_document_declares_auth_only_with_a_token() -> None:
    """Without a token no operation is secured; with one, every one but the cluster's, the
    profiles', the options' and the health check (reads of jobs need a token too)."""

    def secured(schema: Any) -> set[str]:
        document = schema.raw_schema
        return {
            f"{method.upper()} {path}"
            for path, operations in document["paths"].items()
            for method, operation in operations.items()
            if operation.get("security")
        }

    assert secured(open_schema) == set()
    assert "securitySchemes" not in open_schema.raw_schema.get("components", {})
    assert secured(token_schema) == {
        "POST /api/v1/cluster/profile",
        "POST /api/v1/plans",
        "POST /api/v1/jobs",
        "POST /api/v1/jobs/{job_id}/stop",
        "DELETE /api/v1/jobs/{job_id}",
        "POST /api/v1/cluster/devices/{device_id}/fail",
        "POST /api/v1/cluster/devices/{device_id}/slowdown",
        "POST /api/v1/cluster/devices/{device_id}/restore",
        "POST /api/v1/datasets",
        "DELETE /api/v1/datasets/{name}",
        "GET /api/v1/audit",
        "GET /api/v1/datasets",
        "GET /api/v1/jobs",
        "GET /api/v1/jobs/{job_id}",
        "GET /api/v1/jobs/{job_id}/checkpoints",
        "GET /api/v1/jobs/{job_id}/checkpoints/{step}",
        "GET /api/v1/jobs/{job_id}/logs",
        "GET /api/v1/jobs/{job_id}/metrics",
        "GET /api/v1/schedule",
        "GET /api/v1/users",
        "GET /api/v1/users/me",
        "POST /api/v1/users",
        "POST /api/v1/users/{name}/revoke",
        "GET /api/v1/projects",
        "POST /api/v1/projects",
        "PATCH /api/v1/projects/{name}",
    }
