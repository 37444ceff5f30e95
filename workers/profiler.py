"""The profiler: what each device costs per micro-batch and per sample, cached.

Each device is measured in its warm worker (:mod:`workers.cluster.pool`) by
:class:`workers.runtime.measure.Measurement`, simulated and real through the same
code; links of a real cluster by a timed all-reduce (bus bandwidth, Patarasuk &
Yuan 2009), a simulated cluster's from its spec.

A simulated device's figures are its paced time only while the host kept up
(:mod:`workers.devices.contention`): figures over their pacing are not cached,
and :func:`simulation_pace` says whether a simulation's profile and runs can be
trusted. Its times are proportional to the pacing margin, which follows the
host's live load: a cache entry records the margin it was measured at and is
read at any other by scaling its times (:func:`at_margin`), so a restarted
service re-profiles only when the model, the device or the host calibration changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from scheduler.cost.costs import sharding_of
from scheduler.cost.profile import LayerProfile, Profile, profile_from_dict
from scheduler.hardware.cluster import Cluster, Links
from scheduler.models.presets import ModelPreset, check_trainable
from workers.cluster.actors import gather, start_local_ray
from workers.cluster.pool import WorkerPool
from workers.devices.calibration import HostCalibration, calibrate_host, default_cache_dir
from workers.devices.contention import Lag, PaceCheck, lagging, profile_sizes, run_lags
from workers.devices.device import TorchDevice
from workers.devices.layer_profile import host_layers, measure_layers
from workers.devices.pacing import Pacing, PacingOf, no_pacing, pacing_margin, simulated_pacing
from workers.errors import WorkerError
from workers.runtime.measure import SIMULATED_TIMING_SIZES

PROFILE_TIMEOUT_S = 600.0
PROFILE_VERSION = 6
"""Bump when the measurement changes, so old cache entries are not reused."""


def cache_key(
    *,
    device_type: str,
    memory_bytes: int,
    capacity_bytes: int,
    preset: ModelPreset,
    simulated: bool,
    pacing: Pacing | None,
    layers: bool,
) -> str:
    """Everything that changes a device's figures, hashed: devices with the same key
    are measured once, and a later run reads them from the cache.

    The memory is, for real GPUs, what the node's driver reports
    (:func:`workers.session.connect_ray`); a simulated device's
    figures also follow its pacing: its speed ratio and host calibration, and not its
    margin ``K``, by which its times only scale (:func:`at_margin`).
    """
    parts: dict[str, Any] = {
        "version": PROFILE_VERSION,
        "type": device_type,
        "memory_bytes": memory_bytes,
        "capacity_bytes": capacity_bytes,
        "model": asdict(preset),
        "simulated": simulated,
        "layers": layers,
        "torch": torch.__version__,
    }
    if pacing is not None:
        parts["pacing"] = {
            "speed_ratio": round(pacing.speed_ratio, 9),
            "host": asdict(pacing.host),
        }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
    return f"{device_type}-{preset.name}-{'sim' if simulated else 'gpu'}-{digest}"


class LayerHook:
    """Per-layer measurement run inside a worker (pickled across Ray with its inputs)."""

    def __init__(self, host_pieces: dict[str, HostCalibration] | None) -> None:
        self.host_pieces = host_pieces

    def __call__(self, device: TorchDevice, preset: ModelPreset) -> LayerProfile:
        return measure_layers(device, preset, host_pieces=self.host_pieces)


def _non_negative(layers: dict[str, Any] | None) -> dict[str, Any] | None:
    """A fit may dip below zero on a noisy host; a negative time is noise, not a saving."""
    if not layers:
        return None
    out = dict(layers)
    for piece in ("embed", "block", "head"):
        if isinstance(out.get(piece), dict):
            out[piece] = {k: max(v, 0.0) if k.endswith("_s") else v for k, v in out[piece].items()}
    return out


def profile_cluster(
    cluster: Cluster,
    preset: ModelPreset,
    *,
    device_ids: list[str] | None = None,
    cache_dir: Path | None = None,
    refresh: bool = False,
    simulated: bool = True,
    layers: Any = "auto",
    pool: WorkerPool | None = None,
) -> Profile:
    """Measure (or read from the cache) every device of ``cluster`` (or ``device_ids``):
    the profile of DESIGN.md. A model no device could train fails first, in one line.

    ``layers``: ``"auto"`` measures per-layer figures in each device's worker,
    ``None`` skips them, a callable ``(device, preset) -> LayerProfile`` is
    used as given (it must be importable by the Ray workers). ``pool``: the
    warm workers to measure on (a temporary pool when None).
    """
    check_trainable(preset)
    cache_dir = cache_dir or default_cache_dir()
    ids = device_ids if device_ids is not None else cluster.ids
    devices = [cluster.device(i) for i in ids]
    if simulated:
        start_local_ray(cluster)
    elif pool is None:
        raise WorkerError("ray: not connected; call connect_ray(address) first")
    # refresh re-measures the host calibration too, and every profile the host's
    # contention: the pacing of later runs follows both.
    pacing_of = (
        simulated_pacing(cluster, preset, cache_dir=cache_dir, refresh=refresh, probe=True)
        if simulated
        else no_pacing
    )
    hook = _layer_hook(layers, preset, pacing_of(ids[0])[1], cache_dir)
    key_of: dict[str, str] = {}
    margin_of: dict[str, float | None] = {}
    for d in devices:
        capacity, pacing = pacing_of(d.id)
        key_of[d.id] = cache_key(
            device_type=d.type,
            memory_bytes=d.memory_bytes,
            capacity_bytes=capacity,
            preset=preset,
            simulated=simulated,
            pacing=pacing,
            layers=hook is not None,
        )
        margin_of[key_of[d.id]] = pacing.margin if pacing is not None else None
    folder = cache_dir / "profiles"
    results = {} if refresh else _read_cache(folder, margin_of)
    # One measurement per distinct cache key, on the first device that has it.
    first_of: dict[str, str] = {}
    for device_id, key in key_of.items():
        if key not in results:
            first_of.setdefault(key, device_id)
    own_pool = pool is None
    pool = pool or WorkerPool(cluster, simulated=simulated)
    try:
        results |= _measure(pool, preset, first_of, pacing_of, hook, folder)
        gradient_bytes = 4 * (preset.num_params + 1)
        links = cluster.links if simulated else _measure_links(pool, cluster, ids, gradient_bytes)
    finally:
        if own_pool:
            pool.shutdown()
    return profile_from_dict(
        {
            "model": preset.name,
            "source": "measured",
            "links": links.to_dict(),
            "gradient_bytes": gradient_bytes,
            "devices": [_device_doc(d.id, d.node, d.type, results[key_of[d.id]]) for d in devices],
            # as an analytic profile's: the model's units, collectives as the runtime's
            # backend runs them (gloo on simulated devices pads, NCCL on GPUs does not)
            "sharding": sharding_of(preset, padded_collectives=simulated).to_dict(),
        }
    )


def _layer_hook(layers: Any, preset: ModelPreset, pacing: Pacing | None, cache_dir: Path) -> Any:
    """What each worker runs for per-layer figures (see :func:`profile_cluster`)."""
    if layers != "auto":
        return layers
    pieces = host_layers(preset, pacing.host, cache_dir=cache_dir) if pacing else None
    return LayerHook(pieces)


def at_margin(entry: dict[str, Any], margin: float) -> dict[str, Any]:
    """A simulated device's cached figures at pacing margin ``margin``: every time
    (a ``_s`` key, per layer and recomputation mode too) scaled from the margin the entry
    was measured at, since a paced time is ``K · speed ratio · host time``; memory as is.

    >>> at_margin({"margin": 4.0, "figures": {"fixed_s": 0.5, "per_sample_bytes": 9}}, 8.0)
    {'figures': {'fixed_s': 1.0, 'per_sample_bytes': 9}, 'margin': 8.0}
    """
    factor = margin / entry["margin"]

    def scaled(doc: Any) -> Any:
        if not isinstance(doc, dict):
            return doc
        return {
            k: v * factor if k.endswith("_s") and isinstance(v, int | float) else scaled(v)
            for k, v in doc.items()
        }

    return {k: scaled(v) for k, v in entry.items() if k != "margin"} | {"margin": margin}


def _read_cache(folder: Path, margin_of: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    """The cached figures of those keys of ``margin_of`` that have a readable entry, at
    each key's pacing margin (None: a real GPU's, read as measured)."""
    results: dict[str, dict[str, Any]] = {}
    for key, margin in margin_of.items():
        path = folder / f"{key}.json"
        if path.exists():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
                entry = json.loads(path.read_text())
                results[key] = entry if margin is None else at_margin(entry, margin)
    return results


def _measure(
    pool: WorkerPool,
    preset: ModelPreset,
    first_of: dict[str, str],
    pacing_of: PacingOf,
    hook: Any,
    folder: Path,
) -> dict[str, dict[str, Any]]:
    """Measure each key's device (``first_of``: key -> device id) and cache the figures."""
    if not first_of:
        return {}
    todo_ids = list(first_of.values())
    actors = pool.acquire(todo_ids)
    measured = gather(
        [
            a.measure.remote(preset, *pacing_of(device_id), hook)
            for a, device_id in zip(actors, todo_ids, strict=True)
        ],
        todo_ids,
        timeout_s=PROFILE_TIMEOUT_S,
        what="profiling",
    )
    folder.mkdir(parents=True, exist_ok=True)
    results = dict(zip(first_of, measured, strict=True))
    for key, out in results.items():
        device_id = first_of[key]
        pacing = pacing_of(device_id)[1]
        if pacing is not None:
            if figure_lags(device_id, out["figures"], pacing):
                continue  # the host's time, not the GPU's: measure again next time
            out = out | {"margin": pacing.margin}  # read at any other by at_margin
        (folder / f"{key}.json").write_text(json.dumps(out, indent=2) + "\n")
    return results


