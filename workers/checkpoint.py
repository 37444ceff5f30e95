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
pipeline 0, in parallel) writes its own part and fsyncs it; the driver then
reads every part back for its size and SHA-256, fsyncs the parts, writes the
manifest (with those sizes and hashes) to a temporary name, fsyncs it,
renames it into place and fsyncs the folder, in that order, so the manifest
never reaches the disk before what it describes. A checkpoint counts only
once verified (:meth:`CheckpointStore.complete`): its manifest in place and
every part of the size and hash the manifest records. A crash or a power
loss mid-write leaves one that is never loaded, with a log line saying why,
and the previous verified checkpoint stays the latest. ``keep_last``
verified checkpoints are kept; one being downloaded is pinned
(:meth:`CheckpointStore.open_step`) and retention leaves it until the
download ends.

Names: the tied GPT head (``head.weight``) is the token embedding
(``embed.wte.weight``) and is stored once under that name; a pipeline stage
that holds a copy of it loads it from there. (Llama's head, ``output.weight``,
is a parameter of its own.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import fsspec
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from workers.errors import WorkerError

log = logging.getLogger("hetsched.checkpoint")
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
FILES = "files"
"""The manifest's key for each part's ``{"bytes": N, "sha256": HEX}``."""
PINS = ".pins"
"""``ROOT/.pins/step-NNNNNNNN.TOKEN``: a reader of that step; retention leaves it."""
PIN_STALE_S = 600.0
"""A pin not refreshed for this long is a reader that died; retention ignores it."""
PIN_REFRESH_S = 30.0
_STEP_DIR = re.compile(r"^step-(\d{8})$")
_READ_BYTES = 1 << 20
TIED = {"head.weight": "embed.wte.weight"}
"""Local parameter name -> the whole-model name it is stored under."""


def global_name(local: str) -> str:
    return TIED.get(local, local)


def _is_local(fs: Any) -> bool:
    return "file" in fs.protocol if isinstance(fs.protocol, tuple) else fs.protocol == "file"


def _fsync(fs: Any, path: str) -> None:
    """Make a local file or directory durable (an object store's write is, once it returns)."""
    if not _is_local(fs):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(fs: Any, path: str, data: bytes) -> None:
    with fs.open(path, "wb") as f:
        f.write(data)
        if _is_local(fs):
            f.flush()
            os.fsync(f.fileno())


def _digest(fs: Any, path: str) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex}`` of a stored file, read in pieces."""
    sha, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as f:
        while block := f.read(_READ_BYTES):
            sha.update(block)
            size += len(block)
    return {"bytes": size, "sha256": sha.hexdigest()}


def _commit_manifest(fs: Any, folder: str, doc: dict[str, Any]) -> None:
    """Parts, then manifest, then folder, each durable before the next: the manifest
    names only parts already on disk, with their sizes and hashes."""
    files = {}
    for part in doc["parts"]:
        _fsync(fs, f"{folder}/{part}")
        files[part] = _digest(fs, f"{folder}/{part}")
    doc[FILES] = files
    path = f"{folder}/{MANIFEST}"
    _write_durably(fs, f"{path}.tmp", json.dumps(doc, indent=2).encode())
    fs.mv(f"{path}.tmp", path)
    _fsync(fs, folder)
    _fsync(fs, folder.rsplit("/", 1)[0])  # the folder's own entry in the job's root


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointInfo:
    """A complete checkpoint: where it is and what its manifest says."""

    step: int
    """The last step it includes; training resumes at ``step + 1``."""
    uri: str
    manifest: dict[str, Any]


@dataclass(kw_only=True, slots=True)
class OpenCheckpoint:
    """One step's files, opened for a download and pinned against retention until
    :meth:`close`: ``(name relative to the step, size, open file)``, sorted by name."""

    files: list[tuple[str, int, IO[bytes]]]
    pin: str
    fs: Any
    _touched: float = field(default_factory=time.monotonic)

    def refresh(self) -> None:
        """Tell retention the reader is still there (cheap; at most every PIN_REFRESH_S)."""
        if time.monotonic() - self._touched >= PIN_REFRESH_S:
            self.fs.touch(self.pin, truncate=True)
            self._touched = time.monotonic()

    def close(self) -> None:
        for _, _, f in self.files:
            f.close()
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.pin)


class CheckpointStore:
    """The checkpoints of one job under ``root`` (a path or fsspec URI)."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.fs, self._path = fsspec.core.url_to_fs(self.root)
        self.skipped: dict[int, str] = {}
        """Step -> why its checkpoint is not loaded (torn, corrupt), as of :meth:`complete`."""
        self._hashes: dict[tuple[str, int, float], str] = {}
        """(part path, size, mtime) -> SHA-256 already read: a part is hashed once."""

    def step_uri(self, step: int) -> str:
        return f"{self.root}/step-{step:08d}"

    def complete(self) -> list[CheckpointInfo]:
        """Verified checkpoints, oldest first: the manifest in place and every part of the
        size and hash it records. The others are left out, each with its reason in
        :attr:`skipped` and a log line."""
        if not self.fs.exists(self._path):
            return []
        out, skipped = [], {}
        for entry in sorted(self.fs.ls(self._path, detail=False)):
            match = _STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if match is None:
                continue
            step = int(match.group(1))
            manifest, why = self._verified(entry.rstrip("/"))
            if manifest is None:
                skipped[step] = why
                if self.skipped.get(step) != why:
                    log.warning("checkpoint of step %d in %s skipped: %s", step, self.root, why)
                continue
            out.append(CheckpointInfo(step=step, uri=self.step_uri(step), manifest=manifest))
        self.skipped = skipped
        return out

    def _verified(self, folder: str) -> tuple[dict[str, Any] | None, str]:
        """The folder's manifest if it and its parts check out; else None and why not."""
        path = f"{folder}/{MANIFEST}"
        if not self.fs.exists(path):
            return None, f"no {MANIFEST} (a crash while it was written)"
        try:
            with self.fs.open(path, "r") as f:
                manifest = json.load(f)
        except (OSError, ValueError) as exc:
            return None, f"{MANIFEST} cannot be read ({exc})"
        if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), dict):
            return None, f"{MANIFEST} lists no parts"
        why = verify_parts(self.fs, folder, manifest, self._hashes)
        return (None, why) if why else (manifest, "")

    def latest(self) -> CheckpointInfo | None:
        done = self.complete()
        return done[-1] if done else None

    def get(self, step: int) -> CheckpointInfo:
        done = self.complete()
        for info in done:
            if info.step == step:
                return info
        if step in self.skipped:
            raise WorkerError(f"checkpoint: step {step} cannot be loaded: {self.skipped[step]}")
        steps = ", ".join(str(c.step) for c in done) or "none"
        raise WorkerError(f"checkpoint: no complete checkpoint at step {step}; have {steps}")

    def commit(
        self, step: int, parts: dict[str, list[str]], manifest: dict[str, Any]
    ) -> CheckpointInfo:
        """Write the manifest after every part, durably and in order (module docstring):
        from then on the checkpoint counts."""
        doc = {"format": FORMAT_VERSION, "step": step, "parts": parts, **manifest}
        folder = f"{self._path}/step-{step:08d}"
        _commit_manifest(self.fs, folder, doc)
        for part, recorded in doc[FILES].items():  # hashed once: retention need not again
            info = self.fs.info(f"{folder}/{part}")
            mtime = float(info.get("mtime") or info.get("created") or 0.0)
            self._hashes[f"{folder}/{part}", int(info["size"]), mtime] = recorded["sha256"]
        return CheckpointInfo(step=step, uri=self.step_uri(step), manifest=doc)

    def prune(self, keep_last: int) -> tuple[int, ...]:
        """Keep the newest ``keep_last`` verified checkpoints; drop older and torn ones,
        but none a download has pinned (it goes at a later prune).

        Returns the steps of the verified checkpoints kept, oldest first.
        """
        done = self.complete()
        keep = {c.step for c in done[-keep_last:]} if keep_last > 0 else set()
        newest = done[-1].step if done else -1
        if not self.fs.exists(self._path):
            return ()
        verified = {c.step for c in done}
        pinned = self.pinned()
        for entry in self.fs.ls(self._path, detail=False):
            match = _STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if match is None:
                continue
            step = int(match.group(1))
            torn_and_old = step < newest and step not in verified
            if ((step not in keep and step in verified) or torn_and_old) and step not in pinned:
                self.fs.rm(entry, recursive=True)
        return tuple(sorted(keep))

    def pinned(self) -> set[int]:
        """Steps a live download reads (a pin refreshed within PIN_STALE_S)."""
        pins = f"{self._path}/{PINS}"
        if not self.fs.exists(pins):
            return set()
        out = set()
        for info in self.fs.ls(pins, detail=True):
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            match = _STEP_DIR.match(name.split(".", 1)[0])
            mtime = info.get("mtime") or info.get("created") or 0.0
            if match is not None and time.time() - float(mtime) < PIN_STALE_S:
                out.add(int(match.group(1)))
        return out

    def open_step(self, step: int) -> OpenCheckpoint | None:
        """Pin step ``step`` and open every file of it, or None when it is gone (or torn).

        Pinned first, then checked, then opened: a prune that raced the pin either ran
        before the check (None: the caller answers 410, not a truncated download) or
        sees the pin and leaves the files. On a local disk an open file also outlives
        its deletion.
        """
        folder = f"{self._path}/step-{step:08d}"
        pin = f"{self._path}/{PINS}/step-{step:08d}.{uuid.uuid4().hex[:12]}"
        self.fs.makedirs(f"{self._path}/{PINS}", exist_ok=True)
        self.fs.touch(pin)
        files: list[tuple[str, int, IO[bytes]]] = []
        try:
            if not self.fs.exists(f"{folder}/{MANIFEST}"):
                raise FileNotFoundError(folder)
            for path in sorted(self.fs.find(folder)):
                name = path[len(folder) :].lstrip("/")
                handle = self.fs.open(path, "rb")
                files.append((name, int(self.fs.size(path)), handle))
        except FileNotFoundError:
            OpenCheckpoint(files=files, pin=pin, fs=self.fs).close()
            return None
        return OpenCheckpoint(files=files, pin=pin, fs=self.fs)


