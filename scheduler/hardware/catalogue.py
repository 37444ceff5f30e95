"""The GPU catalogue: peak dense tensor throughput, memory and bandwidth.

Figures are vendor datasheet peaks for dense (not 2:4 sparse) bf16/fp16
tensor math with fp32 accumulation, which is what mixed-precision training
runs, and memory bandwidth. Datasheet peaks are not what training sustains:
analytic profiles (:mod:`scheduler.cost.roofline`) run each kernel at the share of
peak FLOP/s (``flops_share``) or of bandwidth (``bandwidth_share``) it can
reach. Most cards reach about half their tensor peak in a training step's
matrix products; cards capped at 70–75 W (T4, L4) reach much less, because
they hold their power limit by running far below their boost clock. Measured
profiles replace all of this. Keys are ``MODEL-MEMORY`` as people say them
(``H100-80GB``) and are matched case-insensitively.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
DEFAULT_FLOPS_SHARE = 0.5
"""Share of peak dense 16-bit tensor FLOP/s a training step's matrix products sustain.

Megatron-LM reaches 52 % of the A100's peak end to end at scale with fused kernels
(Narayanan et al., SC'21, Table 1); PyTorch eager training of a few-billion-parameter
GPT typically reaches 40–50 %. The planner's relative speeds, not this level, decide
splits; ``--efficiency`` overrides it for every device."""
DEFAULT_BANDWIDTH_SHARE = 0.8
"""Share of datasheet memory bandwidth that streaming (elementwise) kernels reach:
STREAM-like copies reach 80–90 % on HBM and GDDR cards."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    key: str
    """Catalogue key, ``MODEL-MEMORY``."""
    name: str
    """Marketing name."""
    peak_tflops: float
    """Peak dense bf16/fp16 tensor TFLOP/s (fp32 accumulate)."""
    memory_gb: float
    """Device memory in GiB, as sold."""
    bandwidth_gbps: float
    """Memory bandwidth in GB/s."""
    source: str
    """Where the figures come from."""
    flops_share: float = DEFAULT_FLOPS_SHARE
    """Share of ``peak_tflops`` that training matrix products sustain (see module docstring)."""
    bandwidth_share: float = DEFAULT_BANDWIDTH_SHARE
    """Share of ``bandwidth_gbps`` that elementwise kernels reach."""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GIB)