def figure_lags(device_id: str, figures: dict[str, Any], pacing: Pacing) -> list[Lag]:
    """Where a simulated device's profiled line exceeds its pacing: at the smallest and
    the largest micro-batch it was timed at (the line's two ends)."""
    limit = figures.get("max_micro_batch", figures.get("micro_batch_limit"))
    lags = []
    for m in profile_sizes(limit, SIMULATED_TIMING_SIZES):
        measured = figures["fixed_s"] + m * figures["per_sample_s"]
        paced = pacing.target_s(m)
        if lagging(measured, paced):
            lags.append(
                Lag(device_id=device_id, where="profile", measured_s=measured, paced_s=paced)
            )
    return lags[-1:]


def simulation_pace(
    cluster: Cluster,
    preset: ModelPreset,
    profile: Profile,
    *,
    runs: Sequence[tuple[str, Sequence[tuple[str, float, float]]]],
    cache_dir: Path | None = None,
) -> PaceCheck:
    """Whether a simulation's devices kept their GPUs' pace, in its profile and its runs.

    ``runs``: per strategy, ``(device id, measured busy_s, planned busy_s)`` of each
    device (medians over the steps). The profile's figures are checked against the
    pacing they are read at (same calibration and speed ratio, the cache key; times
    scaled to the margin in force, :func:`at_margin`).
    """
    cache_dir = cache_dir or default_cache_dir()
    pacing_of = simulated_pacing(cluster, preset, cache_dir=cache_dir)
    margin, load = pacing_margin(cluster, preset, calibrate_host(preset, cache_dir=cache_dir))
    lags: list[Lag] = []
    for d in profile.devices:
        pacing = pacing_of(d.id)[1]
        if pacing is not None:
            figures = {"fixed_s": d.fixed_s, "per_sample_s": d.per_sample_s}
            lags += figure_lags(d.id, figures | {"max_micro_batch": d.micro_batch_limit}, pacing)
    for strategy, devices in runs:
        lags += run_lags(strategy, devices)
    return PaceCheck(margin=margin, load=load, lags=tuple(lags))


