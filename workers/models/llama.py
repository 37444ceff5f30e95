"""A Llama you can read top to bottom, built from a scheduler model preset.

Follows Llama 2 (Touvron et al., 2023) as Hugging Face's ``LlamaForCausalLM``
implements it: token embedding, pre-norm blocks of RMSNorm (Zhang & Sennrich,
2019), causal self-attention with rotary position embeddings (Su et al.,
RoFormer, 2021) and grouped-query attention (Ainslie et al., 2023), a SwiGLU
MLP (Shazeer, 2020), a final RMSNorm and an untied output projection. No
biases anywhere.

Legend: B batch, T sequence length, C d_model, nh query heads, nkv key/value
heads, hs head size, F MLP hidden size, V vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from scheduler.errors import HetschedError
from scheduler.models.presets import ModelPreset
from workers.models.init import ParamKind, init_parameters
from workers.models.stage import StageModel, StagePart, causal_attention

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; annotations only


class RMSNorm(nn.Module):
    """``x / rms(x) · g``, computed in float32 as Hugging Face's LlamaRMSNorm does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Rotary(nn.Module):
    """Cosines and sines of the rotary angles ``t · θ^(-2i/hs)`` for t < T_max.

    The rotation pairs dimension ``i`` of a head with ``i + hs/2``
    (the "rotate half" layout of Hugging Face's Llama), not adjacent dimensions
    as Meta's reference code does, so q/k weights map to and from ``transformers``
    unpermuted (workers/models/hf.py).
    """

    def __init__(self, preset: ModelPreset) -> None:
        super().__init__()
        hs = preset.head_dim
        inv_freq = 1.0 / preset.rope_theta ** (torch.arange(0, hs, 2).float() / hs)  # (hs/2,)
        t = torch.arange(preset.max_seq_len).float()  # (T_max,)
        angles = torch.outer(t, inv_freq)  # (T_max, hs/2)
        angles = torch.cat([angles, angles], dim=-1)  # (T_max, hs): the two halves pair up
        # Not learned and not saved: rebuilt from the preset by every stage.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` (B, nh, T, hs) by its positions' angles."""
        T, half = x.shape[2], x.shape[3] // 2
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)  # (T, hs)
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (B, nh, T, hs)
        return x * cos + rotated * sin


class Attention(nn.Module):
    """Causal self-attention; ``nh / nkv`` query heads share each key/value head."""

    def __init__(self, preset: ModelPreset, rotary: Rotary) -> None:
        super().__init__()
        C, hs = preset.d_model, preset.head_dim
        self.num_heads, self.num_kv_heads = preset.num_heads, preset.num_kv_heads
        self.q = nn.Linear(C, self.num_heads * hs, bias=False)
        self.k = nn.Linear(C, self.num_kv_heads * hs, bias=False)
        self.v = nn.Linear(C, self.num_kv_heads * hs, bias=False)
        self.proj = nn.Linear(self.num_heads * hs, C, bias=False)
        self.rotary = rotary  # one table per stage, shared by its blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        nh, nkv = self.num_heads, self.num_kv_heads
        hs = C // nh
        q = self.q(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k(x).view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v(x).view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        q, k = self.rotary(q), self.rotary(k)
        if nkv != nh:
            # Query head j reads key/value head j // (nh / nkv), as Hugging Face's repeat_kv.
            k = k.repeat_interleave(nh // nkv, dim=1)  # (B, nh, T, hs)
            v = v.repeat_interleave(nh // nkv, dim=1)  # (B, nh, T, hs)
        return self.proj(causal_attention(q, k, v))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) · up(x))``."""

    def __init__(self, preset: ModelPreset) -> None:
        super().__init__()
        self.gate = nn.Linear(preset.d_model, preset.d_ff, bias=False)
        self.up = nn.Linear(preset.d_model, preset.d_ff, bias=False)
        self.down = nn.Linear(preset.d_ff, preset.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))  # (B, T, F) -> (B, T, C)


class Block(nn.Module):
    def __init__(self, preset: ModelPreset, rotary: Rotary) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(preset.d_model, preset.norm_eps)
        self.attn = Attention(preset, rotary)
        self.mlp_norm = RMSNorm(preset.d_model, preset.norm_eps)
        self.mlp = MLP(preset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(StageModel):
    """Blocks ``[first, last)`` of a Llama, with the embedding and/or the head.

    ``Llama(preset, seed=0)`` is the whole model. A pipeline stage is
    ``Llama(preset, seed=0, first=2, last=4, embed=False, head=True)``: its
    forward takes the hidden states ``(B, T, C)`` of the previous stage and
    returns logits ``(B, T, V)`` when it holds the head.
    """

    family = "llama"
    tied = False
    """The head is its own weight (unlike GPT-2's); nothing to keep equal across stages."""

    def __init__(self, preset: ModelPreset, *, seed: int, **part: Unpack[StagePart]) -> None:
        super().__init__(preset, **part)
        C, V = preset.d_model, preset.vocab_size
        self.tok_embeddings = nn.Embedding(V, C) if self.holds_embed else None
        rotary = Rotary(preset)
        self.blocks = nn.ModuleDict(
            {str(i): Block(preset, rotary) for i in range(self.first, self.last)}
        )
        self.norm = RMSNorm(C, preset.norm_eps) if self.holds_head else None
        self.output = nn.Linear(C, V, bias=False) if self.holds_head else None
        init_parameters(self, seed=seed, num_layers=preset.num_layers, kind_of=_param_kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)  # (B, T) token ids -> (B, T, C)
        for block in self.blocks.values():
            x = block(x)
        if self.norm is not None and self.output is not None:
            x = self.output(self.norm(x))  # (B, T, V)
        return x


def _param_kind(name: str) -> ParamKind:
    """Unit RMSNorm gains; residual projections (attention out, MLP down) scaled."""
    if name.endswith("norm.weight"):
        return "ones"
    if name.endswith(("attn.proj.weight", "mlp.down.weight")):
        return "residual"
    return "normal"


def piece_of_param(name: str) -> str:
    """The pipeline piece a parameter belongs to, by its global name.

    >>> [piece_of_param(n) for n in ("tok_embeddings.weight", "blocks.3.attn.q.weight",
    ...                              "norm.weight", "output.weight")]
    ['tok_embeddings', 'block3', 'norm', 'output']
    """
    if name.startswith("blocks."):
        return f"block{name.split('.')[1]}"
    piece = name.split(".", 1)[0]
    if piece not in ("tok_embeddings", "norm", "output"):
        raise HetschedError(f"model: {name!r} is not a parameter of the llama family")
    return piece
