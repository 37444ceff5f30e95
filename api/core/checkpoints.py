"""Reading a durable checkpoint directory back as one model's weights: what ``hetsched
export`` and :meth:`hetsched.Client.export` turn into a Hugging Face directory.

The format itself (a manifest and safetensors parts by global parameter name) is
:mod:`workers.checkpoint`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec

from scheduler.errors import HetschedError
from scheduler.models.presets import ModelPreset, preset_from_dict
from workers.checkpoint import (
    MANIFEST,
    CheckpointInfo,
    CheckpointStore,
    read_tensors,
    verify_parts,
)


def find_in_directory(path: Path) -> CheckpointInfo:
    """The checkpoint of one step's directory (under any name: a download unpacks as
    ``JOB-step-NNNNNNNN/``), or the latest under a job's root."""
    if (path / MANIFEST).exists():
        return read_step_directory(path)
    if re.fullmatch(r"step-\d{8}", path.name):
        raise HetschedError(
            f"checkpoint: {path} has no {MANIFEST}; it is torn (a crash while it was "
            "written) and cannot be exported"
        )
    checkpoints = CheckpointStore(str(path))
    info = checkpoints.latest()
    if info is None:
        torn = [f"step-{s:08d}: {why}" for s, why in sorted(checkpoints.skipped.items())]
        what = f"only torn ones ({'; '.join(torn)})" if torn else "none"
        raise HetschedError(f"checkpoint: {path} holds no complete checkpoint; {what}")
    return info


def read_json(path: Path) -> Any:
    """The JSON document of a checkpoint's ``path`` (manifest, sidecar), or a one-line error."""
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise HetschedError(f"checkpoint: cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise HetschedError(f"checkpoint: {path} is not valid JSON: {exc}") from exc


def read_step_directory(path: Path) -> CheckpointInfo:
    """One checkpoint's directory, its manifest read and its parts verified."""
    where = path / MANIFEST
    manifest = read_json(where)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), dict):
        raise HetschedError(f"checkpoint: {where} is not a hetsched manifest (no 'parts')")
    step = manifest.get("step")
    if not isinstance(step, int):
        raise HetschedError(f"checkpoint: {where} has no integer 'step'")
    fs, root = fsspec.core.url_to_fs(str(path))
    why = verify_parts(fs, root, manifest)
    if why:
        raise HetschedError(f"checkpoint: {path} cannot be exported: {why}")
    return CheckpointInfo(step=step, uri=str(path), manifest=manifest)


def read_durable(info: CheckpointInfo) -> tuple[ModelPreset, dict[str, Any]]:
    """The model and weights of a durable checkpoint (its manifest and safetensors parts)."""
    where = f"{info.uri}/{MANIFEST}"
    raw = info.manifest.get("model")
    if not isinstance(raw, Mapping):
        raise HetschedError(f"checkpoint: {where} lacks the model's dimensions ('model')")
    preset = preset_from_dict(dict(raw), where=f"{where}.model")
    names = [n for held in info.manifest.get("parts", {}).values() for n in held]
    try:
        tensors = read_tensors(
            info.uri, info.manifest, [n for n in names if n.startswith("model/")]
        )
    except Exception as exc:  # a missing part, a truncated safetensors file
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise HetschedError(
            f"checkpoint: {info.uri} is torn or corrupt (a part cannot be read: {first_line})"
        ) from exc
    return preset, {k.removeprefix("model/"): v for k, v in tensors.items()}
