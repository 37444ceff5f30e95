"""Job traces: the CSV format, its one-line errors, and the seeded generator."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.clustersim.simulator import check_runnable
from scheduler.clustersim.trace import (
    TraceError,
    TraceJob,
    generate_trace,
    load_trace,
    parse_trace,
    trace_to_csv,
)
from scheduler.hardware.cluster import load_cluster
from scheduler.policy.rates import PlannedRates

ROOT = Path(__file__).resolve().parents[2]
HEADER = "name,arrival_s,model,global_batch,steps"


def test_optional_columns_default_and_rows_sort_by_arrival() -> None:
    text = (
        f"{HEADER},priority,min_devices,max_devices\n"
        "late,60,gpt2-small,64,100,,,\n"
        "early,0,GPT2-XL,32,50,2,2,8\n"
    )
    late, early = parse_trace(text)[::-1]
    assert early == TraceJob(
        name="early",
        arrival_s=0,
        model="gpt2-xl",
        global_batch=32,
        steps=50,
        priority=2,
        min_devices=2,
        max_devices=8,
    )
    assert (late.priority, late.min_devices, late.max_devices) == (1.0, 1, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            f"{HEADER}\na,0,gpt2-small,64,0\n",
            "trace row 2, column steps: must be an integer >= 1, got '0'",
        ),
        (
            f"{HEADER}\na,0,gpt2-small,64,10\nb,soon,gpt2-small,64,10\n",
            "trace row 3, column arrival_s: must be a number >= 0, got 'soon'",
        ),
        (f"{HEADER}\na,0,gpt5,64,10\n", "trace row 2, column model: unknown preset 'gpt5'"),
        (f"{HEADER}\na,0,gpt2-small,,10\n", "trace row 2, column global_batch: required"),
        (
            f"{HEADER}\na,0,gpt2-small,64,10\na,1,gpt2-small,64,10\n",
            "trace row 3, column name: 'a' already used on row 2",
        ),
        (
            f"{HEADER},max_devices,min_devices\na,0,gpt2-small,64,10,1,2\n",
            "trace row 2, column max_devices: 1 is below min_devices 2",
        ),
        (f"{HEADER},gpus\n", "trace row 1, column gpus: unknown column"),
        ("name,arrival_s,model,steps\n", "trace row 1: column global_batch is missing"),
        (f"{HEADER}\na,0,gpt2-small,64,10,7\n", "trace row 2: 6 cells, the header has 5"),
        (f"{HEADER}\n", "trace: no jobs"),
        (
            f"{HEADER},restart_s\na,0,gpt2-small,64,10,-1\n",
            "trace row 2, column restart_s: must be a number >= 0, got '-1'",
        ),
        (
            f"{HEADER},device_types\na,0,gpt2-small,64,10,A100-40GB|H800\n",
            "trace row 2, column device_types: unknown GPU type 'H800'",
        ),
    ],
)
def test_bad_rows_name_row_and_column(text: str, message: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_restart_cost_and_device_types_parse_and_round_trip() -> None:
    text = f"{HEADER},restart_s,device_types\na,0,gpt2-small,64,10,12.5,a100-40gb|T4-16GB\n"
    (job,) = parse_trace(text)
    assert job.restart_s == 12.5
    assert job.device_types == ("A100-40GB", "T4-16GB"), "canonical catalogue keys"
    assert parse_trace(trace_to_csv([job])) == [job]
    (plain,) = parse_trace(f"{HEADER}\na,0,gpt2-small,64,10\n")
    assert (plain.restart_s, plain.device_types) == (None, None)
    (named,) = parse_trace(f"{HEADER},device_types\na,0,gpt2-small,64,10,A100 80GB|T4\n")
    assert named.device_types == ("A100-80GB", "T4-16GB"), "GPUs as people write them"


def test_generator_is_seeded_and_round_trips_through_csv(tmp_path: Path) -> None:
    jobs = generate_trace(50, jobs_per_hour=10, seed=7)
    assert jobs == generate_trace(50, jobs_per_hour=10, seed=7)
    assert jobs != generate_trace(50, jobs_per_hour=10, seed=8)
    path = tmp_path / "t.csv"
    path.write_text(trace_to_csv(jobs))
    assert load_trace(path) == jobs
    assert len({j.model for j in jobs}) >= 3 and len({j.max_devices for j in jobs}) >= 3
    hours = jobs[-1].arrival_s / 3600
    assert 3 < hours < 8, "50 jobs at 10 per hour arrive over about five hours"


def test_bundled_example_runs_on_the_bundled_cluster() -> None:
    cluster = load_cluster(ROOT / "deploy" / "clusters" / "hetero-64.yaml")
    trace = load_trace(ROOT / "deploy" / "traces" / "example.csv")
    assert len(trace) >= 20
    check_runnable(cluster, trace, PlannedRates.for_cluster(cluster))


def test_generator_rejects_bad_arguments() -> None:
    with pytest.raises(TraceError, match="--rate: must be a number of jobs per hour > 0"):
        generate_trace(5, jobs_per_hour=0, seed=0)
    with pytest.raises(TraceError, match="--generate: must be >= 1 jobs, got 0"):
        generate_trace(0, jobs_per_hour=1, seed=0)