def verify_parts(
    fs: Any,
    folder: str,
    manifest: Mapping[str, Any],
    hashes: dict[tuple[str, int, float], str] | None = None,
) -> str:
    """Why the parts in ``folder`` do not match ``manifest`` ("" when they do): one
    missing, or of another size or SHA-256 than recorded (a manifest written before
    sizes were recorded is checked for its parts' presence only)."""
    recorded = manifest.get(FILES) or {}
    cache = hashes if hashes is not None else {}
    for part in manifest["parts"]:
        path = f"{folder}/{part}"
        try:
            info = fs.info(path)
        except FileNotFoundError:
            return f"{part} is missing"
        want = recorded.get(part)
        if not isinstance(want, Mapping):
            continue
        size = int(info.get("size") or 0)
        if size != want.get("bytes"):
            return f"{part} has {size} bytes, the manifest says {want.get('bytes')} (torn)"
        key = (path, size, float(info.get("mtime") or info.get("created") or 0.0))
        if key not in cache:
            cache[key] = _digest(fs, path)["sha256"]
        if cache[key] != want.get("sha256"):
            return f"{part}'s SHA-256 differs from the manifest's (corrupt)"
    return ""


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
    _commit_manifest(fs, path.rstrip("/"), doc)
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
    _write_durably(fs, f"{path}/{part}", save_tensors(tensors))
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
