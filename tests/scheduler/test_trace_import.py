"""Public traces as hetsched traces: every job keeps its duration on its original GPUs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.clustersim.imports import (
    GAVEL_GPU,
    SIA_GPU,
    OriginalJob,
    TraceFormat,
    convert,
    load_any,
    original_duration_s,
    parse_gavel,
    parse_sia,
    reference_config,
)
from scheduler.clustersim.simulator import check_runnable, simulate
from scheduler.clustersim.trace import TraceError
from scheduler.hardware.cluster import load_cluster, parse_cluster
from scheduler.policy.rates import PlannedRates

PUBLIC = Path(__file__).resolve().parents[2] / "deploy" / "traces" / "public"
EXCERPTS: list[tuple[str, TraceFormat, str]] = [
    ("gavel-max-min-fairness.trace", "gavel", "gavel-physical-48.yaml"),
    ("sia-philly-workload-1.csv", "sia", "../../clusters/hetero-64.yaml"),
    ("sia-helios-saturn-workload-1.csv", "sia", "../../clusters/hetero-64.yaml"),
    ("sia-newtrace-workload-1.csv", "sia", "../../clusters/hetero-64.yaml"),
]


def _originals(name: str, fmt: TraceFormat) -> list[OriginalJob]:
    text = (PUBLIC / name).read_text()
    return parse_gavel(text) if fmt == "gavel" else parse_sia(text)


@pytest.mark.parametrize(("name", "fmt", "cluster"), EXCERPTS)
def test_every_excerpt_job_keeps_its_duration_and_runs_on_its_cluster(
    name: str, fmt: TraceFormat, cluster: str
) -> None:
    rates = PlannedRates()
    originals = _originals(name, fmt)
    jobs = {j.name: j for j in load_any(PUBLIC / name, fmt)}
    assert len(jobs) == len(originals) >= 48
    for o in originals:
        job = jobs[o.name]
        back_s = original_duration_s(job, o.gpu_type, rates)
        step_s = back_s / job.steps
        assert abs(back_s - o.duration_s) <= 0.5 * step_s + 1e-6, o.name
        if job.steps >= 50:  # half a step is then at most 1%
            assert back_s == pytest.approx(o.duration_s, rel=0.01), o.name
        assert job.max_devices == o.num_devices and job.arrival_s == pytest.approx(o.arrival_s)
        assert job.min_devices == (o.num_devices if fmt == "gavel" else 1)
    spec = load_cluster(PUBLIC / cluster)
    check_runnable(spec, list(jobs.values()), PlannedRates.for_cluster(spec))


@pytest.mark.parametrize(
    ("gpu_type", "num_devices", "duration_s"),
    [(GAVEL_GPU, 4, 5400.0), (SIA_GPU, 12, 3 * 3600.0), (SIA_GPU, 1, 900.0)],
)
def test_a_converted_job_replayed_alone_on_its_original_gpus_takes_its_duration(
    gpu_type: str, num_devices: int, duration_s: float
) -> None:
    """The round trip through the simulator itself: one job, its original GPUs (two
    nodes for 12), rigid; its completion time is the source's duration."""
    original = OriginalJob(
        name="j",
        arrival_s=0,
        duration_s=duration_s,
        num_devices=num_devices,
        gpu_type=gpu_type,
        rigid=True,
    )
    job = convert(original, PlannedRates())
    nodes = [
        {"name": f"n{i}", "devices": [{"type": gpu_type, "count": min(8, num_devices - 8 * i)}]}
        for i in range((num_devices + 7) // 8)
    ]
    cluster = parse_cluster({"name": "original", "nodes": nodes})
    (result,) = simulate(cluster, [job], policy="goodput").jobs
    assert result.jct_s == pytest.approx(duration_s, rel=0.01)
    assert reference_config(gpu_type, num_devices).multi_node == (num_devices > 8)


def test_size_class_picks_the_model_and_falls_back_to_what_fits() -> None:
    rates = PlannedRates()

    def model(gpu_hours: float, gpu_type: str = GAVEL_GPU) -> str:
        job = OriginalJob(
            name="j", arrival_s=0, duration_s=gpu_hours * 3600, num_devices=1, gpu_type=gpu_type
        )
        return convert(job, rates).model

    assert [model(h) for h in (0.5, 5, 50)] == ["gpt2-small", "gpt2-medium", "gpt2-large"]
    assert model(500) == "gpt2-large", "gpt2-xl does not fit a V100-16GB: the next size down"
    assert model(50, SIA_GPU) == "gpt2-medium", "nor gpt2-large an RTX 2080 Ti"


@pytest.mark.parametrize(
    ("fmt", "text", "message"),
    [
        ("gavel", "A3C\tx\n", "gavel trace line 1: 2 tab-separated fields, a Gavel job has 10"),
        (
            "gavel",
            "CycleGAN\tc\td\t--n\t1\t100\t1\t1\t-1\t0\n",
            "gavel trace line 1, job type: 'CycleGAN' has no V100 throughput here",
        ),
        (
            "gavel",
            "LM (batch size 40)\tc\td\t--n\t1\t100\t0\t1\t-1\t0\n",
            "gavel trace line 1, scale factor: must be an integer >= 1, got '0'",
        ),
        (
            "sia",
            "name,time,application,num_replicas\na,0,resnet,2\n",
            "sia trace row 2, column application: unknown 'resnet'",
        ),
        ("sia", "name,time,application\n", "sia trace row 1: column num_replicas is missing"),
        (
            "sia",
            "name,time,application,num_replicas\na,soon,bert,2\n",
            "sia trace row 2, column time: must be a number >= 0, got 'soon'",
        ),
    ],
)
def test_bad_public_traces_are_one_line_errors(
    fmt: TraceFormat, text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    path.write_text(text)
    with pytest.raises(TraceError) as info:
        load_any(path, fmt)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_sia_rigid_category_keeps_the_gpu_count() -> None:
    text = "name,time,application,num_replicas,batch_size,category\na,0,bert,4,384,rigid\n"
    (job,) = parse_sia(text)
    assert job.rigid
    converted = convert(replace(job), PlannedRates())
    assert converted.min_devices == converted.max_devices == 4
