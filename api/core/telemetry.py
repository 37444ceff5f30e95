"""What the service counts as it runs, for ``/metrics``: counters that only go up.

A Prometheus counter must never fall while its series lives (``rate()`` and
``increase()`` read a fall as a restart of the process:
https://prometheus.io/docs/concepts/metric_types/#counter). Figures derived from
database rows fell when a job was deleted, and a job's step count fell when it
resumed from a checkpoint; so every counter and histogram here is incremented
by the service itself, once per thing that happened in this process, and starts
from zero with the process, as Prometheus expects.

One :class:`Telemetry` per app (built in ``create_app``, on its own registry);
the job runner tells it of each step, checkpoint, recovery and event, and the
HTTP middleware of each request.
"""

from __future__ import annotations

import functools
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STEP_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Step times from a tiny simulated model (tens of ms) to a large one on slow GPUs."""
SLOW_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Checkpoints, recoveries and queue waits: seconds to half an hour."""
HTTP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
EVENT_KINDS = ("recovery", "replan", "restart", "allocation")


class Telemetry:
    """The service's own counters, gauges and histograms, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        job = ["job_id"]  # not "job": Prometheus' own target label
        self.steps = Counter(
            "hetsched_job_steps",
            "Training steps this service ran, per job (a step run again after a recovery "
            "counts again).",
            job,
            registry=registry,
        )
        self.step_seconds = Histogram(
            "hetsched_job_step_duration_seconds",
            "Duration of every training step, per job.",
            job,
            buckets=STEP_BUCKETS_S,
            registry=registry,
        )
        self.loss = Gauge(
            "hetsched_job_loss", "Mean token loss of the job's latest step.", job, registry=registry
        )
        self.val_loss = Gauge(
            "hetsched_job_validation_loss",
            "Mean token loss on the held-out split at the job's latest evaluation.",
            job,
            registry=registry,
        )
        self.events = Counter(
            "hetsched_job_events",
            "What changed jobs' plans or devices: recoveries, re-plans, restarts, allocations.",
            ["kind"],
            registry=registry,
        )
        for kind in EVENT_KINDS:
            self.events.labels(kind)
        slow = functools.partial(Histogram, buckets=SLOW_BUCKETS_S, registry=registry)
        self.checkpoint_seconds = slow(
            "hetsched_checkpoint_duration_seconds",
            "From the end of a step to its checkpoint being complete.",
        )
        self.recovery_seconds = slow(
            "hetsched_recovery_duration_seconds",
            "From noticing a failure to the end of the first step after it.",
        )
        self.queue_wait_seconds = slow(
            "hetsched_queue_wait_seconds", "From a job's submission to its first start."
        )
        self.http_requests = Counter(
            "hetsched_http_requests",
            "HTTP requests answered, by method, route template and status code.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.http_seconds = Histogram(
            "hetsched_http_request_duration_seconds",
            "Time to answer an HTTP request, by method and route template.",
            ["method", "route"],
            buckets=HTTP_BUCKETS_S,
            registry=registry,
        )

    def step(self, job_id: str, *, step_s: float, loss: float, val_loss: float | None) -> None:
        self.steps.labels(job_id).inc()
        self.step_seconds.labels(job_id).observe(step_s)
        self.loss.labels(job_id).set(loss)
        if val_loss is not None:
            self.val_loss.labels(job_id).set(val_loss)

    def event(self, kind: str) -> None:
        self.events.labels(kind).inc()


ROUTE_KEY = "hetsched.route"
"""Where a middleware that answers before routing (:class:`api.routes.jobs.JobPolls`) puts
the template of the route it answered for."""


def route_of(scope: Scope) -> str:
    """The matched route's template (``/api/v1/jobs/{job_id}``), so that the label takes
    as many values as there are routes; ``unmatched`` for every other path.

    FastAPI keeps an included router's route with its own prefix only; the full
    template is its ``effective_route_context``'s; a middleware that answers before
    routing names its route in ``scope[ROUTE_KEY]``."""
    if isinstance(answered := scope.get(ROUTE_KEY), str):
        return answered
    fastapi = scope.get("fastapi")
    effective = fastapi.get("effective_route_context") if isinstance(fastapi, dict) else None
    for source in (effective, scope.get("route")):
        path = getattr(source, "path", None)
        if isinstance(path, str):
            return path
    return "unmatched"


class HttpMetrics:
    """ASGI middleware: counts and times each HTTP request into :class:`Telemetry`."""

    def __init__(self, app: ASGIApp, *, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client sees when the app raises before answering

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            route, method = route_of(scope), scope["method"]
            self.telemetry.http_requests.labels(method, route, str(status)).inc()
            self.telemetry.http_seconds.labels(method, route).observe(time.perf_counter() - start)
