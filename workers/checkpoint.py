"""Checkpoints that any plan can write and any other plan can load.

DESIGN.md, "A job's life": a checkpoint holds the tensors as one device
training the whole model would hold them, by global parameter name — the
model, AdamW's two moments per parameter, an fp16 run's loss scale — plus a JSON manifest (format
version, step, model dimensions, optimizer step count, which part file holds
which name, and whatever the caller adds: the job spec, the plan that wrote
it). Tensors are in ``safetensors`` files.

Layout under a storage location (a local directory or any ``fsspec`` URI
every Ray node can reach, as Ray Train's ``storage_path``)::

    ROOT/step-00000042/part-0000.safetensors    one per writing rank
    ROOT/step-00000042/manifest.json            written last

Each writing rank (data parallelism: rank 0; pipelines: the stages of
pipeline 0, in parallel) writes its own part; the driver writes the
manifest only after every part is in place, so a crash mid-write leaves a
directory without a manifest, which is never loaded, and the previous
checkpoint stays the latest. ``keep_last`` complete checkpoints are kept.

Names: the tied GPT head (``head.weight``) is the token embedding
(``embed.wte.weight``) and is stored once under that name; a pipeline stage
that holds a copy of it loads it from there. (Llama's head, ``output.weight``,
is a parameter of its own.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from workers.errors import WorkerError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")
TIED = {"head.weight": "embed.wte.weight"}
"""Local parameter name -> the whole-model name it is stored under."""


def global_name(local: str) -> str:
    return TIED.get(local, local)


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointInfo:
    """A complete checkpoint: where it is and what its manifest says."""

    step: int
    """The last step it includes; training resumes at ``step + 1``."""
    uri: str
    manifest: dict[str, Any]


class CheckpointStore:
    """The checkpoints of one job under ``root`` (a path or fsspec URI)."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.fs, self._path = fsspec.core.url_to_fs(self.root)

    def step_uri(self, step: int) -> str:
        return f"{self.root}/step-{step:08d}"

    def complete(self) -> list[CheckpointInfo]:
        """Checkpoints whose manifest is in place, oldest first."""
        if not self.fs.exists(self._path):
            return []
        out = []
        for entry in sorted(self.fs.ls(self._path, detail=False)):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            match = _STEP_DIR.match(name)
            if match is None:
                continue
            manifest_path = f"{entry.rstrip('/')}/{MANIFEST}"
            if not self.fs.exists(manifest_path):
                continue  # torn: a crash before the manifest
            try:
                with self.fs.open(manifest_path, "r") as f:
                    manifest = json.load(f)
            except (OSError, ValueError):
                continue
            out.append(
                CheckpointInfo(
                    step=int(match.group(1)),
                    uri=self.step_uri(int(match.group(1))),
                    manifest=manifest,
                )
            )
        return out

    def latest(self) -> CheckpointInfo | None:
        done = self.complete()
        return done[-1] if done else None

    def get(self, step: int) -> CheckpointInfo:
        for info in self.complete():
            if info.step == step:
                return info
        steps = ", ".join(str(c.step) for c in self.complete()) or "none"
        raise WorkerError(f"checkpoint: no complete checkpoint at step {step}; have {steps}")

    def commit(
        self, step: int, parts: dict[str, list[str]], manifest: dict[str, Any]
    ) -> CheckpointInfo:
        """Write the manifest after every part (the checkpoint then counts)."""
        doc = {"format": FORMAT_VERSION, "step": step, "parts": parts, **manifest}
        path = f"{self._path}/step-{step:08d}/{MANIFEST}"
        tmp = f"{path}.tmp"
        with self.fs.open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
        self.fs.mv(tmp, path)
        return CheckpointInfo(step=step, uri=self.step_uri(step), manifest=doc)

    def prune(self, keep_last: int) -> tuple[int, ...]:
        """Keep the newest ``keep_last`` complete checkpoints; drop older and torn ones.

        Returns the steps of the complete checkpoints kept, oldest first.
        """
        done = self.complete()
        keep = {c.step for c in done[-keep_last:]} if keep_last > 0 else set()
        newest = done[-1].step if done else -1
        if not self.fs.exists(self._path):
            return ()
        for entry in self.fs.ls(self._path, detail=False):
            match = _STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if match is None:
                continue
            step = int(match.group(1))
            torn_and_old = step < newest and step not in {c.step for c in done}
            if (step not in keep and step in {c.step for c in done}) or torn_and_old:
                self.fs.rm(entry, recursive=True)
        return tuple(sorted(keep))


def write_weights(
    uri: str, state: Mapping[str, torch.Tensor], manifest: dict[str, Any]
) -> CheckpointInfo:
    """A checkpoint at ``uri`` of model weights alone (whole-model names), as of step -1.

    No optimizer state: a run restoring it starts at step 0 with fresh AdamW
    moments, which is how a fine-tune starts from released weights (a Hugging
    Face directory, :mod:`workers.models.hf`). It lies outside the job's step
    directories, so resuming and pruning never see it.
    """
    part = "part-0000.safetensors"
    tensors = {
        f"model/{name}": tensor.detach().cpu().contiguous()
        for name, tensor in state.items()
        if global_name(name) == name  # the tied head is stored as the embedding
    }
    doc = {
        "format": FORMAT_VERSION,
        "step": -1,
        "parts": {part: write_part(uri, part, tensors)},
        "optimizer_steps": 0,
        **manifest,
    }
    fs, path = fsspec.core.url_to_fs(uri)
    with fs.open(f"{path}/{MANIFEST}", "w") as f:
        json.dump(doc, f, indent=2)
    return CheckpointInfo(step=-1, uri=uri.rstrip("/"), manifest=doc)


