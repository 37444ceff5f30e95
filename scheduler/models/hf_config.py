"""Hugging Face ``config.json`` to and from the model description the planner uses.

A model may be given as a preset name, explicit dimensions, or a Hugging Face
configuration (a ``config.json``, or the directory holding one) of model type
``gpt2``, ``llama`` or ``mistral`` (Llama's layers with grouped-query attention, Jiang et
al. 2023, trained here at most at its sliding window, where its attention is Llama's).
:func:`preset_from_hf_config` maps one to a :class:`~scheduler.models.presets.ModelPreset`,
refusing in one line anything the hetsched families would compute differently (a tied
Llama head, a scaled rotary embedding, biases where Llama has none, a different
activation, attention past Mistral's window), so a model imported from Hugging Face is
the model hetsched trains. :func:`hf_config_from_preset` is the inverse, used by
``hetsched export`` (a Mistral model is written back as the Llama it trained as).

Field names follow ``transformers``' ``GPT2Config`` and ``LlamaConfig``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.errors import HetschedError
from scheduler.models.presets import ModelPreset, get_preset

CONFIG_NAME = "config.json"
MODEL_TYPES = ("gpt2", "llama", "mistral")
_GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HetschedError(f"config.{key}: must be an integer >= 1, got {value!r}")
    return value


def _float(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HetschedError(f"config.{key}: must be a number, got {value!r}")
    return float(value)


def _expect(config: Mapping[str, Any], key: str, allowed: Any, default: Any, why: str) -> None:
    value = config.get(key, default)
    if value != allowed:
        raise HetschedError(f"config.{key}: {why} (must be {allowed!r}), got {value!r}")


def preset_from_hf_config(
    config: Mapping[str, Any], *, name: str | None = None, seq_len: int | None = None
) -> ModelPreset:
    """The preset of a Hugging Face config; ``seq_len`` defaults to its context length."""
    model_type = config.get("model_type")
    name = name or str(config.get("_name_or_path") or "").rstrip("/").rsplit("/", 1)[-1]
    name = name or f"hf-{model_type}"
    if model_type == "gpt2":
        return _gpt2(config, name=name, seq_len=seq_len)
    if model_type == "llama":
        return _llama(config, name=name, seq_len=seq_len)
    if model_type == "mistral":
        return _mistral(config, name=name, seq_len=seq_len)
    raise HetschedError(
        f"config.model_type: {model_type!r} is not supported; known: {', '.join(MODEL_TYPES)}"
    )


def _gpt2(config: Mapping[str, Any], *, name: str, seq_len: int | None) -> ModelPreset:
    _expect(config, "tie_word_embeddings", True, True, "the gpt family ties its head")
    _expect(config, "scale_attn_by_inverse_layer_idx", False, False, "not in the gpt family")
    _expect(config, "reorder_and_upcast_attn", False, False, "not in the gpt family")
    activation = config.get("activation_function", "gelu_new")
    if activation not in _GELU:
        raise HetschedError(
            f"config.activation_function: {activation!r} is not supported; "
            f"known: {', '.join(_GELU)}"
        )
    d_model = _int(config, "n_embd")
    n_inner = config.get("n_inner")
    positions = _int(config, "n_positions", config.get("n_ctx", 1024))
    return ModelPreset(
        name=name,
        family="gpt",
        num_layers=_int(config, "n_layer"),
        d_model=d_model,
        num_heads=_int(config, "n_head"),
        d_ff=4 * d_model if n_inner is None else _int(config, "n_inner"),
        vocab_size=_int(config, "vocab_size"),
        seq_len=positions if seq_len is None else seq_len,
        max_seq_len=positions,
        norm_eps=_float(config, "layer_norm_epsilon", 1e-5),
        gelu_approximate="tanh" if _GELU[activation] == "tanh" else "none",
    )


def _llama(config: Mapping[str, Any], *, name: str, seq_len: int | None) -> ModelPreset:
    _expect(config, "tie_word_embeddings", False, False, "the llama family has an untied head")
    _expect(config, "hidden_act", "silu", "silu", "the llama family's MLP is SwiGLU")
    _expect(config, "attention_bias", False, False, "the llama family has no biases")
    _expect(config, "mlp_bias", False, False, "the llama family has no biases")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, Mapping) or rope.get("rope_type", "default") != "default":
        raise HetschedError(
            f"config.rope_scaling: scaled rotary embeddings are not supported, got {rope!r}"
        )
    d_model, num_heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * num_heads != d_model:
        raise HetschedError(
            f"config.head_dim: must be hidden_size / num_attention_heads = "
            f"{d_model // num_heads}, got {head_dim!r}"
        )
    positions = _int(config, "max_position_embeddings", 2048)
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    return ModelPreset(
        name=name,
        family="llama",
        num_layers=_int(config, "num_hidden_layers"),
        d_model=d_model,
        num_heads=num_heads,
        num_kv_heads=_int(config, "num_key_value_heads", num_heads),
        d_ff=_int(config, "intermediate_size"),
        vocab_size=_int(config, "vocab_size"),
        seq_len=positions if seq_len is None else seq_len,
        max_seq_len=positions,
        norm_eps=_float(config, "rms_norm_eps", 1e-6),
        rope_theta=_float({"rope_theta": theta}, "rope_theta", 10000.0),
    )


def _mistral(config: Mapping[str, Any], *, name: str, seq_len: int | None) -> ModelPreset:
    """Mistral: Llama's layers, but each token attends to at most ``sliding_window`` tokens
    before it; up to that length the two compute the same, so it trains (by default) at
    its window, and a longer ``seq_len`` is refused."""
    window = config.get("sliding_window")
    if window is not None:
        window = _int(config, "sliding_window")
        if seq_len is None:
            seq_len = min(window, _int(config, "max_position_embeddings", 32768))
        elif seq_len > window:
            raise HetschedError(
                f"seq_len: {seq_len} exceeds config.sliding_window ({window}); sliding-window "
                f"attention is not in the llama family: train at seq_len <= {window}"
            )
    return _llama(config, name=name, seq_len=seq_len)


def hf_config_from_preset(preset: ModelPreset) -> dict[str, Any]:
    """The ``config.json`` of ``transformers``' GPT2LMHeadModel or LlamaForCausalLM."""
    if preset.family == "gpt":
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_layer": preset.num_layers,
            "n_embd": preset.d_model,
            "n_head": preset.num_heads,
            "n_inner": preset.d_ff,
            "vocab_size": preset.vocab_size,
            "n_positions": preset.max_seq_len,
            "n_ctx": preset.max_seq_len,
            "layer_norm_epsilon": preset.norm_eps,
            "activation_function": "gelu_new" if preset.gelu_approximate == "tanh" else "gelu",
            "tie_word_embeddings": True,
            # GPT-2's <|endoftext|> is 50256; a smaller vocabulary has no such token.
            "bos_token_id": 50256 if preset.vocab_size > 50256 else None,
            "eos_token_id": 50256 if preset.vocab_size > 50256 else None,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "torch_dtype": "float32",
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": preset.num_layers,
        "hidden_size": preset.d_model,
        "num_attention_heads": preset.num_heads,
        "num_key_value_heads": preset.num_kv_heads,
        "head_dim": preset.head_dim,
        "intermediate_size": preset.d_ff,
        "vocab_size": preset.vocab_size,
        "max_position_embeddings": preset.max_seq_len,
        "rms_norm_eps": preset.norm_eps,
        "rope_theta": preset.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """A ``config.json``, given as the file or the directory holding it."""
    path = Path(path)
    file = path / CONFIG_NAME if path.is_dir() else path
    try:
        raw = json.loads(file.read_text())
    except OSError as exc:
        raise HetschedError(f"model: cannot read {file}: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HetschedError(f"model: {file} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise HetschedError(f"model: {file} must hold a JSON object")
    return raw


def load_hf_config(path: str | Path, *, seq_len: int | None = None) -> ModelPreset:
    """The preset of a Hugging Face model directory or ``config.json``, named after it."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    name = directory.resolve().name or None
    return preset_from_hf_config(read_hf_config(path), name=name, seq_len=seq_len)


def is_path_ref(ref: str) -> bool:
    """Whether a model reference names a file or directory (``hf:DIR`` too), not a preset."""
    return ref.startswith(("hf:", ".")) or ref.endswith(".json") or "/" in ref or "\\" in ref


def resolve_model(ref: str) -> ModelPreset:
    """A preset name, or a path to a Hugging Face ``config.json`` or model directory."""
    return load_hf_config(ref.removeprefix("hf:")) if is_path_ref(ref) else get_preset(ref)
