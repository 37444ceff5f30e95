"""Which compute precisions a GPU of the catalogue can train in, and the one ``auto`` picks.

A job names ``fp32``, ``bf16``, ``fp16`` or ``auto``. bf16 needs bf16 tensor
math: NVIDIA compute capability 8.0 and newer (Ampere, Ada, Hopper; CUDA
Programming Guide, "Arithmetic Instructions") or AMD CDNA2 and newer. fp16
needs native half arithmetic, compute capability 6.0 and newer (Pascal's P100
has it, but PyTorch's fp16 matrix products accumulate in fp32, which the P100
runs at its fp32 rate; Volta and Turing add fp16 tensor cores). Kepler (K80)
has neither. ``auto`` takes bf16 where it exists, fp16 on tensor-core GPUs
without bf16 (V100, T4, RTX 2080 Ti), fp32 otherwise: fp16 on a P100 halves
memory traffic but needs loss scaling for a small gain, so ``auto`` leaves it to
the user.

The catalogue gives each GPU's dense 16-bit tensor peak. The fp32 peak, which
fp32 training runs at (PyTorch leaves TF32 matmuls off by default,
``torch.backends.cuda.matmul.allow_tf32``), is each vendor's datasheet fp32
figure (the catalogue's ``fp32_tflops``), taken as its ratio to that 16-bit
peak, so a spec's ``tflops`` override scales both. What each GPU can compute in
follows from its catalogue ``architecture``. Pure: reads the catalogue, imports
no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from scheduler.errors import HetschedError
from scheduler.hardware.catalogue import GpuSpec, lookup
from scheduler.hardware.cluster import Device

Precision = Literal["fp32", "bf16", "fp16"]
"""The compute precisions (the same three as :data:`scheduler.planning.plan.PRECISIONS`)."""
PRECISIONS: tuple[str, ...] = get_args(Precision)
JobPrecision = Literal["fp32", "bf16", "fp16", "auto"]
"""What a job may ask for: a precision, or ``auto`` (per device type)."""
JOB_PRECISIONS: tuple[str, ...] = get_args(JobPrecision)

ACTIVATION_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
"""Bytes per element of the activations a forward pass saves under autocast (the
analytic counts of :mod:`scheduler.models.activations` are 16-bit ones)."""


class PrecisionError(HetschedError):
    """A device cannot train in the precision a job asks for."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Capability:
    """What a GPU's silicon can compute in, from its catalogue architecture."""

    bf16: bool
    fp16: bool
    tensor_fp16: bool
    """Has fp16 tensor cores (Volta and newer): where ``auto`` takes fp16 over fp32."""
    fp32_tflops: float


NO_BF16: frozenset[str] = frozenset({"kepler", "pascal", "volta", "turing"})
"""Architectures without bf16 arithmetic (NVIDIA before compute capability 8.0)."""
NO_FP16_TENSOR: frozenset[str] = frozenset({"kepler", "pascal"})
"""Architectures without fp16 tensor cores; Kepler has no fast half arithmetic at all."""

UNKNOWN_FP32_RATIO = 1 / 8
"""fp32 over 16-bit tensor peak for an entry whose vendor publishes no fp32 figure:
between the datacenter parts' 1/16 and the consumer parts' 1/2."""


def architecture(gpu: GpuSpec) -> Capability:
    """What ``gpu`` can train in, read from its catalogue entry (architecture and fp32 peak)."""
    arch = gpu.architecture
    fp32 = gpu.fp32_tflops if gpu.fp32_tflops is not None else gpu.peak_tflops * UNKNOWN_FP32_RATIO
    return Capability(
        bf16=arch not in NO_BF16,
        fp16=arch != "kepler",
        tensor_fp16=arch not in NO_FP16_TENSOR,
        fp32_tflops=fp32,
    )


def supported(gpu: GpuSpec) -> tuple[Precision, ...]:
    """The precisions ``gpu`` can train in, fastest first.

    >>> from scheduler.hardware.catalogue import lookup
    >>> supported(lookup("V100-32GB"))
    ('fp16', 'fp32')
    """
    arch = architecture(gpu)
    out: list[Precision] = []
    if arch.bf16:
        out.append("bf16")
    if arch.fp16:
        out.append("fp16")
    return (*out, "fp32")


def auto_precision(gpu: GpuSpec) -> Precision:
    """bf16 where it exists, fp16 on tensor-core GPUs without it, fp32 otherwise.

    >>> from scheduler.hardware.catalogue import lookup
    >>> [auto_precision(lookup(k)) for k in ("A100-80GB", "T4-16GB", "P100-16GB")]
    ['bf16', 'fp16', 'fp32']
    """
    arch = architecture(gpu)
    if arch.bf16:
        return "bf16"
    if arch.tensor_fp16:
        return "fp16"
    return "fp32"


def resolve(gpu: GpuSpec, requested: str, *, device: str | None = None) -> Precision:
    """The precision a device of type ``gpu`` trains in when a job asks ``requested``.

    Raises :class:`PrecisionError`, one line naming the field, the device and what
    it allows, when it cannot (bf16 on a V100)."""
    if requested not in JOB_PRECISIONS:
        raise PrecisionError(
            f"precision: unknown {requested!r}; allowed: {', '.join(JOB_PRECISIONS)}"
        )
    if requested == "auto":
        return auto_precision(gpu)
    allowed = supported(gpu)
    if requested not in allowed:
        where = f"{device} ({gpu.key}, {gpu.architecture})" if device else gpu.key
        raise PrecisionError(
            f"precision: {requested} is not supported by {where}; it allows "
            f"{', '.join(allowed)} (or auto)"
        )
    return requested


def peak_tflops(gpu: GpuSpec, precision: str, *, tensor_tflops: float | None = None) -> float:
    """Peak TFLOP/s of ``gpu`` in ``precision``: the 16-bit tensor peak
    (``tensor_tflops``, a spec's override, or the catalogue's) for bf16 and fp16,
    scaled by the family's fp32 ratio for fp32."""
    peak = gpu.peak_tflops if tensor_tflops is None else tensor_tflops
    if precision == "fp32":
        return peak * min(1.0, architecture(gpu).fp32_tflops / gpu.peak_tflops)
    return peak


def device_precisions(devices: Iterable[Device], requested: str) -> dict[str, Precision]:
    """Each device's precision under ``requested``; raises :class:`PrecisionError` for the
    first device (in order) that cannot run it."""
    return {d.id: resolve(lookup(d.type), requested, device=d.id) for d in devices}
