"""Control-plane settings: one ``BaseSettings``, read from ``HETSCHED_*`` variables.

Built in ``hetsched serve`` (flags override the environment) or by a test,
and handed to :func:`api.app.create_app`; nothing here runs at import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from api.core.clusters import bundled_cluster
from scheduler.policy.types import DEFAULT_POLICY, PolicyName

DEFAULT_CLUSTER = bundled_cluster("local-sim.yaml")
API_PREFIX = "/api/v1"
"""Where the REST API is mounted."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HETSCHED_", extra="ignore")

    data_dir: Path = Path(".hetsched")
    """Holds the SQLite database, the profile cache and datasets jobs may name."""
    db_url: str | None = None
    """Any SQLAlchemy URL; default ``sqlite:///<data_dir>/hetsched.db``."""
    cache_dir: Path | None = None
    """Profile and host-calibration cache; default ``<data_dir>/cache``."""
    cluster: Path | None = None
    """Cluster spec to simulate locally; default the bundled local-sim.yaml."""
    ray_address: str | None = None
    """Attach to this Ray cluster (real GPUs) instead of starting a local simulation."""
    start_ray: bool = True
    """Start local Ray for the simulated cluster. Off: the cluster is reported unavailable."""
    ray_num_cpus: int = Field(default=2, ge=1)
    """CPUs the embedded local Ray may use."""
    executor: bool = True
    """Run queued jobs. Off: jobs are stored but stay PENDING (API-only tests)."""
    max_upload_bytes: int = Field(default=1 << 30, ge=1)
    """Largest dataset file ``POST /api/v1/datasets`` accepts (default 1 GiB)."""
    api_token: SecretStr | None = None
    """The admin's token. Once it or any user's token (``hetsched users add``) exists,
    every call but the cluster's, the options' and the health check needs a token."""
    open_reads: bool = False
    """Let reads (jobs, specs, logs, metrics, checkpoints, the schedule) through without a
    token although tokens are configured: for a demo, never for a shared cluster."""
    identity_header: str | None = Field(default=None, min_length=1, max_length=64)
    """Trust this request header (``X-Forwarded-User``, say) as the name of the user an
    authenticating reverse proxy let in. Off by default; turn it on only behind a proxy
    that sets it on every request and strips it from what clients send."""
    checkpoint_uri: str | None = None
    """Where jobs' checkpoints go: a directory, or an fsspec URI every Ray node can
    reach (shared storage on a multi-node cluster); default ``<data_dir>/checkpoints``."""
    replan: bool = True
    """Jobs follow a device's speed change by re-planning, unless their spec says no."""
    policy: PolicyName = DEFAULT_POLICY
    """Which devices each job holds (:mod:`scheduler.policy.decide`): ``fifo`` (arrival order,
    a job takes what it asks for, the whole cluster by default), ``fair`` or ``goodput``."""
    round_s: float = Field(default=30.0, gt=0, le=86400)
    """Seconds between scheduling rounds besides those on submit, completion and stop."""
    reallocation_s: float = Field(default=30.0, ge=0, le=86400)
    """What the policy charges a running job's move (checkpoint, restart, re-plan)."""
    db_retry_s: float = Field(default=300.0, ge=0, le=86400)
    """How long a write to the job store is retried, with back-off, while the database is
    locked or unreachable, before the job it was for fails (its final state is retried
    until it lands)."""
    db_busy_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """SQLite: how long one attempt waits for another connection's lock to go."""
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    allowed_hosts: Annotated[list[str], NoDecode] = []
    """Host names the service answers to besides loopback names and ``host`` (and, bound
    to every interface, IP addresses and this machine's name): comma-separated in
    ``HETSCHED_ALLOWED_HOSTS``; ``.example.com`` allows it and its subdomains, ``*`` any.
    Other ``Host`` headers are refused, so a re-bound DNS name cannot reach the API."""
    max_json_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest JSON request body (default 1 MiB; a job spec is a few hundred bytes)."""

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @property
    def database_url(self) -> str:
        if self.db_url:
            return self.db_url
        return f"sqlite:///{(self.data_dir / 'hetsched.db').resolve()}"

    @property
    def cluster_file(self) -> Path:
        return self.cluster if self.cluster is not None else DEFAULT_CLUSTER

    @property
    def profile_cache_dir(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.data_dir / "cache"

    @property
    def checkpoint_root(self) -> str:
        if self.checkpoint_uri:
            return self.checkpoint_uri.rstrip("/")
        return str((self.data_dir / "checkpoints").resolve())

    def job_checkpoints(self, job_id: str) -> str:
        """Where job ``job_id``'s checkpoints are (a path or fsspec URI); the one place
        that says so, for the job runner that writes them and ``hetsched export``."""
        return f"{self.checkpoint_root}/{job_id}"

    @property
    def token(self) -> str | None:
        if self.api_token is None or not self.api_token.get_secret_value():
            return None
        return self.api_token.get_secret_value()
