"""One entry point for every model family: build a (slice of a) model, name its pieces.

The runtimes never name a class: :func:`build_model` dispatches on
``preset.family``, and a pipeline stage asks :func:`stage_pieces` which named
pieces it holds and :func:`piece_of_param` which piece a parameter is in, to
form one gradient all-reduce per set of holders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from scheduler.models.presets import ModelPreset
from workers.models import gpt, llama
from workers.models.stage import StagePart

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; annotations only


@dataclass(frozen=True, kw_only=True, slots=True)
class FamilySpec:
    """What the runtimes need to know about one model family."""

    build: Callable[..., nn.Module]
    embed_pieces: tuple[str, ...]
    """Pieces of the first stage, before its blocks."""
    head_pieces: tuple[str, ...]
    """Pieces of the last stage, after its blocks; a tied piece appears in both lists."""
    piece_of_param: Callable[[str], str]


FAMILIES: dict[str, FamilySpec] = {
    "gpt": FamilySpec(
        build=gpt.GPT,
        embed_pieces=("wte", "wpe"),
        head_pieces=("wte", "ln_f"),
        piece_of_param=gpt.piece_of_param,
    ),
    "llama": FamilySpec(
        build=llama.Llama,
        embed_pieces=("tok_embeddings",),
        head_pieces=("norm", "output"),
        piece_of_param=llama.piece_of_param,
    ),
}


def build_model(preset: ModelPreset, *, seed: int, **part: Unpack[StagePart]) -> nn.Module:
    """The ``part`` of ``preset``'s model: blocks ``[first, last)``, with the embedding
    and/or head (:class:`~workers.models.stage.StagePart`).

    ``build_model(preset, seed=0)`` is the whole model; build it under
    ``with torch.device("meta"):`` to count a 13B model's parameters for free.
    """
    return FAMILIES[preset.family].build(preset, seed=seed, **part)


def model_pieces(preset: ModelPreset) -> list[str]:
    """Every piece of the whole model, in forward order, each once.

    >>> from scheduler.models.presets import get_preset
    >>> model_pieces(get_preset("llama-tiny"))
    ['tok_embeddings', 'block0', 'block1', 'block2', 'block3', 'norm', 'output']
    """
    return stage_pieces(preset, layers=(0, preset.num_layers), is_first=True, is_last=True)


def stage_pieces(
    preset: ModelPreset, *, layers: tuple[int, int], is_first: bool, is_last: bool
) -> list[str]:
    """The pieces a pipeline stage holds, each once, in forward order.

    >>> from scheduler.models.presets import get_preset
    >>> stage_pieces(get_preset("gpt-tiny"), layers=(2, 4), is_first=False, is_last=True)
    ['block2', 'block3', 'wte', 'ln_f']

    =========  ==================================  =====================================
    family     first stage holds                   last stage holds
    =========  ==================================  =====================================
    gpt        ``wte``, ``wpe``                    ``wte`` (tied head copy), ``ln_f``
    llama      ``tok_embeddings``                  ``norm``, ``output`` (untied)
    =========  ==================================  =====================================

    Between them, every stage holds ``block{i}`` for its layer range.
    """
    spec = FAMILIES[preset.family]
    out = list(spec.embed_pieces) if is_first else []
    out += [f"block{i}" for i in range(*layers)]
    if is_last:
        out += spec.head_pieces
    return list(dict.fromkeys(out))


def piece_of_param(preset: ModelPreset, name: str) -> str:
    """The piece a parameter (by its global name) of ``preset``'s model belongs to."""
    return FAMILIES[preset.family].piece_of_param(name)
