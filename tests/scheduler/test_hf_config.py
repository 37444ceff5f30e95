"""Hugging Face configs to presets and back: pure, no transformers needed."""

from __future__ import annotations

import json

import pytest

from scheduler.errors import HetschedError
from scheduler.models.hf_config import (
    hf_config_from_preset,
    load_hf_config,
    preset_from_hf_config,
    resolve_model,
)
from scheduler.models.presets import PRESETS, get_preset

# The published configs of gpt2 and Llama-2-7b, trimmed to the fields that matter.
GPT2 = {
    "model_type": "gpt2",
    "n_layer": 12,
    "n_embd": 768,
    "n_head": 12,
    "n_inner": None,
    "n_positions": 1024,
    "vocab_size": 50257,
    "layer_norm_epsilon": 1e-5,
    "activation_function": "gelu_new",
}
LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


def test_published_configs_give_the_presets_sizes() -> None:
    gpt2 = preset_from_hf_config(GPT2, name="gpt2")
    assert gpt2.num_params == get_preset("gpt2-small").num_params == 124_439_808
    assert gpt2.gelu_approximate == "tanh" and gpt2.seq_len == gpt2.max_seq_len == 1024
    llama = preset_from_hf_config(LLAMA2_7B)
    assert llama.num_params == get_preset("llama-7b").num_params
    assert llama.name == "hf-llama" and llama.norm_eps == 1e-5


def test_seq_len_override_keeps_gpt2s_position_table() -> None:
    gpt2 = preset_from_hf_config(GPT2, seq_len=256)
    assert gpt2.seq_len == 256 and gpt2.max_seq_len == 1024
    assert gpt2.num_params == 124_439_808  # the position table stays 1024 rows


def test_grouped_query_and_rope_theta_in_either_place() -> None:
    v4 = preset_from_hf_config({**LLAMA2_7B, "num_key_value_heads": 8, "rope_theta": 5e5})
    v5 = preset_from_hf_config(
        {**LLAMA2_7B, "num_key_value_heads": 8, "rope_parameters": {"rope_theta": 5e5}}
    )
    assert v4 == v5 and v4.num_kv_heads == 8 and v4.rope_theta == 5e5
    assert v4.num_params < get_preset("llama-7b").num_params  # k and v shrink 4x


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_round_trips_through_a_config(name: str) -> None:
    preset = PRESETS[name]
    back = preset_from_hf_config(hf_config_from_preset(preset), name=name)
    assert back == preset


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "qwen2"}, "config.model_type: 'qwen2' is not supported; known: gpt2"),
        ({"tie_word_embeddings": True}, "config.tie_word_embeddings: the llama family has an"),
        ({"hidden_act": "gelu"}, "config.hidden_act: the llama family's MLP is SwiGLU"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "config.rope_scaling"),
        ({"num_key_value_heads": 5}, "model.num_kv_heads: 5 must be >= 1 and divide"),
        ({"hidden_size": "big"}, "config.hidden_size: must be an integer >= 1, got 'big'"),
        ({"head_dim": 128, "hidden_size": 2048}, "config.head_dim: must be hidden_size"),
    ],
)
def test_configs_hetsched_would_compute_differently_are_one_line_errors(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(HetschedError, match=message.replace("(", r"\(")) as info:
        preset_from_hf_config({**LLAMA2_7B, **change})
    assert "\n" not in str(info.value)


MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1's config.json, the fields read
    **LLAMA2_7B,
    "model_type": "mistral",
    "intermediate_size": 14336,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
}


def test_mistral_is_llama_with_grouped_queries_at_most_its_window_long() -> None:
    preset = preset_from_hf_config(MISTRAL_7B, name="mistral-7b")
    assert (preset.family, preset.num_kv_heads, preset.d_ff) == ("llama", 8, 14336)
    assert preset.seq_len == 4096, "trains at its window unless told"
    assert 7.0e9 < preset.num_params < 7.5e9  # Mistral 7B: 7.24 B parameters
    assert preset_from_hf_config({**MISTRAL_7B, "sliding_window": None}).seq_len == 32768
    with pytest.raises(HetschedError, match=r"^seq_len: 8192 exceeds config.sliding_window"):
        preset_from_hf_config(MISTRAL_7B, seq_len=8192)


def test_gpt2_needs_its_tied_head_and_a_known_activation() -> None:
    with pytest.raises(HetschedError, match="config.tie_word_embeddings: the gpt family ties"):
        preset_from_hf_config({**GPT2, "tie_word_embeddings": False})
    with pytest.raises(HetschedError, match="config.activation_function: 'relu' is not supp"):
        preset_from_hf_config({**GPT2, "activation_function": "relu"})


def test_a_path_or_directory_is_a_model_reference(tmp_path) -> None:
    directory = tmp_path / "my-llama"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(LLAMA2_7B))
    by_dir = resolve_model(str(directory))
    by_file = resolve_model(str(directory / "config.json"))
    assert by_dir == by_file and by_dir.name == "my-llama"
    assert resolve_model("gpt-tiny") == get_preset("gpt-tiny")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(HetschedError, match="bad.json is not valid JSON"):
        load_hf_config(tmp_path / "bad.json")
    with pytest.raises(HetschedError, match="model: cannot read .*missing.json"):
        resolve_model(str(tmp_path / "missing.json"))
