"""Token-file datasets, the validation split and the dataset checks: no Ray."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from scheduler.errors import HetschedError
from workers.data.datafile import inspect_dataset, sidecar_path, write_token_file
from workers.data.dataset import DEFAULT_CORPUS, ByteDataset, TokenFileDataset, open_dataset

SEQ = 32


@pytest.fixture
def corpus_as_tokens(tmp_path: Path) -> Path:
    """The bundled corpus's bytes written as a uint16 token file (vocabulary 256)."""
    ids = np.frombuffer(DEFAULT_CORPUS.read_bytes(), dtype=np.uint8)
    path = tmp_path / "corpus.bin"
    write_token_file(path, ids, vocab_size=256)
    return path


def test_a_token_file_gives_the_same_batches_as_the_text_it_encodes(
    corpus_as_tokens: Path,
) -> None:
    assert json.loads(sidecar_path(corpus_as_tokens).read_text())["dtype"] == "uint16"
    text = open_dataset(None, seq_len=SEQ, vocab_size=256)
    tokens = open_dataset(corpus_as_tokens, seq_len=SEQ, vocab_size=256)
    assert isinstance(text, ByteDataset) and isinstance(tokens, TokenFileDataset)
    for step in (0, 5):
        a = text.device_batch(seed=1, step=step, global_batch=6, offset=2, samples=3)
        b = tokens.device_batch(seed=1, step=step, global_batch=6, offset=2, samples=3)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert b[0].dtype == torch.int64


def test_uint32_files_hold_large_vocabularies(tmp_path: Path) -> None:
    ids = np.arange(100_000, dtype=np.int64) % 70_000 + 1
    path = tmp_path / "big.bin"
    assert write_token_file(path, ids, vocab_size=70_001).dtype == "uint32"
    x, y = open_dataset(path, seq_len=SEQ, vocab_size=80_000).device_batch(
        seed=0, step=0, global_batch=4, offset=0, samples=4
    )
    assert int(x.max()) < 70_001 and torch.equal(x[:, 1:], y[:, :-1])
    assert (x[:, 1:] - x[:, :-1] == 1).float().mean() > 0.9  # consecutive ids, read in order


def test_validation_is_held_out_and_the_same_at_every_evaluation() -> None:
    train = ByteDataset(None, seq_len=SEQ, split="train")
    val = ByteDataset(None, seq_len=SEQ, split="val")
    boundary = val.first
    assert boundary == train.num_tokens and val.num_tokens > 0
    for step in range(20):
        starts = train.batch_starts(seed=step, step=step, global_batch=64)
        assert int(starts.max()) + SEQ + 1 <= boundary  # training never reads held-out tokens
    a = val.device_batch(seed=0, step=0, global_batch=8, offset=0, samples=8)
    b = val.device_batch(seed=7, step=99, global_batch=8, offset=0, samples=8)
    assert torch.equal(a[0], b[0])
    starts = val.batch_starts(seed=0, step=0, global_batch=8)
    assert int(starts.min()) >= boundary and len(set(starts.tolist())) == 8  # spread out
    split = [val.device_batch(seed=0, step=0, global_batch=8, offset=o, samples=4) for o in (0, 4)]
    assert torch.equal(torch.cat([x for x, _ in split]), a[0])


def _write(path: Path, data: bytes, sidecar: object | None) -> Path:
    path.write_bytes(data)
    if sidecar is not None:
        text = sidecar if isinstance(sidecar, str) else json.dumps(sidecar)
        sidecar_path(path).write_text(text)
    return path


U16 = {"dtype": "uint16", "vocab_size": 1000}
GOOD = np.arange(4000, dtype=np.uint16).__mod__(1000).astype(np.uint16).tobytes()


@pytest.mark.parametrize(
    ("data", "sidecar", "message"),
    [
        (GOOD, None, "dataset: d.bin needs its sidecar d.bin.json"),
        (GOOD, "{oops", "dataset: d.bin.json is not valid JSON"),
        (GOOD, {"dtype": "int8", "vocab_size": 10}, "d.bin.json.dtype: must be one of uint16"),
        (GOOD, {"dtype": "uint16", "vocab_size": 70000}, r"vocab_size: must be an integer in \[2"),
        (GOOD, {**U16, "tokenzier": "x"}, "d.bin.json.tokenzier: unknown key"),
        (GOOD + b"\x00", U16, "d.bin has 8001 bytes, not a whole number of uint16 tokens"),
        (np.full(100, 1500, np.uint16).tobytes() + GOOD, U16, "holds token id 1500, beyond its"),
        (GOOD, {"dtype": "uint16", "vocab_size": 1001}, "has vocab_size 1001, larger than the"),
        (GOOD[:100], U16, "d.bin has 50 training tokens; one global batch of 4 × 32 tokens"),
        (b"", U16, "dataset: d.bin holds no tokens"),
    ],
)
def test_bad_token_files_are_one_line_errors(
    tmp_path: Path, data: bytes, sidecar: object, message: str
) -> None:
    path = _write(tmp_path / "d.bin", data, sidecar)
    with pytest.raises(HetschedError, match=message) as info:
        inspect_dataset(path, seq_len=SEQ, vocab_size=1000, global_batch=4, val_fraction=0.0)
    assert "\n" not in str(info.value)


def test_a_text_dataset_too_small_for_one_global_batch(tmp_path: Path) -> None:
    path = tmp_path / "small.txt"
    path.write_text("x" * 1000)
    assert inspect_dataset(path, seq_len=SEQ, global_batch=4).kind == "bytes"
    with pytest.raises(HetschedError, match="small.txt has 950 training tokens; one global batch"):
        inspect_dataset(path, seq_len=SEQ, global_batch=64)
    with pytest.raises(HetschedError, match="the val split of small.txt has 50 tokens"):
        ByteDataset(path, seq_len=64, split="val")
