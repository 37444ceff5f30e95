"""Byte-level language-modelling data with a split-independent sample order.

Every byte of a text file is a token (vocabulary 256, as the CPU presets
use). A sample is ``seq_len + 1`` consecutive bytes starting at some offset:
inputs are the first ``seq_len``, targets the last ``seq_len``.

Correctness rule (DESIGN.md): step ``t``'s global batch is a function of
``(seed, t)`` alone. :func:`batch_starts` draws the ``global_batch`` start
offsets from a generator seeded by ``(seed, t)``; a device whose plan offset
is ``o`` and that computes ``n`` samples takes starts ``[o, o + n)``. The
union over devices is therefore the same samples in the same order for any
plan, and a one-device run sees exactly the same batch.

The default corpus is ``workers/corpus/python-docs.txt`` (see its README),
shipped with the package so training needs no network.
"""

from __future__ import annotations

from pathlib import Path

import torch

from scheduler.errors import HetschedError

DEFAULT_CORPUS = Path(__file__).resolve().parent / "corpus" / "python-docs.txt"
VOCAB_SIZE = 256


def _step_seed(seed: int, step: int) -> int:
    return (seed * 6_364_136_223_846_793_005 + step * 1_442_695_040_888_963_407 + 1) % (2**63)


class ByteDataset:
    """The bytes of one text file as a token stream."""

    def __init__(self, path: Path | None, *, seq_len: int, vocab_size: int = VOCAB_SIZE) -> None:
        path = DEFAULT_CORPUS if path is None else Path(path)
        if vocab_size < VOCAB_SIZE:
            raise HetschedError(
                f"model: vocab_size {vocab_size} is too small for byte-level data (needs 256)"
            )
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise HetschedError(f"dataset: cannot read {path}: {exc.strerror or exc}") from exc
        if len(raw) < seq_len + 2:
            raise HetschedError(
                f"dataset: {path} has {len(raw)} bytes; needs at least seq_len + 2 = {seq_len + 2}"
            )
        self.path = path
        self.seq_len = seq_len
        self.tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)  # (N,)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.numel())

    def batch_starts(self, *, seed: int, step: int, global_batch: int) -> torch.Tensor:
        """Start offsets ``(global_batch,)`` of step ``step``'s samples, fixed by (seed, step)."""
        gen = torch.Generator().manual_seed(_step_seed(seed, step))
        high = self.num_tokens - self.seq_len - 1
        return torch.randint(0, high + 1, (global_batch,), generator=gen)

    def samples(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets ``(n, T)`` for the given start offsets."""
        offsets = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]  # (n, T+1)
        chunk = self.tokens[offsets]  # (n, T+1)
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
