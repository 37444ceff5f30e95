"""What precision changes in a device's cost: its compute rate and its activation bytes.

Model states do not change: bf16 and fp16 keep fp32 master weights, fp32
gradients and fp32 AdamW moments, 16 bytes per parameter whatever the precision
(:data:`scheduler.models.presets.MIXED_PRECISION_STATE_BYTES_PER_PARAM`; Micikevicius
et al., "Mixed Precision Training", ICLR 2018, and Rajbhandari et al., ZeRO, SC'20,
§3.1, count the 16-bit working copy in those 16 for fp16; PyTorch autocast casts
per operation instead and keeps no second copy). What changes:

- **compute**: matrix products run at what the device sustains in that precision, from
  its peak in it (:func:`scheduler.hardware.precision.peak_tflops`; fp32 products at the
  fp32 rate of :func:`scheduler.cost.roofline.sustained_fp32_gemm_tflops`); fp32 also moves every
  element in 4 bytes where the roofline (:mod:`scheduler.cost.roofline`) counts
  2, which is the roofline at half the bandwidth;
- **activations**: saved in 4 bytes per element in fp32, 2 under bf16/fp16
  autocast (:data:`scheduler.hardware.precision.ACTIVATION_BYTES`); the analytic
  counts (Korthikanti et al.) are 16-bit ones and scale by that ratio.

Measured profiles carry what was measured; :func:`with_precision` labels each device
with the precision its plans run in and leaves the figures as measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from scheduler.cost.costs import DeviceProfile, LayerCost, LayerProfile, RecomputeCost
from scheduler.cost.roofline import BYTES_16BIT, Rates
from scheduler.cost.table import DeviceTable
from scheduler.hardware.catalogue import GpuSpec, lookup
from scheduler.hardware.precision import (
    ACTIVATION_BYTES,
    JOB_PRECISIONS,
    Precision,
    PrecisionError,
    peak_tflops,
    resolve,
)


def rates_at(
    gpu: GpuSpec,
    precision: str,
    *,
    tensor_tflops: float | None = None,
    flops_share: float | None = None,
) -> Rates:
    """``gpu``'s sustained roofline slopes when it trains in ``precision``."""
    rates = Rates.of(
        gpu,
        peak_tflops=peak_tflops(gpu, precision, tensor_tflops=tensor_tflops),
        flops_share=flops_share,
        fp32=precision == "fp32",
    )
    element_ratio = ACTIVATION_BYTES[precision] / BYTES_16BIT
    return replace(rates, bytes_per_s=rates.bytes_per_s / element_ratio)


def _bytes(value: int, ratio: float) -> int:
    return round(value * ratio)


def _recompute(cost: RecomputeCost | None, ratio: float) -> RecomputeCost | None:
    if cost is None:
        return None
    return replace(
        cost,
        per_sample_bytes=_bytes(cost.per_sample_bytes, ratio),
        transient_bytes_per_sample=_bytes(cost.transient_bytes_per_sample, ratio),
    )


def _piece(cost: LayerCost, ratio: float) -> LayerCost:
    return replace(
        cost,
        per_sample_bytes=_bytes(cost.per_sample_bytes, ratio),
        selective=_recompute(cost.selective, ratio),
        full=_recompute(cost.full, ratio),
    )


def layers_at(layers: LayerProfile, precision: str) -> LayerProfile:
    """16-bit analytic per-layer activation figures as saved in ``precision``."""
    ratio = ACTIVATION_BYTES[precision] / BYTES_16BIT
    if ratio == 1:
        return layers
    return replace(
        layers,
        embed=_piece(layers.embed, ratio),
        block=_piece(layers.block, ratio),
        head=_piece(layers.head, ratio),
        boundary_bytes_per_sample=_bytes(layers.boundary_bytes_per_sample, ratio),
    )


def device_precision(device_type: str, requested: str, *, device: str) -> Precision:
    """The precision a device of ``device_type`` trains in when a job asks ``requested``;
    a type outside the catalogue (a measured profile's ``unknown``) takes an explicit
    request as given and ``auto`` as fp32."""
    try:
        gpu = lookup(device_type)
    except KeyError:
        if requested not in JOB_PRECISIONS:
            raise PrecisionError(
                f"precision: unknown {requested!r}; allowed: {', '.join(JOB_PRECISIONS)}"
            ) from None
        return "fp32" if requested == "auto" else requested  # type: ignore[return-value]
    return resolve(gpu, requested, device=device)


def with_precision(devices: Sequence[DeviceProfile], requested: str) -> Sequence[DeviceProfile]:
    """``devices`` labelled with the precision each trains in under ``requested``;
    raises :class:`~scheduler.hardware.precision.PrecisionError` naming the first
    device that cannot. A :class:`~scheduler.cost.table.DeviceTable` stays one,
    relabelled kind by kind (a kind's first device is the first of its devices)."""
    if isinstance(devices, DeviceTable):
        return devices.with_kinds(with_precision(devices.kinds, requested))
    out = []
    for d in devices:
        precision = device_precision(d.type, requested, device=d.id)
        out.append(d if d.precision == precision else replace(d, precision=precision))
    return tuple(out)
