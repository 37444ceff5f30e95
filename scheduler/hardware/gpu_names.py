"""Which catalogue entry a GPU is, from the name its driver reports or a person writes.

Ray tells only one accelerator type per node, and only the model ("A100"), so
hetsched asks each node's driver for every GPU's own name and memory
(``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader``) and
maps each GPU with :func:`catalogue_key`. A cluster spec's or a trace's ``type`` goes
through :func:`resolve_type`: a catalogue key, or a name as people write it (``A100
80GB``, ``RTX 4090``, ``T4``, what ``nvidia-smi`` prints), matched the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.errors import SpecError
from scheduler.hardware.catalogue import CATALOGUE, GpuSpec, known_types, lookup

_VENDOR_WORDS = ("NVIDIA", "TESLA", "GEFORCE", "QUADRO", "AMD", "INSTINCT", "INTEL", "HABANA")
MIB = 2**20


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbedGpu:
    """One GPU as its node's driver reports it."""

    index: int
    """Physical index on its node (what CUDA_VISIBLE_DEVICES names)."""
    name: str
    memory_mib: int


def _is_memory_size(word: str) -> bool:
    """``80GB``, ``144G``: the memory, which :func:`catalogue_key` matches on its own."""
    digits = word.rstrip("GB")
    return word != digits and digits.isdigit()


def _words(name: str) -> list[str]:
    """The name's words, upper case: letters and digits, anything else a separator."""
    return "".join(ch if ch.isalnum() else " " for ch in name.upper()).split()


def _word_runs(name: str) -> set[str]:
    """Every run of the name's consecutive words (vendor words and memory sizes dropped),
    joined: ``RTX``, ``RTXA6000``, ``A6000``, … (workstation cards are ``RTX A6000`` to the
    driver and ``A6000`` to people; the A100 PCIe is ``A100 80GB PCIe``)."""
    words = [w for w in _words(name) if w not in _VENDOR_WORDS and not _is_memory_size(w)]
    return {"".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)}


def _model(gpu: GpuSpec) -> str:
    return "".join(ch for ch in gpu.key.rsplit("-", 1)[0].upper() if ch.isalnum())


def _models_named(name: str) -> list[GpuSpec]:
    """The entries of the catalogue model that spells the longest run of ``name``'s words."""
    runs = _word_runs(name)
    matches = [gpu for gpu in CATALOGUE.values() if _model(gpu) in runs]
    longest = max((len(_model(g)) for g in matches), default=0)
    return [g for g in matches if len(_model(g)) == longest]


def _nearest(entries: list[GpuSpec], memory_gib: float) -> GpuSpec:
    return min(entries, key=lambda g: abs(g.memory_gb - memory_gib))


NAMED_MEMORY_TOLERANCE = 0.1
"""A memory written in a spec's ``type`` (``T4 32GB``) must be within this share of an
entry's: a card sold with other memory, or a variant under another key (``H100 94GB`` is
the H100 NVL), is refused rather than read as the nearest entry."""


def _no_such_memory(name: str, entries: list[GpuSpec], memory: float) -> str:
    sold = ", ".join(f"{g.key} ({g.memory_gb:g} GB)" for g in entries)
    for g in entries:
        board = g.memory_gb * g.gpus_per_board
        if g.gpus_per_board > 1 and abs(board - memory) <= NAMED_MEMORY_TOLERANCE * memory:
            return (
                f"GPU type {name!r}: {memory:g} GB is the whole board of {g.gpus_per_board}, "
                f"which the driver shows as {g.gpus_per_board} devices; the catalogue lists "
                f"each, as {g.key}: write that type with {g.gpus_per_board}x the count"
            )
    model = _model(entries[0])
    variants = [
        g.key
        for g in CATALOGUE.values()
        if _model(g).startswith(model)
        and g not in entries
        and abs(g.memory_gb - memory) <= NAMED_MEMORY_TOLERANCE * memory
    ]
    hint = f"; did you mean {' or '.join(variants)}?" if variants else ""
    return (
        f"GPU type {name!r}: no entry of it has {memory:g} GB; the catalogue has {sold}"
        f"{hint} (another memory: give its entry and the device's memory_gb)"
    )


