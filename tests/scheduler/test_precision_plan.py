"""Precision in the planning core: which device runs what, and what it costs the plan."""

from __future__ import annotations

import pytest

from scheduler.cost.profile import analytic_profile, profile_from_dict
from scheduler.hardware.catalogue import CATALOGUE, lookup
from scheduler.hardware.cluster import parse_cluster
from scheduler.hardware.precision import (
    PRECISIONS,
    PrecisionError,
    auto_precision,
    device_precisions,
    peak_tflops,
    resolve,
    supported,
)
from scheduler.models.presets import get_preset
from scheduler.planning import plan as plan_module
from scheduler.planning.planner import make_plan
from tests.support import make_cluster, one_line_error


def _cluster(*types: str) -> object:
    return parse_cluster(
        {"name": "p", "nodes": [{"name": "a", "devices": [{"type": t} for t in types]}]}
    )


def test_the_precisions_are_the_plan_contracts() -> None:
    assert PRECISIONS == plan_module.PRECISIONS


def test_every_catalogue_gpu_trains_in_fp32_and_auto_picks_what_it_supports() -> None:
    for gpu in CATALOGUE.values():
        allowed = supported(gpu)
        assert allowed[-1] == "fp32" and auto_precision(gpu) in allowed, gpu.key
        assert 0 < peak_tflops(gpu, "fp32") <= gpu.peak_tflops, gpu.key


@pytest.mark.parametrize(
    ("gpu", "choice"),
    [
        ("H100-80GB", "bf16"),
        ("A100-40GB", "bf16"),
        ("L4-24GB", "bf16"),
        ("RTX3090-24GB", "bf16"),
        ("MI300X-192GB", "bf16"),
        ("V100-32GB", "fp16"),
        ("T4-16GB", "fp16"),
        ("RTX2080TI-11GB", "fp16"),
        ("P100-16GB", "fp32"),
        ("K80-12GB", "fp32"),
    ],
)
def test_auto_chooses_bf16_where_supported_fp16_on_volta_and_turing_fp32_otherwise(
    gpu: str, choice: str
) -> None:
    assert auto_precision(lookup(gpu)) == choice
    assert resolve(lookup(gpu), "auto") == choice
    assert choice in supported(lookup(gpu))


def test_bf16_on_a_v100_is_a_one_line_error_naming_the_field_device_and_what_it_allows() -> None:
    message = one_line_error(
        PrecisionError, lambda r: resolve(lookup("V100-16GB"), r, device="node-b/0"), "bf16"
    )
    assert message.startswith("precision: bf16 is not supported by node-b/0 (V100-16GB")
    assert "volta" in message and "fp16, fp32" in message
    assert "fp32" in one_line_error(
        PrecisionError, lambda r: resolve(lookup("K80-12GB"), r), "fp16"
    )
    unknown = one_line_error(PrecisionError, lambda r: resolve(lookup("A100-80GB"), r), "fp8")
    assert unknown == "precision: unknown 'fp8'; allowed: fp32, bf16, fp16, auto"


def test_a_cluster_check_names_the_first_device_that_cannot() -> None:
    cluster = make_cluster(["A100-80GB", "T4-16GB"])
    assert device_precisions(cluster.devices, "auto") == {"a/0": "bf16", "a/1": "fp16"}
    assert device_precisions(cluster.devices, "fp16") == {"a/0": "fp16", "a/1": "fp16"}
    with pytest.raises(PrecisionError, match="by a/1 "):
        device_precisions(cluster.devices, "bf16")


def test_fp32_runs_at_the_datasheet_fp32_peak() -> None:
    assert peak_tflops(lookup("A100-80GB"), "fp32") == pytest.approx(19.5)
    assert peak_tflops(lookup("V100-32GB"), "fp32") == pytest.approx(15.7)
    # The HGX page gives the B200's tensor figures only; without its fp32 vector 80 the
    # guess of an eighth of the 16-bit peak priced fp32 jobs (the default) at 281.
    assert peak_tflops(lookup("B200-180GB"), "fp32") == pytest.approx(80.0)
    assert peak_tflops(lookup("A100-80GB"), "bf16") == 312.0
    # a spec's tflops override of the 16-bit peak scales the fp32 one alike
    assert peak_tflops(lookup("A100-80GB"), "fp32", tensor_tflops=156.0) == pytest.approx(9.75)


