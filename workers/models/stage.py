"""What every family's model shares: a stage is blocks ``[first, last)`` of one preset."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from scheduler.errors import HetschedError
from scheduler.models.presets import ModelPreset


class StageModel(nn.Module):
    """Base of :class:`workers.models.gpt.GPT` and :class:`workers.models.llama.Llama`.

    Owns the preset and the checked block range ``[first, last)`` the stage holds;
    the subclass builds its embedding, blocks and head. The blocks are kept under
    their global index (``blocks["3"]``), the embedding and the head are optional,
    and every parameter is initialised from its own generator seeded by ``(seed,
    global parameter name)`` (:mod:`workers.models.init`), so a stage holds exactly
    the weights the whole model would have, whatever the slicing, without building
    the whole model.
    """

    family: ClassVar[str]
    """The preset family this class builds (``ModelPreset.family``)."""

    def __init__(self, preset: ModelPreset, *, first: int, last: int | None) -> None:
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

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
