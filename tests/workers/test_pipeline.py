"""Pipeline runtime on simulated devices: the same training as one device, whatever the stages."""

from __future__ import annotations

import pytest

from scheduler.hardware.cluster import Cluster
from scheduler.planning.plan import DevicePlan, Plan
from tests.reference import single_device_losses as reference_losses
from tests.support import TINY, make_cluster, pipeline_stage, plan_of, tiny_job
from workers.runtime.stages import ordered_stages, sync_groups
from workers.session import OptimizerConfig, WorkerError, WorkerPool, train

pytestmark = pytest.mark.usefixtures("local_ray")

CLUSTER = make_cluster(["A100-80GB", "A100-80GB", "A100-80GB"])
SMALL = make_cluster(["A100-80GB", "A100-40GB"], memory_scale=0.0003)
"""Under this memory scale the 40 GB device cannot hold gpt-tiny's states and activations."""
OPT = OptimizerConfig()
SEED, STEPS, BATCH = 3, 3, 12


def single_device_losses(config: OptimizerConfig = OPT) -> list[float]:
    """Full-batch training in this process: what every plan must reproduce."""
    return reference_losses(TINY, config, seed=SEED, steps=STEPS, global_batch=BATCH)


PP = plan_of(
    "pp",
    [
        pipeline_stage("a/0", samples=12, num_micro_batches=4, layers=(0, 1), stage=0),
        pipeline_stage("a/1", samples=12, num_micro_batches=4, layers=(1, 3), stage=1),
        pipeline_stage("a/2", samples=12, num_micro_batches=4, layers=(3, 4), stage=2),
    ],
)
HYBRID = plan_of(
    "hybrid",
    [  # a two-stage pipeline with 7 samples, a one-stage one with 5
        pipeline_stage("a/0", samples=7, num_micro_batches=3, layers=(0, 2), stage=0),
        pipeline_stage("a/1", samples=7, num_micro_batches=3, layers=(2, 4), stage=1),
        pipeline_stage(
            "a/2", samples=5, offset=7, num_micro_batches=2, layers=(0, 4), stage=0, pipeline=1
        ),
    ],
)


def test_sync_groups_pair_the_holders_of_each_piece():
    groups = dict((pieces, ranks) for ranks, pieces in sync_groups(ordered_stages(HYBRID), TINY))
    # tied embedding: a/0 (embedding), a/1 (head copy), a/2 (both)
    assert groups[("wte",)] == (0, 1, 2)
    assert groups[("wpe", "block0", "block1")] == (0, 2)
    assert groups[("block2", "block3", "ln_f")] == (1, 2)
    assert sync_groups(ordered_stages(PP), TINY) == [((0, 2), ("wte",))]


@pytest.fixture(scope="module")
def pool(mixed_pool: WorkerPool) -> WorkerPool:
    """The shared warm workers, ``mixed_pool``, which serve this module's clusters too."""
    return mixed_pool


def _train(
    plan: Plan,
    cache_dir,
    pool,
    *,
    cluster: Cluster = CLUSTER,
    steps: int = STEPS,
    seed: int = SEED,
    optimizer: OptimizerConfig = OPT,
):
    """``plan`` on the module's pool and cluster (or ``cluster``): STEPS steps from SEED
    unless told otherwise."""
    job = tiny_job(cluster, cache_dir, steps=steps, seed=seed, optimizer=optimizer)
    return train(job, plan, pool=pool)


@pytest.mark.parametrize("plan", [PP, HYBRID], ids=["pp", "hybrid"])
def test_pipeline_loss_curve_equals_single_device_training(plan: Plan, cache_dir, pool):
    result = _train(plan, cache_dir, pool)
    assert result.steps_done == STEPS
    assert result.losses == pytest.approx(single_device_losses(), rel=1e-4)
    assert {d.id for d in result.devices} == {d.id for d in plan.devices}
    for d in result.devices:
        assert d.busy_s > 0 and d.peak_bytes > 0


