"""A GPT you can read top to bottom, built from a scheduler model preset.

Follows nanoGPT (Karpathy, 2022) and GPT-2 (Radford et al., 2019): learned
token and position embeddings, pre-norm blocks of causal self-attention and a
GELU MLP, a final LayerNorm and a head tied to the token embedding.

Legend: B batch, T sequence length, C d_model, nh heads, hs head size, V vocabulary.
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


class CausalSelfAttention(nn.Module):
    def __init__(self, preset: ModelPreset) -> None:
        super().__init__()
        self.num_heads = preset.num_heads
        self.qkv = nn.Linear(preset.d_model, 3 * preset.d_model)
        self.proj = nn.Linear(preset.d_model, preset.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 × (B, T, C)
        hs = C // self.num_heads
        q = q.view(B, T, self.num_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.num_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.num_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        return self.proj(causal_attention(q, k, v))


class MLP(nn.Module):
    def __init__(self, preset: ModelPreset) -> None:
        super().__init__()
        self.fc = nn.Linear(preset.d_model, preset.d_ff)
        self.proj = nn.Linear(preset.d_ff, preset.d_model)
        self.approximate = preset.gelu_approximate  # GPT-2's checkpoints use "tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate=self.approximate))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, preset: ModelPreset) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(preset.d_model, eps=preset.norm_eps)
        self.attn = CausalSelfAttention(preset)
        self.ln_2 = nn.LayerNorm(preset.d_model, eps=preset.norm_eps)
        self.mlp = MLP(preset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Embedding(nn.Module):
    def __init__(self, preset: ModelPreset) -> None:
        super().__init__()
        self.wte = nn.Embedding(preset.vocab_size, preset.d_model)
        self.wpe = nn.Embedding(preset.max_seq_len, preset.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)  # (T,)
        return self.wte(idx) + self.wpe(pos)  # (B, T, C)


class Head(nn.Module):
    """Final LayerNorm and the output projection (weight shaped like ``wte``)."""

    def __init__(self, preset: ModelPreset) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(preset.d_model, eps=preset.norm_eps)
        self.weight = nn.Parameter(torch.empty(preset.vocab_size, preset.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln_f(x), self.weight)  # (B, T, V)


class GPT(StageModel):
    """Blocks ``[first, last)`` of a GPT, with the embedding and/or the head.

    ``GPT(preset, seed=0)`` is the whole model. A pipeline stage is
    ``GPT(preset, seed=0, first=2, last=4, embed=False, head=True)``: its
    forward takes the hidden states ``(B, T, C)`` of the previous stage and
    returns logits ``(B, T, V)`` when it holds the head.

    The whole model (embedding and head on one device) ties
    ``head.weight`` to ``embed.wte.weight``, as GPT-2 does. A stage that holds the
    head but not the embedding gets its own copy of the embedding weight,
    initialised identically; the pipeline runtime sums the two copies' gradients
    between first and last stage so they stay equal.
    """

    family = "gpt"

    def __init__(self, preset: ModelPreset, *, seed: int, **part: Unpack[StagePart]) -> None:
        super().__init__(preset, **part)
        self.embed = Embedding(preset) if self.holds_embed else None
        self.blocks = nn.ModuleDict({str(i): Block(preset) for i in range(self.first, self.last)})
        self.head = Head(preset) if self.holds_head else None
        init_parameters(
            self,
            seed=seed,
            num_layers=preset.num_layers,
            kind_of=_param_kind,
            global_name=_global_name,
        )
        if self.embed is not None and self.head is not None:
            self.head.weight = self.embed.wte.weight  # tied, as in GPT-2

    @property
    def tied(self) -> bool:
        return self.embed is not None and self.head is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)  # (B, T) token ids -> (B, T, C)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(x)  # (B, T, V)
        return x


def _global_name(name: str) -> str:
    """The head's weight is named like the token embedding, so an untied head copy
    starts from the same values as the embedding it mirrors."""
    return "embed.wte.weight" if name == "head.weight" else name


def _param_kind(name: str) -> ParamKind:
    """GPT-2 init (workers/models/init.py): unit LayerNorm gains, zero biases, scaled residuals."""
    leaf = name.rsplit(".", 1)[-1]
    if ".ln_" in f".{name}" or "ln_f" in name:
        return "ones" if leaf == "weight" else "zeros"
    if leaf == "bias":
        return "zeros"
    return "residual" if name.endswith("proj.weight") else "normal"


def lm_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed token cross-entropy: logits (B, T, V), targets (B, T) -> scalar.

    Dividing by ``global_batch · seq_len`` on every device and SUM-reducing the
    gradients gives the full-batch mean (DESIGN.md, Correctness).
    """
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum"
    )


def piece_of_param(name: str) -> str:
    """The pipeline piece a parameter belongs to, by its global name.

    The tied head and the token embedding are one piece, ``wte``: the first and
    the last stage each hold a copy and sum their gradients.

    >>> [piece_of_param(n) for n in ("embed.wte.weight", "head.weight", "embed.wpe.weight",
    ...                              "blocks.3.mlp.fc.bias", "head.ln_f.weight")]
    ['wte', 'wte', 'wpe', 'block3', 'ln_f']
    """
    if name in ("embed.wte.weight", "head.weight"):
        return "wte"
    if name.startswith("embed."):
        return "wpe"
    if name.startswith("blocks."):
        return f"block{name.split('.')[1]}"
    if name.startswith("head.ln_f."):
        return "ln_f"
    raise HetschedError(f"model: {name!r} is not a parameter of the gpt family")
