"""``hetsched gpus``: the GPU catalogue that cluster specs and analytic profiles draw on.

hetsched gpus           a table: key, name, TFLOP/s, memory, bandwidth, power, source
hetsched gpus --json    every figure, the interconnect and the source's address, as JSON
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from api.commands.common import add_command
from api.commands.plan import format_table
from scheduler.hardware.catalogue import CATALOGUE


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
                    }
                    for g in gpus
                ],
                indent=2,
            )
        )
        return 0
    headers = ["KEY", "NAME", "TFLOP/S", "MEMORY GB", "BANDWIDTH GB/S", "POWER W", "SOURCE"]
    rows = [
        [
            g.key,
            g.name,
            f"{g.peak_tflops:g}",
            f"{g.memory_gb:g}",
            f"{g.bandwidth_gbps:g}",
            f"{g.tdp_w:g}",
            f"{g.source} <{g.url}>",
        ]
        for g in gpus
    ]
    print(format_table(headers, rows, right={2, 3, 4, 5}))
    print(
        "\nTFLOP/s: peak dense bf16/fp16 tensor math with fp32 accumulate (fp32 where 16-bit"
        "\nmath has no speed-up), vendor figures; `--json` adds fp32 and the interconnect."
    )
    return 0
