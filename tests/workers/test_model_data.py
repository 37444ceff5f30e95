"""The model and the data, in this process: no Ray."""

from __future__ import annotations

import pytest
import torch

from scheduler.errors import HetschedError
from tests.support import TINY
from workers.data.dataset import DEFAULT_CORPUS, ByteDataset
from workers.models.gpt import GPT, lm_loss_sum


def test_default_corpus_is_real_english_prose_shipped_with_the_package() -> None:
    text = DEFAULT_CORPUS.read_text()
    assert len(text) > 300_000
    words = text.split()
    assert sum(w.lower() in {"the", "and", "of", "to", "is"} for w in words) > 0.08 * len(words)


def test_step_batch_depends_on_seed_and_step_only_and_splits_are_contiguous_slices() -> None:
    data = ByteDataset(None, seq_len=TINY.seq_len)
    whole_x, whole_y = data.device_batch(seed=3, step=7, global_batch=10, offset=0, samples=10)
    parts = [
        data.device_batch(seed=3, step=7, global_batch=10, offset=o, samples=n)
        for o, n in [(0, 6), (6, 1), (7, 3)]
    ]
    assert torch.equal(torch.cat([x for x, _ in parts]), whole_x)
    assert torch.equal(torch.cat([y for _, y in parts]), whole_y)
    assert torch.equal(whole_x[:, 1:], whole_y[:, :-1])  # targets are inputs shifted by one
    other_step, _ = data.device_batch(seed=3, step=8, global_batch=10, offset=0, samples=10)
    other_seed, _ = data.device_batch(seed=4, step=7, global_batch=10, offset=0, samples=10)
    assert not torch.equal(other_step, whole_x) and not torch.equal(other_seed, whole_x)


def test_a_slice_outside_the_global_batch_is_a_clear_error() -> None:
    data = ByteDataset(None, seq_len=TINY.seq_len)
    with pytest.raises(
        HetschedError, match=r"samples \[8, 12\) lie outside the global batch of 10"
    ):
        data.device_batch(seed=0, step=0, global_batch=10, offset=8, samples=4)


def test_unreadable_dataset_names_the_file(tmp_path) -> None:
    with pytest.raises(HetschedError, match="dataset: cannot read .*missing.txt"):
        ByteDataset(tmp_path / "missing.txt", seq_len=64)


def test_stages_hold_exactly_the_weights_of_the_whole_model() -> None:
    whole = GPT(TINY, seed=9)
    first = GPT(TINY, seed=9, first=0, last=1, head=False)
    middle = GPT(TINY, seed=9, first=1, last=3, embed=False, head=False)
    last = GPT(TINY, seed=9, first=3, last=4, embed=False)
    x = ByteDataset(None, seq_len=TINY.seq_len).device_batch(
        seed=0, step=0, global_batch=3, offset=0, samples=3
    )[0]
    logits = whole(x)
    assert logits.shape == (3, TINY.seq_len, TINY.vocab_size)
    assert torch.equal(last(middle(first(x))), logits)
    # The untied head copy starts equal to the embedding it mirrors.
    assert torch.equal(last.head.weight, whole.embed.wte.weight)
    assert whole.tied and whole.head.weight is whole.embed.wte.weight
    assert whole.num_params() == TINY.num_params


def test_different_seeds_give_different_models() -> None:
    a, b = GPT(TINY, seed=0), GPT(TINY, seed=1)
    assert not torch.equal(a.blocks["0"].attn.qkv.weight, b.blocks["0"].attn.qkv.weight)


def test_initial_loss_is_that_of_a_uniform_guess() -> None:
    model = GPT(TINY, seed=0)
    x, y = ByteDataset(None, seq_len=TINY.seq_len).device_batch(
        seed=0, step=0, global_batch=4, offset=0, samples=4
    )
    loss = lm_loss_sum(model(x), y) / y.numel()
    assert loss.item() == pytest.approx(torch.log(torch.tensor(256.0)).item(), abs=0.15)
