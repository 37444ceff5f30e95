"""Validation loss on the held-out split: the same figure whatever the plan."""

from __future__ import annotations

import pytest
import torch

from tests.support import TINY, make_cluster, manual_plan, pipeline_stage, plan_of, tiny_job
from workers.data.dataset import ByteDataset
from workers.models.gpt import GPT, lm_loss_sum
from workers.session import (
    OptimizerConfig,
    Recorder,
    RunConfig,
    Validation,
    WorkerError,
    WorkerPool,
    default_validation,
    train,
)

CLUSTER = make_cluster(["A100-80GB", "A100-80GB", "A100-80GB"])
SEED, STEPS, BATCH, VAL_BATCHES = 2, 3, 12, 2
EVERY = 2
"""Evaluated after steps 1 and 2 (the last)."""


PLANS = {
    "dp": manual_plan([("a/0", 7, 4), ("a/1", 5, 5)]),
    "even": manual_plan([("a/0", 4, 2), ("a/1", 4, 4), ("a/2", 4, 3)], strategy="even"),
    "proportional": manual_plan([("a/0", 9, 3), ("a/1", 0, 1), ("a/2", 3, 3)], strategy="dp"),
    "pp": plan_of(
        "pp",
        [
            pipeline_stage("a/0", samples=12, num_micro_batches=4, layers=(0, 1), stage=0),
            pipeline_stage("a/1", samples=12, num_micro_batches=4, layers=(1, 3), stage=1),
            pipeline_stage("a/2", samples=12, num_micro_batches=4, layers=(3, 4), stage=2),
        ],
    ),
    "hybrid": plan_of(
        "hybrid",
        [
            pipeline_stage("a/0", samples=7, num_micro_batches=3, layers=(0, 2), stage=0),
            pipeline_stage("a/1", samples=7, num_micro_batches=3, layers=(2, 4), stage=1),
            pipeline_stage(
                "a/2", samples=5, offset=7, num_micro_batches=2, layers=(0, 4), stage=0, pipeline=1
            ),
        ],
    ),
}


def single_device_val_losses() -> dict[int, float]:
    """Full-batch training in this process, evaluated on every validation window after
    steps 1 and 2: what every plan must report."""
    model = GPT(TINY, seed=SEED).double()
    c = OptimizerConfig()  # what the job trains with
    opt = torch.optim.AdamW(
        model.parameters(), lr=c.lr, betas=(c.beta1, c.beta2), weight_decay=c.weight_decay
    )
    train_data = ByteDataset(None, seq_len=TINY.seq_len)
    val = ByteDataset(None, seq_len=TINY.seq_len, split="val")
    n = VAL_BATCHES * BATCH
    vx, vy = val.device_batch(seed=99, step=7, global_batch=n, offset=0, samples=n)
    out = {}
    for step in range(STEPS):
        x, y = train_data.device_batch(
            seed=SEED, step=step, global_batch=BATCH, offset=0, samples=BATCH
        )
        opt.zero_grad()
        (lm_loss_sum(model(x), y) / (BATCH * TINY.seq_len)).backward()
        opt.step()
        if step >= 1:
            with torch.no_grad():
                out[step] = float(lm_loss_sum(model(vx), vy)) / vy.numel()
    return out


@pytest.fixture(scope="module")
def reference() -> dict[int, float]:
    return single_device_val_losses()


@pytest.fixture(scope="module")
def pool(mixed_pool: WorkerPool) -> WorkerPool:
    """Warm workers shared by every run here, as the service keeps them: the shared
    ``mixed_pool``, which serves this module's cluster too."""
    return mixed_pool


@pytest.mark.parametrize("name", list(PLANS))
def test_validation_loss_is_the_same_whatever_the_split(name: str, reference, pool, cache_dir):
    hooks = Recorder()
    job = tiny_job(CLUSTER, cache_dir, steps=STEPS, seed=SEED, dtype="float64")
    result = train(
        job,
        PLANS[name],
        pool=pool,
        config=RunConfig(validation=Validation(every_steps=EVERY, batches=VAL_BATCHES)),
        hooks=hooks,
    )
    # due after every second step and after the last one; None on the others
    assert [m.val_loss is None for m in hooks.steps] == [True, False, False]
    assert result.val_losses == pytest.approx(reference, rel=1e-5)
    # the held-out split is not the training data: its loss is not the training loss
    assert all(result.val_losses[s] != pytest.approx(result.losses[s], rel=1e-3) for s in (1, 2))


def test_default_validation_is_a_tenth_of_the_job_and_off_for_short_ones():
    assert default_validation(100) == Validation(every_steps=10)
    assert default_validation(25).every_steps == 3
    assert default_validation(19) is None
    assert default_validation(19, every=4, batches=2) == Validation(every_steps=4, batches=2)
    assert default_validation(100, every=0) is None
    with pytest.raises(WorkerError, match="val_batches: must be >= 1"):
        Validation(every_steps=1, batches=0)


def test_a_held_out_split_too_short_is_one_line_before_training(tmp_path, pool, cache_dir):
    text = tmp_path / "short.txt"
    text.write_bytes(b"x" * 400)  # 5 % held out: 20 tokens, a sample needs 65
    with pytest.raises(Exception, match=r"dataset: the val split of short.txt has 20 tokens"):
        train(
            tiny_job(CLUSTER, cache_dir, steps=1, seed=0, dataset=text),
            manual_plan([("a/0", 2, 2)]),
            pool=pool,
            config=RunConfig(validation=Validation(every_steps=1)),
        )
