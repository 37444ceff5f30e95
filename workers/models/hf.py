"""Hugging Face in and out: hetsched state dicts to ``transformers``' names and back.

:func:`to_hf_state_dict` and :func:`from_hf_state_dict` map a whole model's state
dict to those of ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` and back, touching no
file; :func:`save_hf_directory` and :func:`load_hf_directory` write and read the
directory ``from_pretrained`` reads. Needs ``safetensors`` (the ``hf`` extra) only
to read and write files.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from scheduler.errors import HetschedError
from scheduler.models.hf_config import CONFIG_NAME, hf_config_from_preset, load_hf_config
from scheduler.models.presets import ModelPreset
from workers.models.families import build_model

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TOKENIZER_NAME = "tokenizer.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"

StateDict = dict[str, torch.Tensor]

# (hetsched name, Hugging Face name, transposed?) per block; "{i}" is the block index.
_GPT_BLOCK = [
    ("ln_1.weight", "ln_1.weight", False),
    ("ln_1.bias", "ln_1.bias", False),
    ("attn.qkv.weight", "attn.c_attn.weight", True),
    ("attn.qkv.bias", "attn.c_attn.bias", False),
    ("attn.proj.weight", "attn.c_proj.weight", True),
    ("attn.proj.bias", "attn.c_proj.bias", False),
    ("ln_2.weight", "ln_2.weight", False),
    ("ln_2.bias", "ln_2.bias", False),
    ("mlp.fc.weight", "mlp.c_fc.weight", True),
    ("mlp.fc.bias", "mlp.c_fc.bias", False),
    ("mlp.proj.weight", "mlp.c_proj.weight", True),
    ("mlp.proj.bias", "mlp.c_proj.bias", False),
]
_GPT_OUTER = [
    ("embed.wte.weight", "transformer.wte.weight"),
    ("embed.wpe.weight", "transformer.wpe.weight"),
    ("head.ln_f.weight", "transformer.ln_f.weight"),
    ("head.ln_f.bias", "transformer.ln_f.bias"),
]
_LLAMA_BLOCK = [
    ("attn_norm.weight", "input_layernorm.weight", False),
    ("attn.q.weight", "self_attn.q_proj.weight", False),
    ("attn.k.weight", "self_attn.k_proj.weight", False),
    ("attn.v.weight", "self_attn.v_proj.weight", False),
    ("attn.proj.weight", "self_attn.o_proj.weight", False),
    ("mlp_norm.weight", "post_attention_layernorm.weight", False),
    ("mlp.gate.weight", "mlp.gate_proj.weight", False),
    ("mlp.up.weight", "mlp.up_proj.weight", False),
    ("mlp.down.weight", "mlp.down_proj.weight", False),
]
_LLAMA_OUTER = [
    ("tok_embeddings.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
]
# Buffers some checkpoints carry that hold no learned weights.
_IGNORED = re.compile(r"(\.attn\.bias|\.attn\.masked_bias|\.rotary_emb\.inv_freq)$")


def _name_map(preset: ModelPreset) -> list[tuple[str, str, bool]]:
    """Every (hetsched name, Hugging Face name, transposed?) of the whole model.

    Two layout differences, handled here:

    - GPT-2's ``Conv1D`` stores its weight as ``(in, out)``, the transpose of
      ``nn.Linear``'s ``(out, in)``; its fused ``c_attn`` splits into q, k, v in
      the same order as hetsched's ``qkv``. The head is tied to ``wte``, so only
      ``wte`` is written.
    - Llama: hetsched's rotary embedding pairs dimensions ``i`` and ``i + hs/2``,
      the layout of ``transformers``' Llama, so q and k map unpermuted.
    """
    if preset.family == "gpt":
        outer, block, prefix = _GPT_OUTER, _GPT_BLOCK, "transformer.h"
    else:
        outer, block, prefix = _LLAMA_OUTER, _LLAMA_BLOCK, "model.layers"
    names = [(ours, theirs, False) for ours, theirs in outer]
    for i in range(preset.num_layers):
        names += [(f"blocks.{i}.{o}", f"{prefix}.{i}.{t}", tr) for o, t, tr in block]
    return names


def to_hf_state_dict(preset: ModelPreset, state: Mapping[str, torch.Tensor]) -> StateDict:
    """``transformers``' state dict of the model whose hetsched state dict is ``state``."""
    out: StateDict = {}
    for ours, theirs, transposed in _name_map(preset):
        if ours not in state:
            raise HetschedError(f"checkpoint: no parameter {ours!r} for {preset.name}")
        tensor = state[ours].detach()
        out[theirs] = (tensor.t() if transposed else tensor).contiguous()
    return out


