"""The Llama family and the model factory, in this process: no Ray."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from scheduler.errors import HetschedError
from scheduler.models.presets import PRESETS, get_preset
from workers.data.dataset import ByteDataset
from workers.models.families import (
    build_model,
    model_pieces,
    piece_of_param,
    stage_pieces,
)
from workers.models.gpt import GPT, lm_loss_sum
from workers.models.llama import Llama

LLAMA = get_preset("llama-tiny")


def _batch(n: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return ByteDataset(None, seq_len=LLAMA.seq_len).device_batch(
        seed=0, step=0, global_batch=n, offset=0, samples=n
    )


@pytest.mark.parametrize("name", list(PRESETS))
def test_analytic_parameter_count_equals_the_built_model(name: str) -> None:
    preset = PRESETS[name]
    with torch.device("meta"):  # 13B parameters cost nothing here
        model = build_model(preset, seed=0)
    assert sum(p.numel() for p in model.parameters()) == preset.num_params
    with torch.device("meta"):
        embed = build_model(preset, seed=0, last=0, head=False)
        block = build_model(preset, seed=0, first=0, last=1, embed=False, head=False)
    assert sum(p.numel() for p in embed.parameters()) == preset.embed_params
    assert sum(p.numel() for p in block.parameters()) == preset.block_params


def test_factory_builds_each_family() -> None:
    assert isinstance(build_model(LLAMA, seed=0), Llama)
    assert isinstance(build_model(get_preset("gpt-tiny"), seed=0), GPT)


def test_llama_stages_hold_exactly_the_weights_of_the_whole_model() -> None:
    whole = build_model(LLAMA, seed=5)
    first = build_model(LLAMA, seed=5, first=0, last=1, head=False)
    middle = build_model(LLAMA, seed=5, first=1, last=3, embed=False, head=False)
    last = build_model(LLAMA, seed=5, first=3, embed=False)
    x, _ = _batch()
    logits = whole(x)
    assert logits.shape == (3, LLAMA.seq_len, LLAMA.vocab_size)
    assert torch.equal(last(middle(first(x))), logits)
    stage_params = {n: p for m in (first, middle, last) for n, p in m.named_parameters()}
    assert stage_params.keys() == dict(whole.named_parameters()).keys()
    for name, param in whole.named_parameters():
        assert torch.equal(stage_params[name], param), name


def test_llama_head_is_untied_and_seeds_differ() -> None:
    a, b = build_model(LLAMA, seed=0), build_model(LLAMA, seed=1)
    assert not torch.equal(a.output.weight, a.tok_embeddings.weight)
    assert not torch.equal(a.blocks["0"].attn.q.weight, b.blocks["0"].attn.q.weight)


def test_llama_initial_loss_is_that_of_a_uniform_guess_and_training_lowers_it() -> None:
    torch.manual_seed(0)
    model = build_model(LLAMA, seed=0)
    x, y = _batch(8)
    first = lm_loss_sum(model(x), y) / y.numel()
    assert first.item() == pytest.approx(torch.log(torch.tensor(256.0)).item(), abs=0.15)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(10):
        opt.zero_grad()
        (lm_loss_sum(model(x), y) / y.numel()).backward()
        opt.step()
    assert (lm_loss_sum(model(x), y) / y.numel()).item() < first.item() - 0.5


def test_grouped_query_attention_is_causal_and_shares_key_value_heads() -> None:
    preset = dataclasses.replace(LLAMA, num_kv_heads=1)
    model = build_model(preset, seed=0)
    assert model.blocks["0"].attn.k.weight.shape == (preset.head_dim, preset.d_model)
    x, _ = _batch(2)
    changed = x.clone()
    changed[:, 40:] = (changed[:, 40:] + 1) % 256
    # The future never leaks into the past: positions before 40 are unchanged.
    assert torch.allclose(model(x)[:, :40], model(changed)[:, :40])
    assert not torch.allclose(model(x)[:, 40:], model(changed)[:, 40:])


def test_rotary_embeddings_make_the_model_position_aware() -> None:
    model = build_model(LLAMA, seed=0)
    x = torch.full((1, 8), 65)  # the same token everywhere: only positions tell them apart
    logits = model(x)[0]
    assert not torch.allclose(logits[1], logits[7])


def test_pieces_cover_every_parameter_once_per_stage() -> None:
    for preset in (LLAMA, get_preset("gpt-tiny")):
        whole = build_model(preset, seed=0)
        assert {piece_of_param(preset, n) for n, _ in whole.named_parameters()} == set(
            model_pieces(preset)
        )
        last = build_model(preset, seed=0, first=2, embed=False)
        held = stage_pieces(preset, layers=(2, 4), is_first=False, is_last=True)
        assert {piece_of_param(preset, n) for n, _ in last.named_parameters()} == set(held)
    assert stage_pieces(LLAMA, layers=(2, 4), is_first=False, is_last=True) == [
        "block2",
        "block3",
        "norm",
        "output",
    ]


def test_wrong_family_and_bad_ranges_are_one_line_errors() -> None:
    with pytest.raises(HetschedError, match="llama-7b is a llama preset; build it with"):
        GPT(get_preset("llama-7b"), seed=0)
    with pytest.raises(HetschedError, match=r"layers: \[3, 9\) is not a block range"):
        build_model(LLAMA, seed=0, first=3, last=9)
    with pytest.raises(HetschedError, match="not a parameter of the llama family"):
        piece_of_param(LLAMA, "embed.wte.weight")


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters()}


def test_llama_gradients_are_the_same_whatever_the_split() -> None:
    """The correctness rule at model level: uneven data-parallel shares (gradients
    summed) and pipeline stages (gradients handed back across detached boundaries)
    give one device's full-batch gradient."""
    data = ByteDataset(None, seq_len=LLAMA.seq_len)
    G, scale = 6, 1.0 / (6 * LLAMA.seq_len)

    def data_parallel(split: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        model = build_model(LLAMA, seed=2).double()
        for offset, samples in split:  # one model accumulating = a SUM all-reduce
            x, y = data.device_batch(seed=0, step=3, global_batch=G, offset=offset, samples=samples)
            (lm_loss_sum(model(x), y) * scale).backward()
        return _grads(model)

    whole = data_parallel([(0, G)])
    uneven = data_parallel([(0, 1), (1, 3), (4, 2)])
    stages = [
        build_model(LLAMA, seed=2, first=0, last=1, head=False).double(),
        build_model(LLAMA, seed=2, first=1, last=3, embed=False, head=False).double(),
        build_model(LLAMA, seed=2, first=3, embed=False).double(),
    ]
    x, y = data.device_batch(seed=0, step=3, global_batch=G, offset=0, samples=G)
    h1 = stages[0](x)
    h1_in = h1.detach().requires_grad_()
    h2 = stages[1](h1_in)
    h2_in = h2.detach().requires_grad_()
    (lm_loss_sum(stages[2](h2_in), y) * scale).backward()
    h2.backward(h2_in.grad)
    h1.backward(h1_in.grad)
    piped = {n: g for stage in stages for n, g in _grads(stage).items()}
    assert whole.keys() == uneven.keys() == piped.keys()
    for name, grad in whole.items():
        assert torch.allclose(uneven[name], grad, rtol=1e-9, atol=1e-12), name
        assert torch.allclose(piped[name], grad, rtol=1e-9, atol=1e-12), name
