"""Activation memory per attention kernel and recomputation mode (scheduler/models/activations.py).

Each figure is checked against the term-by-term count of Korthikanti et al.
(2022), §4.1, written out again here, so a reader can compare with the paper.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.errors import HetschedError
from scheduler.models.presets import get_preset


def test_the_math_kernel_is_eq_1_and_the_fused_kernels_keep_a_log_sum_exp() -> None:
    m = get_preset("gpt2-medium")
    s, h, a = m.seq_len, m.d_model, m.num_heads
    eq_1 = s * h * 34 + 5 * a * s * s
    assert replace(m, attention="math").activation_bytes_per_sample_per_layer == eq_1
    for kernel in ("flash", "memory_efficient"):
        fused = replace(m, attention=kernel)  # type: ignore[arg-type]
        assert fused.activation_bytes_per_sample_per_layer == 34 * s * h + 4 * a * s


def test_llama_blocks_count_swiglu_and_no_dropout() -> None:
    m = get_preset("llama-7b")
    s, h, a, f = m.seq_len, m.d_model, m.num_heads, m.d_ff
    attention = 2 * s * h + 4 * s * h + 2 * s * h + 2 * s * h  # QKV in, Q and K, V, out-proj in
    mlp = 2 * s * h + 4 * 2 * s * f  # input; gate, up, SiLU output, product
    norms = 4 * s * h
    assert m.activation_bytes_per_sample_per_layer == attention + mlp + norms + 4 * a * s


@pytest.mark.parametrize("name", ["gpt2-small", "llama-13b"])
def test_recomputation_keeps_less_and_repeats_forward_work(name: str) -> None:
    m = replace(get_preset(name), attention="math")
    s, h = m.seq_len, m.d_model
    none, selective, full = (m.block_stored(r) for r in ("none", "selective", "full"))
    # Selective: the attention core (its 5·a·s² bytes) is recomputed; 34·s·h stays for GPT.
    assert selective.bytes == none.bytes - 5 * m.num_heads * s * s
    if m.family == "gpt":
        assert selective.bytes == 34 * s * h
    assert selective.extra_forward_flops == 4 * s * s * h
    # Full: only the block input in 16-bit; the block's forward runs again (x 4/3 overall).
    assert full.bytes == 2 * s * h
    assert full.transient_bytes == none.bytes - full.bytes
    assert m.flops_per_sample_with("full") == pytest.approx(
        m.flops_per_sample + m.num_layers * m.block_flops_per_sample / 3
    )
    # Whole-model peaks: one recomputed block's activations on top of what is kept.
    totals = [m.activation_bytes_per_sample_with(r) for r in ("none", "selective", "full")]
    assert totals == sorted(totals, reverse=True)
    assert totals[2] == (
        m.num_layers * 2 * s * h + full.transient_bytes + m.head_activation_bytes_per_sample
    )


def test_llama_13b_activations_are_those_of_the_kernel_the_workers_run() -> None:
    m = get_preset("llama-13b")
    # Issue 12: eq. 1 with the score matrix counted 163 GB per sample (166 GB with the
    # SwiGLU MLP counted as it is); SDPA's fused kernels do not store the scores.
    assert replace(m, attention="math").activation_bytes_per_sample / 1e9 > 160
    assert m.activation_bytes_per_sample / 1e9 < 35
    assert m.activation_bytes_per_sample_with("full") / 1e9 < 3


def test_unknown_attention_kernel_names_the_allowed_ones() -> None:
    with pytest.raises(
        HetschedError, match=r"model.attention: unknown kernel 'sparse'; allowed: math"
    ):
        replace(get_preset("gpt-tiny"), attention="sparse")  # type: ignore[arg-type]