def from_hf_state_dict(preset: ModelPreset, hf_state: Mapping[str, torch.Tensor]) -> StateDict:
    """hetsched's state dict (global names) of a ``transformers`` state dict.

    GPT-2 checkpoints saved without the ``transformer.`` prefix (the original
    ``gpt2`` release) are read too; keys other than weights are an error.
    """
    state = {k: v for k, v in hf_state.items() if not _IGNORED.search(k)}
    if preset.family == "gpt":
        state = {
            k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v
            for k, v in state.items()
        }
        state.pop("lm_head.weight", None)  # tied to wte
    out: StateDict = {}
    for ours, theirs, transposed in _name_map(preset):
        tensor = state.pop(theirs, None)
        if tensor is None:
            raise HetschedError(f"hf: no weight {theirs!r} for a {preset.family} model")
        out[ours] = (tensor.t() if transposed else tensor).contiguous()
    if state:
        raise HetschedError(
            f"hf: unexpected weight {sorted(state)[0]!r} ({len(state)} unexpected in all)"
        )
    if preset.family == "gpt":
        out["head.weight"] = out["embed.wte.weight"]
    with torch.device("meta"):
        expected = build_model(preset, seed=0).state_dict()
    for name, tensor in out.items():
        if tensor.shape != expected[name].shape:
            raise HetschedError(
                f"hf: {name} has shape {tuple(tensor.shape)}; the config needs "
                f"{tuple(expected[name].shape)}"
            )
    return out


def _safetensors() -> tuple[Callable[..., None], Callable[..., StateDict]]:
    try:
        from safetensors.torch import load_file, save_file
    except ModuleNotFoundError as exc:
        raise HetschedError(
            "hf: needs the safetensors package; pip install 'hetsched[hf]'"
        ) from exc
    return save_file, load_file


def read_safetensors(path: str | Path) -> StateDict:
    """The tensors of one ``.safetensors`` file."""
    _, load_file = _safetensors()
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own SafetensorError, OSError too
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise HetschedError(f"hf: cannot read {path}: {first_line}") from exc


def save_hf_directory(
    preset: ModelPreset,
    state: Mapping[str, torch.Tensor],
    out_dir: str | Path,
    *,
    tokenizer: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[Path]:
    """Write ``config.json``, ``model.safetensors`` and the tokenizer; the files written.

    ``config.json`` comes from :mod:`scheduler.models.hf_config`; ``tokenizer.json``
    goes with a ``tokenizer_config.json`` that lets ``AutoTokenizer`` read it.
    """
    save_file, _ = _safetensors()
    out_dir = Path(out_dir)
    hf_state = {
        k: v.to(device="cpu", dtype=dtype) if v.is_floating_point() else v.cpu()
        for k, v in to_hf_state_dict(preset, state).items()
    }
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        config = hf_config_from_preset(preset)
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
        (out_dir / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        save_file(hf_state, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})
        written = [out_dir / CONFIG_NAME, out_dir / WEIGHTS_NAME]
        if tokenizer is not None:
            shutil.copyfile(tokenizer, out_dir / TOKENIZER_NAME)
            # Tells AutoTokenizer to read tokenizer.json as it is, whatever the model type.
            (out_dir / TOKENIZER_CONFIG_NAME).write_text(
                json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}) + "\n"
            )
            written += [out_dir / TOKENIZER_NAME, out_dir / TOKENIZER_CONFIG_NAME]
    except OSError as exc:
        raise HetschedError(f"export: cannot write {out_dir}: {exc.strerror or exc}") from exc
    return written


def load_hf_directory(
    directory: str | Path, *, seq_len: int | None = None
) -> tuple[ModelPreset, StateDict]:
    """The preset and hetsched state dict of a Hugging Face model directory: its
    ``model.safetensors``, or the sharded ``model-*.safetensors`` its index names."""
    directory = Path(directory)
    preset = load_hf_config(directory, seq_len=seq_len)
    index = directory / WEIGHTS_INDEX_NAME
    if (directory / WEIGHTS_NAME).is_file():
        files = [directory / WEIGHTS_NAME]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HetschedError(f"hf: {index} is not a safetensors index: {exc}") from exc
        files = [directory / name for name in sorted(set(weight_map.values()))]
    else:
        raise HetschedError(
            f"hf: {directory} holds neither {WEIGHTS_NAME} nor {WEIGHTS_INDEX_NAME}"
        )
    hf_state: StateDict = {}
    for file in files:
        hf_state.update(read_safetensors(file))
    return preset, from_hf_state_dict(preset, hf_state)
