"""The profiler: measure what each device costs per micro-batch and per sample.

Simulated and real devices go through the same code (:class:`ProfilerWorker`,
one Ray actor per device, through :meth:`TorchDevice.run_micro_batch`):

1. model states ``static_bytes``: weights, gradients and AdamW moments;
2. saved activations ``per_sample_bytes``: the peak of a micro-batch minus
   the model states, per sample (the largest of the ratios at 1 and 2
   samples, so the planner's ``(capacity − static) // per_sample`` never
   overshoots);
3. the largest micro-batch that fits ``capacity_bytes`` (the usable budget),
   checked by running it;
4. forward+backward time at several micro-batch sizes (median of repeats
   after a warm-up) and a least-squares fit of ``fixed_s + m · per_sample_s``
   (the cost model of DESIGN.md);
5. per-layer figures for pipeline planning, when :mod:`workers.layer_profile`
   is present (``layers=`` overrides the hook; see :func:`profile_devices`).

Links: a simulated cluster emulates the links of its spec, so those are
reported; on real GPUs the actors form one NCCL group and time an
all-reduce of the gradient buffer (bus bandwidth, Patarasuk & Yuan 2009).

Each device's figures are cached on disk under a key covering everything that
changes them: device type and capacity, model shape and, for simulated
devices, the pacing (margin ``K``, speed ratio, host calibration). Devices with
the same key are measured once; a second run is instant unless ``refresh``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist

from scheduler.cluster import Cluster, Links
from scheduler.models import ModelPreset
from scheduler.profile import LayerProfile, Profile, profile_from_dict
from workers.actors import actor_options, free_port, gather, kill_all
from workers.calibration import default_cache_dir, fit_line
from workers.data import ByteDataset
from workers.devices import HostCalibration, Pacing, TorchDevice, model_state_bytes
from workers.errors import DeviceOutOfMemory, WorkerError
from workers.model import GPT, lm_loss_sum
from workers.records import OptimizerConfig
from workers.runtime import WorkerSpec, build_device

TIMING_SIZES = (1, 2, 4, 8, 16)
TIMING_REPEATS = 3
MAX_RETRY_FACTOR = 3
PROFILE_TIMEOUT_S = 600.0
PROFILE_VERSION = 2
"""Bump when the measurement changes, so old cache entries are not reused."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceFigures:
    """What one measurement of a device yields (the cached part of its profile)."""

    capacity_bytes: int
    static_bytes: int
    per_sample_bytes: int
    fixed_s: float
    per_sample_s: float
    max_micro_batch: int


