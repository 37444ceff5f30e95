"""``hetsched prepare-data`` as a user runs it, and the token file it writes trains."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from scheduler.models.presets import get_preset
from tests.api.conftest import run_cli
from workers.data.datafile import inspect_dataset
from workers.data.dataset import DEFAULT_CORPUS, open_dataset
from workers.models.families import build_model
from workers.models.gpt import lm_loss_sum

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_bytes(DEFAULT_CORPUS.read_bytes()[:120_000])
    return path


def test_train_a_tokenizer_and_the_data_decodes_back_to_the_text(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "data" / "notes.bin"
    code, stdout, err = run_cli(
        capsys, "prepare-data", str(text), "-o", str(out), "--train-tokenizer", "512"
    )
    assert code == 0, err
    assert f"wrote {out}: " in stdout and "(uint16, vocabulary 512)" in stdout
    sidecar = json.loads((tmp_path / "data" / "notes.bin.json").read_text())
    assert sidecar == {"dtype": "uint16", "vocab_size": 512, "tokenizer": "notes.tokenizer.json"}
    ids = np.fromfile(out, dtype=np.uint16)
    assert len(ids) < 120_000 / 2  # BPE merges: well under one token per byte
    tokenizer = tokenizers.Tokenizer.from_file(str(tmp_path / "data" / "notes.tokenizer.json"))
    assert tokenizer.decode(ids.tolist()) == text.read_text()
    info = inspect_dataset(out, seq_len=64, vocab_size=512, global_batch=16)
    assert info.kind == "tokens" and info.tokenizer == "notes.tokenizer.json"

    # The same tokenizer given back encodes the same ids.
    again = tmp_path / "again.bin"
    tokenizer_file = str(tmp_path / "data" / "notes.tokenizer.json")
    assert (
        run_cli(capsys, "prepare-data", str(text), "-o", str(again), "--tokenizer", tokenizer_file)[
            0
        ]
        == 0
    )
    assert np.array_equal(np.fromfile(again, dtype=np.uint16), ids)
    assert (tmp_path / "again.tokenizer.json").is_file()


def test_without_a_tokenizer_the_tokens_are_the_bytes(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bytes.bin"
    assert run_cli(capsys, "prepare-data", str(text), "-o", str(out))[0] == 0
    assert np.array_equal(
        np.fromfile(out, dtype=np.uint16), np.frombuffer(text.read_bytes(), np.uint8)
    )
    assert json.loads((tmp_path / "bytes.bin.json").read_text())["vocab_size"] == 256


def test_a_prepared_token_file_trains_a_llama(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "notes.bin"
    run_cli(capsys, "prepare-data", str(text), "-o", str(out), "--train-tokenizer", "512")
    preset = dataclasses.replace(get_preset("llama-tiny"), vocab_size=512)
    data = open_dataset(out, seq_len=preset.seq_len, vocab_size=preset.vocab_size)
    val = open_dataset(out, seq_len=preset.seq_len, vocab_size=preset.vocab_size, split="val")
    model = build_model(preset, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def val_loss() -> float:
        x, y = val.device_batch(seed=0, step=0, global_batch=8, offset=0, samples=8)
        with torch.no_grad():
            return (lm_loss_sum(model(x), y) / y.numel()).item()

    before = val_loss()
    for step in range(30):
        x, y = data.device_batch(seed=0, step=step, global_batch=8, offset=0, samples=8)
        opt.zero_grad()
        (lm_loss_sum(model(x), y) / y.numel()).backward()
        opt.step()
    assert val_loss() < before - 0.5  # held-out tokens: it learned the language, not the batch


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--train-tokenizer", "100"], "--train-tokenizer: VOCAB must be >= 257"),
        (["--tokenizer", "{tmp}/nope.json"], "--tokenizer: cannot load "),
        (["-o", "{tmp}/data.txt"], "--output: must end in .bin, got 'data.txt'"),
    ],
)
def test_bad_requests_are_one_line_errors(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    argv = ["prepare-data", str(text), "-o", str(tmp_path / "d.bin")]
    argv += [a.replace("{tmp}", str(tmp_path)) for a in extra]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "d.bin").exists()


def test_missing_text_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys, "prepare-data", str(tmp_path / "x.txt"), "-o", str(tmp_path / "d.bin")
    )
    assert code == 2 and "TEXT: cannot read " in err