def _device_doc(
    device_id: str, node: str, device_type: str, result: dict[str, Any]
) -> dict[str, Any]:
    figures = dict(result["figures"])
    max_m = figures.pop("max_micro_batch")
    recompute = figures.pop("recompute", None)
    doc: dict[str, Any] = {"id": device_id, "node": node, "type": device_type, **figures}
    if recompute:
        doc["recompute"] = recompute
    if max_m >= 1:
        doc["micro_batch_limit"] = max_m
    layers = _non_negative(result.get("layers"))
    if layers:
        doc["layers"] = layers
    return doc


def _measure_links(
    pool: WorkerPool, cluster: Cluster, ids: list[str], gradient_bytes: int
) -> Links:
    """All-reduce bandwidth among the devices; the slowest ring hop it implies."""
    if len(ids) < 2:
        return cluster.links
    actors = pool.acquire(ids)
    addr, port = gather([actors[0].rendezvous.remote()], ids[:1], timeout_s=120, what="rendezvous")[
        0
    ]
    gbps = gather(
        [
            a.allreduce_gbps.remote(addr, port, r, len(ids), gradient_bytes)
            for r, a in enumerate(actors)
        ],
        ids,
        timeout_s=300,
        what="all-reduce",
    )
    measured = float(min(gbps))
    multi_node = len({cluster.device(i).node for i in ids}) > 1
    # The measured figure replaces the cluster-wide one; nodes the spec gives their own
    # links keep them.
    if multi_node:
        return replace(cluster.links, inter_node_gbps=measured)
    return replace(cluster.links, intra_node_gbps=measured)