@pytest.mark.parametrize("strategy", ["dp", "pp", "hybrid"])
def test_planner_memory_and_time_fall_with_16_bit_compute(strategy: str) -> None:
    """Same devices, same batch: bf16 halves the activations (the model states stay 16
    bytes a parameter) and runs at the tensor peak, so every device needs less memory
    for the same micro-batch and the step is faster; each device's plan says bf16."""
    cluster = _cluster("A100-80GB", "A100-80GB", "A100-40GB", "A100-40GB")
    model = get_preset("gpt2-large")
    fp32 = analytic_profile(cluster, model, precision="fp32")
    bf16 = analytic_profile(cluster, model, precision="bf16")
    for a, b in zip(fp32.devices, bf16.devices, strict=True):
        assert b.static_bytes == a.static_bytes == 16 * model.num_params
        assert b.per_sample_bytes < a.per_sample_bytes
        assert b.per_sample_s < a.per_sample_s / 4
    slow, fast = make_plan(fp32, 32, strategy), make_plan(bf16, 32, strategy)
    assert fast.predicted_step_s < slow.predicted_step_s / 4
    assert {d.precision for d in fast.devices} == {"bf16"}
    assert {d.precision for d in slow.devices} == {"fp32"}


def test_auto_on_a_mixed_cluster_plans_each_type_in_its_own_precision() -> None:
    cluster = _cluster("A100-80GB", "V100-32GB", "P100-16GB")
    plan = make_plan(
        analytic_profile(cluster, get_preset("gpt2-small"), precision="auto"), 48, "dp"
    )
    assert [d.precision for d in plan.devices] == ["bf16", "fp16", "fp32"]
    doc = plan.to_dict()
    assert [d["precision"] for d in doc["devices"]] == ["bf16", "fp16", "fp32"]
    assert plan_module.plan_from_dict(doc) == plan


def test_without_a_precision_the_analytic_figures_are_fp32_as_a_default_job_trains() -> None:
    """A job trains in fp32 unless it asks, so a profile that is not told prices fp32
    (it used to price 16-bit figures labelled fp32: twice the activations were missing)."""
    cluster = _cluster("A100-80GB", "T4-16GB")
    model = get_preset("gpt2-small")
    default = analytic_profile(cluster, model)
    fp32 = analytic_profile(cluster, model, precision="fp32")
    sixteen = analytic_profile(cluster, model, precision="auto")
    assert default == fp32
    for a, b in zip(default.devices, sixteen.devices, strict=True):
        assert a.precision == "fp32"
        assert a.per_sample_bytes == 2 * b.per_sample_bytes
        assert a.per_sample_s > b.per_sample_s


def test_a_measured_profile_takes_the_jobs_precision_as_a_label_and_keeps_its_figures() -> None:
    doc = {
        "model": "gpt-tiny",
        "devices": [
            {"id": "a/0", "type": "A100-80GB", "capacity_bytes": 10**9, "static_bytes": 10**6,
             "per_sample_bytes": 10**5, "fixed_s": 0.01, "per_sample_s": 0.001},
            {"id": "a/1", "type": "V100-16GB", "capacity_bytes": 10**9, "static_bytes": 10**6,
             "per_sample_bytes": 10**5, "fixed_s": 0.01, "per_sample_s": 0.002},
        ],
    }  # fmt: skip
    measured = profile_from_dict(doc)
    labelled = measured.at_precision("auto")
    assert [d.precision for d in labelled.devices] == ["bf16", "fp16"]
    assert [d.per_sample_s for d in labelled.devices] == [0.001, 0.002]
    assert profile_from_dict(labelled.to_dict()) == labelled  # the label round-trips
    plan = make_plan(labelled, 16, "dp")
    assert [d.precision for d in plan.devices] == ["bf16", "fp16"]
    with pytest.raises(PrecisionError, match="^precision: bf16 is not supported by a/1"):
        measured.at_precision("bf16")
    bad = {**doc, "devices": [{**doc["devices"][0], "precision": "fp8"}]}
    with pytest.raises(ValueError, match=r"devices\[0\]\.precision must be one of fp32"):
        profile_from_dict(bad)
