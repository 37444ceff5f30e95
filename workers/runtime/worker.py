"""The device worker: one warm Ray actor per device, reused by every job.

A :class:`DeviceWorker` is a plain class, made remote where it is spawned
(:mod:`workers.cluster.pool`), so tests can drive it in-process. It starts once per
device (importing torch, one thread) and then serves any number of runs:

``rendezvous()`` (rank 0) names an address and a free port; ``join(run,
rank, addr, port)`` forms the run's process group (:mod:`workers.runtime.distributed`)
and builds the rank's engine (:mod:`workers.runtime.engine`: data-parallel, pipeline
stage or fully sharded, :func:`workers.runtime.spec.engine_kind`); ``step(t)`` returns
a typed :class:`~workers.records.RankStep`;
``leave()`` drops the engine and the group so the next job starts clean. The
profiler measures through the same worker (``measure``), so profiling reuses
warm actors too.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import asdict
from typing import Any

import ray
import torch
import torch.distributed as dist

from scheduler.models.presets import ModelPreset
from workers.checkpoint import optimizer_steps
from workers.devices.device import CudaDevice, SimulatedDevice, TorchDevice
from workers.devices.pacing import Pacing
from workers.errors import DeviceOutOfMemory
from workers.records import RankStep
from workers.runtime.distributed import free_port, join_group, leave_group
from workers.runtime.engine import DataParallelEngine, Engine
from workers.runtime.fsdp import FullyShardedEngine
from workers.runtime.measure import Measurement
from workers.runtime.pipeline_engine import PipelineEngine
from workers.runtime.spec import EngineKind, RankSpec, RunSpec, engine_kind

ENGINES: dict[EngineKind, type[Engine]] = {
    "dp": DataParallelEngine,
    "pipeline": PipelineEngine,
    "fsdp": FullyShardedEngine,
}


def make_device(
    device_id: str, *, simulated: bool, capacity_bytes: int, pacing: Pacing | None
) -> TorchDevice:
    """A simulated device with its capacity and pacing, or this actor's GPU."""
    if simulated:
        if pacing is None:
            raise ValueError(f"{device_id}: a simulated device needs its pacing")
        return SimulatedDevice(device_id=device_id, capacity_bytes=capacity_bytes, pacing=pacing)
    return CudaDevice(device_id=device_id)


