"""Dataset files on disk: the two kinds, their checks, and the token file's sidecar.

A text file (any suffix but ``.bin``) is its bytes as tokens; a token file
``NAME.bin`` is a flat array of token ids described by its :class:`Sidecar`.
Only numpy is imported, so the control plane can check uploads cheaply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from scheduler.errors import HetschedError

TOKEN_SUFFIX = ".bin"
SIDECAR_SUFFIX = ".json"
TOKEN_DTYPES: dict[str, type[np.unsignedinteger[Any]]] = {"uint16": np.uint16, "uint32": np.uint32}
BYTE_VOCAB = 256
DEFAULT_CORPUS = Path(__file__).resolve().parent / "corpus" / "python-docs.txt"
"""The bundled byte-level corpus (see its README), the dataset named ``default``."""
DEFAULT_VAL_FRACTION = 0.05
"""Share of a dataset's tokens, at its end, held out for validation."""
_SCAN_TOKENS = 1 << 24
"""Tokens read at a time when scanning a file for its largest id."""

Split = Literal["train", "val"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Sidecar:
    """What ``NAME.bin.json`` says of the token file ``NAME.bin`` beside it.

    The token file is a flat array of token ids, the layout nanoGPT's
    ``prepare.py`` writes (``np.array(ids, dtype=np.uint16).tofile(...)``), native
    little-endian, no header; its dtype and vocabulary live here:
    ``{"dtype": "uint16", "vocab_size": 50257, "tokenizer": "NAME.tokenizer.json"}``
    (the tokenizer is optional, a file name beside the data).
    """

    dtype: str
    vocab_size: int
    tokenizer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "vocab_size": self.vocab_size, "tokenizer": self.tokenizer}


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetInfo:
    """What a job needs to know of a dataset file, found by :func:`inspect_dataset`."""

    path: Path
    kind: Literal["bytes", "tokens"]
    num_tokens: int
    vocab_size: int
    """Declared vocabulary (256 for text)."""
    max_token: int
    """Largest token id (found by scanning, or the vocabulary's largest)."""
    tokenizer: str | None = None

    def split_range(self, split: Split, val_fraction: float = DEFAULT_VAL_FRACTION) -> range:
        """Token positions of a split: validation is the last ``val_fraction`` of the file."""
        return split_range(self.num_tokens, split, val_fraction)


def split_range(num_tokens: int, split: Split, val_fraction: float) -> range:
    if not 0.0 <= val_fraction < 1.0:
        raise HetschedError(f"dataset.val_fraction: must be in [0, 1), got {val_fraction}")
    boundary = num_tokens - int(num_tokens * val_fraction)
    return range(0, boundary) if split == "train" else range(boundary, num_tokens)


def is_token_file(path: Path) -> bool:
    return path.suffix == TOKEN_SUFFIX


def sidecar_path(path: Path) -> Path:
    """``NAME.bin`` -> ``NAME.bin.json``."""
    return path.with_name(path.name + SIDECAR_SUFFIX)


def parse_sidecar(raw: Any, *, where: str) -> Sidecar:
    """A sidecar's checked contents; ``where`` names it in errors."""
    if not isinstance(raw, dict):
        raise HetschedError(f"{where}: must hold a JSON object with dtype and vocab_size")
    unknown = sorted(set(raw) - {"dtype", "vocab_size", "tokenizer"})
    if unknown:
        raise HetschedError(
            f"{where}.{unknown[0]}: unknown key; known: dtype, vocab_size, tokenizer"
        )
    dtype, vocab, tokenizer = raw.get("dtype"), raw.get("vocab_size"), raw.get("tokenizer")
    if dtype not in TOKEN_DTYPES:
        raise HetschedError(
            f"{where}.dtype: must be one of {', '.join(TOKEN_DTYPES)}, got {dtype!r}"
        )
    limit = int(np.iinfo(TOKEN_DTYPES[dtype]).max) + 1
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 2 <= vocab <= limit:
        raise HetschedError(
            f"{where}.vocab_size: must be an integer in [2, {limit}], got {vocab!r}"
        )
    if tokenizer is not None and (not isinstance(tokenizer, str) or "/" in tokenizer):
        raise HetschedError(
            f"{where}.tokenizer: must be a file name beside the data, got {tokenizer!r}"
        )
    return Sidecar(dtype=dtype, vocab_size=vocab, tokenizer=tokenizer)


