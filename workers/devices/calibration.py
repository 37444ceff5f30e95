"""Host calibration: this machine's own forward+backward time for one model.

Simulated devices are paced relative to it (:mod:`workers.devices.device`): device
``i`` takes ``K · (speed_max / speed_i) · t_host(m)`` per micro-batch of
``m`` samples. ``t_host(m) = fixed_s + m · per_sample_s`` is fitted by least
squares on the minimum of several single-thread runs per size, each timed in
thread CPU time (``time.thread_time``): what the compute costs, the same while
other processes share the cores, where wall time would count the time the
thread waited for one. It is measured once per host and model and cached on
disk, so profiles and training runs in later processes pace identically.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray
import torch

from scheduler.models.presets import ModelPreset
from workers.data.dataset import ByteDataset
from workers.models.families import build_model
from workers.models.gpt import lm_loss_sum

CALIBRATION_SIZES = (1, 2, 4, 8, 16)
CALIBRATION_REPEATS = 5
_MEMO: dict[str, HostCalibration] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCalibration:
    """This host's single-thread forward+backward CPU time of one model (uncontended)."""

    fixed_s: float
    per_sample_s: float

    def time_s(self, micro_batch: int) -> float:
        return self.fixed_s + micro_batch * self.per_sample_s


def default_cache_dir() -> Path:
    """``$HETSCHED_CACHE_DIR`` or ``~/.cache/hetsched``: profiles and calibrations."""
    env = os.environ.get("HETSCHED_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "hetsched"


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b·x``; returns ``(a, b)``, neither of them negative.

    A negative fixed cost, or a time that shrinks as the work grows (timings
    taken on a loaded host), is noise: the line is fitted through the origin.

    >>> fit_line([1, 2, 4], [3.0, 5.0, 9.0])
    (1.0, 2.0)
    >>> fit_line([1, 2, 4], [4.0, 3.0, 3.0])
    (0.0, 1.047619047619)
    """
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx if sxx > 0 else mean_y / max(mean_x, 1e-12)
    intercept = mean_y - slope * mean_x
    if intercept < 0 or slope < 0:  # noise; refit through the origin
        slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
        intercept = 0.0
    return round(intercept, 12), round(slope, 12)


def host_key(preset: ModelPreset) -> str:
    """What the calibration depends on: the model's shape, this host and torch."""
    shape = (
        f"L{preset.num_layers}-C{preset.d_model}-H{preset.num_heads}-F{preset.d_ff}"
        f"-V{preset.vocab_size}-T{preset.seq_len}"
    )
    # "cputime": timed in CPU time (older calibrations, in wall time, are measured again)
    host = f"{platform.node()}-{os.cpu_count()}cpu-torch{torch.__version__}-cputime"
    return f"{preset.name}-{shape}-{host}".replace("/", "_").replace(" ", "_")


class ForwardBackward:
    """``preset``'s forward+backward on this thread, timed in its CPU time: what the
    calibration measures, and what the live probe
    (:func:`workers.devices.contention.probe_host`) repeats under the load of the moment."""

    def __init__(self, preset: ModelPreset) -> None:
        self.model = build_model(preset, seed=0)
        self.data = ByteDataset(None, seq_len=preset.seq_len, vocab_size=preset.vocab_size)
        self.batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def cpu_s(self, micro_batch: int) -> float:
        """Run one pass of ``micro_batch`` samples; its thread CPU time."""
        if micro_batch not in self.batches:
            self.batches[micro_batch] = self.data.device_batch(
                seed=0, step=micro_batch, global_batch=micro_batch, offset=0, samples=micro_batch
            )
        x, y = self.batches[micro_batch]
        start = time.thread_time()
        lm_loss_sum(self.model(x), y).backward()
        elapsed = time.thread_time() - start
        self.model.zero_grad(set_to_none=True)
        return elapsed


def measure_host(
    preset: ModelPreset,
    *,
    sizes: Sequence[int] = CALIBRATION_SIZES,
    repeats: int = CALIBRATION_REPEATS,
) -> HostCalibration:
    """Time forward+backward on one CPU thread (its CPU time); min over repeats, a line fit."""
    torch.set_num_threads(1)
    passes = ForwardBackward(preset)
    best: list[float] = []
    for m in sizes:
        times = [passes.cpu_s(m) for _ in range(repeats + 1)]  # the first warms caches up
        best.append(min(times[1:]))
    fixed_s, per_sample_s = fit_line([float(m) for m in sizes], best)
    return HostCalibration(fixed_s=fixed_s, per_sample_s=per_sample_s)


def _measure_remote(preset: ModelPreset) -> HostCalibration:
    """Run :func:`measure_host` in a fresh Ray worker (one thread, like the device actors)."""
    task = ray.remote(num_cpus=0)(measure_host)
    return ray.get(task.remote(preset))


def calibrate_host(
    preset: ModelPreset, *, cache_dir: Path | None = None, refresh: bool = False
) -> HostCalibration:
    """The host calibration for ``preset``: memory, then disk cache, then a measurement."""
    key = host_key(preset)
    path = (cache_dir or default_cache_dir()) / "calibration" / f"{key}.json"
    with _LOCK:
        if not refresh and key in _MEMO:
            return _MEMO[key]
        if not refresh and path.exists():
            try:
                raw = json.loads(path.read_text())
                cal = HostCalibration(
                    fixed_s=float(raw["fixed_s"]), per_sample_s=float(raw["per_sample_s"])
                )
                _MEMO[key] = cal
                return cal
            except (OSError, ValueError, KeyError, TypeError):
                pass  # unreadable cache: measure again
        cal = _measure_remote(preset) if ray.is_initialized() else measure_host(preset)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {"key": key, "fixed_s": cal.fixed_s, "per_sample_s": cal.per_sample_s}, indent=2
            )
            + "\n"
        )
        _MEMO[key] = cal
        return cal