_GPUS = [
    GpuSpec(
        key="H200-141GB",
        name="NVIDIA H200 SXM",
        peak_tflops=989.0,
        memory_gb=141,
        bandwidth_gbps=4800,
        source="NVIDIA H200 datasheet (2024)",
    ),
    GpuSpec(
        key="H100-80GB",
        name="NVIDIA H100 SXM5",
        peak_tflops=989.0,
        memory_gb=80,
        bandwidth_gbps=3350,
        source="NVIDIA H100 datasheet, SXM column (2023)",
    ),
    GpuSpec(
        key="H100PCIE-80GB",
        name="NVIDIA H100 PCIe",
        peak_tflops=756.0,
        memory_gb=80,
        bandwidth_gbps=2000,
        source="NVIDIA H100 datasheet, PCIe column (2023)",
    ),
    GpuSpec(
        key="A100-80GB",
        name="NVIDIA A100 SXM4 80GB",
        peak_tflops=312.0,
        memory_gb=80,
        bandwidth_gbps=2039,
        source="NVIDIA A100 datasheet (2021)",
    ),
    GpuSpec(
        key="A100-40GB",
        name="NVIDIA A100 SXM4 40GB",
        peak_tflops=312.0,
        memory_gb=40,
        bandwidth_gbps=1555,
        source="NVIDIA A100 datasheet (2021)",
    ),
    GpuSpec(
        key="L40S-48GB",
        name="NVIDIA L40S",
        peak_tflops=362.0,
        memory_gb=48,
        bandwidth_gbps=864,
        source="NVIDIA L40S datasheet (2023)",
    ),
    GpuSpec(
        key="A10G-24GB",
        name="NVIDIA A10G (AWS G5)",
        peak_tflops=70.0,
        memory_gb=24,
        bandwidth_gbps=600,
        source="AWS G5 figures; NVIDIA publishes no A10G datasheet (the A10's gives 125)",
    ),
    GpuSpec(
        key="A10-24GB",
        name="NVIDIA A10",
        peak_tflops=125.0,
        memory_gb=24,
        bandwidth_gbps=600,
        source="NVIDIA A10 datasheet (2021)",
    ),
    GpuSpec(
        key="L4-24GB",
        name="NVIDIA L4",
        peak_tflops=121.0,
        memory_gb=24,
        bandwidth_gbps=300,
        source="NVIDIA L4 datasheet (2023)",
        # 72 W card: it holds its power cap far below its 2040 MHz boost clock. No
        # published sustained GEMM rate found; 0.2 (24 TFLOP/s, the T4's measured rate)
        # reproduces the published per-layer GPT-2.7B ratios V100 : L4 ≈ 2.7 and
        # T4 : L4 ≈ 1 that issue 12 quotes (tests/scheduler/test_roofline.py).
        flops_share=0.2,
    ),
    GpuSpec(
        key="V100-32GB",
        name="NVIDIA V100 SXM2 32GB",
        peak_tflops=125.0,
        memory_gb=32,
        bandwidth_gbps=900,
        source="NVIDIA V100 datasheet, SXM2 column, fp16 only (2018)",
    ),
    GpuSpec(
        key="V100-16GB",
        name="NVIDIA V100 SXM2 16GB",
        peak_tflops=125.0,
        memory_gb=16,
        bandwidth_gbps=900,
        source="NVIDIA V100 datasheet, SXM2 column, fp16 only (2018)",
    ),
    GpuSpec(
        key="T4-16GB",
        name="NVIDIA T4",
        peak_tflops=65.0,
        memory_gb=16,
        bandwidth_gbps=320,
        source="NVIDIA T4 datasheet, fp16 only (2019)",
        # 70 W card: a 4096³ cuBLAS fp16 GEMM sustains about 24 TFLOP/s, its power cap
        # holding the clock near base (NVIDIA developer forums, "About GPU peak
        # performance", 2023, thread 264462): 24 / 65.
        flops_share=0.37,
    ),
    GpuSpec(
        key="RTX4090-24GB",
        name="NVIDIA GeForce RTX 4090",
        peak_tflops=165.2,
        memory_gb=24,
        bandwidth_gbps=1008,
        source="NVIDIA Ada Lovelace whitepaper, fp16 tensor with fp32 accumulate (2022)",
    ),
    GpuSpec(
        key="RTX3090-24GB",
        name="NVIDIA GeForce RTX 3090",
        peak_tflops=71.0,
        memory_gb=24,
        bandwidth_gbps=936,
        source="NVIDIA Ampere GA102 whitepaper, fp16 tensor with fp32 accumulate (2020)",
    ),
    # Older and consumer GPUs of public cluster-scheduler studies: Gavel (Narayanan
    # et al., OSDI'20) uses K80, P100 and V100; Sia (Jayaram Subramanya et al.,
    # SOSP'23) and Pollux use RTX 2080 Ti and T4 nodes.
    GpuSpec(
        key="RTX2080TI-11GB",
        name="NVIDIA GeForce RTX 2080 Ti",
        peak_tflops=53.8,
        memory_gb=11,
        bandwidth_gbps=616,
        source="NVIDIA Turing whitepaper, fp16 tensor with fp32 accumulate (2018)",
    ),
    GpuSpec(
        key="P100-16GB",
        name="NVIDIA Tesla P100 SXM2",
        peak_tflops=21.2,
        memory_gb=16,
        bandwidth_gbps=732,
        source="NVIDIA Tesla P100 datasheet, SXM2 column, fp16 without tensor cores (2016)",
    ),
    GpuSpec(
        key="K80-12GB",
        name="NVIDIA Tesla K80 (one of the board's two GPUs)",
        peak_tflops=4.37,
        memory_gb=12,
        bandwidth_gbps=240,
        source="NVIDIA Tesla K80 datasheet, fp32 boost halved per GPU; no fp16 speed-up (2014)",
    ),
    GpuSpec(
        key="MI300X-192GB",
        name="AMD Instinct MI300X",
        peak_tflops=1307.4,
        memory_gb=192,
        bandwidth_gbps=5300,
        source="AMD Instinct MI300X datasheet (2023)",
    ),
    GpuSpec(
        key="MI250X-128GB",
        name="AMD Instinct MI250X",
        peak_tflops=383.0,
        memory_gb=128,
        bandwidth_gbps=3277,
        source="AMD Instinct MI250X datasheet (2021)",
    ),
]

CATALOGUE: dict[str, GpuSpec] = {gpu.key: gpu for gpu in _GPUS}


def known_types() -> list[str]:
    return list(CATALOGUE)


def lookup(gpu_type: str) -> GpuSpec:
    """Return the catalogue entry for ``gpu_type``, matched case-insensitively.

    >>> lookup("a100-40gb").peak_tflops
    312.0
    """
    for key, gpu in CATALOGUE.items():
        if key.lower() == gpu_type.strip().lower():
            return gpu
    raise KeyError(gpu_type)