SCHEDULED = OptimizerConfig(lr=3e-3, warmup_steps=1, decay_steps=STEPS, grad_clip=0.3)
DP_SPLIT = plan_of(
    "dp",
    [
        DevicePlan(id="a/0", samples=7, micro_batch=4, accum_steps=2, busy_s=0, peak_bytes=0),
        DevicePlan(
            id="a/2", samples=5, micro_batch=5, accum_steps=1, busy_s=0, peak_bytes=0, offset=7
        ),
    ],
)


@pytest.mark.parametrize("plan", [DP_SPLIT, HYBRID], ids=["dp", "hybrid"])
def test_warmup_cosine_decay_and_clipping_train_the_same_whatever_the_split(plan, cache_dir, pool):
    """The global norm is summed over every device and stage, so clipping is the same."""
    want = single_device_losses(SCHEDULED)
    assert want != pytest.approx(single_device_losses(), rel=1e-4), "the settings change training"
    result = _train(plan, cache_dir, pool, optimizer=SCHEDULED)
    assert result.losses == pytest.approx(want, rel=1e-4)


def test_broken_pipeline_is_a_one_line_error(cache_dir, pool):
    gap = plan_of(
        "pp",
        [
            pipeline_stage("a/0", samples=12, num_micro_batches=2, layers=(0, 1), stage=0),
            pipeline_stage("a/1", samples=12, num_micro_batches=2, layers=(2, 4), stage=1),
        ],
    )
    job = tiny_job(CLUSTER, cache_dir, steps=1, seed=0)
    with pytest.raises(WorkerError, match="a/0 ends at block 1 but the next stage a/1 starts"):
        train(job, gap, pool=pool)


def _one_pace(profile):
    """``profile`` with ``a/1`` timed as ``a/0`` was: one chip (A100) and one model, so
    the planner's choice turns on memory alone, not on how busy the host was while each
    device was profiled (the pipeline once left ``a/1`` out, measured slow beside another
    test process)."""
    from dataclasses import replace

    def bytes_of(d):
        pieces = (d, d.layers.embed, d.layers.block, d.layers.head)
        return [(p.static_bytes, p.per_sample_bytes) for p in pieces]

    big, small = profile.device("a/0"), profile.device("a/1")
    assert bytes_of(big) == bytes_of(small), "what is copied below is times, not memory"
    paced = replace(
        big,
        id=small.id,
        node=small.node,
        type=small.type,
        capacity_bytes=small.capacity_bytes,
        micro_batch_limit=small.micro_batch_limit,
    )
    return replace(profile, devices=(big, paced))


def test_pp_trains_on_devices_that_cannot_hold_the_model(cache_dir, pool):
    """The 40 GB device cannot hold gpt-tiny's states and activations under this memory
    scale: dp without recomputation leaves it idle; the pipeline planner gives it a stage
    and the run stays within its memory."""
    from scheduler.planning.planner import make_plan
    from workers.session import profile_cluster

    profile = _one_pace(profile_cluster(SMALL, TINY, cache_dir=cache_dir, pool=pool))
    assert all(d.layers is not None for d in profile.devices)
    dp = make_plan(profile.without_recompute(), 8, "dp")
    assert [e.id for e in dp.excluded] == ["a/1"]
    pp = make_plan(profile, 8, "pp")
    assert {d.id for d in pp.active} == {"a/0", "a/1"}
    result = _train(pp, cache_dir, pool, cluster=SMALL, steps=2, seed=1)
    assert result.steps_done == 2 and result.losses[1] < result.losses[0]
    for d in result.devices:
        assert d.peak_bytes <= profile.device(d.id).capacity_bytes


def test_stage_out_of_memory_names_the_device(cache_dir, pool):
    crowded = plan_of(
        "pp",
        [  # three blocks and the head do not fit 12.9 MB
            pipeline_stage("a/0", samples=12, num_micro_batches=2, layers=(0, 1), stage=0),
            pipeline_stage("a/1", samples=12, num_micro_batches=2, layers=(1, 4), stage=1),
        ],
    )
    with pytest.raises(WorkerError, match=r"a/1: out of memory: micro-batch \d+ needs"):
        _train(crowded, cache_dir, pool, cluster=SMALL, steps=1, seed=0)
