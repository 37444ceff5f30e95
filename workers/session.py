"""The entry point for training and profiling: Ray, the profile, a job's runs.

``hetsched simulate``, ``hetsched profile`` and the service's job runner train and
profile through these names (other commands and routes reach the modules they read
directly: datasets, checkpoint export, placement checks)::

    from workers.session import TrainJob, WorkerPool, profile_cluster, start_local_ray, train
    start_local_ray(cluster)
    pool = WorkerPool(cluster, simulated=True)       # warm workers, reused by every run
    cache_dir = Path(".hetsched/cache")
    profile = profile_cluster(cluster, preset, cache_dir=cache_dir, pool=pool)
    plan = make_plan(profile, 64, "dp")
    job = TrainJob(cluster=cluster, model=preset, steps=20, seed=0, cache_dir=cache_dir)
    result = train(job, plan, pool=pool)
    pool.shutdown()

:class:`RunBuilder` is the run both the service and the CLI start from a profile.

Simulated devices are paced against a host calibration cached under
``cache_dir``; give :func:`profile_cluster` and the :class:`TrainJob` the same
``cache_dir`` so that the two pace identically (the default is
:func:`workers.devices.calibration.default_cache_dir`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from scheduler.cost.profile import Profile
from scheduler.errors import HetschedError
from scheduler.hardware.catalogue import lookup
from scheduler.hardware.cluster import Cluster, Device, Links
from scheduler.hardware.faults import FaultSchedule
from scheduler.hardware.gpu_names import ProbedGpu, catalogue_key, parse_nvidia_smi
from scheduler.models.presets import ModelPreset, check_trainable
from scheduler.planning.plan import Plan
from scheduler.planning.planner import make_plan
from workers.checkpoint import CheckpointInfo, CheckpointStore, write_weights
from workers.cluster.actors import start_local_ray
from workers.cluster.pool import WorkerPool
from workers.data.dataset import open_dataset
from workers.devices.calibration import default_cache_dir
from workers.devices.pacing import no_pacing, pacing_margin, simulated_pacing
from workers.errors import WorkerError
from workers.models.hf import load_hf_directory
from workers.profiler import profile_cluster
from workers.records import DeviceStep, OptimizerConfig, Recovery, StepMetrics, TrainResult
from workers.run.config import Checkpointing, RunConfig, TrainJob, Validation, default_validation
from workers.run.hooks import NoHooks, Recorder, RunHooks
from workers.run.job import Job
from workers.run.replanning import LiveReplanning
from workers.runtime.spec import RankSpec, RunSpec, make_ranks

__all__ = [
    "CheckpointInfo",
    "CheckpointStore",
    "Checkpointing",
    "DeviceStep",
    "FaultSchedule",
    "LiveReplanning",
    "OptimizerConfig",
    "Recorder",
    "Recovery",
    "RunBuilder",
    "RunConfig",
    "RunHooks",
    "StepMetrics",
    "TrainJob",
    "TrainResult",
    "Validation",
    "WorkerError",
    "WorkerPool",
    "connect_ray",
    "default_cache_dir",
    "default_validation",
    "pacing_margin",
    "profile_cluster",
    "start_from_hf",
    "start_local_ray",
    "train",
]

DEFAULT_CONFIG = RunConfig()


def connect_ray(address: str) -> Cluster:
    """Attach to an existing Ray cluster and describe its GPUs as a Cluster.

    Each live node with GPUs becomes a node named by its IP address. Ray
    reports one accelerator type per node and only its model, so each node's
    driver is asked for every GPU's own name and memory (:func:`probe_gpus`),
    mapped to the catalogue by :func:`scheduler.hardware.gpu_names.catalogue_key`;
    device ``NODE/INDEX`` is the GPU of that physical index, which its worker
    is pinned to.
    """
    from workers.cluster.ray_connect import connect

    connect(address)  # token authentication checked, one line when it fails
    devices: list[Device] = []
    for info in sorted(ray.nodes(), key=lambda n: str(n.get("NodeManagerAddress"))):
        if not info.get("Alive") or int(info.get("Resources", {}).get("GPU", 0)) == 0:
            continue
        node = str(info["NodeManagerAddress"])
        for gpu in probe_gpus(str(info["NodeID"])):
            spec = lookup(catalogue_key(gpu.name, gpu.memory_mib))
            devices.append(
                Device(
                    id=f"{node}/{gpu.index}",
                    node=node,
                    index=gpu.index,
                    type=spec.key,
                    memory_gb=gpu.memory_mib / 1024,
                    peak_tflops=spec.peak_tflops,
                )
            )
    if not devices:
        raise WorkerError(f"ray-address: the Ray cluster at {address} has no GPU nodes")
    return Cluster(name=f"ray-{address}", devices=tuple(devices), links=Links())


def _nvidia_smi() -> str:
    result = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise WorkerError(f"nvidia-smi failed: {result.stderr.strip()[:200]}")
    return result.stdout


def probe_gpus(node_id: str) -> list[ProbedGpu]:
    """Every GPU of one Ray node as its driver reports it (a task that needs no GPU of its own)."""
    task = ray.remote(num_cpus=0)(_nvidia_smi).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    )
    try:
        return parse_nvidia_smi(ray.get(task.remote(), timeout=120))
    except (RayTaskError, GetTimeoutError) as exc:
        raise WorkerError(f"ray: cannot list the GPUs of node {node_id}: {exc}") from exc


def train(
    job: TrainJob,
    plan: Plan,
    *,
    pool: WorkerPool | None = None,
    config: RunConfig = DEFAULT_CONFIG,
    hooks: RunHooks | None = None,
    restore: CheckpointInfo | None = None,
    replan: Callable[[set[str]], Plan] | None = None,
) -> TrainResult:
    """Train ``job`` on ``plan`` up to the job's steps and return the losses and timings.

    One warm worker per active device of the plan (from ``pool``, or a temporary
    pool) joined into a fresh torch.distributed group, for every strategy
    (:class:`workers.run.driver.Run`); ``hooks`` hear of every step, checkpoint,
    recovery and re-plan in this thread, and ``hooks.should_stop`` is asked between
    steps. Raises :class:`WorkerError` naming the device on OOM, crash or a lost
    actor, within bounded time.

    With ``restore`` (a checkpoint of any plan) it goes on at the step after the
    checkpoint's. ``config`` says what else the job does (:class:`RunConfig`:
    checkpoints, validation, recovery from up to ``max_failures`` failures, live
    re-planning, injected faults); a recovery goes on from the last checkpoint on the
    plan ``replan(lost devices)`` returns (by default the same plan: a crashed worker
    is replaced, a lost device is not).
    """
    _check_run(job, plan, config)
    if not ray.is_initialized():
        if not job.simulated:
            raise WorkerError("ray: not connected; call connect_ray(address) first")
        start_local_ray(job.cluster)
    cache_dir = job.cache_dir or default_cache_dir()
    pacing_of = (
        simulated_pacing(job.cluster, job.model, cache_dir=cache_dir)
        if job.simulated
        else no_pacing
    )
    run_spec = RunSpec(
        preset=job.model,
        seed=job.seed,
        global_batch=plan.global_batch,
        optimizer=job.optimizer,
        dataset=job.dataset,
        simulated=job.simulated,
        dtype=job.dtype,
    )

    def ranks_of(plan: Plan) -> list[RankSpec]:
        return make_ranks(plan, preset=job.model, pacing_of=pacing_of, cache_dir=cache_dir)

    own_pool = pool is None
    pool = pool or WorkerPool(job.cluster, simulated=job.simulated)
    try:
        return Job(
            pool,
            run_spec=run_spec,
            plan=plan,
            steps=job.steps,
            ranks_of=ranks_of,
            replan=replan or (lambda lost: plan),
            config=config,
            hooks=hooks or NoHooks(),
            restore=restore,
        ).train()
    finally:
        if own_pool:
            pool.shutdown()


def _check_run(job: TrainJob, plan: Plan, config: RunConfig) -> None:
    """What fails the run anyway, said in one line before any worker starts."""
    model = job.model
    check_trainable(model)
    if config.validation is not None:  # a split too short for one sample
        open_dataset(job.dataset, seq_len=model.seq_len, vocab_size=model.vocab_size, split="val")
    for d in plan.devices:
        job.cluster.device(d.id)


SHAPE_FIELDS = (
    "family",
    "num_layers",
    "d_model",
    "num_heads",
    "num_kv_heads",
    "d_ff",
    "vocab_size",
    "max_seq_len",
    "norm_eps",
    "rope_theta",
    "gelu_approximate",
)
"""What a run's model must share with the weights it starts from (shapes and the functions)."""


