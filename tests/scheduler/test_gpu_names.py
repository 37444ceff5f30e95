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
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 40536, "A100-40GB"),
        ("Tesla V100-SXM2-16GB", 16160, "V100-16GB"),
        ("Tesla V100-SXM2-32GB", 32510, "V100-32GB"),
        ("Tesla V100-PCIE-16GB", 16160, "V100-16GB"),
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
    ],
)
def test_driver_names_map_to_their_catalogue_entry(name, memory_mib, key) -> None:
    assert catalogue_key(name, memory_mib) == key


def test_an_unknown_gpu_is_a_one_line_error_naming_it() -> None:
    with pytest.raises(SpecError, match=r"^gpu: 'NVIDIA B200' \(180 GiB\) is not in the catalogue"):
        catalogue_key("NVIDIA B200", 184320)


def test_nvidia_smi_rows_parse_and_bad_rows_name_the_line() -> None:
    text = "0, NVIDIA A100-SXM4-40GB, 40960 MiB\n1, Tesla T4, 15360 MiB\n"
    gpus = parse_nvidia_smi(text)
    assert [(g.index, catalogue_key(g.name, g.memory_mib)) for g in gpus] == [
        (0, "A100-40GB"),
        (1, "T4-16GB"),
    ]
    with pytest.raises(SpecError, match="nvidia-smi: cannot read"):
        parse_nvidia_smi("0, Tesla T4\n")