def resolve_type(name: str, *, memory_gb: float | None = None) -> GpuSpec:
    """The catalogue entry a spec's ``type`` names: a key in any case (``a100-80gb``), or
    the GPU as people and drivers write it (``A100 80GB``, ``NVIDIA A100-SXM4-80GB``,
    ``RTX 4090``, ``T4``): its model as in :func:`catalogue_key`, then of that model's
    entries the one nearest the memory the name gives, else ``memory_gb``, else its only
    one. A model sold with several memories and none given is refused, naming them.

    >>> resolve_type("RTX 4090").key, resolve_type("A100 80GB").key
    ('RTX4090-24GB', 'A100-80GB')
    >>> resolve_type("A100", memory_gb=40).key
    'A100-40GB'
    """
    try:
        return lookup(name)
    except KeyError:
        pass
    entries = _models_named(name)
    if not entries:
        raise SpecError(f"unknown GPU type {name!r}; known: {', '.join(known_types())}")
    sizes = [float(w.rstrip("GB")) for w in _words(name) if _is_memory_size(w)]
    if sizes:
        nearest = _nearest(entries, sizes[-1])
        if abs(nearest.memory_gb - sizes[-1]) > NAMED_MEMORY_TOLERANCE * sizes[-1]:
            raise SpecError(_no_such_memory(name, entries, sizes[-1]))
        return nearest
    if memory_gb is not None:
        return _nearest(entries, memory_gb)
    if len(entries) > 1:
        keys = ", ".join(g.key for g in entries)
        raise SpecError(f"GPU type {name!r} is sold with several memories: name one of {keys}")
    return entries[0]


def catalogue_key(name: str, memory_mib: int) -> str:
    """The catalogue key of a GPU the driver calls ``name`` with ``memory_mib`` MiB.

    It is the catalogue model that spells the longest run of
    the reported name's consecutive words (``RTX 4090``, ``H100 PCIe``, ``A6000`` of
    ``RTX A6000``; whole words, so ``A10`` is not ``A100`` and ``L4`` is not ``L40S``),
    then of that model's entries the one whose memory is nearest the reported memory.

    >>> catalogue_key("NVIDIA A100-SXM4-40GB", 40 * 1024)
    'A100-40GB'
    >>> catalogue_key("Tesla V100-SXM2-16GB", 16 * 1024)
    'V100-16GB'
    >>> catalogue_key("NVIDIA GeForce RTX 4090", 24564)
    'RTX4090-24GB'
    >>> catalogue_key("NVIDIA RTX A6000", 49140)
    'A6000-48GB'
    """
    best = _models_named(name)
    if not best:
        raise SpecError(
            f"gpu: {name!r} ({memory_mib / 1024:.0f} GiB) is not in the catalogue; "
            f"known: {', '.join(CATALOGUE)} (describe the cluster with a spec file instead)"
        )
    return _nearest(best, memory_mib / 1024).key


def parse_nvidia_smi(text: str) -> list[ProbedGpu]:
    """Rows of ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader``.

    >>> parse_nvidia_smi("0, Tesla T4, 15360 MiB\\n1, Tesla T4, 15360 MiB\\n")[1]
    ProbedGpu(index=1, name='Tesla T4', memory_mib=15360)
    """
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            raise SpecError(f"nvidia-smi: cannot read {line!r} (want 'index, name, memory')")
        index, name, memory = parts
        number = memory.split()[0] if memory else ""
        if not index.isdigit() or not number.isdigit():
            raise SpecError(f"nvidia-smi: cannot read {line!r} (want 'index, name, memory')")
        gpus.append(ProbedGpu(index=int(index), name=name, memory_mib=int(number)))
    return gpus
