"""Subcommands of the ``hetsched`` command line, one module each (one for a family of them).

:data:`COMMANDS` is the command line's table: which module implements each command and
what its help says, so ``hetsched --help`` lists every command without importing any.
Each command module defines ``add_parser(subparsers)``, which registers its commands with
:func:`api.commands.common.add_command` and adds their arguments; :mod:`api.commands.common`
holds what several share. A module is imported only when its command runs, so
``hetsched plan`` never pays for importing torch or ray.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Command:
    """One command of the table."""

    module: str
    """The module under ``api.commands`` that implements it."""
    help: str
    """Its line in ``hetsched --help``."""
    description: str | None = None
    """What its own ``--help`` says under the usage (None: nothing)."""


# In the order ``hetsched --help`` lists them.
COMMANDS: dict[str, Command] = {
    "gpus": Command(
        "gpus",
        "list the GPU catalogue (keys for cluster specs)",
        "GPU types a cluster spec may name (any case), with the peak dense "
        "bf16/fp16 tensor TFLOP/s, memory and bandwidth analytic profiles use.",
    ),
    "plan": Command(
        "plan",
        "plan per-device batches for a cluster spec or a profile (no cluster needed)",
        "Plan an uneven split of the global batch and compare it with the "
        "even (DDP) and proportional baselines.",
    ),
    "profile": Command(
        "profile",
        "measure each device's time and memory per micro-batch (cached)",
        "Measure every device of a cluster for one model: fixed and per-sample "
        "time, model-state and activation memory, largest micro-batch, links.",
    ),
    "simulate": Command(
        "simulate",
        "train on a local simulated mixed cluster and compare strategies",
        "Profile, plan and train each strategy on simulated GPUs (Ray actors on "
        "this machine's CPU, paced to their GPU's speed, memory-capped), from the same seed.",
    ),
    "cluster-sim": Command(
        "cluster_sim",
        "replay a job trace on a cluster under scheduling policies (no training)",
        "Compare scheduling policies on a cluster spec and a job trace from the cost "
        "model alone, or generate such a trace. The trace is a CSV with columns name, "
        "arrival_s, model, global_batch, steps and, optionally, priority, min_devices, "
        "max_devices, restart_s, device_types (A100-40GB|V100-32GB).",
    ),
    "serve": Command(
        "serve",
        "run the control plane (REST API, dashboard, job executor)",
        "Run the control plane. With no arguments: a local simulated mixed "
        "cluster and a SQLite database in the data directory.",
    ),
    "prepare-data": Command(
        "prepare_data",
        "tokenize a text file into a token-id dataset (.bin + .bin.json)",
        "Turn a text file into a flat file of token ids that jobs can train on.",
    ),
    "export": Command(
        "export",
        "write a checkpoint as a Hugging Face model directory",
        "Export a trained model: config.json + model.safetensors (+ tokenizer.json) "
        "that transformers' AutoModelForCausalLM loads.",
    ),
    "db": Command(
        "db",
        "show, upgrade or downgrade the job store's schema",
        "Migrate the service's database (Alembic revisions in api/migrations).",
    ),
    "submit": Command("client", "submit a training job to the control plane"),
    "jobs": Command("client", "list the control plane's jobs"),
    "logs": Command("client", "print a job's log"),
    "wait": Command("client", "wait for a job to end; exit 0 if it SUCCEEDED, 1 if not"),
    "status": Command("client", "show one job"),
    "stop": Command("client", "stop a job"),
    "delete": Command("client", "delete a finished job and its records"),
    "cluster": Command("remote", "show the control plane's devices and what runs on them"),
    "schedule": Command("remote", "show the scheduling policy's latest round"),
    "datasets": Command("remote", "list the datasets a job may train on"),
    "upload": Command(
        "remote",
        "store a dataset file on the control plane",
        "Upload NAME.txt (byte tokens), or NAME.bin.json then NAME.bin (token ids), "
        "or NAME.tokenizer.json, into the server's data directory. Files are never replaced.",
    ),
    "users": Command("users", "create, list and revoke users (admins)"),
    "projects": Command("users", "create, change and list projects (admins)"),
    "audit": Command("users", "who did what, newest first (admins)"),
}
