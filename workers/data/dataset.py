"""Language-modelling data with a split-independent sample order.

Step ``t``'s global batch is a function of ``(seed, t)`` alone (DESIGN.md,
"Correctness"): the same samples in the same order whatever the plan. Two kinds of
dataset (:mod:`workers.data.datafile`) share that code: the bytes of a text file and
a flat file of token ids; :func:`open_dataset` returns either.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from scheduler.errors import HetschedError
from workers.data.datafile import (
    BYTE_VOCAB,
    DEFAULT_CORPUS,
    DEFAULT_VAL_FRACTION,
    Split,
    inspect_dataset,
    is_token_file,
    memmap_tokens,
    split_range,
)

VOCAB_SIZE = BYTE_VOCAB


def _step_seed(seed: int, step: int) -> int:
    return (seed * 6_364_136_223_846_793_005 + step * 1_442_695_040_888_963_407 + 1) % (2**63)


class TokenDataset:
    """One split of a token stream ``tokens`` (N,), any integer array, possibly mapped.

    A sample is ``seq_len + 1`` consecutive tokens starting at some offset: inputs
    are the first ``seq_len``, targets the last ``seq_len``. The last
    ``val_fraction`` of the tokens (5 % by default) form the ``val`` split, which
    training never reads. The two kinds of dataset differ only in how tokens are
    read.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        *,
        path: Path,
        seq_len: int,
        split: Split = "train",
        val_fraction: float = DEFAULT_VAL_FRACTION,
    ) -> None:
        if split not in ("train", "val"):
            raise HetschedError(f"dataset.split: must be 'train' or 'val', got {split!r}")
        region = split_range(len(tokens), split, val_fraction)
        if len(region) < seq_len + 1:
            raise HetschedError(
                f"dataset: the {split} split of {path.name} has {len(region)} tokens; "
                f"a sample needs seq_len + 1 = {seq_len + 1}"
            )
        self.path = path
        self.seq_len = seq_len
        self.split = split
        self.tokens = tokens
        self.first = region.start
        self.num_tokens = len(region)
        """Tokens in this split."""

    def batch_starts(self, *, seed: int, step: int, global_batch: int) -> torch.Tensor:
        """Start offsets ``(global_batch,)`` of step ``step``'s samples, fixed by (seed, step).

        Drawn from a generator seeded by ``(seed, step)``; a device whose plan offset
        is ``o`` and that computes ``n`` samples takes starts ``[o, o + n)``. The
        union over devices is therefore the same samples in the same order for any
        plan, and a one-device run sees exactly the same batch.

        For the ``val`` split: ``global_batch`` windows spread evenly over the split,
        the same for every seed and step, so a validation curve shows the model
        changing, not the sample.
        """
        high = self.num_tokens - self.seq_len - 1
        if self.split == "val":
            spread = torch.linspace(0, high, global_batch, dtype=torch.float64)
            return self.first + spread.round().to(torch.int64)
        gen = torch.Generator().manual_seed(_step_seed(seed, step))
        return self.first + torch.randint(0, high + 1, (global_batch,), generator=gen)

    def samples(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets ``(n, T)`` for the given start offsets."""
        offsets = starts.numpy()[:, None] + np.arange(self.seq_len + 1)[None, :]  # (n, T+1)
        chunk = torch.from_numpy(self.tokens[offsets].astype(np.int64))  # (n, T+1)
        return chunk[:, :-1], chunk[:, 1:]

    def device_batch(
        self, *, seed: int, step: int, global_batch: int, offset: int, samples: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``[offset, offset + samples)`` slice of step ``step``'s global batch."""
        if offset < 0 or samples < 0 or offset + samples > global_batch:
            raise HetschedError(
                f"plan: samples [{offset}, {offset + samples}) lie outside the global batch "
                f"of {global_batch}"
            )
        starts = self.batch_starts(seed=seed, step=step, global_batch=global_batch)
        return self.samples(starts[offset : offset + samples])


class ByteDataset(TokenDataset):
    """The bytes of one text file as a token stream (the bundled corpus by default)."""

    def __init__(
        self,
        path: Path | None,
        *,
        seq_len: int,
        vocab_size: int = VOCAB_SIZE,
        split: Split = "train",
        val_fraction: float = DEFAULT_VAL_FRACTION,
    ) -> None:
        path = DEFAULT_CORPUS if path is None else Path(path)
        if vocab_size < VOCAB_SIZE:
            raise HetschedError(
                f"model: vocab_size {vocab_size} is too small for byte-level data (needs 256)"
            )
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise HetschedError(f"dataset: cannot read {path}: {exc.strerror or exc}") from exc
        tokens = np.frombuffer(raw, dtype=np.uint8)  # (N,)
        super().__init__(tokens, path=path, seq_len=seq_len, split=split, val_fraction=val_fraction)


class TokenFileDataset(TokenDataset):
    """A ``.bin`` file of token ids (workers/data/datafile.py), memory-mapped, never read whole."""

    def __init__(
        self,
        path: Path,
        *,
        seq_len: int,
        vocab_size: int,
        split: Split = "train",
        val_fraction: float = DEFAULT_VAL_FRACTION,
    ) -> None:
        path = Path(path)
        info = inspect_dataset(path, seq_len=seq_len, vocab_size=vocab_size, val_fraction=0.0)
        tokens, _ = memmap_tokens(path)
        self.vocab_size = info.vocab_size
        self.tokenizer = info.tokenizer
        super().__init__(tokens, path=path, seq_len=seq_len, split=split, val_fraction=val_fraction)


def open_dataset(
    path: Path | None,
    *,
    seq_len: int,
    vocab_size: int,
    split: Split = "train",
    val_fraction: float = DEFAULT_VAL_FRACTION,
) -> TokenDataset:
    """A ``.bin`` token file, or the bytes of any other file (``None``: the bundled corpus).

    The default corpus is ``workers/data/corpus/python-docs.txt`` (see its README),
    shipped with the package so training needs no network.
    """
    if path is not None and is_token_file(Path(path)):
        return TokenFileDataset(
            Path(path),
            seq_len=seq_len,
            vocab_size=vocab_size,
            split=split,
            val_fraction=val_fraction,
        )
    return ByteDataset(
        path, seq_len=seq_len, vocab_size=vocab_size, split=split, val_fraction=val_fraction
    )
