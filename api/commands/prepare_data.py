"""``hetsched prepare-data``: a text file as a token-id dataset.

    hetsched prepare-data notes.txt -o notes.bin --train-tokenizer 4096
    hetsched prepare-data notes.txt -o notes.bin --tokenizer tokenizer.json
    hetsched prepare-data notes.txt -o notes.bin            # byte tokens, vocabulary 256

writes ``notes.bin`` (flat token ids, nanoGPT's layout), its sidecar
``notes.bin.json`` (dtype, vocabulary, tokenizer) and, with a tokenizer,
``notes.tokenizer.json`` beside them, so the three travel together (upload
them with ``POST /api/v1/datasets``; ``hetsched export --tokenizer`` ships the
tokenizer with a model). ``--train-tokenizer VOCAB`` trains a byte-level BPE
(GPT-2's scheme: every byte is in the alphabet, so any text encodes) on the
text itself, since nothing can be downloaded; ``<|endoftext|>`` is id 0.
Tokenizers are files of the ``tokenizers`` library (the ``hf`` extra).
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from api.commands.common import add_command
from scheduler.errors import HetschedError
from workers.data.datafile import BYTE_VOCAB, token_dtype, write_token_file

END_OF_TEXT = "<|endoftext|>"
CHUNK_CHARS = 1 << 20
"""Text encoded per batch: lines up to about a megabyte."""


def add_parser(subparsers: Any) -> None:
    parser = add_command(subparsers, "prepare-data", run)
    parser.add_argument("text", metavar="TEXT", help="UTF-8 text file")
    parser.add_argument("-o", "--output", required=True, metavar="DATA.bin", help="file to write")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--tokenizer", metavar="FILE", help="an existing tokenizer.json")
    how.add_argument(
        "--train-tokenizer",
        type=int,
        metavar="VOCAB",
        help="train a byte-level BPE of VOCAB tokens (>= 257) on TEXT",
    )


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ModuleNotFoundError as exc:
        raise HetschedError(
            "prepare-data: a tokenizer needs the tokenizers package; "
            "pip install 'hetsched[hf]' (or omit it for byte tokens)"
        ) from exc
    return tokenizers


def _chunks(text: str) -> Iterator[str]:
    """Pieces of about CHUNK_CHARS, cut after a newline so no word is split."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def train_tokenizer(text: str, vocab_size: int) -> Any:
    """A byte-level BPE of ``vocab_size`` tokens trained on ``text``."""
    tk = _tokenizers()
    alphabet = tk.pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise HetschedError(
            f"--train-tokenizer: VOCAB must be >= {len(alphabet) + 1} (every byte and "
            f"{END_OF_TEXT}), got {vocab_size}"
        )
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(_chunks(text), trainer=trainer)
    return tokenizer


def load_tokenizer(path: Path) -> Any:
    tk = _tokenizers()
    try:
        return tk.Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a plain Exception
        first_line = (str(exc).strip().splitlines() or ["unreadable"])[0]
        raise HetschedError(f"--tokenizer: cannot load {path}: {first_line}") from exc


def encode(tokenizer: Any, text: str) -> np.ndarray:
    ids = [np.asarray(e.ids, dtype=np.int64) for e in tokenizer.encode_batch(list(_chunks(text)))]
    return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)


def run(args: argparse.Namespace) -> int:
    source, out = Path(args.text), Path(args.output)
    if out.suffix != ".bin":
        raise HetschedError(f"--output: must end in .bin, got {out.name!r}")
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise HetschedError(f"TEXT: cannot read {source}: {exc.strerror or exc}") from exc
    tokenizer_out = out.with_suffix(".tokenizer.json")
    if args.tokenizer is None and args.train_tokenizer is None:
        ids, vocab_size, tokenizer_name = np.frombuffer(raw, dtype=np.uint8), BYTE_VOCAB, None
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HetschedError(f"TEXT: {source} is not UTF-8 text ({exc.reason})") from exc
        if args.tokenizer is not None:
            tokenizer = load_tokenizer(Path(args.tokenizer))
        else:
            tokenizer = train_tokenizer(text, args.train_tokenizer)
        vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        ids, tokenizer_name = encode(tokenizer, text), tokenizer_out.name
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if args.tokenizer is not None:
            if Path(args.tokenizer).resolve() != tokenizer_out.resolve():
                shutil.copyfile(args.tokenizer, tokenizer_out)
        elif args.train_tokenizer is not None:
            tokenizer.save(str(tokenizer_out))
        write_token_file(out, ids, vocab_size=vocab_size, tokenizer=tokenizer_name)
    except OSError as exc:
        raise HetschedError(f"--output: cannot write {out}: {exc.strerror or exc}") from exc
    per_token = len(raw) / max(len(ids), 1)
    tail = f"; tokenizer {tokenizer_out}" if tokenizer_name else ""
    print(
        f"wrote {out}: {len(ids):,} tokens ({token_dtype(vocab_size)}, vocabulary {vocab_size:,}) "
        f"from {len(raw):,} bytes of {source.name}, {per_token:.2f} bytes per token{tail}"
    )
    return 0
