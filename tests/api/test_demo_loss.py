"""The README's first demo trains smoothly: ``hetsched submit --model gpt-tiny
--global-batch 32 --steps 50`` (seed 0) with the service's default optimizer.

Without gradient clipping by default, its loss went from 3.2 to 7.96 at step 19
and back a step later: a few batches of the default corpus give a gradient norm
a hundred times the usual (0.3 -> 20 to 140), and AdamW (beta2 0.95) turns such
a spike into a step of about half the learning rate on every parameter at once,
for several steps. The run here is the job's: its spec's defaults, the model,
data order and AdamW settings the runtime uses, and the runtime's own update
(:meth:`workers.runtime.engine.Engine.update`: schedule, clipping, step) on one
device, which every split reproduces (DESIGN.md, "Same training, whatever the split").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from api.schemas.jobs import JobCreate
from scheduler.models.presets import get_preset
from workers.data.dataset import ByteDataset
from workers.models.gpt import GPT, lm_loss_sum
from workers.records import OptimizerConfig
from workers.runtime.engine import Engine


@dataclass
class _Run:
    optimizer: OptimizerConfig


@dataclass
class _OneDevice:
    """What :meth:`Engine.update` reads from a rank: the run, its model and optimizer."""

    run: _Run
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def grad_sq_norm(self) -> float:
        return float(sum(p.grad.double().pow(2).sum() for p in self.model.parameters()))


def test_the_default_demo_loss_never_rises_above_its_first_value() -> None:
    spec = JobCreate.model_validate({"model": "gpt-tiny", "global_batch": 32, "steps": 50})
    config = OptimizerConfig(**spec.optimizer.model_dump())  # as the job runner builds it
    preset = get_preset("gpt-tiny")
    torch.set_num_threads(1)
    model = GPT(preset, seed=spec.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        weight_decay=config.weight_decay,
    )
    rank = _OneDevice(run=_Run(optimizer=config), model=model, optimizer=optimizer)
    data = ByteDataset(None, seq_len=preset.seq_len)
    losses = []
    for step in range(spec.steps):
        x, y = data.device_batch(seed=spec.seed, step=step, global_batch=32, offset=0, samples=32)
        optimizer.zero_grad()
        loss = lm_loss_sum(model(x), y) / (32 * preset.seq_len)
        loss.backward()
        Engine.update(rank, step)  # type: ignore[arg-type]
        losses.append(float(loss))
    assert all(math.isfinite(v) for v in losses)
    worst = max(range(1, len(losses)), key=lambda i: losses[i])
    assert losses[worst] < losses[0], f"step {worst}: loss {losses[worst]:.2f} > {losses[0]:.2f}"
    assert losses[-1] < 3.6  # and it still learns: 5.5 untrained, about 3.2 after 50 steps
