"""Model presets and their analytic sizes.

Shapes follow the published configurations: GPT-2 (Radford et al., 2019;
sizes from the released checkpoints) and Llama 2 (Touvron et al., 2023).
FLOPs per sample follow Narayanan et al., "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM" (2021): forward costs two
FLOPs per weight per token plus ``4·s²·h`` per layer for attention scores, and
backward twice the forward. Activation memory per layer follows Korthikanti
et al., "Reducing Activation Recomputation in Large Transformer Models"
(2022), eq. 1 with ``t = 1``, for the attention kernel the model runs and
the recomputation chosen (:mod:`scheduler.models.activations`). Model states
under AdamW mixed precision take 16 bytes per parameter (Rajbhandari et al.,
ZeRO, 2020: fp16 weights and gradients, fp32 master weights, momentum and
variance).

Legend: ``s`` sequence length, ``h`` d_model, ``a`` heads, ``L`` layers,
``V`` vocabulary, ``f`` MLP hidden size.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from scheduler.errors import HetschedError
from scheduler.models.activations import (
    ATTENTION_KERNELS,
    AttentionKernel,
    BlockShape,
    Recompute,
    Stored,
    stored,
)

Family = Literal["gpt", "llama"]

MIXED_PRECISION_STATE_BYTES_PER_PARAM = 16
GRADIENT_BYTES_PER_PARAM = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelPreset:
    """A transformer's shape, and the analytic sizes derived from it: parameters,
    model states, activations per sample and FLOPs per token."""

    name: str
    family: Family
    """``gpt``: LayerNorm, GELU MLP, biases, learned positions, tied head.
    ``llama``: RMSNorm, SwiGLU MLP, no biases, rotary positions, untied head."""
    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    """MLP hidden size."""
    vocab_size: int
    seq_len: int
    """Training context length (tokens per sample)."""
    num_kv_heads: int = 0
    """Key/value heads (grouped-query attention, llama only); 0 means ``num_heads``."""
    max_seq_len: int = 0
    """Longest context the model supports (GPT's position table has this many rows);
    0 means ``seq_len``. A Hugging Face GPT-2 keeps its ``n_positions`` here."""
    norm_eps: float = 1e-5
    """Epsilon of LayerNorm (gpt) or RMSNorm (llama)."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding's frequencies (llama)."""
    gelu_approximate: Literal["none", "tanh"] = "none"
    """GPT's MLP activation: exact GELU, or the tanh approximation GPT-2 was trained with."""
    attention: AttentionKernel = "memory_efficient"
    """The ``scaled_dot_product_attention`` kernel the block runs; it sets what attention
    keeps for the backward pass (:mod:`scheduler.models.activations`)."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KERNELS:
            raise HetschedError(
                f"model.attention: unknown kernel {self.attention!r}; "
                f"allowed: {', '.join(ATTENTION_KERNELS)}"
            )
        for field_name in ("num_layers", "d_model", "num_heads", "d_ff", "vocab_size", "seq_len"):
            value = getattr(self, field_name)
            if value < 1:
                raise HetschedError(f"model.{field_name}: must be >= 1, got {value}")
        if self.d_model % self.num_heads:
            raise HetschedError(
                f"model.d_model: {self.d_model} must be divisible by num_heads {self.num_heads}"
            )
        # Frozen: the two "0 means ..." defaults are resolved once, here.
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.max_seq_len == 0:
            object.__setattr__(self, "max_seq_len", self.seq_len)
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise HetschedError(
                f"model.num_kv_heads: {self.num_kv_heads} must be >= 1 and divide "
                f"num_heads {self.num_heads}"
            )
        if self.family == "gpt" and self.num_kv_heads != self.num_heads:
            raise HetschedError(
                f"model.num_kv_heads: the gpt family has no grouped-query attention; "
                f"must equal num_heads {self.num_heads}, got {self.num_kv_heads}"
            )
        if self.max_seq_len < self.seq_len:
            raise HetschedError(
                f"model.seq_len: {self.seq_len} exceeds max_seq_len {self.max_seq_len}"
            )
        for field_name in ("norm_eps", "rope_theta"):
            value = getattr(self, field_name)
            if not value > 0 or value == float("inf"):
                raise HetschedError(f"model.{field_name}: must be a finite number > 0, got {value}")

    @property
    def head_dim(self) -> int:
        """Size of one attention head (``h / a``)."""
        return self.d_model // self.num_heads

    # --- parameters -------------------------------------------------------

    @property
    def block_params(self) -> int:
        """Parameters of one transformer block."""
        h, f = self.d_model, self.d_ff
        if self.family == "gpt":
            attn = 4 * h * h + 4 * h  # qkv and out projections, with biases
            mlp = 2 * h * f + f + h
            norms = 2 * 2 * h  # two LayerNorms, weight and bias
        else:
            kv = self.num_kv_heads * self.head_dim  # grouped-query: fewer key/value heads
            attn = 2 * h * h + 2 * h * kv  # q and out projections, k and v; no biases
            mlp = 3 * h * f  # gate, up, down
            norms = 2 * h  # two RMSNorms, weight only
        return attn + mlp + norms

    @property
    def embed_params(self) -> int:
        """Token (and, for GPT, position) embeddings."""
        positions = self.max_seq_len * self.d_model if self.family == "gpt" else 0
        return self.vocab_size * self.d_model + positions

    @property
    def head_params(self) -> int:
        """Final norm and, when untied, the output projection."""
        h = self.d_model
        if self.family == "gpt":
            return 2 * h  # final LayerNorm; the head shares the token embedding
        return h + self.vocab_size * h

    @property
    def num_params(self) -> int:
        return self.embed_params + self.num_layers * self.block_params + self.head_params

    # --- compute ----------------------------------------------------------

    @property
    def block_flops_per_sample(self) -> float:
        """Forward + backward FLOPs of one block for one sample."""
        s, h = self.seq_len, self.d_model
        matmul_weights = self.block_params - (4 * h if self.family == "gpt" else 2 * h)
        forward = 2 * s * matmul_weights + 4 * s * s * h
        return 3.0 * forward

    @property
    def head_flops_per_sample(self) -> float:
        """Forward + backward FLOPs of the output projection for one sample."""
        return 3.0 * 2 * self.seq_len * self.d_model * self.vocab_size

    @property
    def flops_per_sample(self) -> float:
        """Forward + backward FLOPs for one sample (no recomputation)."""
        return self.num_layers * self.block_flops_per_sample + self.head_flops_per_sample

    # --- memory -----------------------------------------------------------

    @property
    def model_state_bytes(self) -> int:
        """Weights, gradients and AdamW state under mixed precision."""
        return MIXED_PRECISION_STATE_BYTES_PER_PARAM * self.num_params

    @property
    def gradient_bytes(self) -> int:
        """Bytes all-reduced per step. The workers keep fp32 weights under autocast, so
        their gradients, and the flat buffer they all-reduce, are fp32."""
        return GRADIENT_BYTES_PER_PARAM * self.num_params

    @property
    def block_shape(self) -> BlockShape:
        """This preset's values of the fields :class:`BlockShape` names."""
        return BlockShape(**{f.name: getattr(self, f.name) for f in fields(BlockShape)})

    def block_stored(self, recompute: Recompute = "none") -> Stored:
        """What one block keeps per sample, and recomputes, under ``recompute``."""
        return stored(
            self.block_shape,
            kernel=self.attention,
            recompute=recompute,
            block_forward_flops=self.block_flops_per_sample / 3,
        )

    @property
    def activation_bytes_per_sample_per_layer(self) -> int:
        """Korthikanti et al. eq. 1 for this model's attention kernel, no recomputation."""
        return self.block_stored("none").bytes

    @property
    def head_activation_bytes_per_sample(self) -> int:
        """Embedding output plus fp32 logits kept for the cross-entropy (``4·s·V``)."""
        return 2 * self.seq_len * self.d_model + 4 * self.seq_len * self.vocab_size

    def activation_bytes_per_sample_with(self, recompute: Recompute) -> int:
        """Peak activation bytes per sample of a whole model under ``recompute``."""
        block = self.block_stored(recompute)
        return (
            self.num_layers * block.bytes
            + block.transient_bytes
            + self.head_activation_bytes_per_sample
        )

    @property
    def activation_bytes_per_sample(self) -> int:
        return self.activation_bytes_per_sample_with("none")

    def flops_per_sample_with(self, recompute: Recompute) -> float:
        """Forward + backward FLOPs per sample, with the forward work ``recompute`` repeats."""
        extra = self.num_layers * self.block_stored(recompute).extra_forward_flops
        return self.flops_per_sample + extra

    @property
    def boundary_bytes_per_sample(self) -> int:
        """Bytes of one sample's hidden state at a pipeline stage boundary (16-bit)."""
        return 2 * self.seq_len * self.d_model


def _gpt(
    name: str,
    *,
    num_layers: int,
    d_model: int,
    num_heads: int,
    vocab_size: int = 50257,
    seq_len: int = 1024,
) -> ModelPreset:
    """A GPT-2-shaped model, 4× MLP; by default GPT-2's BPE vocabulary and 1024-token context."""
    return ModelPreset(
        name=name,
        family="gpt",
        num_layers=num_layers,
        d_model=d_model,
        num_heads=num_heads,
        d_ff=4 * d_model,
        vocab_size=vocab_size,
        seq_len=seq_len,
    )


_llama2 = functools.partial(ModelPreset, family="llama", vocab_size=32000, seq_len=4096)
"""A Llama 2 size: its 32k SentencePiece vocabulary and 4096-token context."""
CPU_VOCAB_SIZE = 256
"""Presets small enough to train on a CPU in the simulation use a byte vocabulary."""
_gpt_on_cpu = functools.partial(_gpt, vocab_size=CPU_VOCAB_SIZE)
"""A GPT small enough to train on a CPU in the simulation."""

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in [
        _gpt_on_cpu("gpt-tiny", num_layers=4, d_model=128, num_heads=4, seq_len=64),
        _gpt_on_cpu("gpt-small-cpu", num_layers=8, d_model=256, num_heads=8, seq_len=128),
        # The llama family's counterpart of gpt-tiny: grouped-query attention (two
        # query heads per key/value head) and a SwiGLU width of about 8/3·h.
        ModelPreset(
            name="llama-tiny",
            family="llama",
            num_layers=4,
            d_model=128,
            num_heads=4,
            num_kv_heads=2,
            d_ff=352,
            vocab_size=CPU_VOCAB_SIZE,
            seq_len=64,
        ),
        _gpt("gpt2-small", num_layers=12, d_model=768, num_heads=12),
        _gpt("gpt2-medium", num_layers=24, d_model=1024, num_heads=16),
        _gpt("gpt2-large", num_layers=36, d_model=1280, num_heads=20),
        _gpt("gpt2-xl", num_layers=48, d_model=1600, num_heads=25),
        _llama2(name="llama-7b", num_layers=32, d_model=4096, num_heads=32, d_ff=11008),
        _llama2(name="llama-13b", num_layers=40, d_model=5120, num_heads=40, d_ff=13824),
    ]
}


