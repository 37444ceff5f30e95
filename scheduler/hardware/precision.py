"""Which compute precisions a GPU of the catalogue can train in, and the one ``auto`` picks.

A job names ``fp32``, ``bf16``, ``fp16`` or ``auto``. bf16 needs bf16 tensor
math: NVIDIA compute capability 8.0 and newer (Ampere, Ada, Hopper; CUDA
Programming Guide, "Arithmetic Instructions") or AMD CDNA2 and newer. fp16
needs native half arithmetic, compute capability 6.0 and newer (Pascal's P100
runs it at twice fp32; Volta and Turing add fp16 tensor cores). Kepler (K80)
has neither. ``auto`` takes bf16 where it exists, fp16 on tensor-core GPUs
without bf16 (V100, T4, RTX 2080 Ti), fp32 otherwise: fp16 on a P100 halves
memory traffic but needs loss scaling for a small gain, so ``auto`` leaves it to
the user.

The catalogue gives each GPU's dense 16-bit tensor peak. The fp32 peak, which
fp32 training runs at (PyTorch leaves TF32 matmuls off by default,
``torch.backends.cuda.matmul.allow_tf32``), is each vendor's datasheet fp32
figure, kept here per GPU family (the key without its memory size) as its ratio
to that 16-bit peak, so a spec's ``tflops`` override scales both. Pure: reads the
catalogue, imports no torch.
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
class Architecture:
    """What a GPU family's silicon can compute in."""

    name: str
    compute_capability: float | None
    """NVIDIA's ``major.minor``; None for AMD."""
    bf16: bool
    fp16: bool
    fp32_tflops: float
    """Datasheet fp32 (non-tensor) peak of the catalogue's part, TFLOP/s."""


def _nvidia(name: str, cc: float, fp32_tflops: float) -> Architecture:
    return Architecture(
        name=name, compute_capability=cc, bf16=cc >= 8.0, fp16=cc >= 6.0, fp32_tflops=fp32_tflops
    )


FAMILIES: dict[str, Architecture] = {
    "H200": _nvidia("Hopper", 9.0, 67.0),  # H200 datasheet, SXM fp32
    "H100": _nvidia("Hopper", 9.0, 67.0),  # H100 datasheet, SXM5 fp32
    "H100PCIE": _nvidia("Hopper", 9.0, 51.0),  # H100 datasheet, PCIe fp32
    "A100": _nvidia("Ampere", 8.0, 19.5),  # A100 datasheet, fp32
    "L40S": _nvidia("Ada Lovelace", 8.9, 91.6),  # L40S datasheet
    "A10G": _nvidia("Ampere", 8.6, 31.2),  # the A10's GA102 part (AWS gives no fp32 figure)
    "A10": _nvidia("Ampere", 8.6, 31.2),  # A10 datasheet
    "L4": _nvidia("Ada Lovelace", 8.9, 30.3),  # L4 datasheet
    "V100": _nvidia("Volta", 7.0, 15.7),  # V100 datasheet, SXM2
    "T4": _nvidia("Turing", 7.5, 8.1),  # T4 datasheet
    "RTX4090": _nvidia("Ada Lovelace", 8.9, 82.6),  # Ada whitepaper
    "RTX3090": _nvidia("Ampere", 8.6, 35.6),  # GA102 whitepaper
    "RTX2080TI": _nvidia("Turing", 7.5, 13.4),  # Turing whitepaper
    "P100": _nvidia("Pascal", 6.0, 10.6),  # P100 datasheet, SXM2
    "K80": _nvidia("Kepler", 3.7, 4.37),  # the catalogue's per-GPU figure is fp32 already
    "MI300X": Architecture(
        name="CDNA3", compute_capability=None, bf16=True, fp16=True, fp32_tflops=163.4
    ),  # MI300X datasheet, fp32 vector
    "MI250X": Architecture(
        name="CDNA2", compute_capability=None, bf16=True, fp16=True, fp32_tflops=47.9
    ),  # MI250X datasheet, fp32 vector
}
"""GPU family (the catalogue key without ``-MEMORY``) -> its architecture."""

UNKNOWN_FP32_RATIO = 1 / 8
"""fp32 over 16-bit tensor peak for a catalogue entry with no family row: between
the datacenter parts' 1/16 and the consumer parts' 1/2, as Volta's and MI300X's."""


def family(gpu: GpuSpec) -> str:
    """``"A100-80GB"`` -> ``"A100"``."""
    return gpu.key.rsplit("-", 1)[0].upper()


def architecture(gpu: GpuSpec) -> Architecture:
    """The family's architecture; a catalogue entry without a row is taken to be a
    current (bf16-capable) GPU, the kind new entries describe."""
    known = FAMILIES.get(family(gpu))
    if known is not None:
        return known
    return Architecture(
        name="unknown",
        compute_capability=None,
        bf16=True,
        fp16=True,
        fp32_tflops=gpu.peak_tflops * UNKNOWN_FP32_RATIO,
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
    cc = arch.compute_capability
    if arch.fp16 and (cc is None or cc >= 7.0):
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
        arch = architecture(gpu)
        cc = (
            ""
            if arch.compute_capability is None
            else f", compute capability {arch.compute_capability}"
        )
        where = f"{device} ({gpu.key}{cc})" if device else f"{gpu.key}{cc}"
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