def start_from_hf(
    directory: Path, *, model: ModelPreset, ref: str, uri: str, manifest: dict[str, Any]
) -> CheckpointInfo:
    """A Hugging Face directory's weights as a checkpoint of step -1 at ``uri``, for a
    run of ``model`` to start from (fresh optimizer state); ``ref`` names the
    directory in messages, as the caller's user gave it (``hf:NAME``)."""
    preset, state = load_hf_directory(directory, seq_len=model.seq_len)
    for dim in SHAPE_FIELDS:
        if getattr(preset, dim) != getattr(model, dim):
            raise HetschedError(
                f"init_from: {ref.removeprefix('hf:')} holds a model with {dim} "
                f"{getattr(preset, dim)}, the run's has {getattr(model, dim)}; "
                f"give the run model {ref!r}"
            )
    return write_weights(uri, state, manifest)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunBuilder:
    """The runs of one job and strategy on a measured profile, as the service's jobs and
    ``hetsched simulate`` both start theirs: its first plan, the plans a recovery
    makes on the devices still usable, and live re-planning when it follows speed."""

    job: TrainJob
    profile: Profile
    """The devices the run may use, measured."""
    strategy: str
    global_batch: int

    def plan(self, device_ids: Sequence[str] | None = None) -> Plan:
        """The plan on ``device_ids`` of the profile (default: every one)."""
        profile = self.profile if device_ids is None else self.profile.subset(list(device_ids))
        return make_plan(profile, self.global_batch, self.strategy)

    def config(
        self,
        *,
        checkpointing: Checkpointing | None,
        validation: Validation | None,
        max_failures: int,
        follow_speed: bool,
        faults: FaultSchedule | None = None,
    ) -> RunConfig:
        live = LiveReplanning(
            profile=self.profile, strategy=self.strategy, total_steps=self.job.steps
        )
        return RunConfig(
            checkpointing=checkpointing,
            validation=validation,
            max_failures=max_failures,
            live=live if follow_speed else None,
            faults=faults,
        )

    def train(
        self,
        plan: Plan,
        *,
        pool: WorkerPool,
        config: RunConfig,
        hooks: RunHooks,
        restore: CheckpointInfo | None = None,
    ) -> TrainResult:
        """Train ``plan``; a recovery re-plans on the devices not lost that ``hooks.claim``
        grants, and tells ``hooks.on_plan``."""

        def replan(lost: set[str]) -> Plan:
            candidates = [d.id for d in self.profile.devices if d.id not in lost]
            usable = hooks.claim(candidates)
            if not usable:
                raise HetschedError(
                    f"recovery: no usable device left (lost: {', '.join(sorted(lost))})"
                )
            new_plan = self.plan(usable)
            hooks.on_plan(new_plan)
            return new_plan

        return train(
            self.job, plan, pool=pool, config=config, hooks=hooks, restore=restore, replan=replan
        )
