"""``hetsched export``: a trained model as a Hugging Face directory.

    hetsched export run.pt --format hf -o out/
    hetsched export model.safetensors --format hf -o out/ --tokenizer data.tokenizer.json

writes ``out/config.json`` and ``out/model.safetensors`` (and
``out/tokenizer.json``), which ``transformers``' ``AutoModelForCausalLM``
(``GPT2LMHeadModel`` or ``LlamaForCausalLM``) loads with hetsched's logits.

A CHECKPOINT is, for now, either a ``torch.save`` file holding
``{"model": state_dict, "preset": preset}`` (the preset's fields as a dict,
or a preset name; optionally ``"tokenizer": path``), or a ``.safetensors``
file of the state dict with a small JSON beside it, ``FILE.safetensors.json``,
holding ``{"preset": ...}``. Reading the file is kept apart from the mapping
(workers/hf.py), so the durable checkpoint format plugs in here alone.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from scheduler.errors import HetschedError
from scheduler.models import ModelPreset, get_preset, preset_from_dict
from workers.hf import read_safetensors, save_hf_directory

FORMATS = ("hf",)
DTYPES = ("float32", "bfloat16", "float16")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face model directory",
        description="Export a trained model: config.json + model.safetensors (+ tokenizer.json) "
        "that transformers' AutoModelForCausalLM loads.",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a .pt or .safetensors file")
    parser.add_argument("--format", choices=FORMATS, default="hf", help="(default: %(default)s)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="directory to write")
    parser.add_argument("--tokenizer", metavar="FILE", help="tokenizer.json to ship with it")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="weights' type (default: %(default)s)"
    )
    parser.set_defaults(run=run)


def _preset(raw: Any, where: str) -> ModelPreset:
    if isinstance(raw, ModelPreset):
        return raw
    if isinstance(raw, str):
        return get_preset(raw)
    if isinstance(raw, Mapping):
        return preset_from_dict(dict(raw), where=f"{where}.preset")
    raise HetschedError(f"{where}: needs a 'preset' (a preset name or its fields)")


def read_checkpoint(path: Path) -> tuple[ModelPreset, dict[str, Any], str | None]:
    """The preset, whole-model state dict and tokenizer path (if any) of a checkpoint file."""
    if not path.is_file():
        raise HetschedError(f"checkpoint: no file {path}")
    if path.suffix == ".safetensors":
        sidecar = path.with_name(path.name + ".json")
        try:
            meta = json.loads(sidecar.read_text())
        except OSError as exc:
            raise HetschedError(f"checkpoint: cannot read {sidecar}: {exc.strerror}") from exc
        except ValueError as exc:
            raise HetschedError(f"checkpoint: {sidecar} is not valid JSON: {exc}") from exc
        if not isinstance(meta, dict):
            raise HetschedError(f"checkpoint: {sidecar} must hold a JSON object")
        state = read_safetensors(path)
        return _preset(meta.get("preset"), str(sidecar)), state, meta.get("tokenizer")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle and zip errors of many types
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise HetschedError(f"checkpoint: cannot read {path}: {first_line}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        raise HetschedError(f"checkpoint: {path} must hold {{'model': state_dict, 'preset': ...}}")
    return _preset(raw.get("preset"), str(path)), raw["model"], raw.get("tokenizer")


def run(args: argparse.Namespace) -> int:
    checkpoint = Path(args.checkpoint)
    preset, state, tokenizer = read_checkpoint(checkpoint)
    if args.tokenizer:
        tokenizer = args.tokenizer
    elif tokenizer is not None:
        tokenizer = str(checkpoint.parent / tokenizer)  # relative to the checkpoint
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise HetschedError(f"--tokenizer: no file {tokenizer}")
    written = save_hf_directory(
        preset, state, args.output, tokenizer=tokenizer, dtype=getattr(torch, args.dtype)
    )
    print(
        f"exported {preset.name} ({preset.family}, {preset.num_params:,} parameters) to "
        f"{args.output}: {', '.join(p.name for p in written)}"
    )
    return 0
