"""Property-based fuzz of the OpenAPI spec (schemathesis): nothing a client sends is a 500.

Runs against the app object in-process (ASGI), over a temporary database,
with Ray and the executor off so every operation answers quickly; the
handlers, validation and store are the real ones. Deterministic and bounded:
derandomized Hypothesis with a few dozen examples per operation.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from api.app import build_state, create_app
from api.settings import Settings

_DATA_DIR = Path(tempfile.mkdtemp(prefix="hetsched-fuzz-"))
_SETTINGS = Settings(
    data_dir=_DATA_DIR,
    start_ray=False,
    executor=False,
    api_token=None,
    db_url=None,
    cluster=None,
    ray_address=None,
)
app = create_app(_SETTINGS)
# The ASGI transport does not run the lifespan; build its state the same way.
app.state.hetsched = build_state(_SETTINGS)

schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)


@schema.parametrize()
@settings(max_examples=20, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])
