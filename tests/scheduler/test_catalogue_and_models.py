"""The GPU catalogue and the model presets' analytic sizes against published figures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.errors import HetschedError
from scheduler.hardware.catalogue import CATALOGUE, CROSS_CHECKED, GIB, known_types, lookup
from scheduler.models.presets import PRESETS, get_preset

REQUIRED_GPUS = [
    "H200-141GB",
    "H100-80GB",
    "A100-80GB",
    "A100-40GB",
    "L40S-48GB",
    "A10G-24GB",
    "L4-24GB",
    "V100-32GB",
    "V100-16GB",
    "T4-16GB",
    "RTX4090-24GB",
    "RTX3090-24GB",
    # issue 20: the types real mixed clusters have
    "A6000-48GB",
    "P40-24GB",
    "H100NVL-94GB",
    "A40-48GB",
    "L40-48GB",
    "A5000-24GB",
    "A4000-16GB",
    "RTX6000ADA-48GB",
    "A30-24GB",
    "A2-16GB",
    "A16-16GB",
    "H20-96GB",
    "B200-180GB",
    "GH200-96GB",
    "RTX5090-32GB",
    "MI210-64GB",
    "MI250X-64GB",
    "GAUDI2-96GB",
    "V100PCIE-16GB",
    "V100PCIE-32GB",
    "A100PCIE-80GB",
    "A100PCIE-40GB",
]


def test_catalogue_has_the_required_gpus_with_figures_and_sources() -> None:
    assert len(CATALOGUE) >= 12
    for key in REQUIRED_GPUS:
        assert key in CATALOGUE, key
    for key, gpu in CATALOGUE.items():
        assert gpu.key == key
        assert gpu.peak_tflops > 0 and gpu.memory_gb > 0 and gpu.bandwidth_gbps > 0, key
        assert len(gpu.source) > 10, f"{key} cites where its figures come from"
        assert gpu.url.startswith("https://"), f"{key} cites where its source is published"
        assert gpu.tdp_w > 0 and gpu.interconnect, f"{key}: board power and links"
        assert gpu.fp32_tflops is None or 0 < gpu.fp32_tflops <= gpu.peak_tflops, key
        measured = gpu.measured_gemm_tflops, gpu.measured_bandwidth_gbps
        if any(m is not None for m in measured):
            assert "http" in gpu.measured_source, f"{key} cites its measurement"
        assert str(round(gpu.memory_gb)) in key, f"{key}: key is MODEL-MEMORY"


def test_geforce_cards_quote_the_fp32_accumulate_rate_half_the_fp16_one() -> None:
    # GA102/Ada/Blackwell whitepapers: GeForce tensor cores accumulate fp16 products in
    # fp32 at half the fp16-accumulate rate; professional cards of the same chip do not.
    geforce = [g for g in CATALOGUE.values() if g.segment == "geforce"]
    assert len(geforce) >= 4
    for gpu in geforce:
        assert gpu.fp16_accumulate_tflops == pytest.approx(2 * gpu.peak_tflops, rel=0.01), gpu.key
    a6000, rtx3090 = lookup("A6000-48GB"), lookup("RTX3090-24GB")
    assert a6000.peak_tflops > 2 * rtx3090.peak_tflops * 0.95  # same GA102, full rate


def test_precision_picks_the_peak_that_applies() -> None:
    a100, v100, p40 = lookup("A100-80GB"), lookup("V100-32GB"), lookup("P40-24GB")
    assert a100.peak_tflops_at("bf16") == a100.peak_tflops_at("fp16") == 312
    assert a100.peak_tflops_at("fp32") == 19.5
    assert v100.peak_tflops_at("bf16") == v100.fp32_tflops  # Volta has no bf16 tensor math
    assert p40.peak_tflops_at("fp16") == p40.fp32_tflops  # the P40's fp16 runs at 1/64
    with pytest.raises(ValueError, match="GAUDI2-96GB: the vendor publishes no fp32 rate"):
        lookup("GAUDI2-96GB").peak_tflops_at("fp32")


def test_catalogue_figures_match_datasheets() -> None:
    # Dense bf16/fp16 tensor TFLOP/s and memory from the vendors' datasheets.
    assert lookup("H100-80GB").peak_tflops == pytest.approx(989, rel=0.01)
    assert lookup("A100-80GB").peak_tflops == pytest.approx(312, rel=0.01)
    assert lookup("V100-16GB").peak_tflops == pytest.approx(125, rel=0.01)
    assert lookup("T4-16GB").peak_tflops == pytest.approx(65, rel=0.01)
    assert lookup("H200-141GB").memory_gb == 141
    assert lookup("A100-40GB").memory_bytes == 40 * GIB
    speeds = [lookup(k).peak_tflops for k in ("H100-80GB", "A100-80GB", "V100-32GB", "T4-16GB")]
    assert speeds == sorted(speeds, reverse=True)


@pytest.mark.parametrize("written", ["h100-80gb", "H100-80GB", "  H100-80gb "])
def test_lookup_is_case_insensitive(written: str) -> None:
    assert lookup(written).key == "H100-80GB"


def test_lookup_unknown_raises_key_error() -> None:
    with pytest.raises(KeyError):
        lookup("H100")
    assert known_types() == list(CATALOGUE)


# Parameter counts of the released checkpoints (GPT-2: Hugging Face transformers
# reports these for gpt2, gpt2-medium, gpt2-large, gpt2-xl; Llama 2: Touvron et al.).
PUBLISHED_PARAMS = {
    "gpt2-small": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama-7b": 6_738_415_616,
    "llama-13b": 13_015_864_320,
}


@pytest.mark.parametrize(("name", "params"), PUBLISHED_PARAMS.items())
def test_parameter_counts_match_published_sizes(name: str, params: int) -> None:
    assert get_preset(name).num_params == params


def test_gpt_tiny_trains_on_a_cpu() -> None:
    tiny = get_preset("gpt-tiny")
    assert tiny.vocab_size == 256 and tiny.d_model <= 256 and tiny.num_layers <= 6
    assert tiny.num_params < 2_000_000


@pytest.mark.parametrize("name", ["gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_flops_match_megatron_formula(name: str) -> None:
    # Narayanan et al. (2021), eq. 3 per sample: 72·s·l·h²·(1 + s/(6h) + V/(12·h·l)).
    # It leaves out biases, which we count: 54·s·l·h more, under 0.1 % for h >= 768.
    m = get_preset(name)
    s, h, layers, v = m.seq_len, m.d_model, m.num_layers, m.vocab_size
    megatron = 72 * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * h * layers))
    assert m.flops_per_sample == pytest.approx(megatron, rel=1e-3)


@pytest.mark.parametrize("name", ["gpt2-medium", "gpt2-large", "gpt2-xl", "llama-7b", "llama-13b"])
def test_flops_are_about_six_n_per_token_for_large_models(name: str) -> None:
    # Kaplan et al. (2020): C ≈ 6·N per token; attention scores add 4·s²·h per layer
    # forward, within 20 % of 6·N·s at these sizes.
    m = get_preset(name)
    ratio = m.flops_per_sample / (6 * m.num_params * m.seq_len)
    assert 1.0 <= ratio <= 1.2


def test_memory_formulas() -> None:
    m = get_preset("gpt2-small")
    assert m.model_state_bytes == 16 * m.num_params  # ZeRO: mixed-precision AdamW
    assert m.gradient_bytes == 4 * m.num_params  # fp32 gradients, all-reduced as one buffer
    s, h, a = m.seq_len, m.d_model, m.num_heads
    # Korthikanti et al. (2022), eq. 1, micro-batch 1, no tensor parallelism, for the
    # attention kernel that stores its score matrix ...
    math = replace(m, attention="math")
    assert math.activation_bytes_per_sample_per_layer == s * h * (34 + 5 * a * s / h)
    # ... and for the fused kernels the workers run: one fp32 log-sum-exp per head and query.
    assert m.attention == "memory_efficient"
    assert m.activation_bytes_per_sample_per_layer == 34 * s * h + 4 * a * s
    assert m.activation_bytes_per_sample > m.num_layers * m.activation_bytes_per_sample_per_layer
    # Logits dominate the head: fp32, seq x vocab.
    assert m.head_activation_bytes_per_sample >= 4 * s * m.vocab_size


def test_sizes_grow_with_the_model() -> None:
    order = ["gpt-tiny", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"]
    for attr in ("num_params", "flops_per_sample", "activation_bytes_per_sample"):
        values = [getattr(get_preset(n), attr) for n in order]
        assert values == sorted(values), attr


def test_get_preset_is_case_insensitive_and_lists_known_on_error() -> None:
    assert get_preset(" GPT2-Small ") is PRESETS["gpt2-small"]
    with pytest.raises(HetschedError, match=r"model: unknown preset 'gpt5'; known: gpt-tiny"):
        get_preset("gpt5")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"d_model": 100, "num_heads": 3}, "model.d_model: 100 must be divisible by num_heads 3"),
        ({"num_layers": 0}, "model.num_layers: must be >= 1, got 0"),
    ],
)
def test_invalid_preset_shape_names_the_field(change: dict[str, int], message: str) -> None:
    with pytest.raises(HetschedError, match=message):
        replace(PRESETS["gpt-tiny"], **change)


def test_cross_checked_entries_exist() -> None:
    """Every cross-checked citation names a catalogue entry (a renamed key would orphan it)."""
    assert set(CROSS_CHECKED) <= set(CATALOGUE)
