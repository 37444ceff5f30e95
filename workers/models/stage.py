"""What every family's model shares: a stage is blocks ``[first, last)`` of one preset,
with or without the embedding and the head; attention is causal, over heads.

Legend: B batch, T sequence length, C d_model, nh heads, hs head size.
"""

from __future__ import annotations

from typing import ClassVar, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from scheduler.errors import HetschedError
from scheduler.models.presets import ModelPreset


class StagePart(TypedDict, total=False):
    """Which part of a model a stage holds, as keywords of :class:`StageModel` and
    :func:`workers.models.families.build_model`; none given: the whole model."""

    first: int
    """First block (default 0)."""
    last: int | None
    """One past the last block (default None: the preset's last)."""
    embed: bool
    """Whether it holds the embedding (default True)."""
    head: bool
    """Whether it holds the head (default True)."""


class StageModel(nn.Module):
    """Base of :class:`workers.models.gpt.GPT` and :class:`workers.models.llama.Llama`.

    Owns the preset, the checked block range ``[first, last)`` the stage holds and
    whether it holds the embedding and the head (:class:`StagePart`; the defaults are
    this constructor's); the subclass builds its embedding, blocks and head. The blocks
    are kept under their global index (``blocks["3"]``), and every parameter is
    initialised from its own generator seeded by ``(seed, global parameter name)``
    (:mod:`workers.models.init`), so a stage holds exactly the weights the whole model
    would have, whatever the slicing, without building the whole model.
    """

    family: ClassVar[str]
    """The preset family this class builds (``ModelPreset.family``)."""

    def __init__(
        self,
        preset: ModelPreset,
        *,
        first: int = 0,
        last: int | None = None,
        embed: bool = True,
        head: bool = True,
    ) -> None:
        super().__init__()
        if preset.family != self.family:
            raise HetschedError(
                f"model: {preset.name} is a {preset.family} preset; build it with "
                "workers.models.families.build_model"
            )
        last = preset.num_layers if last is None else last
        if not 0 <= first <= last <= preset.num_layers:
            raise HetschedError(
                f"layers: [{first}, {last}) is not a block range of {preset.name} "
                f"(0..{preset.num_layers})"
            )
        self.preset = preset
        self.first, self.last = first, last
        self.holds_embed, self.holds_head = embed, head

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Each position attends to itself and the positions before it, in every head: queries,
    keys and values ``(B, nh, T, hs)`` to the heads' outputs side by side, ``(B, T, C)``."""
    B, nh, T, hs = q.shape
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
    return y.transpose(1, 2).contiguous().view(B, T, nh * hs)  # (B, T, C)
