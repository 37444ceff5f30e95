"""The one entry point of the workers: Ray, profiling and training.

``hetsched simulate``, ``hetsched profile`` and the API's job executor call
only these names::

    from workers.session import WorkerPool, start_local_ray, profile_cluster, train
    start_local_ray(cluster)
    pool = WorkerPool(cluster, simulated=True)       # warm workers, reused by every run
    profile = profile_cluster(cluster, preset, cache_dir=Path(".hetsched/cache"), pool=pool)
    plan = make_plan(profile, 64, "dp")
    result = train(cluster=cluster, model=preset, plan=plan, steps=20, seed=0, pool=pool)
    pool.shutdown()

Simulated devices are paced against a host calibration cached under
``cache_dir``; pass the same ``cache_dir`` to :func:`profile_cluster` and
:func:`train` so that the two pace identically (the default is
:func:`workers.devices.calibration.default_cache_dir`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from scheduler.cost.profile import Profile
from scheduler.hardware.catalogue import lookup
from scheduler.hardware.cluster import Cluster, Device, Links
from scheduler.hardware.faults import FaultSchedule
from scheduler.hardware.gpu_names import ProbedGpu, catalogue_key, parse_nvidia_smi
from scheduler.models.presets import ModelPreset, check_trainable
from scheduler.planning.plan import Plan
from scheduler.replan.decision import ReplanDecision
from workers.checkpoint import CheckpointInfo, CheckpointStore, write_weights
from workers.cluster.actors import start_local_ray
from workers.cluster.pool import WorkerPool
from workers.data.dataset import open_dataset
from workers.devices.calibration import default_cache_dir
from workers.devices.pacing import no_pacing, pacing_margin, simulated_pacing
from workers.errors import WorkerError
from workers.profiler import profile_devices
from workers.records import DeviceStep, OptimizerConfig, StepMetrics, TrainResult
from workers.run.driver import Checkpointing, Validation, default_validation
from workers.run.faults import FaultInjector
from workers.run.job import Recovery, train_job
from workers.run.replanning import LiveReplanning, Replanner
from workers.runtime.spec import RankSpec, RunSpec, make_ranks

__all__ = [
    "CheckpointInfo",
    "CheckpointStore",
    "Checkpointing",
    "FaultSchedule",
    "LiveReplanning",
    "Recovery",
    "DeviceStep",
    "OptimizerConfig",
    "StepMetrics",
    "TrainResult",
    "Validation",
    "WorkerError",
    "WorkerPool",
    "connect_ray",
    "default_validation",
    "pacing_margin",
    "profile_cluster",
    "start_local_ray",
    "train",
    "write_weights",
]

DEFAULT_OPTIMIZER = OptimizerConfig()


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


def profile_cluster(
    cluster: Cluster,
    model: ModelPreset,
    *,
    device_ids: list[str] | None = None,
    cache_dir: Path,
    refresh: bool = False,
    simulated: bool = True,
    layers: Any = "auto",
    pool: WorkerPool | None = None,
) -> Profile:
    """Measure each device (cached) and return the profile of DESIGN.md.

    ``layers``: per-layer figures for pipeline planning; ``"auto"`` measures
    them, ``None`` skips them (see :func:`workers.profiler.profile_devices`).
    """
    check_trainable(model)
    return profile_devices(
        cluster,
        model,
        device_ids=device_ids,
        cache_dir=cache_dir,
        refresh=refresh,
        simulated=simulated,
        layers=layers,
        pool=pool,
    )


def train(
    *,
    cluster: Cluster,
    model: ModelPreset,
    plan: Plan,
    steps: int,
    seed: int,
    dataset: Path | None = None,
    optimizer: OptimizerConfig = DEFAULT_OPTIMIZER,
    simulated: bool = True,
    on_step: Callable[[StepMetrics], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    cache_dir: Path | None = None,
    dtype: str = "float32",
    keep_state: bool = False,
    pool: WorkerPool | None = None,
    checkpointing: Checkpointing | None = None,
    restore: CheckpointInfo | None = None,
    max_failures: int = 0,
    replan: Callable[[set[str]], Plan] | None = None,
    on_checkpoint: Callable[[CheckpointInfo], None] | None = None,
    on_recovery: Callable[[Recovery], None] | None = None,
    faults: FaultSchedule | None = None,
    live: LiveReplanning | None = None,
    on_replan: Callable[[ReplanDecision], None] | None = None,
    validation: Validation | None = None,
) -> TrainResult:
    """Train ``plan`` up to ``steps`` steps and return the losses and timings.

    One warm worker per active device of the plan (from ``pool``, or a
    temporary pool) joined into a fresh torch.distributed group, for every
    strategy (:mod:`workers.run.driver`); ``on_step`` is called in this thread
    after every step and ``should_stop`` is checked between steps. Raises
    :class:`WorkerError` naming the device on OOM, crash or a lost actor,
    within bounded time. ``dtype="float64"`` trains in double precision, for
    runs that check exactness against a reference; ``keep_state=True``
    returns the final whole-model state (and rank 0's optimizer state for
    data-parallel plans).

    ``steps`` counts the job's steps from 0; with ``restore`` (a checkpoint
    of any plan) it goes on at the step after the checkpoint's. Durable runs
    (:mod:`workers.run.job`): ``checkpointing`` writes plan-independent
    checkpoints, and with ``max_failures > 0`` a failed device is recovered
    from the last checkpoint on the plan ``replan(lost devices)`` returns (by
    default the same plan: a crashed worker is replaced, a lost device is not).
    ``faults`` injects a simulated cluster's faults (:mod:`workers.run.faults`);
    ``live`` follows speed changes (:mod:`workers.run.replanning`), in place for
    data parallelism and, with ``checkpointing``, through a checkpoint otherwise.
    ``validation`` evaluates the dataset's held-out split (:class:`Validation`);
    each evaluated step's :class:`StepMetrics` carries its ``val_loss``.
    """
    check_trainable(model)
    if steps < 0:
        raise WorkerError(f"steps: must be >= 0, got {steps}")
    if validation is not None:  # a split too short for one sample: say so before any worker
        open_dataset(dataset, seq_len=model.seq_len, vocab_size=model.vocab_size, split="val")
    for d in plan.devices:
        cluster.device(d.id)
    if not ray.is_initialized():
        if not simulated:
            raise WorkerError("ray: not connected; call connect_ray(address) first")
        start_local_ray(cluster)
    cache_dir = cache_dir or default_cache_dir()
    pacing_of = simulated_pacing(cluster, model, cache_dir=cache_dir) if simulated else no_pacing
    run_spec = RunSpec(
        preset=model,
        seed=seed,
        global_batch=plan.global_batch,
        optimizer=optimizer,
        dataset=dataset,
        simulated=simulated,
        dtype=dtype,
    )

    def ranks_of(plan: Plan) -> list[RankSpec]:
        return make_ranks(plan, preset=model, pacing_of=pacing_of, cache_dir=cache_dir)

    own_pool = pool is None
    pool = pool or WorkerPool(cluster, simulated=simulated)
    injector = FaultInjector(faults, pool) if faults else None
    replanner = Replanner(live) if live is not None else None
    try:
        return train_job(
            pool,
            run_spec=run_spec,
            plan=plan,
            steps=steps,
            ranks_of=ranks_of,
            replan=replan or (lambda lost: plan),
            checkpointing=checkpointing,
            max_failures=max_failures,
            restore=restore,
            on_step=on_step,
            on_checkpoint=on_checkpoint,
            on_recovery=on_recovery,
            should_stop=should_stop,
            faults=injector,
            replanner=replanner,
            on_replan=on_replan,
            keep_state=keep_state,
            validation=validation,
        )
    finally:
        if injector is not None:
            injector.finish()
        if own_pool:
            pool.shutdown()