def get_preset(name: str) -> ModelPreset:
    """Look a preset up by name (case-insensitive)."""
    preset = PRESETS.get(name.strip().lower())
    if preset is None:
        raise HetschedError(f"model: unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return preset


def preset_to_dict(preset: ModelPreset) -> dict[str, Any]:
    """Every field of ``preset``, JSON-ready (checkpoints and exports carry this)."""
    return {f.name: getattr(preset, f.name) for f in fields(preset)}


def preset_from_dict(raw: Mapping[str, Any], *, where: str = "model") -> ModelPreset:
    """The inverse of :func:`preset_to_dict`; unknown keys name the known ones."""
    known = [f.name for f in fields(ModelPreset)]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise HetschedError(f"{where}.{unknown[0]}: unknown field; known: {', '.join(known)}")
    try:
        return ModelPreset(**raw)
    except TypeError as exc:
        raise HetschedError(f"{where}: {exc}") from exc


TRAINABLE_FAMILIES = ("gpt", "llama")
"""Families the runtimes build (workers.models.families.build_model); others plan analytically."""


def check_trainable(preset: ModelPreset) -> None:
    """Refuse, before any worker starts, a model the runtimes cannot build."""
    if preset.family not in TRAINABLE_FAMILIES:
        raise HetschedError(
            f"model: {preset.name} is a {preset.family} preset; the trainer builds the "
            f"{', '.join(TRAINABLE_FAMILIES)} families only (plan it analytically with "
            "`hetsched plan`)"
        )