class ProfilerWorker:
    """Measures one device; a plain class made remote where it is spawned."""

    def __init__(self, spec: WorkerSpec) -> None:
        torch.set_num_threads(1)
        self.spec = spec
        self.device: TorchDevice = build_device(spec)

    def _model(self) -> GPT:
        model = GPT(self.spec.preset, seed=0).to(self.device.torch_device)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        return model

    def _forward(self, model: GPT, data: ByteDataset, m: int, step: int) -> Any:
        x, y = data.device_batch(seed=0, step=step, global_batch=m, offset=0, samples=m)
        x, y = x.to(self.device.torch_device), y.to(self.device.torch_device)
        scale = 1.0 / (m * self.spec.preset.seq_len)
        return lambda: lm_loss_sum(model(x), y) * scale

    def _peak(self, model: GPT, data: ByteDataset, m: int) -> int:
        """Peak bytes of a micro-batch of ``m``, even when it does not fit."""
        try:
            fwd = self._forward(model, data, m, 0)
            return self.device.run_micro_batch(fwd, model=model, micro_batch=m).peak_bytes
        except DeviceOutOfMemory as exc:
            return exc.need_bytes

    def measure(self, layer_hook: Any = None) -> dict[str, Any]:
        preset = self.spec.preset
        model = self._model()
        data = ByteDataset(self.spec.dataset, seq_len=preset.seq_len, vocab_size=preset.vocab_size)
        static = self._static_bytes(model)
        per_sample = max(-(-(self._peak(model, data, m) - static) // m) for m in (1, 2))
        per_sample = max(per_sample, 1)
        capacity = self.device.capacity_bytes
        max_m = max(0, (capacity - static) // per_sample)
        max_m = self._check_fits(model, data, max_m)
        sizes = [m for m in TIMING_SIZES if m <= max(max_m, 1)]
        if max_m < 1:
            # Nothing fits: time anyway, without the memory limit, so the profile still
            # says how fast the device is; the planner excludes it for its memory.
            self.device.capacity_bytes = 2**62
        times = [self._time(model, data, m) for m in sizes]
        self.device.capacity_bytes = capacity
        if len(sizes) == 1:
            fixed_s, per_sample_s = 0.0, times[0]
        else:
            fixed_s, per_sample_s = fit_line([float(m) for m in sizes], times)
        figures = DeviceFigures(
            capacity_bytes=capacity,
            static_bytes=static,
            per_sample_bytes=per_sample,
            fixed_s=fixed_s,
            per_sample_s=per_sample_s,
            max_micro_batch=max_m,
        )
        out: dict[str, Any] = {"figures": asdict(figures), "layers": None}
        if layer_hook is not None:
            out["layers"] = layer_hook(self.device, preset).to_dict()
        return out

    def _time(self, model: GPT, data: ByteDataset, m: int) -> float:
        """Median device time of a micro-batch of ``m`` after a warm-up.

        Runs whose real compute overran a simulated device's target (another
        process took the cores) measure the host, not the emulated GPU: they
        are repeated, up to a bound, and used only if nothing better comes.
        """
        fwd = self._forward(model, data, m, m)
        self.device.run_micro_batch(fwd, model=model, micro_batch=m)  # warm-up
        kept, overran = [], []
        for _ in range(TIMING_REPEATS * MAX_RETRY_FACTOR):
            result = self.device.run_micro_batch(fwd, model=model, micro_batch=m)
            (overran if result.overran else kept).append(result.busy_s)
            if len(kept) == TIMING_REPEATS:
                break
        return statistics.median(kept or overran)

    def _static_bytes(self, model: GPT) -> int:
        if self.device.torch_device.type != "cuda":
            return model_state_bytes(model)
        # Let the allocator see the AdamW moments too: one step materialises them.
        torch.optim.AdamW(model.parameters(), lr=0.0).step()
        torch.cuda.synchronize(self.device.torch_device)
        return int(torch.cuda.memory_allocated(self.device.torch_device))

    def _check_fits(self, model: GPT, data: ByteDataset, max_m: int) -> int:
        """Run the largest micro-batch the figures allow; step down while it does not fit."""
        while max_m >= 1:
            try:
                fwd = self._forward(model, data, max_m, 1)
                self.device.run_micro_batch(fwd, model=model, micro_batch=max_m)
                return max_m
            except DeviceOutOfMemory:
                max_m = max_m * 9 // 10 if max_m > 10 else max_m - 1
        return 0

    # --- links (real GPUs) -------------------------------------------------

    def rendezvous(self) -> tuple[str, int]:
        return free_port()

    def allreduce_gbps(
        self, master_addr: str, master_port: int, rank: int, world_size: int, num_bytes: int
    ) -> float:
        """Bus bandwidth of a ring all-reduce of ``num_bytes`` among all profiler actors."""
        backend = "nccl" if self.device.torch_device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=120),
        )
        try:
            buf = torch.ones(max(num_bytes // 4, 1), device=self.device.torch_device)
            dist.all_reduce(buf)  # warm-up: connections are made lazily
            runs = []
            for _ in range(5):
                if buf.is_cuda:
                    torch.cuda.synchronize(buf.device)
                start = time.perf_counter()
                dist.all_reduce(buf)
                if buf.is_cuda:
                    torch.cuda.synchronize(buf.device)
                runs.append(time.perf_counter() - start)
            seconds = statistics.median(runs)
            return 2 * (world_size - 1) / world_size * buf.numel() * 4 * 8 / seconds / 1e9
        finally:
            dist.destroy_process_group()


def cache_key(
    *,
    device_type: str,
    capacity_bytes: int,
    preset: ModelPreset,
    simulated: bool,
    pacing: Pacing | None,
    layers: bool,
) -> str:
    """Everything that changes a device's figures, hashed."""
    parts: dict[str, Any] = {
        "version": PROFILE_VERSION,
        "type": device_type,
        "capacity_bytes": capacity_bytes,
        "model": asdict(preset),
        "simulated": simulated,
        "layers": layers,
        "torch": torch.__version__,
    }
    if pacing is not None:
        parts["pacing"] = {
            "margin": round(pacing.margin, 6),
            "speed_ratio": round(pacing.speed_ratio, 9),
            "host": asdict(pacing.host),
        }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
    return f"{device_type}-{preset.name}-{'sim' if simulated else 'gpu'}-{digest}"


def _layer_hook(preset: ModelPreset, host: HostCalibration | None, cache_dir: Path) -> Any:
    """The pipeline helper's per-layer measurement, if this install has it."""
    if importlib.util.find_spec("workers.layer_profile") is None:
        return None
    from workers import layer_profile

    host_pieces = None
    if host is not None:
        host_pieces = layer_profile.host_layers(preset, host, cache_dir=cache_dir)

    def hook(device: TorchDevice, model: ModelPreset) -> LayerProfile:
        return layer_profile.measure_layers(device, model, host_pieces=host_pieces)

    return hook


def _non_negative(layers: dict[str, Any] | None) -> dict[str, Any] | None:
    """A fit may dip below zero on a noisy host; a negative time is noise, not a saving."""
    if not layers:
        return None
    out = dict(layers)
    for piece in ("embed", "block", "head"):
        if isinstance(out.get(piece), dict):
            out[piece] = {k: max(v, 0.0) if k.endswith("_s") else v for k, v in out[piece].items()}
    return out


def profile_devices(
    cluster: Cluster,
    preset: ModelPreset,
    *,
    device_ids: list[str] | None = None,
    cache_dir: Path | None = None,
    refresh: bool = False,
    simulated: bool = True,
    layers: Any = "auto",
) -> Profile:
    """Measure (or read from the cache) every device of ``cluster`` (or ``device_ids``).

    ``layers``: ``"auto"`` calls :func:`workers.layer_profile.measure_layers`
    inside each device's actor when that module exists; ``None`` skips
    per-layer figures; a callable ``(device, preset) -> LayerProfile`` is used
    as given (it must be importable by the Ray workers).
    """
    from workers.session import simulated_pacing, start_local_ray

    cache_dir = cache_dir or default_cache_dir()
    ids = device_ids if device_ids is not None else cluster.ids
    devices = [cluster.device(i) for i in ids]
    if not ray.is_initialized():
        if not simulated:
            raise WorkerError("ray: not connected; call connect_ray(address) first")
        start_local_ray(cluster)
    # refresh re-measures the host calibration too: the pacing of later runs follows it.
    pacing_of = (
        simulated_pacing(cluster, preset, cache_dir=cache_dir, refresh=refresh)
        if simulated
        else None
    )
    host = pacing_of(ids[0])[1].host if pacing_of is not None else None
    hook = _layer_hook(preset, host, cache_dir) if layers == "auto" else layers

    # One measurement per distinct cache key.
    specs: dict[str, WorkerSpec] = {}
    key_of: dict[str, str] = {}
    for d in devices:
        capacity, pacing = pacing_of(d.id) if pacing_of is not None else (0, None)
        key = cache_key(
            device_type=d.type,
            capacity_bytes=capacity,
            preset=preset,
            simulated=simulated,
            pacing=pacing,
            layers=hook is not None,
        )
        key_of[d.id] = key
        specs.setdefault(
            key,
            WorkerSpec(
                device_id=d.id,
                rank=0,
                world_size=1,
                preset=preset,
                seed=0,
                global_batch=1,
                offset=0,
                samples=1,
                micro_batch=1,
                accum_steps=1,
                optimizer=OptimizerConfig(),
                dataset=None,
                simulated=simulated,
                capacity_bytes=capacity,
                pacing=pacing,
            ),
        )
    folder = cache_dir / "profiles"
    results: dict[str, dict[str, Any]] = {}
    for key in specs:
        path = folder / f"{key}.json"
        if not refresh and path.exists():
            with contextlib.suppress(OSError, ValueError):
                results[key] = json.loads(path.read_text())
    todo = [k for k in specs if k not in results]
    if todo:
        remote_cls = ray.remote(ProfilerWorker)
        actors = [
            remote_cls.options(
                **actor_options(cluster.device(specs[k].device_id), simulated=simulated)
            ).remote(specs[k])
            for k in todo
        ]
        try:
            measured = gather(
                [a.measure.remote(hook) for a in actors],
                [specs[k].device_id for k in todo],
                timeout_s=PROFILE_TIMEOUT_S,
                what="profiling",
            )
        finally:
            kill_all(actors)
        folder.mkdir(parents=True, exist_ok=True)
        for key, out in zip(todo, measured, strict=True):
            results[key] = out
            (folder / f"{key}.json").write_text(json.dumps(out, indent=2) + "\n")

    gradient_bytes = 4 * (GPT(preset, seed=0).num_params() + 1)
    links = (
        cluster.links if simulated else _measure_links(cluster, ids, specs, key_of, gradient_bytes)
    )
    doc = {
        "model": preset.name,
        "source": "measured",
        "links": links.to_dict(),
        "gradient_bytes": gradient_bytes,
        "devices": [
            {
                "id": d.id,
                "node": d.node,
                "type": d.type,
                **{
                    k: v
                    for k, v in results[key_of[d.id]]["figures"].items()
                    if k != "max_micro_batch"
                },
                **(
                    {"layers": _non_negative(results[key_of[d.id]]["layers"])}
                    if results[key_of[d.id]].get("layers")
                    else {}
                ),
            }
            for d in devices
        ],
    }
    return profile_from_dict(doc)


def _measure_links(
    cluster: Cluster,
    ids: list[str],
    specs: dict[str, WorkerSpec],
    key_of: dict[str, str],
    gradient_bytes: int,
) -> Links:
    """All-reduce bandwidth among the devices; the slowest ring hop it implies."""
    if len(ids) < 2:
        return cluster.links
    remote_cls = ray.remote(ProfilerWorker)
    actors = [
        remote_cls.options(**actor_options(cluster.device(i), simulated=False)).remote(
            specs[key_of[i]]
        )
        for i in ids
    ]
    try:
        addr, port = gather(
            [actors[0].rendezvous.remote()], ids[:1], timeout_s=120, what="rendezvous"
        )[0]
        gbps = gather(
            [
                a.allreduce_gbps.remote(addr, port, r, len(ids), gradient_bytes)
                for r, a in enumerate(actors)
            ],
            ids,
            timeout_s=300,
            what="all-reduce",
        )
    finally:
        kill_all(actors)
    measured = float(min(gbps))
    multi_node = len({cluster.device(i).node for i in ids}) > 1
    if multi_node:
        return Links(intra_node_gbps=cluster.links.intra_node_gbps, inter_node_gbps=measured)
    return Links(intra_node_gbps=measured, inter_node_gbps=cluster.links.inter_node_gbps)
