"""Hugging Face out and in: transformers computes hetsched's logits from an export."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from scheduler.errors import HetschedError
from scheduler.models.presets import ModelPreset, get_preset, preset_to_dict
from workers.models.families import build_model
from workers.models.hf import from_hf_state_dict, load_hf_directory, save_hf_directory

transformers = pytest.importorskip("transformers")

GPT = dataclasses.replace(get_preset("gpt-tiny"), num_layers=2, gelu_approximate="tanh")
LLAMA = dataclasses.replace(get_preset("llama-tiny"), num_layers=2, rope_theta=500.0)  # GQA 4:2
TOLERANCE = 1e-4


def _trained_like(preset: ModelPreset) -> torch.nn.Module:
    """A model whose norms and biases are not at their initial 1 and 0, as after training."""
    model = build_model(preset, seed=3).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or ".ln_" in f".{name}" or name.endswith("bias"):
                param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    return model


def _tokens(preset: ModelPreset) -> torch.Tensor:
    return torch.randint(0, preset.vocab_size, (2, preset.seq_len), generator=torch.Generator())


@pytest.mark.parametrize("preset", [GPT, LLAMA], ids=["gpt2", "llama-gqa"])
def test_transformers_computes_hetscheds_logits_from_an_export(
    preset: ModelPreset, tmp_path: Path
) -> None:
    model = _trained_like(preset)
    save_hf_directory(preset, model.state_dict(), tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    expected = {"gpt": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[preset.family]
    assert type(hf).__name__ == expected
    x = _tokens(preset)
    with torch.no_grad():
        ours, theirs = model(x), hf(x).logits
    assert (ours - theirs).abs().max().item() < TOLERANCE


@pytest.mark.parametrize("preset", [GPT, LLAMA], ids=["gpt2", "llama-gqa"])
def test_importing_an_export_reproduces_the_model(preset: ModelPreset, tmp_path: Path) -> None:
    model = _trained_like(preset)
    save_hf_directory(preset, model.state_dict(), tmp_path / "run-7")
    imported, state = load_hf_directory(tmp_path / "run-7")
    assert imported.name == "run-7"
    assert dataclasses.replace(imported, name=preset.name) == preset
    again = build_model(imported, seed=99)  # a different seed: every weight comes from the file
    again.load_state_dict(state)
    x = _tokens(preset)
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


def test_a_model_transformers_saved_imports_too(tmp_path: Path) -> None:
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=300,
        max_position_embeddings=32,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path)
    preset, state = load_hf_directory(tmp_path, seq_len=16)
    assert preset.seq_len == 16 and preset.num_kv_heads == 1
    model = build_model(preset, seed=0)
    model.load_state_dict(state)
    x = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        assert (model(x) - hf(x).logits).abs().max().item() < TOLERANCE


def test_weights_that_do_not_fit_the_config_are_one_line_errors(tmp_path: Path) -> None:
    model = build_model(LLAMA, seed=0)
    save_hf_directory(LLAMA, model.state_dict(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    with pytest.raises(HetschedError, match=r"hf: blocks.0.mlp.gate.weight has shape \(352, 128\)"):
        load_hf_directory(tmp_path)
    with pytest.raises(
        HetschedError, match="hf: no weight 'model.embed_tokens.weight' for a llama model"
    ):
        from_hf_state_dict(LLAMA, {})
    assert preset_to_dict(LLAMA)["num_kv_heads"] == 2
