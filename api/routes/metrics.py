"""``/metrics``: Prometheus exposition through ``prometheus_client``.

Each app has its own :class:`~prometheus_client.CollectorRegistry` (built in
``create_app``, never a module-level global). Names follow Prometheus' conventions
(base units, ``_total`` for counters; https://prometheus.io/docs/practices/naming/)
and are stable: dashboards and alerts use them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from api.deps import AppState
from api.execution.ledger import LiveJob
from api.states import JobState
from scheduler.hardware.capacity import usable_capacity_bytes

router = APIRouter(tags=["metrics"])
DEVICE_LABELS = ["device", "node", "type"]


class LiveCollector(Collector):
    """The service's state, read when Prometheus scrapes: gauges only.

    Jobs by state and the queue (small queries), cluster availability, and each
    running job's latest step, devices and description from the executor's memory:
    a scrape costs the same however many steps are stored. Counters and histograms
    are :class:`api.core.telemetry.Telemetry`'s, counted as things happen.
    """

    def __init__(self, state: Callable[[], AppState | None]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        if state is None:  # not started yet (or already stopped)
            return
        jobs = GaugeMetricFamily("hetsched_jobs", "Jobs by state.", labels=["state"])
        counts = state.store.count_by_state()
        for job_state, count in sorted(counts.items()):
            jobs.add_metric([job_state], count)
        yield jobs
        yield GaugeMetricFamily(
            "hetsched_queue_length",
            "Jobs waiting for devices (PENDING).",
            value=counts.get(JobState.PENDING, 0),
        )
        yield GaugeMetricFamily(
            "hetsched_cluster_available",
            "1 when the Ray cluster is reachable.",
            value=1.0 if state.handle.available else 0.0,
        )
        live = state.executor.live() if state.executor else []
        yield from self._devices(state, live)
        yield from self._jobs(state, live)

    @staticmethod
    def _jobs(state: AppState, live: list[LiveJob]) -> Iterator[Metric]:
        samples_per_s = GaugeMetricFamily(
            "hetsched_job_samples_per_second",
            "Throughput of each running job's latest step.",
            labels=["job_id"],
        )
        step_s = GaugeMetricFamily(
            "hetsched_job_step_seconds",
            "Duration of each running job's latest step (every step: "
            "hetsched_job_step_duration_seconds).",
            labels=["job_id"],
        )
        info = InfoMetricFamily(
            "hetsched_job",
            "What each running job is: its name, owner, project, model and strategy.",
            labels=["job_id"],
        )
        for job in live:
            if job.samples_per_s:
                samples_per_s.add_metric([job.job_id], job.samples_per_s)
            if job.step_s:
                step_s.add_metric([job.job_id], job.step_s)
            record = state.store.get(job.job_id)
            if record is not None:
                info.add_metric(
                    [job.job_id],
                    {
                        "name": record.name,
                        "owner": record.owner,
                        "project": record.project,
                        "model": record.model_name,
                        "strategy": record.plan.strategy if record.plan else record.spec.strategy,
                    },
                )
        yield from (samples_per_s, step_s, info)

    @staticmethod
    def _devices(state: AppState, live: list[LiveJob]) -> Iterator[Metric]:
        cluster = state.handle.cluster
        if cluster is None:
            return
        latest: dict[str, tuple[float, int]] = {}  # device -> (busy ratio, peak bytes)
        for job in live:
            for device_id, (busy_s, _wait_s, peak_bytes) in job.device_steps.items():
                ratio = min(1.0, busy_s / job.step_s) if job.step_s else 0.0
                latest[device_id] = (ratio, peak_bytes)
        busy = GaugeMetricFamily(
            "hetsched_device_busy_ratio",
            "Share of the latest step the device spent computing (0 when idle).",
            labels=DEVICE_LABELS,
        )
        memory = GaugeMetricFamily(
            "hetsched_device_memory_bytes",
            "Peak memory of the device in the latest step (0 when idle).",
            labels=DEVICE_LABELS,
        )
        capacity = GaugeMetricFamily(
            "hetsched_device_memory_capacity_bytes",
            "Memory the device offers (scaled for simulated devices).",
            labels=DEVICE_LABELS,
        )
        holder = GaugeMetricFamily(
            "hetsched_device_job",
            "1 for each device and the job that holds it (join on job_id).",
            labels=[*DEVICE_LABELS, "job_id"],
        )
        held = state.executor.busy_devices() if state.executor else {}
        for d in cluster.devices:
            labels = [d.id, d.node, d.type]
            if d.id in held:
                holder.add_metric([*labels, held[d.id]], 1)
            ratio, peak_bytes = latest.get(d.id, (0.0, 0))
            busy.add_metric(labels, ratio)
            memory.add_metric(labels, peak_bytes)
            capacity.add_metric(
                labels,
                usable_capacity_bytes(
                    d.memory_bytes,
                    simulated=state.handle.simulated,
                    memory_scale=cluster.simulation.memory_scale,
                ),
            )
        yield from (busy, memory, capacity, holder)


def build_registry(state: Callable[[], AppState | None]) -> CollectorRegistry:
    """A registry of this app's own: process figures and :class:`LiveCollector`."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(LiveCollector(state))
    return registry


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def metrics(request: Request) -> Response:
    """The Prometheus text exposition format."""
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
