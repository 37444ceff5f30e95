"""Per-layer figures for pipeline planning: one block, the embedding and the head.

Two measurements, both through :mod:`workers.devices.device`: this host's time per
piece (:func:`host_layers`), which paces simulated stages, and a device's time and
memory per piece (:func:`measure_layers`). Stage-boundary activations are one
``(T, C)`` fp32 tensor per sample.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from scheduler.cost.profile import LayerCost, LayerProfile
from scheduler.models.presets import ModelPreset
from workers.data.dataset import ByteDataset
from workers.devices.calibration import HostCalibration, default_cache_dir, fit_line, host_key
from workers.devices.device import SimulatedDevice, TorchDevice, model_state_bytes
from workers.devices.pacing import Pacing
from workers.models.families import build_model
from workers.models.gpt import lm_loss_sum

PIECES = ("embed", "block", "head")
HOST_SIZES = (1, 2, 4, 8)
HOST_REPEATS = 4
DEVICE_SIZES = (1, 2)
_MEMO: dict[str, dict[str, HostCalibration]] = {}
_LOCK = threading.Lock()


def piece_module(preset: ModelPreset, piece: str, *, seed: int = 0) -> torch.nn.Module:
    """The embedding, block 0, or the head (GPT's with its own embedding-weight copy)."""
    if piece == "embed":
        return build_model(preset, seed=seed, first=0, last=0, embed=True, head=False)
    if piece == "block":
        return build_model(preset, seed=seed, first=0, last=1, embed=False, head=False)
    if piece == "head":
        n = preset.num_layers
        return build_model(preset, seed=seed, first=n, last=n, embed=False, head=True)
    raise ValueError(f"piece: {piece!r}; known: {', '.join(PIECES)}")


def piece_forward(
    preset: ModelPreset, piece: str, module: torch.nn.Module, micro_batch: int, device: torch.device
) -> Callable[[], torch.Tensor]:
    """A closure computing a scalar whose backward runs the piece's backward."""
    data = ByteDataset(None, seq_len=preset.seq_len, vocab_size=preset.vocab_size)
    x, y = data.device_batch(
        seed=0, step=micro_batch, global_batch=micro_batch, offset=0, samples=micro_batch
    )
    x, y = x.to(device), y.to(device)
    gen = torch.Generator().manual_seed(micro_batch)
    hidden = torch.randn(micro_batch, preset.seq_len, preset.d_model, generator=gen)  # (B, T, C)
    hidden = hidden.to(device)
    weights = torch.randn(micro_batch, preset.seq_len, preset.d_model, generator=gen).to(device)

    def forward() -> torch.Tensor:
        if piece == "embed":
            return (module(x) * weights).sum()
        h = hidden.clone().requires_grad_(True)
        out = module(h)
        if piece == "head":
            return lm_loss_sum(out, y) / (micro_batch * preset.seq_len)
        return (out * weights).sum()

    return forward


# --- host shares (pacing of simulated stages) ----------------------------


def _time_piece(
    preset: ModelPreset, piece: str, sizes: Sequence[int], repeats: int
) -> HostCalibration:
    torch.set_num_threads(1)
    module = piece_module(preset, piece)
    best = []
    for m in sizes:
        forward = piece_forward(preset, piece, module, m, torch.device("cpu"))
        times = []
        for _ in range(repeats + 1):
            start = time.thread_time()  # what the piece costs, however busy the host
            forward().backward()
            times.append(time.thread_time() - start)
            module.zero_grad(set_to_none=True)
        best.append(min(times[1:]))
    fixed_s, per_sample_s = fit_line([float(m) for m in sizes], best)
    return HostCalibration(fixed_s=fixed_s, per_sample_s=per_sample_s)


def measure_host_pieces(
    preset: ModelPreset, *, sizes: Sequence[int] = HOST_SIZES, repeats: int = HOST_REPEATS
) -> dict[str, HostCalibration]:
    return {piece: _time_piece(preset, piece, sizes, repeats) for piece in PIECES}


NORMALISE_AT = 4
"""Micro-batch size at which the pieces' sum is matched to the whole model's time."""


def normalise(
    pieces: dict[str, HostCalibration], whole: HostCalibration, num_blocks: int
) -> dict[str, HostCalibration]:
    """Scale the pieces so that ``embed + L·block + head`` takes the whole model's time.

    One factor for fixed and per-sample time, matched at :data:`NORMALISE_AT`
    samples: the pieces keep their own measured split between the two (a
    whole-model fit on a busy host may clip its fixed time to zero, which
    would otherwise erase every piece's fixed cost).

    >>> p = {k: HostCalibration(fixed_s=1.0, per_sample_s=1.0) for k in PIECES}
    >>> normalise(p, HostCalibration(fixed_s=0.0, per_sample_s=10.0), 2)["block"]
    HostCalibration(fixed_s=2.0, per_sample_s=2.0)
    """
    count = {"embed": 1, "block": num_blocks, "head": 1}
    total = sum(pieces[k].time_s(NORMALISE_AT) * count[k] for k in PIECES)
    factor = whole.time_s(NORMALISE_AT) / total if total > 0 else 0.0
    return {
        k: HostCalibration(fixed_s=v.fixed_s * factor, per_sample_s=v.per_sample_s * factor)
        for k, v in pieces.items()
    }


def host_layers(
    preset: ModelPreset, whole: HostCalibration, *, cache_dir: Path | None = None
) -> dict[str, HostCalibration]:
    """This host's per-piece times, normalised to ``whole`` (memory, disk, then measured).

    Times each piece's forward+backward on this host (one thread's CPU time, min of
    several runs per micro-batch size, a line fit as in :mod:`workers.devices.calibration`) and
    rescales the pieces by one factor so that ``embed + L·block + head`` equals the
    whole model's host calibration. A simulated pipeline stage is then paced by the sum
    of its pieces, so a pipeline and a data-parallel run of the same model do the same
    total work. Cached on disk next to the host calibration.
    """
    key = f"layers-{host_key(preset)}"
    path = (cache_dir or default_cache_dir()) / "calibration" / f"{key}.json"
    with _LOCK:
        raw = _MEMO.get(key)
        if raw is None and path.exists():
            try:
                data = json.loads(path.read_text())
                raw = {
                    k: HostCalibration(
                        fixed_s=float(data[k]["fixed_s"]),
                        per_sample_s=float(data[k]["per_sample_s"]),
                    )
                    for k in PIECES
                }
            except (OSError, ValueError, KeyError, TypeError):
                raw = None
        if raw is None:
            import ray

            if ray.is_initialized():
                raw = ray.get(ray.remote(num_cpus=0)(measure_host_pieces).remote(preset))
            else:
                raw = measure_host_pieces(preset)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps(
                    {
                        k: {"fixed_s": v.fixed_s, "per_sample_s": v.per_sample_s}
                        for k, v in raw.items()
                    },
                    indent=2,
                )
                + "\n"
            )
        _MEMO[key] = raw
    return normalise(raw, whole, preset.num_layers)