class DeviceWorker:
    """One device's warm worker (module docstring)."""

    def __init__(self, device_id: str, *, simulated: bool, gpu_index: int | None = None) -> None:
        torch.set_num_threads(1)
        if not simulated and gpu_index is not None:
            # Ray hands the actor some free GPU of its node; device NODE/INDEX is the GPU of
            # that physical index. Set before CUDA starts in this process, so cuda:0 is it.
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_index)
        self.device_id = device_id
        self.simulated = simulated
        self.engine: Engine | None = None
        self.group_key: tuple[str, ...] | None = None
        self.slowdown = 1.0
        """An injected slow-down of this simulated device, kept across runs until changed."""

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this worker runs on."""
        return str(ray.get_runtime_context().get_node_id())

    def rendezvous(self) -> tuple[str, int]:
        return free_port()

    def group(self) -> tuple[str, ...] | None:
        """The device ids, in rank order, of the process group this worker is in."""
        return self.group_key if dist.is_initialized() else None

    def join(
        self,
        run: RunSpec,
        rank: RankSpec,
        master_addr: str,
        master_port: int,
        group_key: tuple[str, ...] = (),
        reuse_group: bool = False,
    ) -> None:
        """Join ``run`` as ``rank``: its process group, then its model and optimizer.

        With ``reuse_group`` (the driver saw every rank in the group ``group_key``
        already: the same devices, ranks in the same order) the group is kept,
        which spares a job on the same devices the group's formation.
        """
        self.leave()
        device = make_device(
            self.device_id,
            simulated=self.simulated,
            capacity_bytes=rank.capacity_bytes,
            pacing=rank.pacing,
        )
        if not (reuse_group and self.group() == group_key):
            join_group(
                device=device.torch_device,
                master_addr=master_addr,
                master_port=master_port,
                rank=rank.rank,
                world_size=rank.world_size,
            )
            self.group_key = group_key
        self.engine = ENGINES[engine_kind(rank)](run, rank, device)
        self.set_slowdown(self.slowdown)

    def step(self, step: int) -> RankStep:
        engine = self._engine()
        try:
            return engine.step(step)
        except torch.OutOfMemoryError as exc:  # the optimizer step or a collective's buffer
            device = engine.device
            need = (
                torch.cuda.memory_reserved(device.torch_device) if torch.cuda.is_available() else 0
            )
            raise DeviceOutOfMemory(
                self.device_id,
                engine.rank.micro_batch,
                max(need, device.capacity_bytes + 1),
                device.capacity_bytes,
            ) from exc

    def evaluate(self, val_batches: int) -> float:
        """Mean validation loss of the current model (:meth:`Engine.evaluate`)."""
        return self._engine().evaluate(val_batches)

    def reshard(self, rank: RankSpec) -> None:
        """Take another share of the batch between two steps (an in-place re-plan)."""
        self._engine().reshard(rank)

    def set_slowdown(self, factor: float) -> None:
        """A simulated device runs ``factor`` times slower from now on (fault injection)."""
        self.slowdown = factor
        if self.engine is not None and isinstance(self.engine.device, SimulatedDevice):
            self.engine.device.slowdown = factor

    def save_checkpoint(self, uri: str, part: str) -> tuple[list[str], int]:
        """Write this rank's part of a checkpoint; the names it holds and AdamW's step count."""
        engine = self._engine()
        return engine.save_part(uri, part), optimizer_steps(engine.optimizer)

    def load_checkpoint(self, uri: str, manifest: dict[str, Any]) -> None:
        self._engine().load_checkpoint(uri, manifest)

    def model_state(self) -> dict[str, torch.Tensor]:
        return self._engine().model_state()

    def state_dict(self) -> dict[str, Any]:
        """Model (whole-model names) and optimizer state, and the last step done."""
        engine = self._engine()
        return {
            "step": engine.step_done,
            "model": engine.model_state(),
            "optimizer": engine.optimizer.state_dict(),
        }

    # --- profiling -------------------------------------------------------------

    def measure(
        self, preset: ModelPreset, capacity_bytes: int, pacing: Pacing | None, layer_hook: Any
    ) -> dict[str, Any]:
        """This device's figures (:mod:`~workers.runtime.measure`), per layer with a hook."""
        self.leave()
        device = make_device(
            self.device_id, simulated=self.simulated, capacity_bytes=capacity_bytes, pacing=pacing
        )
        figures = Measurement(device, preset).run()
        out: dict[str, Any] = {"figures": asdict(figures), "layers": None}
        if layer_hook is not None:
            out["layers"] = layer_hook(device, preset).to_dict()
        return out

    def allreduce_gbps(
        self, master_addr: str, master_port: int, rank: int, world_size: int, num_bytes: int
    ) -> float:
        """Bus bandwidth of a ring all-reduce of ``num_bytes`` among the profiled workers."""
        device = make_device(
            self.device_id, simulated=self.simulated, capacity_bytes=0, pacing=None
        )
        join_group(
            device=device.torch_device,
            master_addr=master_addr,
            master_port=master_port,
            rank=rank,
            world_size=world_size,
        )
        try:
            buf = torch.ones(max(num_bytes // 4, 1), device=device.torch_device)
            dist.all_reduce(buf)  # warm-up: connections are made lazily
            runs = []
            for _ in range(5):
                device.synchronize()
                start = time.perf_counter()
                dist.all_reduce(buf)
                device.synchronize()
                runs.append(time.perf_counter() - start)
            seconds = statistics.median(runs)
            return 2 * (world_size - 1) / world_size * buf.numel() * 4 * 8 / seconds / 1e9
        finally:
            leave_group()

    def leave(self) -> None:
        """Drop the run's engine; the worker stays warm, and so does its process group
        (the next run on the same devices reuses it; any other forms its own)."""
        if self.engine is not None:
            self.engine.close()
        self.engine = None
        gc.collect()
        if not self.simulated and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def abandon(self) -> None:
        """Leave a run that failed: its engine and its process group, whose peers may be
        gone. The worker stays warm for the next run (:meth:`WorkerPool.salvage`)."""
        self.leave()
        leave_group()
        self.group_key = None

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError(f"{self.device_id}: not in a run; join() first")
        return self.engine
