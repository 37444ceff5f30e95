"""The client's local files: a downloaded checkpoint unpacked, exported to a Hugging Face
directory (with the same code as ``hetsched export``), and a dataset read for upload."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from scheduler.errors import HetschedError


def step_directory(step: int) -> str:
    """A checkpoint's directory name, as :mod:`workers.checkpoint` writes it."""
    return f"step-{step:08d}"


def extract_checkpoint(archive: Path, dest: Path, step: int) -> Path:
    """Unpack the service's ``.tar.gz`` of one checkpoint to ``dest/step-NNNNNNNN`` (its
    one top folder renamed so), refusing members that would land outside it; the
    archive is removed. The directory."""
    target = dest / step_directory(step)
    if target.exists():
        raise HetschedError(f"download: {target} exists; remove it or choose another dest")
    staging = dest / f".{archive.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(staging, filter="data")  # no absolute paths, links or '..'
        (top,) = staging.iterdir()
        top.rename(target)
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise HetschedError(f"download: {archive.name} is not a checkpoint archive: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    archive.unlink()
    return target


def export_checkpoint(
    directory: Path, output: str | Path, *, tokenizer: str | Path | None, dtype: str
) -> list[Path]:
    """A checkpoint directory as a Hugging Face model directory; the files written."""
    # torch and the model code load here, not with the client: submitting and following
    # jobs from a notebook needs neither.
    import torch

    from api.core.checkpoints import find_in_directory, read_durable
    from workers.models.hf import save_hf_directory

    if dtype not in ("float32", "bfloat16", "float16"):
        raise HetschedError(f"dtype: {dtype!r} is not one of float32, bfloat16, float16")
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise HetschedError(f"tokenizer: no file {tokenizer}")
    preset, state = read_durable(find_in_directory(directory))
    return save_hf_directory(
        preset, state, output, tokenizer=tokenizer, dtype=getattr(torch, dtype)
    )


def read_upload(path: Path) -> bytes:
    """A dataset file's bytes, or a one-line error saying why they cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise HetschedError(f"upload: cannot read {path}: {exc.strerror}") from None
