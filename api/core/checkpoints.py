"""Reading a durable checkpoint directory back as one model's weights: what ``hetsched
export`` and :meth:`hetsched.Client.export` turn into a Hugging Face directory.

The format itself (a manifest and safetensors parts by global parameter name) is
:mod:`workers.checkpoint`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.errors import HetschedError
from scheduler.models.presets import ModelPreset, preset_from_dict
from workers.checkpoint import MANIFEST, CheckpointInfo, CheckpointStore, read_tensors


def find_in_directory(path: Path) -> CheckpointInfo:
    """The checkpoint of a step directory, or the latest under a job's root."""
    one_step = re.fullmatch(r"step-\d{8}", path.name) or (path / MANIFEST).exists()
    checkpoints = CheckpointStore(str(path.parent if one_step else path))
    if one_step:
        step = int(path.name.removeprefix("step-"))
        found = [c for c in checkpoints.complete() if c.step == step]
        if not found:
            raise HetschedError(
                f"checkpoint: {path} has no {MANIFEST}; it is torn (a crash while it was "
                "written) and cannot be exported"
            )
        return found[0]
    info = checkpoints.latest()
    if info is None:
        torn = sorted(p.name for p in path.glob("step-*"))
        what = f"only torn ones ({', '.join(torn)}: no {MANIFEST})" if torn else "none"
        raise HetschedError(f"checkpoint: {path} holds no complete checkpoint; {what}")
    return info


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
