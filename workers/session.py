"""The one entry point of the workers: Ray, profiling and training (contract.md).

``hetsched simulate``, ``hetsched profile`` and the API's job executor call
only these names::

    from workers.session import start_local_ray, profile_cluster, train
    start_local_ray(cluster)
    profile = profile_cluster(cluster, preset, cache_dir=Path(".hetsched/cache"))
    plan = make_plan(profile, 64, "dp")
    result = train(cluster=cluster, model=preset, plan=plan, steps=20, seed=0)

Simulated devices are paced against a host calibration cached under
``cache_dir``; pass the same ``cache_dir`` to :func:`profile_cluster` and
:func:`train` so that the two pace identically (the default is
:func:`workers.calibration.default_cache_dir`).
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from scheduler.catalogue import CATALOGUE, lookup
from scheduler.cluster import Cluster, Device, Links
from scheduler.models import ModelPreset
from scheduler.plan import DP_STRATEGIES, Plan
from scheduler.profile import Profile
from workers.actors import start_local_ray
from workers.calibration import calibrate_host, default_cache_dir
from workers.devices import Pacing, default_margin, simulated_capacity_bytes, speed_ratio
from workers.errors import WorkerError
from workers.model import check_trainable
from workers.records import DeviceStep, OptimizerConfig, StepMetrics, TrainResult
from workers.runtime import make_specs, run_data_parallel

__all__ = [
    "DeviceStep",
    "OptimizerConfig",
    "StepMetrics",
    "TrainResult",
    "WorkerError",
    "connect_ray",
    "pacing_margin",
    "profile_cluster",
    "start_local_ray",
    "train",
]

DEFAULT_OPTIMIZER = OptimizerConfig()
_RUN_IDS = itertools.count()
_RUN_LOCK = threading.Lock()


def pacing_margin(cluster: Cluster) -> float:
    """Contention margin ``K`` for ``cluster``'s simulation on this machine.

    ``$HETSCHED_PACING_MARGIN`` overrides it; otherwise it follows the number
    of simulated devices per CPU Ray may use (:func:`workers.devices.default_margin`).
    """
    env = os.environ.get("HETSCHED_PACING_MARGIN")
    if env:
        try:
            value = float(env)
        except ValueError:
            raise WorkerError(
                f"HETSCHED_PACING_MARGIN: must be a number >= 1, got {env!r}"
            ) from None
        if value < 1:
            raise WorkerError(f"HETSCHED_PACING_MARGIN: must be a number >= 1, got {env!r}")
        return value
    num_cpus = int(ray.cluster_resources().get("CPU", 2)) if ray.is_initialized() else 2
    return default_margin(len(cluster.devices), min(num_cpus, os.cpu_count() or num_cpus))


def simulated_pacing(
    cluster: Cluster, model: ModelPreset, *, cache_dir: Path | None, refresh: bool = False
) -> Callable[[str], tuple[int, Pacing]]:
    """``device id -> (capacity_bytes, Pacing)`` for the simulated devices of ``cluster``."""
    host = calibrate_host(model, cache_dir=cache_dir, refresh=refresh)
    margin = pacing_margin(cluster)

    def of(device_id: str) -> tuple[int, Pacing]:
        device = cluster.device(device_id)
        return simulated_capacity_bytes(cluster, device), Pacing(
            margin=margin, speed_ratio=speed_ratio(cluster, device), host=host
        )

    return of


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
) -> Profile:
    """Measure each device (cached) and return the profile of DESIGN.md.

    ``layers``: per-layer figures for pipeline planning; ``"auto"`` measures
    them when :mod:`workers.layer_profile` is installed, ``None`` skips them
    (see :func:`workers.profiler.profile_devices`).
    """
    from workers.profiler import profile_devices

    check_trainable(model)
    return profile_devices(
        cluster,
        model,
        device_ids=device_ids,
        cache_dir=cache_dir,
        refresh=refresh,
        simulated=simulated,
        layers=layers,
    )


def needs_pipeline(plan: Plan) -> bool:
    return plan.strategy not in DP_STRATEGIES or any(d.layers is not None for d in plan.devices)


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
) -> TrainResult:
    """Train ``plan`` for ``steps`` steps and return the losses and timings.

    One Ray actor per active device of the plan and a fresh torch.distributed
    group; ``on_step`` is called in this thread after every step and
    ``should_stop`` is checked between steps. Raises :class:`WorkerError`
    naming the device on OOM, crash or a lost actor, within bounded time.
    pp/hybrid plans run in :mod:`workers.pipeline` (``train_pipeline`` with
    the same keyword arguments plus ``pacing_of``). ``dtype="float64"`` trains
    in double precision, for runs that check exactness against a reference;
    ``keep_state=True`` returns rank 0's final model and optimizer state.
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
    pacing_of: Callable[[str], tuple[int, Pacing | None]]
    if simulated:
        pacing_of = simulated_pacing(cluster, model, cache_dir=cache_dir or default_cache_dir())
    else:

        def pacing_of(device_id: str) -> tuple[int, Pacing | None]:
            return 0, None

    if needs_pipeline(plan):
        pipeline = importlib.import_module("workers.pipeline")
        return pipeline.train_pipeline(
            cluster=cluster,
            model=model,
            plan=plan,
            steps=steps,
            seed=seed,
            dataset=dataset,
            optimizer=optimizer,
            simulated=simulated,
            on_step=on_step,
            should_stop=should_stop,
            pacing_of=pacing_of,
            cache_dir=cache_dir,
            dtype=dtype,
            keep_state=keep_state,
        )
    specs = make_specs(
        cluster=cluster,
        preset=model,
        plan=plan,
        seed=seed,
        dataset=dataset,
        optimizer=optimizer,
        simulated=simulated,
        pacing_of=pacing_of,
        dtype=dtype,
    )
    with _RUN_LOCK:
        run_id = next(_RUN_IDS)
    return run_data_parallel(
        cluster=cluster,
        specs=specs,
        plan=plan,
        steps=steps,
        on_step=on_step,
        should_stop=should_stop,
        actor_name_prefix=f"hetsched-dp-{os.getpid()}-{run_id}-",
        keep_state=keep_state,
    )
