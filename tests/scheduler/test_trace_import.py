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
        (
            "gavel",
            "A3C\tx\n",
            "gavel trace line 1: 2 tab-separated fields, a Gavel job has 6, 7, 9 or 10",
        ),
        (
            "gavel",
            "Transformer\tc\t-step\t1\t100\t0\t1\t-1\n",
            "gavel trace line 1: 8 tab-separated fields, a Gavel job has 6, 7, 9 or 10",
        ),
        (
            "gavel",
            "vgg16\tc\td\t--n\t1\t100\t1\t1\t-1\t0\n",
            "gavel trace line 1, job type: 'vgg16' has no V100 throughput in Gavel's published",
        ),
        (
            "gavel",
            "BERT\tc\t--n\t100\t0\t1\n",
            "gavel trace line 1, job type: 'BERT' has no V100 throughput in Gavel's published",
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


# Each layout of Gavel's published traces (github.com/stanford-futuredata/gavel), as
# the first lines of a real trace. Expected durations are total steps over (GPUs x the
# one-V100 steps/s of Gavel's throughput file, written out here as in that file).

# scheduler/traces/physical_cluster/small_test.trace @ 19a0dd258418623439f795693ae47ea54dea3edd
GAVEL_10_FIELDS = (
    "Transformer (batch size 128)\tpython3 train.py -data %s/data/translation/multi30k.atok"
    ".low.pt-batch_size 128 -proj_share_weight\tgpusched/workloads/pytorch/translation\t-step"
    "\t1\t346\t2\t1\t-1.000000\t0\n"
    "Recommendation (batch size 8192)\tpython3 train.py --data_dir %s/data/ml-20m/pro_sg/ "
    "--batch_size 8192\tgpusched/workloads/pytorch/recommendation\t-n\t1\t36\t1\t1\t-1.000000\t0\n"
    "Transformer (batch size 256)\tpython3 train.py -data %s/data/translation/multi30k.atok"
    ".low.pt-batch_size 256 -proj_share_weight\tgpusched/workloads/pytorch/translation\t-step"
    "\t1\t102\t1\t1\t-1.000000\t0\n"
    "ResNet-18 (batch size 32)\tpython3 main.py --data_dir=%s/data/cifar10 --batch_size 32\t"
    "gpusched/workloads/pytorch/image_classification/cifar10\t--num_steps\t1\t3948\t2\t1\t"
    "-1.000000\t0\n"
)
# The 9-field layout of scheduler/utils.py: parse_trace
# @ 52d9895abb4c3a4f6a9595d53c105477903ec41c
# (no working directory). No 9-field trace is in the stored copy of Gavel's repository,
# so these are the lines above as that reader takes them: the working directory dropped.
GAVEL_9_FIELDS = "\n".join(
    "\t".join(f for i, f in enumerate(line.split("\t")) if i != 2)
    for line in GAVEL_10_FIELDS.splitlines()
)
# scheduler/traces/msr/seed=0/51b7ef.trace @ 42ca27dcfd137df7615929dccef5cc81d3a0192a
GAVEL_7_FIELDS = (
    "Transformer (batch size 128)\tcd %s/gpusched/workloads/pytorch/translation && python3 "
    "train.py -data %s/data/translation/multi30k.atok.low.pt -batch_size 128 -proj_share_weight"
    "\t-step\t1\t246378\t0.000000\t1\n"
    "Recommendation (batch size 8192)\tcd %s/gpusched/workloads/pytorch/recommendation/scripts/"
    "ml-20m && python3 train.py --data_dir %s/data/ml-20m/pro_sg/ --batch_size 8192\t-n\t1\t"
    "11064\t58417.000000\t1\n"
    "Transformer (batch size 256)\tcd %s/gpusched/workloads/pytorch/translation && python3 "
    "train.py -data %s/data/translation/multi30k.atok.low.pt -batch_size 256 -proj_share_weight"
    "\t-step\t1\t3248\t76902.000000\t8\n"
    "ResNet-18 (batch size 32)\tcd %s/gpusched/workloads/pytorch/image_classification/cifar10 "
    "&& python3 main.py --data_dir=%s/data/cifar10 --batch_size 32 \t--num_steps\t1\t197547\t"
    "79955.000000\t8\n"
)
# scheduler/traces/generated/microbenchmark/arrival_rate_1.trace
# @ 4f0bde95485b21d66d61d2925402e4c488a91dd0
GAVEL_6_FIELDS = (
    "Recommendation\tcd /lfs/1/keshav/gpusched/workloads/pytorch/recommendation/scripts/ml-20m "
    "&& python3 train.py --data_dir /lfs/1/keshav/data/ml-20m/pro_sg/\t-n\t2721\t0\t1\n"
    "LM\tcd /lfs/1/keshav/gpusched/workloads/pytorch/language_modeling && python main.py --cuda "
    "--data /lfs/1/keshav/data/wikitext-2 \t--steps\t978676\t1\t1\n"
    "CycleGAN\tcd /lfs/1/keshav/gpusched/workloads/pytorch/cyclegan && python3 cyclegan.py "
    "--dataset_path /lfs/1/keshav/data/monet2photo --decay_epoch 0\t--n_steps\t700224\t1\t1\n"
    "ResNet-18\tcd /lfs/1/keshav/gpusched/workloads/pytorch/image_classification/cifar10 && "
    "python3 main.py --data_dir=/lfs/1/keshav/data/cifar10\t--num_steps\t5376266\t1\t1\n"
    "ResNet-50\tcd /lfs/1/keshav/gpusched/workloads/pytorch/image_classification/imagenet && "
    "python3 main.py -j 4 -a resnet50 -b 64 /lfs/1/keshav/data/imagenet/pytorch\t"
    "--num_minibatches\t31918\t1\t1\n"
)
# (GPUs, arrival s, duration s) of each line, from oracle_throughputs.json @ 19b15c0a0d5f
# (batch-size job types) and combined_throughputs.json @ 474a31a26c9f (bare ones).
PHYSICAL_SMALL_TEST = [
    (2, 0.0, 346 / (2 * 5.771210833383417)),
    (1, 0.0, 36 / 0.6023546957515021),
    (1, 0.0, 102 / 1.707029875260509),
    (2, 0.0, 3948 / (2 * 65.80540708735272)),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GAVEL_10_FIELDS, PHYSICAL_SMALL_TEST),
        (GAVEL_9_FIELDS, PHYSICAL_SMALL_TEST),
        (
            GAVEL_7_FIELDS,
            [
                (1, 0.0, 246378 / 5.771210833383417),
                (1, 58417.0, 11064 / 0.6023546957515021),
                (8, 76902.0, 3248 / (8 * 1.707029875260509)),
                (8, 79955.0, 197547 / (8 * 65.80540708735272)),
            ],
        ),
        (
            GAVEL_6_FIELDS,
            [
                (1, 0.0, 2721 / 0.43019487158826614),
                (1, 1.0, 978676 / 96.24638978858054),
                (1, 1.0, 700224 / 3.675618512816215),
                (1, 1.0, 5376266 / 46.81725852189685),
                (1, 1.0, 31918 / 1.3768704198194044),
            ],
        ),
    ],
    ids=["10-fields", "9-fields", "7-fields", "6-fields"],
)
def test_every_gavel_layout_imports_gpus_arrivals_and_durations(
    text: str, expected: list[tuple[int, float, float]]
) -> None:
    jobs = parse_gavel(text)
    got = [(j.num_devices, j.arrival_s, j.duration_s) for j in jobs]
    assert got == [(n, a, pytest.approx(d, rel=1e-12)) for n, a, d in expected]
    assert all(j.priority == 1.0 and j.rigid and j.gpu_type == GAVEL_GPU for j in jobs)


def test_a_gavel_7_field_line_of_scale_factor_0_is_skipped_as_gavel_skips_it() -> None:
    first, second, *_ = GAVEL_7_FIELDS.splitlines()
    dropped = second.rsplit("\t", 1)[0] + "\t0"
    (job,) = parse_gavel(f"{first}\n{dropped}\n")
    assert job.duration_s == pytest.approx(246378 / 5.771210833383417)


def test_a_gavel_9_field_priority_weight_is_read() -> None:
    line = GAVEL_9_FIELDS.splitlines()[0].split("\t")
    line[6] = "2.5"
    (job,) = parse_gavel("\t".join(line))
    assert job.priority == 2.5 and job.num_devices == 2