# --- inside a worker: one rank's part ------------------------------------------------


def part_tensors(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, torch.Tensor]:
    """A rank's model and AdamW moments under whole-model names (CPU, contiguous)."""
    out: dict[str, torch.Tensor] = {}
    params = dict(model.named_parameters(remove_duplicate=True))
    for local, param in params.items():
        name = global_name(local)
        if name != local:
            continue  # a stage's copy of the tied embedding: stage 0 stores the original
        out[f"model/{name}"] = param.detach().cpu().contiguous().clone()
        state = optimizer.state.get(param, {})
        for moment in ("exp_avg", "exp_avg_sq"):
            if moment in state:
                out[f"optim/{moment}/{name}"] = state[moment].detach().cpu().contiguous().clone()
    return out


SCALER_PREFIX = "scaler/"
"""fp16 runs: the dynamic loss scale and its count of good steps, stored once (rank 0's
part), so a resumed job continues the scale (:class:`workers.runtime.precision.LossScaler`)."""
SCALER_KEYS = ("scale", "good_steps")


def scaler_tensors(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A loss scaler's state under its checkpoint names."""
    return {f"{SCALER_PREFIX}{k}": v.detach().cpu().reshape(()) for k, v in state.items()}


def read_scaler(uri: str, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The loss scaler's state in checkpoint ``uri``; empty for one written without it."""
    tensors = read_tensors(uri, manifest, [f"{SCALER_PREFIX}{k}" for k in SCALER_KEYS])
    return {k.removeprefix(SCALER_PREFIX): v for k, v in tensors.items()}


def optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    for state in optimizer.state.values():
        if "step" in state:
            return int(float(state["step"]))
    return 0


def write_part(uri: str, part: str, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Write one rank's part file; returns the names it holds."""
    fs, path = fsspec.core.url_to_fs(uri)
    fs.makedirs(path, exist_ok=True)
    with fs.open(f"{path}/{part}", "wb") as f:
        f.write(save_tensors(tensors))
    return sorted(tensors)


def read_tensors(
    uri: str, manifest: dict[str, Any], names: Iterable[str]
) -> dict[str, torch.Tensor]:
    """The named tensors, read from the parts that hold them."""
    wanted = set(names)
    fs, path = fsspec.core.url_to_fs(uri)
    out: dict[str, torch.Tensor] = {}
    for part, held in manifest["parts"].items():
        if not wanted & set(held):
            continue
        with fs.open(f"{path}/{part}", "rb") as f:
            tensors = load_tensors(f.read())
        out.update({k: v for k, v in tensors.items() if k in wanted})
    return out


def read_states(
    uri: str, manifest: dict[str, Any], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, dict[str, torch.Tensor]]:
    """By whole-model name: the parameter (``"model"``) and, where the checkpoint has
    them, AdamW's ``"exp_avg"`` and ``"exp_avg_sq"``; every name of ``shapes`` must be
    there with that shape."""
    keys = [f"model/{n}" for n in shapes]
    moments = [f"optim/{m}/{n}" for n in shapes for m in ("exp_avg", "exp_avg_sq")]
    tensors = read_tensors(uri, manifest, [*keys, *moments])
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise WorkerError(
            f"checkpoint: {uri} lacks {len(missing)} parameter(s) this model holds, "
            f"e.g. {missing[0].removeprefix('model/')} (another model?)"
        )
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, shape in shapes.items():
        source = tensors[f"model/{name}"]
        if tuple(source.shape) != tuple(shape):
            raise WorkerError(
                f"checkpoint: {name} has shape {tuple(source.shape)}, the model {tuple(shape)}"
            )
        out[name] = {"model": source}
        for moment in ("exp_avg", "exp_avg_sq"):
            if f"optim/{moment}/{name}" in tensors:
                out[name][moment] = tensors[f"optim/{moment}/{name}"]
    return out


def load_part(
    uri: str, manifest: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Load what this rank holds (any slice of the model) from a checkpoint of any plan."""
    params = dict(model.named_parameters(remove_duplicate=True))
    names = {local: global_name(local) for local in params}
    states = read_states(uri, manifest, {names[k]: tuple(p.shape) for k, p in params.items()})
    steps = int(manifest.get("optimizer_steps", 0))
    with torch.no_grad():
        for local, param in params.items():
            state = states[names[local]]
            param.copy_(state["model"].to(param.dtype))
            if "exp_avg" in state and steps > 0:
                optimizer.state[param] = {
                    "step": torch.tensor(float(steps)),
                    "exp_avg": state["exp_avg"].to(param),
                    "exp_avg_sq": state["exp_avg_sq"].to(param),
                }