def read_sidecar(path: Path) -> Sidecar:
    side = sidecar_path(path)
    try:
        raw = json.loads(side.read_text())
    except FileNotFoundError as exc:
        raise HetschedError(
            f"dataset: {path.name} needs its sidecar {side.name} "
            '({"dtype": "uint16", "vocab_size": N})'
        ) from exc
    except OSError as exc:
        raise HetschedError(f"dataset: cannot read {side}: {exc.strerror or exc}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise HetschedError(f"dataset: {side.name} is not valid JSON: {exc}") from exc
    return parse_sidecar(raw, where=side.name)


def token_dtype(vocab_size: int) -> str:
    """The narrowest dtype holding every id (nanoGPT's uint16 for GPT-2's 50257)."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def write_token_file(
    path: Path, ids: np.ndarray, *, vocab_size: int, tokenizer: str | None = None
) -> Sidecar:
    """Write ``ids`` as ``path`` (flat, native order) and its sidecar."""
    sidecar = Sidecar(dtype=token_dtype(vocab_size), vocab_size=vocab_size, tokenizer=tokenizer)
    np.asarray(ids, dtype=TOKEN_DTYPES[sidecar.dtype]).tofile(path)
    sidecar_path(path).write_text(json.dumps(sidecar.to_dict()) + "\n")
    return sidecar


def memmap_tokens(path: Path) -> tuple[np.ndarray, Sidecar]:
    """The token ids of a ``.bin`` file, memory-mapped, and its sidecar."""
    sidecar = read_sidecar(path)
    itemsize = np.dtype(TOKEN_DTYPES[sidecar.dtype]).itemsize
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise HetschedError(f"dataset: cannot read {path}: {exc.strerror or exc}") from exc
    if size % itemsize:
        raise HetschedError(
            f"dataset: {path.name} has {size} bytes, not a whole number of "
            f"{sidecar.dtype} tokens ({itemsize} bytes each); the file is corrupt or truncated"
        )
    if size == 0:
        raise HetschedError(f"dataset: {path.name} holds no tokens")
    return np.memmap(path, dtype=TOKEN_DTYPES[sidecar.dtype], mode="r"), sidecar


def max_token(tokens: np.ndarray) -> int:
    """The largest id, read in chunks so a large memory map is never copied whole."""
    return max(int(tokens[i : i + _SCAN_TOKENS].max()) for i in range(0, len(tokens), _SCAN_TOKENS))


def describe_file(path: Path) -> DatasetInfo:
    """A dataset file's kind, size and vocabulary, from its size and sidecar alone (cheap:
    ids are not scanned, so ``max_token`` is the largest id the vocabulary allows)."""
    if is_token_file(path):
        tokens, sidecar = memmap_tokens(path)
        return DatasetInfo(
            path=path,
            kind="tokens",
            num_tokens=len(tokens),
            vocab_size=sidecar.vocab_size,
            max_token=sidecar.vocab_size - 1,
            tokenizer=sidecar.tokenizer,
        )
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise HetschedError(f"dataset: cannot read {path}: {exc.strerror or exc}") from exc
    return DatasetInfo(
        path=path, kind="bytes", num_tokens=size, vocab_size=BYTE_VOCAB, max_token=BYTE_VOCAB - 1
    )


def check_token_ids(path: Path) -> int:
    """The largest id of a token file, which must lie below its declared vocabulary."""
    tokens, sidecar = memmap_tokens(path)
    largest = max_token(tokens)
    if largest >= sidecar.vocab_size:
        raise HetschedError(
            f"dataset: {path.name} holds token id {largest}, beyond its declared "
            f"vocab_size {sidecar.vocab_size}; the file is corrupt or its sidecar wrong"
        )
    return largest


def inspect_dataset(
    path: Path,
    *,
    seq_len: int,
    vocab_size: int | None = None,
    global_batch: int | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
) -> DatasetInfo:
    """Every check a job's dataset must pass, against a model (``vocab_size``, ``seq_len``)
    and a global batch when given; raises one line on the first failure.

    It runs every check a job needs before any worker
    starts, each failure one line naming the file and what is allowed: a missing
    or invalid sidecar, a size that is not a whole number of tokens, token ids
    beyond the declared vocabulary (a corrupt file), a declared vocabulary or
    ids beyond the model's, and too few tokens for one global batch.
    """
    info = describe_file(path)
    if info.kind == "tokens":
        check_token_ids(path)
    if vocab_size is not None and info.vocab_size > vocab_size:
        raise HetschedError(
            f"dataset: {path.name} has vocab_size {info.vocab_size}, larger than the model's "
            f"{vocab_size}; give a model with vocab_size >= {info.vocab_size}"
        )
    train = len(info.split_range("train", val_fraction))
    needed = (global_batch or 1) * seq_len + 1
    if train < needed:
        batch = (
            f"one global batch of {global_batch} × {seq_len} tokens"
            if global_batch
            else f"one sample of {seq_len} tokens"
        )
        raise HetschedError(
            f"dataset: {path.name} has {train:,} training tokens; {batch} needs {needed:,}"
        )
    return info
