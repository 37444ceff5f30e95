"""``hetsched gpus``: the GPU catalogue that cluster specs and analytic profiles draw on.

hetsched gpus           a table: key, name, TFLOP/s (peak, and sustained as plans price it),
                        memory, bandwidth, power, source
hetsched gpus --json    every figure, the interconnect, the sustained rates and the sources
                        of the measurements behind them, as JSON
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from api.commands.common import add_command
from api.commands.plan import format_table
from scheduler.cost.roofline import (
    sustained_bandwidth_gbps,
    sustained_fp32_gemm_tflops,
    sustained_gemm_tflops,
)
from scheduler.hardware.catalogue import CATALOGUE, GpuSpec
from scheduler.hardware.precision import peak_tflops


def add_parser(subparsers: Any) -> None:
    parser = add_command(subparsers, "gpus", run)
    parser.add_argument("--json", action="store_true", help="print the catalogue as JSON")


def run(args: argparse.Namespace) -> int:
    gpus = list(CATALOGUE.values())
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "key": g.key,
                        "name": g.name,
                        "peak_tflops": g.peak_tflops,
                        "memory_gb": g.memory_gb,
                        "bandwidth_gbps": g.bandwidth_gbps,
                        "fp32_tflops": g.fp32_tflops,
                        "tdp_w": g.tdp_w,
                        "interconnect": g.interconnect,
                        "source": g.source,
                        "url": g.url,
                        "sustained_tflops": round(sustained_gemm_tflops(g), 2),
                        "sustained_fp32_tflops": round(_fp32_tflops(g), 2),
                        "sustained_bandwidth_gbps": round(sustained_bandwidth_gbps(g), 1),
                        "measured_gemm_tflops": g.measured_gemm_tflops,
                        "measured_bandwidth_gbps": g.measured_bandwidth_gbps,
                        "measured_source": g.measured_source or None,
                        "measured_fp32_gemm_tflops": g.measured_fp32_gemm_tflops,
                        "measured_fp32_source": g.measured_fp32_source or None,
                    }
                    for g in gpus
                ],
                indent=2,
            )
        )
        return 0
    headers = [
        "KEY",
        "NAME",
        "TFLOP/S",
        "SUSTAINED",
        "SUSTAINED FP32",
        "MEMORY GB",
        "BANDWIDTH GB/S",
        "POWER W",
        "SOURCE",
    ]
    rows = [
        [
            g.key,
            g.name,
            f"{g.peak_tflops:g}",
            _sustained(g),
            _rate(_fp32_tflops(g), measured=g.measured_fp32_gemm_tflops is not None),
            f"{g.memory_gb:g}",
            f"{g.bandwidth_gbps:g}",
            f"{g.tdp_w:g}",
            f"{g.source} <{g.url}>",
        ]
        for g in gpus
    ]
    print(format_table(headers, rows, right={2, 3, 4, 5, 6, 7}))
    print(
        "\nTFLOP/s: peak dense bf16/fp16 tensor math with fp32 accumulate (fp32 where 16-bit"
        "\nmath has no speed-up), vendor figures. SUSTAINED: what analytic plans price a"
        "\n16-bit matrix product at (scheduler/cost/roofline.py); * a published measurement of"
        "\nthe part (a GeForce card's may exceed its peak: the peak is quoted at the rated"
        "\nboost clock, which those cards run above), else its segment's share of peak or"
        "\nits power cap's bound. SUSTAINED FP32: the same for fp32 products (TF32 off, the"
        "\ndefault precision), from the part's own fp32 measurement (*) or its architecture's"
        "\nmeasured share of its fp32 peak. `--json` adds the fp32 peak, the interconnect,"
        "\nthe sustained bandwidth and each measurement's source."
    )
    return 0


def _sustained(gpu: GpuSpec) -> str:
    return _rate(sustained_gemm_tflops(gpu), measured=gpu.measured_gemm_tflops is not None)


def _fp32_tflops(gpu: GpuSpec) -> float:
    return sustained_fp32_gemm_tflops(gpu, fp32_peak_tflops=peak_tflops(gpu, "fp32"))


def _rate(tflops: float, *, measured: bool) -> str:
    return (f"{tflops:,.0f}" if tflops >= 100 else f"{tflops:.3g}") + ("*" if measured else "")
