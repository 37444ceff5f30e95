"""Mixed precision for every runtime: autocast compute, fp32 master state, dynamic loss scaling.

A rank trains in the precision its plan entry names (:attr:`RankSpec.precision`):

- ``fp32``: everything in the run's dtype (fp32, or fp64 for exactness checks).
- ``bf16``: forward and backward under ``torch.autocast`` with bfloat16 (CPU
  autocast runs it for real; on CUDA ``device_type="cuda"``). Parameters,
  their ``.grad`` and AdamW's moments stay fp32: autocast casts each weight
  per operation, and the cast's backward returns an fp32 gradient, so the
  all-reduce sums fp32 gradients (Micikevicius et al., "Mixed Precision
  Training", ICLR 2018, §3.1, master weights).
- ``fp16``: the same with float16 (CPU autocast runs float16 on torch 2.13 too;
  the simulation computes fp16 for real), plus dynamic loss scaling
  (:class:`LossScaler`, §3.2 of that paper; the update rule of
  ``torch.amp.GradScaler``): the loss is multiplied by ``S`` before backward,
  the summed gradients divided by it before the update; a step whose summed
  gradients hold an inf or a NaN is skipped on every rank and ``S`` halves;
  after ``growth_interval`` good steps in a row ``S`` doubles.

Agreement: every rank must skip the same steps and hold the same ``S``, or the
replicas drift apart. :func:`agree_overflow` all-reduces one inf/nan flag (MAX)
over the whole job's group, which pipelines and sharded runtimes call; a
data-parallel rank needs no extra collective, because its SUM all-reduce of the
gradients already is one (:func:`nonfinite`: inf or NaN in any rank's summand
makes the sum non-finite on every rank). Every rank starts from the same
``S``, sees the same verdicts and applies the same rule, so ``S`` stays identical;
it is saved with the checkpoint (:meth:`LossScaler.state`), so a resumed job
continues it. When any rank of a run trains in fp16 every rank scales its loss
(a bf16 or fp32 rank's gradients must carry the same ``S`` to be summed with it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
INITIAL_SCALE = 2.0**16
"""``torch.amp.GradScaler``'s default starting scale."""
GROWTH_INTERVAL = 2000
"""Good steps in a row before the scale doubles (``GradScaler``'s default)."""
MIN_SCALE = 2.0**-24
"""Smallest scale: below it, an overflow is not the scale's fault (the smallest fp16 subnormal)."""


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The context forward passes run in: autocast to bf16/fp16, nothing for fp32."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def nonfinite(tensors: Iterable[torch.Tensor | None]) -> bool:
    """Whether any of ``tensors`` holds an inf or a NaN."""
    return any(t is not None and not bool(torch.isfinite(t).all()) for t in tensors)


def agree_overflow(local: bool, *, device: torch.device, group: Any = None) -> bool:
    """One all-reduce (MAX) of this rank's inf/nan flag over ``group`` (default: the
    job's whole group): True on every rank when any rank overflowed."""
    flag = torch.tensor([1.0 if local else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item() > 0)


@dataclass(kw_only=True, slots=True)
class LossScaler:
    """Dynamic loss scaling, identical on every rank of a run.

    Owns the scale ``S`` and the count of good steps since it last changed; does
    nothing (``S = 1``, never skips) when ``enabled`` is False.
    """

    enabled: bool
    scale: float = INITIAL_SCALE
    good_steps: int = 0
    growth_interval: int = GROWTH_INTERVAL
    skipped: int = 0
    """Steps skipped for an overflow in this run (reported, not checkpointed)."""

    def __post_init__(self) -> None:
        if not self.enabled:
            self.scale = 1.0

    def update(self, overflow: bool) -> bool:
        """Apply the rule after a step's verdict (the same on every rank); True when the
        step's update must be skipped."""
        if not self.enabled:
            return False
        if overflow:
            self.scale = max(self.scale / 2, MIN_SCALE)
            self.good_steps = 0
            self.skipped += 1
            return True
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= 2
            self.good_steps = 0
        return False

    def unscale(self, grads: Iterable[torch.Tensor | None], scale: float) -> None:
        """Divide the summed gradients by the ``scale`` their losses were multiplied by."""
        if not self.enabled or scale == 1.0:
            return
        for g in grads:
            if g is not None:
                g.div_(scale)

    def state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps (as tensors, beside the model's)."""
        return {
            "scale": torch.tensor(self.scale, dtype=torch.float64),
            "good_steps": torch.tensor(self.good_steps, dtype=torch.int64),
        }

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Continue a checkpoint's scale; a run without scaling ignores it, and one
        with scaling that starts from a checkpoint without it starts afresh."""
        if self.enabled and "scale" in state:
            self.scale = float(state["scale"])
            self.good_steps = int(state["good_steps"])


def needs_loss_scaling(precisions: Iterable[str]) -> bool:
    """A run scales its losses when any of its ranks computes in fp16."""
    return "fp16" in set(precisions)