def stage_host(
    pieces: dict[str, HostCalibration], *, num_blocks: int, embed: bool, head: bool
) -> HostCalibration:
    """Host time of a stage: its blocks plus the embedding and/or head it holds."""
    parts = [(pieces["block"], num_blocks)]
    if embed:
        parts.append((pieces["embed"], 1))
    if head:
        parts.append((pieces["head"], 1))
    return HostCalibration(
        fixed_s=sum(c.fixed_s * n for c, n in parts),
        per_sample_s=sum(c.per_sample_s * n for c, n in parts),
    )


# --- per-device measurement ----------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class _Point:
    busy_s: float
    peak_bytes: int


def _measure_piece(
    device: TorchDevice, preset: ModelPreset, piece: str, sizes: Sequence[int], repeats: int
) -> LayerCost:
    module = piece_module(preset, piece).to(device.torch_device)
    points = []
    for m in sizes:
        forward = piece_forward(preset, piece, module, m, device.torch_device)
        runs = []
        for _ in range(repeats):
            result = device.run_micro_batch(forward, model=module, micro_batch=m)
            module.zero_grad(set_to_none=True)
            runs.append(_Point(busy_s=result.busy_s, peak_bytes=result.peak_bytes))
        points.append(min(runs, key=lambda r: r.busy_s))
    fixed_s, per_sample_s = fit_line([float(m) for m in sizes], [p.busy_s for p in points])
    span = sizes[-1] - sizes[0]
    per_sample_bytes = max(points[-1].peak_bytes - points[0].peak_bytes, 0) // span
    return LayerCost(
        fixed_s=fixed_s,
        per_sample_s=per_sample_s,
        static_bytes=model_state_bytes(module),
        per_sample_bytes=per_sample_bytes,
    )


def measure_layers(
    device: TorchDevice,
    preset: ModelPreset,
    *,
    host_pieces: dict[str, HostCalibration] | None = None,
    sizes: Sequence[int] = DEVICE_SIZES,
    repeats: int = 2,
) -> LayerProfile:
    """Per-layer costs of ``preset`` on ``device``.

    A simulated device paces each piece by its share of the host time
    (``host_pieces``, from :func:`host_layers`), so it needs them; a CUDA
    device is timed as it is.

    Runs each piece, as a module of its own, through a device's ``run_micro_batch`` at
    two micro-batch sizes: the device's time (CUDA events on a GPU, the paced time on a
    simulated device) gives ``fixed_s`` and ``per_sample_s``; its peak memory gives the
    saved activations per sample (the slope), and the piece's parameters the model
    states (weights, gradients, AdamW moments). The head is measured as a pipeline's
    last stage holds it, with its own copy of the tied embedding weight, so its
    ``static_bytes`` include that copy
    (:func:`scheduler.planning.stages.tied_embedding`).
    """
    costs = {}
    for piece in PIECES:
        measuring = device
        if isinstance(device, SimulatedDevice):
            if host_pieces is None:
                raise ValueError("a simulated device needs the host's per-piece calibration")
            # Measure, do not enforce: a piece alone may be profiled on any device.
            measuring = SimulatedDevice(
                device_id=device.id,
                capacity_bytes=2**62,
                pacing=replace(device.pacing, host=host_pieces[piece]),
            )
        costs[piece] = _measure_piece(measuring, preset, piece, sizes, repeats)
    return LayerProfile(
        num_blocks=preset.num_layers,
        embed=costs["embed"],
        block=costs["block"],
        head=costs["head"],
        boundary_bytes_per_sample=preset.seq_len * preset.d_model * 4,
    )


def simulated_layers(
    pacing: Pacing,
    preset: ModelPreset,
    *,
    device_id: str,
    cache_dir: Path | None = None,
    repeats: int = 2,
) -> LayerProfile:
    """Per-layer figures of one simulated device paced by ``pacing`` (whole-model host time).

    For profilers: ``simulated_layers(pacing, preset, device_id=id, cache_dir=...)`` runs
    the pieces through a :class:`SimulatedDevice` with the same margin and speed ratio.
    """
    pieces = host_layers(preset, pacing.host, cache_dir=cache_dir)
    device = SimulatedDevice(device_id=device_id, capacity_bytes=2**62, pacing=pacing)
    return measure_layers(device, preset, host_pieces=pieces, repeats=repeats)
