"""``/metrics``: Prometheus text exposition format 0.0.4, written by hand.

Names follow Prometheus' conventions (base units, ``_seconds``, ``_bytes``,
``_total`` for counters; https://prometheus.io/docs/practices/naming/).
Running jobs' figures come from the executor's memory, so a scrape costs one
small query (jobs by state) however many steps are stored.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from api.deps import StateDep
from scheduler.capacity import usable_capacity_bytes

router = APIRouter(tags=["metrics"])

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            rendered = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(
                f"{name}{{{rendered}}} {value:.9g}" if rendered else f"{name} {value:.9g}"
            )

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@router.get(
    "/metrics", response_class=PlainTextResponse, responses={200: {"content": {"text/plain": {}}}}
)
def metrics(state: StateDep) -> PlainTextResponse:
    out = _Exposition()
    counts = state.store.count_by_state()
    out.family(
        "hetsched_jobs",
        "gauge",
        "Jobs by state.",
        [({"state": s}, float(n)) for s, n in sorted(counts.items())],
    )
    out.family(
        "hetsched_cluster_available",
        "gauge",
        "1 when the Ray cluster is reachable.",
        [({}, 1.0 if state.handle.available else 0.0)],
    )
    cluster = state.handle.cluster
    live = state.executor.live() if state.executor else []
    device_live: dict[str, tuple[str, float, int]] = {}
    for job in live:
        for device_id, (busy_s, _wait_s, peak) in job.device_steps.items():
            ratio = min(1.0, busy_s / job.step_s) if job.step_s else 0.0
            device_live[device_id] = (job.job_id, ratio, peak)
    if cluster is not None:
        labels = [{"device": d.id, "node": d.node, "type": d.type} for d in cluster.devices]
        out.family(
            "hetsched_device_busy_ratio",
            "gauge",
            "Share of the latest step the device spent computing (0 when idle).",
            [(lab, device_live.get(lab["device"], ("", 0.0, 0))[1]) for lab in labels],
        )
        out.family(
            "hetsched_device_memory_bytes",
            "gauge",
            "Peak memory of the device in the latest step (0 when idle).",
            [(lab, float(device_live.get(lab["device"], ("", 0.0, 0))[2])) for lab in labels],
        )
        out.family(
            "hetsched_device_memory_capacity_bytes",
            "gauge",
            "Memory the device offers (scaled for simulated devices).",
            [
                (
                    lab,
                    float(
                        usable_capacity_bytes(
                            d.memory_bytes,
                            simulated=state.handle.simulated,
                            memory_scale=cluster.simulation.memory_scale,
                        )
                    ),
                )
                for lab, d in zip(labels, cluster.devices, strict=True)
            ],
        )
    out.family(
        "hetsched_job_samples_per_second",
        "gauge",
        "Throughput of each running job's latest step.",
        [({"job": j.job_id}, j.samples_per_s) for j in live if j.samples_per_s],
    )
    out.family(
        "hetsched_job_step_seconds",
        "gauge",
        "Duration of each running job's latest step.",
        [({"job": j.job_id}, j.step_s) for j in live if j.step_s],
    )
    out.family(
        "hetsched_job_steps_total",
        "counter",
        "Steps each running job has completed.",
        [({"job": j.job_id}, float(j.steps_done)) for j in live],
    )
    return PlainTextResponse(out.text(), media_type=CONTENT_TYPE)
