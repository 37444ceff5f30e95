"""Real GPU names, as drivers report them, map to the right catalogue entry."""

from __future__ import annotations

import pytest

from scheduler.errors import SpecError
from scheduler.hardware.gpu_names import catalogue_key, parse_nvidia_smi


@pytest.mark.parametrize(
    ("name", "memory_mib", "key"),
    [
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        # the PCIe parts have their own entries (lower power and bandwidth than the SXM4)
        ("NVIDIA A100 80GB PCIe", 81920, "A100PCIE-80GB"),
        ("NVIDIA A100-PCIE-40GB", 40536, "A100PCIE-40GB"),
        ("NVIDIA A100-SXM4-40GB", 40536, "A100-40GB"),
        ("Tesla V100-SXM2-16GB", 16160, "V100-16GB"),
        ("Tesla V100-SXM2-32GB", 32510, "V100-32GB"),
        ("Tesla V100-PCIE-16GB", 16160, "V100PCIE-16GB"),
        ("Tesla V100-PCIE-32GB", 32510, "V100PCIE-32GB"),
        ("Tesla T4", 15360, "T4-16GB"),
        ("NVIDIA L4", 23034, "L4-24GB"),
        ("NVIDIA L40S", 46068, "L40S-48GB"),
        ("NVIDIA A10G", 23028, "A10G-24GB"),
        ("NVIDIA A10", 23028, "A10-24GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100PCIE-80GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX4090-24GB"),
        ("NVIDIA GeForce RTX 3090", 24576, "RTX3090-24GB"),
        ("NVIDIA GeForce RTX 3090 Ti", 24564, "RTX3090TI-24GB"),
        # Issue 20: the types real mixed clusters have, as their drivers name them.
        ("NVIDIA RTX A6000", 49140, "A6000-48GB"),
        ("Tesla P40", 24451, "P40-24GB"),
        ("NVIDIA H100 NVL", 95830, "H100NVL-94GB"),
        ("NVIDIA A40", 46068, "A40-48GB"),
        ("NVIDIA L40", 46068, "L40-48GB"),
        ("NVIDIA RTX A5000", 24564, "A5000-24GB"),
        ("NVIDIA RTX A4000", 16376, "A4000-16GB"),
        ("NVIDIA RTX 6000 Ada Generation", 49140, "RTX6000ADA-48GB"),
        ("NVIDIA A30", 24576, "A30-24GB"),
        ("NVIDIA A2", 15356, "A2-16GB"),
        ("NVIDIA A16", 15356, "A16-16GB"),
        ("NVIDIA H20", 97871, "H20-96GB"),
        ("NVIDIA B200", 183359, "B200-180GB"),
        ("NVIDIA GH200 480GB", 97871, "GH200-96GB"),
        ("NVIDIA GH200 144G HBM3e", 146000, "GH200-144GB"),
        ("NVIDIA GeForce RTX 5090", 32607, "RTX5090-32GB"),
        ("AMD Instinct MI210", 65520, "MI210-64GB"),
        ("AMD Instinct MI250X", 65520, "MI250X-64GB"),  # one GCD, as ROCm shows it
        ("Intel Gaudi 2", 98304, "GAUDI2-96GB"),
    ],
)
def test_driver_names_map_to_their_catalogue_entry(name, memory_mib, key) -> None:
    assert catalogue_key(name, memory_mib) == key


def test_an_unknown_gpu_is_a_one_line_error_naming_it() -> None:
    with pytest.raises(
        SpecError, match=r"^gpu: 'NVIDIA GeForce GTX 1080' \(8 GiB\) is not in the catalogue"
    ):
        catalogue_key("NVIDIA GeForce GTX 1080", 8192)


def test_nvidia_smi_rows_parse_and_bad_rows_name_the_line() -> None:
    text = "0, NVIDIA A100-SXM4-40GB, 40960 MiB\n1, Tesla T4, 15360 MiB\n"
    gpus = parse_nvidia_smi(text)
    assert [(g.index, catalogue_key(g.name, g.memory_mib)) for g in gpus] == [
        (0, "A100-40GB"),
        (1, "T4-16GB"),
    ]
    with pytest.raises(SpecError, match="nvidia-smi: cannot read"):
        parse_nvidia_smi("0, Tesla T4\n")
