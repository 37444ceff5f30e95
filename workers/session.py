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
:func:`workers.calibration.default_cache_dir`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from scheduler.catalogue import CATALOGUE, lookup
from scheduler.cluster import Cluster, Device, Links
from scheduler.models import ModelPreset
from scheduler.plan import Plan
from scheduler.profile import Profile
from workers import driver
from workers.actors import start_local_ray
from workers.calibration import default_cache_dir
from workers.errors import WorkerError
from workers.model import check_trainable
from workers.pacing import no_pacing, pacing_margin, simulated_pacing
from workers.pool import WorkerPool
from workers.profiler import profile_devices
from workers.records import DeviceStep, OptimizerConfig, StepMetrics, TrainResult
from workers.spec import RunSpec, make_ranks

__all__ = [
    "DeviceStep",
    "OptimizerConfig",
    "StepMetrics",
    "TrainResult",
    "WorkerError",
    "WorkerPool",
    "connect_ray",
    "pacing_margin",
    "profile_cluster",
    "start_local_ray",
    "train",
]

DEFAULT_OPTIMIZER = OptimizerConfig()


def connect_ray(address: str) -> Cluster:
    """Attach to an existing Ray cluster and describe its GPUs as a Cluster.

    Each live node with GPUs becomes a node named by its IP address; the GPU
    type comes from Ray's ``accelerator_type:NAME`` resource matched to the
    catalogue (the largest-memory entry of that model name).
    """
    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise WorkerError(f"ray-address: cannot connect to {address}: {exc}") from exc
    devices: list[Device] = []
    for info in sorted(ray.nodes(), key=lambda n: str(n.get("NodeManagerAddress"))):
        resources = info.get("Resources", {})
        num_gpus = int(resources.get("GPU", 0))
        if not info.get("Alive") or num_gpus == 0:
            continue
        accel = next(
            (k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), ""
        )
        gpu_key = _catalogue_key(accel)
        gpu = lookup(gpu_key)
        node = str(info["NodeManagerAddress"])
        for index in range(num_gpus):
            devices.append(
                Device(
                    id=f"{node}/{index}",
                    node=node,
                    index=index,
                    type=gpu.key,
                    memory_gb=gpu.memory_gb,
                    peak_tflops=gpu.peak_tflops,
                )
            )
    if not devices:
        raise WorkerError(f"ray-address: the Ray cluster at {address} has no GPU nodes")
    return Cluster(name=f"ray-{address}", devices=tuple(devices), links=Links())


def _catalogue_key(accelerator: str) -> str:
    name = accelerator.upper().replace("NVIDIA", "").replace("-", "").replace(" ", "")
    matches = [g for key, g in CATALOGUE.items() if key.split("-")[0].replace(" ", "") == name]
    if not matches:
        matches = [g for key, g in CATALOGUE.items() if name and name in key.replace("-", "")]
    if not matches:
        raise WorkerError(
            f"ray: GPU type {accelerator or 'unknown'!r} is not in the catalogue; "
            f"known: {', '.join(CATALOGUE)}"
        )
    return max(matches, key=lambda g: g.memory_gb).key


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
) -> TrainResult:
    """Train ``plan`` for ``steps`` steps and return the losses and timings.

    One warm worker per active device of the plan (from ``pool``, or a
    temporary pool) joined into a fresh torch.distributed group, for every
    strategy (:mod:`workers.driver`); ``on_step`` is called in this thread
    after every step and ``should_stop`` is checked between steps. Raises
    :class:`WorkerError` naming the device on OOM, crash or a lost actor,
    within bounded time. ``dtype="float64"`` trains in double precision, for
    runs that check exactness against a reference; ``keep_state=True``
    returns the final whole-model state (and rank 0's optimizer state for
    data-parallel plans).
    """
    check_trainable(model)
    if steps < 0:
        raise WorkerError(f"steps: must be >= 0, got {steps}")
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
    ranks = make_ranks(plan, preset=model, pacing_of=pacing_of, cache_dir=cache_dir)
    own_pool = pool is None
    pool = pool or WorkerPool(cluster, simulated=simulated)
    try:
        return driver.run(
            pool,
            run_spec=run_spec,
            ranks=ranks,
            plan=plan,
            steps=steps,
            on_step=on_step,
            should_stop=should_stop,
            keep_state=keep_state,
        )
    finally:
        if own_pool:
            pool.shutdown()
