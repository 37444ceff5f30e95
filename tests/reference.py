"""Training on one device in the test's own process: the reference every split must match.

Kept apart from :mod:`tests.support` because it imports torch.
"""

from __future__ import annotations

import torch

from scheduler.models.presets import ModelPreset
from workers.data.dataset import ByteDataset
from workers.models.gpt import GPT, lm_loss_sum
from workers.records import OptimizerConfig


def single_device_losses(
    config: ModelPreset, optimizer: OptimizerConfig, *, seed: int, steps: int, global_batch: int
) -> list[float]:
    """Each step's loss of :func:`single_device_training`."""
    return single_device_training(
        config, optimizer, seed=seed, steps=steps, global_batch=global_batch
    )[1]


def single_device_training(
    config: ModelPreset,
    optimizer: OptimizerConfig,
    *,
    seed: int,
    steps: int,
    global_batch: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[GPT, list[float]]:
    """Full-batch AdamW on the bundled corpus, as the runtime schedules and clips it, in
    ``dtype``: the trained model and each step's loss."""
    model = GPT(config, seed=seed).to(dtype)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=optimizer.lr,
        betas=(optimizer.beta1, optimizer.beta2),
        weight_decay=optimizer.weight_decay,
    )
    data = ByteDataset(None, seq_len=config.seq_len)
    losses = []
    for step in range(steps):
        x, y = data.device_batch(
            seed=seed, step=step, global_batch=global_batch, offset=0, samples=global_batch
        )
        opt.zero_grad()
        loss = lm_loss_sum(model(x), y) / (global_batch * config.seq_len)
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = optimizer.lr_at(step)
        if optimizer.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), optimizer.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
    return model, losses
