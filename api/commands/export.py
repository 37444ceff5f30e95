"""``hetsched export``: a trained model as a Hugging Face directory.

    hetsched export 3f2a9c01 -o out/           # a job's latest checkpoint; 3f2a9c01@39: step 39
    hetsched export .hetsched/checkpoints/3f2a9c01 -o out/   # a checkpoint directory
    hetsched export model.safetensors -o out/ --tokenizer data.tokenizer.json
    hetsched export 3f2a9c01@39 -o out/ --url http://gpu-lab:8000   # from a remote service

writes ``config.json`` and ``model.safetensors`` (and ``tokenizer.json``), which
``transformers``' ``AutoModelForCausalLM`` loads with hetsched's logits. What a
CHECKPOINT may be: :func:`read_any`. The mapping itself is in workers/models/hf.py.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from api.commands.client import CLI_RETRY
from api.commands.common import add_command, add_data_dir_argument
from api.core.checkpoints import find_in_directory, read_durable, read_json
from api.core.db import make_engine
from api.core.settings import Settings
from api.store import JobStore
from hetsched import Client
from scheduler.errors import HetschedError
from scheduler.models.presets import ModelPreset, get_preset, preset_from_dict
from workers.checkpoint import CheckpointInfo, CheckpointStore
from workers.data.datafile import describe_file
from workers.models.hf import read_safetensors, save_hf_directory

JOB_REF = re.compile(r"^([0-9a-f]{1,32})(?:@([0-9]{1,9}))?$")

FORMATS = ("hf",)
DTYPES = ("float32", "bfloat16", "float16")


def add_parser(subparsers: Any) -> None:
    parser = add_command(subparsers, "export", run)
    parser.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a job id (JOB_ID or JOB_ID@STEP), a checkpoint directory, or a .pt or "
        ".safetensors file",
    )
    parser.add_argument("--format", choices=FORMATS, default="hf", help="(default: %(default)s)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="directory to write")
    parser.add_argument("--tokenizer", metavar="FILE", help="tokenizer.json to ship with it")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="weights' type (default: %(default)s)"
    )
    add_data_dir_argument(
        parser,
        help="the service's data directory, to find a job (default: as hetsched serve, "
        "./.hetsched or HETSCHED_DATA_DIR)",
    )
    parser.add_argument(
        "--url",
        metavar="URL",
        help="download the job's checkpoint from the control plane at URL (token: "
        "$HETSCHED_TOKEN or $HETSCHED_API_TOKEN) instead of reading the local data directory",
    )


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
        meta = read_json(sidecar)
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


def find_job_checkpoint(ref: str, data_dir: Path | None) -> tuple[CheckpointInfo, Path]:
    """``JOB_ID`` or ``JOB_ID@STEP`` in the service's records; the checkpoint and the
    service's data directory."""
    match = JOB_REF.match(ref)
    assert match is not None
    job_id, step = match.group(1), match.group(2)
    settings = Settings(data_dir=data_dir) if data_dir is not None else Settings()
    if not settings.db_url and not (settings.data_dir / "hetsched.db").is_file():
        raise HetschedError(
            f"export: no file or directory {ref!r}, and no hetsched database in "
            f"{settings.data_dir.resolve()} to find a job in; give --data-dir"
        )
    engine = make_engine(settings.database_url)
    try:
        store = JobStore(engine)
        if store.get(job_id) is None:
            raise HetschedError(f"export: no job {job_id} in {settings.data_dir.resolve()}")
        records = store.checkpoints(job_id)
    finally:
        engine.dispose()
    checkpoints = CheckpointStore(settings.job_checkpoints(job_id))
    info = checkpoints.get(int(step)) if step is not None else checkpoints.latest()
    if info is None and records:  # the service wrote them elsewhere
        raise HetschedError(
            f"export: job {job_id}'s checkpoints are recorded at {records[-1].uri}, but "
            f"{checkpoints.root} holds none; set HETSCHED_CHECKPOINT_URI as the service had it"
        )
    if info is None:
        raise HetschedError(f"export: job {job_id} has no checkpoint yet")
    return info, settings.data_dir


def dataset_tokenizer(manifest: Mapping[str, Any], data_dir: Path) -> str | None:
    """The tokenizer beside the job's dataset, when the job trained on a token file with one."""
    spec = manifest.get("spec")
    dataset = spec.get("dataset") if isinstance(spec, Mapping) else None
    if not isinstance(dataset, str) or dataset == "default":
        return None
    path = data_dir / dataset
    try:
        tokenizer = describe_file(path).tokenizer
    except HetschedError:
        return None
    return str(path.parent / tokenizer) if tokenizer else None


def read_any(ref: str, data_dir: Path | None) -> tuple[ModelPreset, dict[str, Any], str | None]:
    """The preset, weights and tokenizer (if any) of whatever CHECKPOINT names, one of:

    - a job id, ``JOB_ID`` (its latest checkpoint) or ``JOB_ID@STEP``, looked up in the
      service's database and checkpoint storage (``data_dir``, default ``./.hetsched``
      as ``hetsched serve``; ``HETSCHED_DB_URL`` and ``HETSCHED_CHECKPOINT_URI`` as the
      service reads them); the tokenizer of the job's dataset goes with it;
    - a durable checkpoint directory (:mod:`workers.checkpoint`): one step's
      ``step-NNNNNNNN`` directory, or a job's root holding them (the latest);
    - a ``torch.save`` file of ``{"model": state_dict, "preset": preset}`` (the preset's
      fields or name; optionally ``"tokenizer": path``), or a ``.safetensors`` file of
      the state dict with ``FILE.safetensors.json`` beside it holding ``{"preset": ...}``.
    """
    path = Path(ref)
    if path.is_dir():
        preset, state = read_durable(find_in_directory(path))
        return preset, state, None
    if path.exists() or not JOB_REF.match(ref):
        preset, state, tokenizer = read_checkpoint(path)
        if tokenizer is not None:
            tokenizer = str(path.parent / tokenizer)  # relative to the checkpoint
        return preset, state, tokenizer
    info, service_dir = find_job_checkpoint(ref, data_dir)
    preset, state = read_durable(info)
    return preset, state, dataset_tokenizer(info.manifest, service_dir)


def run_remote(args: argparse.Namespace) -> int:
    """``--url``: download the job's checkpoint from the service, then export it here."""
    match = JOB_REF.match(args.checkpoint)
    if match is None:
        raise HetschedError(
            f"checkpoint: with --url, give JOB_ID or JOB_ID@STEP, got {args.checkpoint!r}"
        )
    job_id, step = match.group(1), match.group(2)
    with Client(args.url, retry=CLI_RETRY) as client:
        written = client.export(
            job_id,
            args.output,
            step=int(step) if step is not None else None,
            tokenizer=args.tokenizer,
            dtype=args.dtype,
        )
    where = f"step {step}" if step is not None else "latest checkpoint"
    print(
        f"exported job {job_id} ({where}) from {args.url} to {args.output}: "
        f"{', '.join(p.name for p in written)}"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    if args.url:
        return run_remote(args)
    preset, state, tokenizer = read_any(args.checkpoint, args.data_dir)
    if args.tokenizer:
        tokenizer = args.tokenizer
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
