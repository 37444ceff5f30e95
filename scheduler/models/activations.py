"""What one transformer block keeps for its backward pass, per attention kernel and recomputation.

Counts follow Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023), §4.1–4.2, with no tensor or sequence
parallelism (``t = 1``), in bytes per sample of a 16-bit training step.

Legend: ``s`` sequence length, ``h`` d_model, ``a`` heads, ``f`` MLP hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

AttentionKernel = Literal["math", "flash", "memory_efficient"]
"""``math``: scores materialised (eq. 1 as written); the fused kernels: log-sum-exp only."""
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[Recompute, ...] = get_args(Recompute)
"""In order of increasing recomputation; ties in time go to the earlier one."""

LOGSUMEXP_BYTES = 4
"""The fused kernels keep their softmax statistics in fp32."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockShape:
    """The few numbers of a block the activation count needs."""

    family: Literal["gpt", "llama"]
    seq_len: int
    d_model: int
    num_heads: int
    d_ff: int


def attention_core_bytes(shape: BlockShape, kernel: AttentionKernel) -> int:
    """Bytes per sample the attention kernel itself saves beyond its inputs and output.

    Eq. 1's ``5·a·s²`` term is the score matrix, its
    softmax and dropout: what the ``math`` kernel stores. hetsched's workers call
    ``F.scaled_dot_product_attention``, whose fused kernels (FlashAttention: Dao
    et al., 2022; the memory-efficient kernel: Rabe & Staats, "Self-attention does
    not need O(n²) memory", 2021, as in xFormers) save only Q, K, V, the output and
    one fp32 log-sum-exp per head and query, ``4·a·s`` bytes, and recompute the
    scores in the backward pass. That is the default (``memory_efficient``).
    """
    s, a = shape.seq_len, shape.num_heads
    if kernel == "math":
        return 5 * a * s * s  # softmax output, dropout mask, dropped-out scores
    return LOGSUMEXP_BYTES * a * s


def base_bytes(shape: BlockShape) -> int:
    """Everything eq. 1 counts except the attention core: ``34·s·h`` for GPT with ``f = 4h``.

    =========  ===========================  =========================================
    part       bytes (GPT, ``f = 4h``)      terms (Korthikanti et al. §4.1)
    =========  ===========================  =========================================
    attention  ``11·s·h + 5·a·s²``          QKV input ``2sh``; Q and K for ``QKᵀ``
                                            ``4sh``; softmax output ``2as²``, its
                                            dropout mask ``as²``, the dropped-out
                                            scores ``2as²`` and V ``2sh`` for the
                                            product with V; output-projection input
                                            ``2sh``; dropout mask ``sh``
    MLP        ``19·s·h``                   first linear input ``2sh``; GELU input
                                            ``2sf``; second linear input ``2sf``;
                                            dropout mask ``sh``
    norms      ``4·s·h``                    the two LayerNorm inputs
    =========  ===========================  =========================================

    which is their eq. 1, ``s·h·(34 + 5·a·s/h)``. Llama blocks (Touvron et al.,
    2023) have no dropout and a SwiGLU MLP that keeps its input ``2sh``, the gate
    and up projections ``2sf + 2sf``, the SiLU output ``2sf`` and the product fed
    to the down projection ``2sf``; their RMSNorm inputs are ``4sh``.
    """
    s, h, f = shape.seq_len, shape.d_model, shape.d_ff
    if shape.family == "gpt":
        attention = 11 * s * h
        mlp = 3 * s * h + 4 * s * f
    else:
        attention = 10 * s * h  # no dropout mask
        mlp = 2 * s * h + 8 * s * f
    norms = 4 * s * h
    return attention + mlp + norms


@dataclass(frozen=True, kw_only=True, slots=True)
class Stored:
    """What a block holds per sample under one recomputation mode."""

    bytes: int
    """Kept from the forward to the backward pass."""
    transient_bytes: int
    """Held while the block is recomputed: once per device or stage, not per block."""
    extra_forward_flops: float
    """FLOPs run again in the backward pass."""


def stored(
    shape: BlockShape, *, kernel: AttentionKernel, recompute: Recompute, block_forward_flops: float
) -> Stored:
    """Per-sample memory and extra work of one block.

    Recomputation (``torch.utils.checkpoint``, Korthikanti et al. §4.2):
    ``selective`` recomputes the attention core (the kernel's call) in the
    backward pass, so only ``34·s·h`` (GPT) stays and the forward of the core,
    ``4·s²·h`` FLOPs, runs twice; ``full`` keeps only each block's input,
    ``2·s·h``, and runs the block's forward again (compute ×4/3: Chen et al.,
    "Training Deep Nets with Sublinear Memory Cost", 2016). While a block is
    recomputed it briefly holds what it would have kept without recomputation
    (:attr:`Stored.transient_bytes`), one block at a time.
    """
    core = attention_core_bytes(shape, kernel)
    everything = base_bytes(shape) + core
    if recompute == "none":
        return Stored(bytes=everything, transient_bytes=0, extra_forward_flops=0.0)
    if recompute == "selective":
        s, h = shape.seq_len, shape.d_model
        return Stored(
            bytes=everything - core, transient_bytes=core, extra_forward_flops=4.0 * s * s * h
        )
    block_input = 2 * shape.seq_len * shape.d_model
    return Stored(
        bytes=block_input,
        transient_bytes=everything - block_input,
        extra_forward_flops=block_forward_flops,
    )
