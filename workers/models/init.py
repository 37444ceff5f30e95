"""Slicing-independent weight initialisation, shared by every model family.

Every parameter is drawn from its own generator, seeded by ``(seed, global
parameter name)``. A pipeline stage that builds only blocks 4..7 therefore
holds exactly the values the whole model would give those blocks, without
building the rest of it, and the same holds for any split.

The scheme is GPT-2's (Radford et al., 2019), which Llama trainers also use
(e.g. torchtitan, nanoGPT-style Llama ports): N(0, 0.02) weights, zero
biases, unit norm gains, and residual output projections scaled by
``1/sqrt(2·L)`` so the residual stream's variance does not grow with depth.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

INIT_STD = 0.02
"""GPT-2 initialisation; residual projections are further scaled by 1/sqrt(2·L)."""

ParamKind = Literal["ones", "zeros", "normal", "residual"]
"""How one parameter starts: norm gains at one, biases at zero, weights normal."""


def param_seed(seed: int, name: str) -> int:
    """One generator seed per (seed, global parameter name): slicing-independent init."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def init_parameters(
    model: nn.Module,
    *,
    seed: int,
    num_layers: int,
    kind_of: Callable[[str], ParamKind],
    global_name: Callable[[str], str] = lambda name: name,
) -> None:
    """Initialise ``model``'s parameters in place, each from its own generator.

    ``kind_of`` says how a parameter (by its name in ``model``) starts;
    ``global_name`` maps a stage-local name to the whole model's (a tied
    head's copy is named like the embedding it mirrors, so both start equal).
    Parameters on the ``meta`` device are left alone: a model built there only
    to count its parameters costs nothing, whatever its size.
    """
    residual_std = INIT_STD / math.sqrt(2 * num_layers)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.is_meta:
                continue
            kind = kind_of(name)
            if kind == "ones":
                param.fill_(1.0)
            elif kind == "zeros":
                param.zero_()
            else:
                std = residual_std if kind == "residual" else INIT_STD
                gen = torch.Generator().manual_seed(param_seed(seed, global_name(name)))
                values = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
                param.copy_(values.to(param.dtype))
