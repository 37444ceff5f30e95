"""The GPU catalogue: vendor figures of every accelerator a cluster spec may name.

Each entry carries what the vendor publishes, with the document it comes from
(``source`` and ``url``): peak dense (not 2:4 sparse) 16-bit tensor throughput
with fp32 accumulation, which is what mixed-precision training runs
(``peak_tflops``; for cards without a 16-bit speed-up, the fp32 rate), the fp32
rate, memory, bandwidth, board power and interconnect. Datasheet peaks are not
what training sustains: :mod:`scheduler.cost.roofline` derives the sustained
rates from these figures and the published measurements carried here
(``measured_*``). Keys are ``MODEL-MEMORY`` as people say them (``H100-80GB``)
and are matched case-insensitively.

Where the catalogue's measured GEMM rates come from, and the rule for the second source
(fixed before its effect on any held-out row was looked at):

- Mu Li's transformers-benchmarks (8192² fp16 matmul, PyTorch 1.13: A100, A6000, V100,
  RTX 3090 Ti, RTX 4090), the same notebook on PyTorch 2.0 (H100 SXM), the NVIDIA forum's
  T4, and the A100 PCIe scaled from the SXM4: kept as they are, whatever the second source
  says of the same parts (they are the software stack of the mli studies; replacing them
  would mix eras inside those studies).
- zzc0721/torch-performance-test-data (:data:`TPTD`): one script, ``test.py``, times
  ``torch.mm`` of two random square fp16 matrices (6 warm-up and 30 timed calls, 2n³ FLOPs)
  at n = 1024 to 10240 on contributors' GPUs (PyTorch 2.2-2.11), and each run is posted as
  an issue "新增性能数据：<GPU>" whose "详细性能数据" block lists every size. A catalogue
  part with no measured rate takes **the fp16 figure at 8192²** (the size the other measured
  rates use), read from that per-size block; not ``database.md``'s summary, which is the
  maximum over sizes (3-28 % above 8192² on the parts used here) and, on power-capped
  cards, a burst too short to throttle. Only the part itself counts (the name
  ``torch.cuda.get_device_name`` reports; a memory variant of the same chip, clocks and
  board power, as the catalogue's own variants share rates); with several contributors, the
  median of their first runs. Parts the source lists only in its summary are left alone.
- S. Bekman's table of maximum achievable matmul FLOPS (:data:`MAMF`; bf16, the mean of 100
  matmuls at the best shape a search finds, one script on every part), for a part measured
  by neither source above: **the H100 SXM's catalogue rate times the part's figure over the
  H100 SXM's in that table**. Its figures are a maximum over shapes, above a fixed 8192² on
  every part both measure (A100 SXM 271.2 against 230, H100 SXM 794.5 against 637.4), so
  only its ratios are taken; they agree with the catalogue's own to 5-8 % (A100 SXM and
  PCIe against the H100 SXM: 0.341 and 0.318 there, 0.361 and 0.345 here). Without it these
  parts ran at their segment's 0.75 of peak, which the table puts at 0.51 of peak on the
  MI300X (its rate 980 TFLOP/s, 1.5x the H100 SXM's, where the table has 0.84x), 0.78 on
  the B200 and 0.84 on the GH200. A part only the README's older "v1" table measures (the
  MI250X, one GCD) takes its ratio to that table's own H100 SXM figure.

fp32 rates (``measured_fp32_gemm_tflops``, what fp32 training's products run at with TF32 off,
PyTorch's default) come from :data:`TPTD` alone, by the same rule: the FP32 figure at 8192² of
the same per-size block. Mu Li's notebook's fp32 matmul ran with TF32 on (NGC's containers
enable it: its A100 reads 116 TFLOP/s against an fp32 peak of 19.5), so it is not used.

A board or module the driver shows as several devices (the K80, the A16, the MI250X) is
listed per device, with its share of the board's figures (``gpus_per_board``): a cluster
spec counts devices as ``nvidia-smi``, ``rocm-smi`` and Ray do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

GIB = 2**30
DEFAULT_FLOPS_SHARE = 0.5
"""The share of peak ``--efficiency`` suggests when a user wants one share for all."""

Segment = Literal["datacenter", "workstation", "geforce"]
"""Who the part is sold to; it decides what share of its peak a GEMM sustains when no
measurement is at hand (:func:`scheduler.cost.roofline.sustained_gemm_tflops`)."""
Architecture = Literal[
    "kepler",
    "pascal",
    "volta",
    "turing",
    "ampere-ga100",
    "ampere-ga10x",
    "ada",
    "hopper",
    "blackwell",
    "cdna2",
    "cdna3",
    "gaudi2",
]
Precision = Literal["fp32", "fp16", "bf16"]
NO_BF16_TENSOR: frozenset[str] = frozenset({"kepler", "pascal", "volta", "turing"})
"""Architectures whose tensor cores (if any) have no bf16 mode: bf16 runs at fp32 speed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """One accelerator type: vendor figures, where they come from, and the published
    measurements of it that the analytic speed model uses."""

    key: str
    """Catalogue key, ``MODEL-MEMORY``."""
    name: str
    """Marketing name."""
    peak_tflops: float
    """Peak dense bf16/fp16 tensor TFLOP/s with fp32 accumulate (fp32 where 16-bit
    math has no speed-up: Kepler, the P40, and the P100, whose twice-fp32 half2 rate
    needs fp16 accumulation: PyTorch's fp16 matrix products accumulate in fp32,
    ``cublasGemmEx`` with ``CUDA_R_32F`` compute in aten/src/ATen/cuda/CUDABlas.cpp's
    ``gemm<at::Half>``, which a part without tensor cores runs at its fp32 rate)."""
    fp32_tflops: float | None
    """Peak TFLOP/s of fp32 matrix products with TF32 off: the fp32 (non-tensor) rate on
    NVIDIA parts, the fp32 matrix rate on AMD CDNA parts, whose fp32 products run on the
    matrix cores; None where the vendor's document gives none."""
    memory_gb: float
    """Device memory in GiB, as sold."""
    bandwidth_gbps: float
    """Memory bandwidth in GB/s."""
    tdp_w: float
    """Board power (TDP/TBP) in W; for a multi-GPU board, its share per GPU."""
    interconnect: str
    """Host and peer links as the vendor lists them."""
    source: str
    """The document the figures come from."""
    url: str
    """Where that document is published."""
    segment: Segment
    architecture: Architecture
    fp16_accumulate_tflops: float | None = None
    """GeForce cards only: the fp16 tensor rate with fp16 accumulate, twice
    ``peak_tflops`` (NVIDIA's GA102 and Ada whitepapers list both; training
    accumulates in fp32, at half this rate)."""
    measured_gemm_tflops: float | None = None
    """A published large fp16 GEMM rate (``measured_source``), when there is one."""
    measured_bandwidth_gbps: float | None = None
    """A published streaming-kernel bandwidth (``measured_source``), when there is one."""
    measured_source: str = ""
    measured_fp32_gemm_tflops: float | None = None
    """A published large fp32 GEMM rate, TF32 off (``measured_fp32_source``): what fp32
    training's products run at, which the 16-bit rate does not tell (module docstring)."""
    measured_fp32_source: str = ""
    gpus_per_board: int = 1
    """Devices the driver shows for one board or module (the K80's two GPUs, the A16's four,
    the MI250X's two GCDs): the entry is one of them, as a cluster has them."""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GIB)

    def peak_tflops_at(self, precision: Precision) -> float:
        """Peak dense TFLOP/s of matrix products in ``precision`` (no TF32: PyTorch's
        default keeps fp32 products in fp32)."""
        if precision == "fp32" or (precision == "bf16" and self.architecture in NO_BF16_TENSOR):
            if self.fp32_tflops is None:
                raise ValueError(f"{self.key}: the vendor publishes no fp32 rate ({self.source})")
            return self.fp32_tflops
        return self.peak_tflops


MLI = (
    "Mu Li, transformers-benchmarks, micro-benchmark summary (fp16 8192² matmul; "
    "vector multiply): https://github.com/mli/transformers-benchmarks"
)
GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
H100_DS = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
V100_DS = (
    "https://images.nvidia.com/content/technologies/volta/pdf/"
    "volta-v100-datasheet-update-us-1165301-r5.pdf"
)
A100_DS = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
MLI_H100 = (
    "Mu Li's micro_bench.ipynb run on an H100 80GB HBM3 (PyTorch 2.0.0, CUDA 12.1), fp16 "
    "8192² matmul: https://github.com/olokshyn/transformers-benchmarks (commit 84c23be)"
)
A100_PCIE_MEASURED = (
    "the A100 SXM4's measured 230 TFLOP/s (" + MLI + ") times the PCIe/SXM ratio of "
    "S. Bekman's maximum achievable matmul FLOPS, 256.4 / 267.9 (bf16, CUDA 12.1; "
    "https://github.com/stas00/ml-engineering, compute/accelerator/README.md); bandwidth: "
    "the SXM4's measured share of its datasheet's (1,616 of 2,039 GB/s) on this HBM2e part"
)

TPTD = "https://github.com/zzc0721/torch-performance-test-data"

MAMF = (
    "S. Bekman, Machine Learning Engineering, compute/accelerator/README.md, 'Maximum "
    "Achievable Matmul FLOPS comparison table', BF16: https://github.com/stas00/ml-engineering"
)
H100_SXM_TFLOPS = 637.4
"""The H100 SXM5's measured fp16 8192² rate (:data:`MLI_H100`): the reference :func:`_mamf`
scales from."""
MAMF_H100_SXM = 794.5
"""The H100 SXM's figure in :data:`MAMF` (torch 2.7.0+cu126)."""
MAMF_V1_H100_SXM = 792.1
"""The H100 SXM's figure in the same README's older "v1" table (CUDA 12.1), which the
current one has not yet replaced for every part (commit b9e29720 of stas00/ml-engineering
lists both)."""


def _mamf(tflops: float, *, h100: float = MAMF_H100_SXM) -> float:
    """The rate the catalogue gives a part whose :data:`MAMF` figure is ``tflops`` (module
    docstring): the H100 SXM's measured rate scaled by the table's ratio; ``h100`` is the
    H100 SXM's figure in the table ``tflops`` is read from."""
    return round(H100_SXM_TFLOPS * tflops / h100, 1)


def _mamf_source(row: str, *, h100: float = MAMF_H100_SXM, table: str = "") -> str:
    return (
        f"the H100 SXM5's measured {H100_SXM_TFLOPS} TFLOP/s ({MLI_H100}) times this part's "
        f"maximum achievable matmul FLOPS over the H100 SXM's, {row} / {h100} ({MAMF}{table})"
    )


def _tptd(runs: str, *, dtype: str = "fp16") -> str:
    """The citation of a rate taken from :data:`TPTD` by the rule in the module docstring."""
    return (
        f"zzc0721/torch-performance-test-data, test.py (torch.mm, {dtype}, 8192²), per-size "
        f"figures of {runs}: {TPTD}/issues"
    )


# A part sold with less memory (or a faster one) is the listed part with what differs replaced.
_GPUS = [
    GpuSpec(
        key="B200-180GB",
        name="NVIDIA B200 (HGX B200)",
        peak_tflops=2250.0,
        fp32_tflops=80.0,
        memory_gb=180,
        bandwidth_gbps=8000,
        tdp_w=1000,
        interconnect="NVLink 5, 1.8 TB/s; PCIe 5.0 x16",
        source="NVIDIA HGX B200 specifications, per GPU of eight (dense = half the sparse 4.5 PF); "
        "fp32 80 (vector, the HGX B200 at 1,000 W): NVIDIA's Blackwell architecture figures as "
        "tabulated at glennklockwood.com/garden/processors/B200",
        url="https://www.nvidia.com/en-us/data-center/hgx/",
        segment="datacenter",
        architecture="blackwell",
        measured_gemm_tflops=_mamf(1745.0),
        measured_source=_mamf_source("NVIDIA B200 SXM 1745.0 (torch 2.7.1+cu128)"),
    ),
    (
        gh200 := GpuSpec(
            key="GH200-96GB",
            name="NVIDIA GH200 Grace Hopper Superchip (HBM3)",
            peak_tflops=989.0,
            fp32_tflops=67.0,
            memory_gb=96,
            bandwidth_gbps=4000,
            tdp_w=1000,
            interconnect="NVLink-C2C to Grace, 900 GB/s; NVLink 4, 900 GB/s",
            source="NVIDIA GH200 Grace Hopper Superchip datasheet (module power 450-1000 W, "
            "CPU included)",
            url="https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
            segment="datacenter",
            architecture="hopper",
            measured_gemm_tflops=_mamf(828.6),
            measured_source=_mamf_source(
                "NVIDIA GH200 SXM 828.6 (900 W, 141 GiB HBM3e version; torch 2.6.0+cu126)"
            ),
        )
    ),
    replace(
        gh200,
        key="GH200-144GB",
        name="NVIDIA GH200 Grace Hopper Superchip (HBM3e)",
        memory_gb=144,
        bandwidth_gbps=4900,
        source="NVIDIA GH200 Grace Hopper Superchip datasheet, HBM3e version",
    ),
    (
        h100 := GpuSpec(
            key="H100-80GB",
            name="NVIDIA H100 SXM5",
            peak_tflops=989.0,
            fp32_tflops=67.0,
            memory_gb=80,
            bandwidth_gbps=3350,
            tdp_w=700,
            interconnect="NVLink 4, 900 GB/s; PCIe 5.0 x16",
            source="NVIDIA H100 datasheet, SXM column (2023)",
            url=H100_DS,
            segment="datacenter",
            architecture="hopper",
            # The same notebook's vector multiply reads 3,835 GB/s at 4 M floats, above the
            # 3,350 of the datasheet: its 32 MB working set stays in the 50 MB L2, so it is no
            # DRAM figure and none is taken.
            measured_gemm_tflops=H100_SXM_TFLOPS,
            measured_source=MLI_H100,
            measured_fp32_gemm_tflops=51.81,
            measured_fp32_source=_tptd(
                "#79 (NVIDIA H100 80GB HBM3, PyTorch 2.7, 2025-10-18)", dtype="fp32"
            ),
        )
    ),
    # The H100 SXM5's GH100 at the same clocks and 700 W with more and faster HBM: its matrix
    # products run at the H100's measured rate (the module docstring's rule for a memory
    # variant); the bandwidth is its own datasheet's.
    replace(
        h100,
        key="H200-141GB",
        name="NVIDIA H200 SXM",
        memory_gb=141,
        bandwidth_gbps=4800,
        source="NVIDIA H200 datasheet (2024)",
        url="https://www.nvidia.com/en-us/data-center/h200/",
        measured_source=MLI_H100 + " (the H100 SXM5's chip, clocks and power)",
        measured_fp32_source=h100.measured_fp32_source
        + " (the H100 SXM5's chip, clocks and power)",
    ),
    GpuSpec(
        key="H100NVL-94GB",
        name="NVIDIA H100 NVL",
        peak_tflops=835.0,
        fp32_tflops=60.0,
        memory_gb=94,
        bandwidth_gbps=3900,
        tdp_w=400,
        interconnect="NVLink bridge, 600 GB/s; PCIe 5.0 x16, 128 GB/s",
        source="NVIDIA H100 datasheet, NVL column (dense = half the sparse 1,671)",
        url=H100_DS,
        segment="datacenter",
        architecture="hopper",
    ),
    GpuSpec(
        key="H100PCIE-80GB",
        name="NVIDIA H100 PCIe",
        peak_tflops=756.0,
        fp32_tflops=51.0,
        memory_gb=80,
        bandwidth_gbps=2000,
        tdp_w=350,
        interconnect="NVLink bridge, 600 GB/s; PCIe 5.0 x16, 128 GB/s",
        source="NVIDIA H100 datasheet, PCIe column (2023)",
        url=H100_DS,
        segment="datacenter",
        architecture="hopper",
        measured_gemm_tflops=437.07,
        measured_source=_tptd("#95 (NVIDIA H100 PCIe, PyTorch 2.9, 2025-12-14)"),
        measured_fp32_gemm_tflops=36.95,
        measured_fp32_source=_tptd("#95 (NVIDIA H100 PCIe, PyTorch 2.9, 2025-12-14)", dtype="fp32"),
    ),
    GpuSpec(
        key="H20-96GB",
        name="NVIDIA H20",
        peak_tflops=148.0,
        fp32_tflops=44.0,
        memory_gb=96,
        bandwidth_gbps=4000,
        tdp_w=400,
        interconnect="NVLink 4, 900 GB/s; PCIe 5.0 x16",
        source="NVIDIA publishes no H20 datasheet; figures as reported from partner "
        "specification sheets (fp32 44 TFLOP/s: zangshuxian.com/new/674733024499207168)",
        url="https://willitrunai.com/es/gpus/h20-96gb",
        segment="datacenter",
        architecture="hopper",
        measured_gemm_tflops=138.52,
        measured_source=_tptd("#77 (NVIDIA H20, PyTorch 2.7, 2025-10-17)"),
        measured_fp32_gemm_tflops=31.99,
        measured_fp32_source=_tptd("#77 (NVIDIA H20, PyTorch 2.7, 2025-10-17)", dtype="fp32"),
    ),
    (
        a100 := GpuSpec(
            key="A100-80GB",
            name="NVIDIA A100 SXM4 80GB",
            peak_tflops=312.0,
            fp32_tflops=19.5,
            memory_gb=80,
            bandwidth_gbps=2039,
            tdp_w=400,
            interconnect="NVLink 3, 600 GB/s; PCIe 4.0 x16",
            source="NVIDIA A100 datasheet (2021)",
            url=A100_DS,
            segment="datacenter",
            architecture="ampere-ga100",
            measured_gemm_tflops=230.0,
            measured_bandwidth_gbps=1616.0,
            measured_source=MLI,
        )
    ),
    replace(
        a100,
        key="A100-40GB",
        name="NVIDIA A100 SXM4 40GB",
        memory_gb=40,
        bandwidth_gbps=1555,
        measured_bandwidth_gbps=None,
        measured_source=MLI + " (the 80 GB part; same chip and clocks)",
    ),
    GpuSpec(
        key="A100PCIE-80GB",
        name="NVIDIA A100 PCIe 80GB",
        peak_tflops=312.0,
        fp32_tflops=19.5,
        memory_gb=80,
        bandwidth_gbps=1935,
        tdp_w=300,
        interconnect="NVLink bridge for 2 GPUs, 600 GB/s; PCIe 4.0 x16, 64 GB/s",
        source="NVIDIA A100 datasheet, 80GB PCIe column (2021)",
        url=A100_DS,
        segment="datacenter",
        architecture="ampere-ga100",
        measured_gemm_tflops=220.0,
        measured_bandwidth_gbps=1534.0,
        measured_source=A100_PCIE_MEASURED,
    ),
    GpuSpec(
        key="A100PCIE-40GB",
        name="NVIDIA A100 PCIe 40GB",
        peak_tflops=312.0,
        fp32_tflops=19.5,
        memory_gb=40,
        bandwidth_gbps=1555,
        tdp_w=250,
        interconnect="NVLink bridge for 2 GPUs, 600 GB/s; PCIe 4.0 x16, 64 GB/s",
        source="NVIDIA A100 datasheet, 40GB PCIe column (2020 revision)",
        url="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet.pdf",
        segment="datacenter",
        architecture="ampere-ga100",
        measured_gemm_tflops=220.0,
        measured_bandwidth_gbps=1232.0,
        measured_source=A100_PCIE_MEASURED,
        measured_fp32_gemm_tflops=17.56,
        measured_fp32_source=_tptd(
            "#108 (NVIDIA A100-PCIE-40GB, PyTorch 2.8, 2026-01-05)", dtype="fp32"
        ),
    ),
    GpuSpec(
        key="A30-24GB",
        name="NVIDIA A30",
        peak_tflops=165.0,
        fp32_tflops=10.3,
        memory_gb=24,
        bandwidth_gbps=933,
        tdp_w=165,
        interconnect="NVLink 3 bridge, 200 GB/s; PCIe 4.0 x16, 64 GB/s",
        source="NVIDIA A30 datasheet (dense = half the sparse 330)",
        url="https://www.nvidia.com/en-us/data-center/products/a30-gpu/",
        segment="datacenter",
        architecture="ampere-ga100",
    ),
    GpuSpec(
        key="L40S-48GB",
        name="NVIDIA L40S",
        peak_tflops=362.0,
        fp32_tflops=91.6,
        memory_gb=48,
        bandwidth_gbps=864,
        tdp_w=350,
        interconnect="PCIe 4.0 x16, 64 GB/s; no NVLink",
        source="NVIDIA L40S datasheet (2023)",
        url="https://www.nvidia.com/en-us/data-center/l40s/",
        segment="datacenter",
        architecture="ada",
    ),
    GpuSpec(
        key="L40-48GB",
        name="NVIDIA L40",
        peak_tflops=181.05,
        fp32_tflops=90.5,
        memory_gb=48,
        bandwidth_gbps=864,
        tdp_w=300,
        interconnect="PCIe 4.0 x16, 64 GB/s; no NVLink",
        source="NVIDIA L40 datasheet (dense = half the sparse 362.1)",
        url="https://images.nvidia.com/content/Solutions/data-center/vgpu-L40-datasheet.pdf",
        segment="datacenter",
        architecture="ada",
    ),
    GpuSpec(
        key="A40-48GB",
        name="NVIDIA A40",
        peak_tflops=149.7,
        fp32_tflops=37.4,
        memory_gb=48,
        bandwidth_gbps=696,
        tdp_w=300,
        interconnect="NVLink bridge, 112.5 GB/s; PCIe 4.0 x16, 64 GB/s",
        source="NVIDIA A40 datasheet (dense = half the sparse 299.4)",
        url="https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf",
        segment="workstation",
        architecture="ampere-ga10x",
        measured_gemm_tflops=108.47,
        measured_source=_tptd("#185 (NVIDIA A40, PyTorch 2.11, 2026-07-22)"),
        measured_fp32_gemm_tflops=23.73,
        measured_fp32_source=_tptd("#185 (NVIDIA A40, PyTorch 2.11, 2026-07-22)", dtype="fp32"),
    ),
    GpuSpec(
        key="A10G-24GB",
        name="NVIDIA A10G (AWS G5)",
        peak_tflops=70.0,
        fp32_tflops=31.2,
        memory_gb=24,
        bandwidth_gbps=600,
        tdp_w=300,
        interconnect="PCIe 4.0 x16",
        source="AWS G5 figures; NVIDIA publishes no A10G datasheet (the A10's gives 125)",
        url="https://aws.amazon.com/ec2/instance-types/g5/",
        segment="datacenter",
        architecture="ampere-ga10x",
        measured_gemm_tflops=65.67,
        measured_source=_tptd("#126 (NVIDIA A10G, PyTorch 2.7, 2026-01-20)"),
        measured_fp32_gemm_tflops=23.23,
        measured_fp32_source=_tptd("#126 (NVIDIA A10G, PyTorch 2.7, 2026-01-20)", dtype="fp32"),
    ),
    GpuSpec(
        key="A10-24GB",
        name="NVIDIA A10",
        peak_tflops=125.0,
        fp32_tflops=31.2,
        memory_gb=24,
        bandwidth_gbps=600,
        tdp_w=150,
        interconnect="PCIe 4.0 x16, 64 GB/s",
        source="NVIDIA A10 datasheet (2021)",
        url="https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
        segment="datacenter",
        architecture="ampere-ga10x",
    ),
    GpuSpec(
        key="L4-24GB",
        name="NVIDIA L4",
        peak_tflops=121.0,
        fp32_tflops=30.3,
        memory_gb=24,
        bandwidth_gbps=300,
        tdp_w=72,
        interconnect="PCIe 4.0 x16, 64 GB/s",
        source="NVIDIA L4 datasheet (2023)",
        url="https://www.nvidia.com/en-us/data-center/l4/",
        segment="datacenter",
        architecture="ada",
        measured_gemm_tflops=53.80,
        measured_source=_tptd(
            "#120 (NVIDIA L4, PyTorch 2.9, 2026-01-12; 68.83 at 2048², the "
            "summary's figure, is a burst under the 72 W cap)"
        ),
        measured_fp32_gemm_tflops=10.66,
        measured_fp32_source=_tptd("#120 (NVIDIA L4, PyTorch 2.9, 2026-01-12)", dtype="fp32"),
    ),
    GpuSpec(
        key="A2-16GB",
        name="NVIDIA A2",
        peak_tflops=18.0,
        fp32_tflops=4.5,
        memory_gb=16,
        bandwidth_gbps=200,
        tdp_w=60,
        interconnect="PCIe 4.0 x8",
        source="NVIDIA A2 datasheet: fp16 tensor 18 dense, 36 with sparsity (72 is sparse "
        "INT8); four times its 4.5 fp32, as on every full-rate GA10x part; power 40-60 W",
        url="https://www.nvidia.com/en-us/data-center/products/a2/",
        segment="datacenter",
        architecture="ampere-ga10x",
    ),
    GpuSpec(
        key="A16-16GB",
        name="NVIDIA A16 (one of the board's four GPUs)",
        peak_tflops=17.9,
        fp32_tflops=4.5,
        memory_gb=16,
        bandwidth_gbps=200,
        tdp_w=62.5,
        interconnect="PCIe 4.0 x16 for the board of four",
        source="NVIDIA A16 datasheet, per GPU (board 250 W): fp16 tensor 17.9 dense, 35.9 "
        "with sparsity; four times its 4.5 fp32, as on every full-rate GA10x part",
        url="https://www.nvidia.com/en-us/data-center/products/a16-gpu/",
        segment="datacenter",
        architecture="ampere-ga10x",
        gpus_per_board=4,
    ),
    GpuSpec(
        key="RTX6000ADA-48GB",
        name="NVIDIA RTX 6000 Ada Generation",
        peak_tflops=364.2,
        fp32_tflops=91.1,
        memory_gb=48,
        bandwidth_gbps=960,
        tdp_w=300,
        interconnect="PCIe 4.0 x16, 64 GB/s; no NVLink",
        source="NVIDIA Ada Lovelace whitepaper, RTX 6000 Ada column, fp16 tensor with fp32 "
        "accumulate (2022)",
        url=ADA,
        segment="workstation",
        architecture="ada",
    ),
    GpuSpec(
        key="A6000-48GB",
        name="NVIDIA RTX A6000",
        peak_tflops=154.8,
        fp32_tflops=38.7,
        memory_gb=48,
        bandwidth_gbps=768,
        tdp_w=300,
        interconnect="NVLink bridge, 112.5 GB/s; PCIe 4.0 x16, 64 GB/s",
        source="NVIDIA Ampere GA102 whitepaper, RTX A6000 column, fp16 tensor with fp32 "
        "accumulate (full rate on this professional card)",
        url=GA102,
        segment="workstation",
        architecture="ampere-ga10x",
        measured_gemm_tflops=95.0,
        measured_bandwidth_gbps=656.0,
        measured_source=MLI,
    ),
    GpuSpec(
        key="A5000-24GB",
        name="NVIDIA RTX A5000",
        peak_tflops=111.1,
        fp32_tflops=27.8,
        memory_gb=24,
        bandwidth_gbps=768,
        tdp_w=230,
        interconnect="NVLink bridge, 112.5 GB/s; PCIe 4.0 x16, 64 GB/s",
        source="NVIDIA RTX A5000 datasheet (dense = half the sparse 222.2)",
        url="https://www.nvidia.com/en-us/design-visualization/rtx-a5000/",
        segment="workstation",
        architecture="ampere-ga10x",
    ),
    GpuSpec(
        key="A4000-16GB",
        name="NVIDIA RTX A4000",
        peak_tflops=76.7,
        fp32_tflops=19.2,
        memory_gb=16,
        bandwidth_gbps=448,
        tdp_w=140,
        interconnect="PCIe 4.0 x16, 64 GB/s",
        source="NVIDIA RTX A4000 datasheet (dense = half the sparse 153.4)",
        url="https://www.nvidia.com/en-us/design-visualization/rtx-a4000/",
        segment="workstation",
        architecture="ampere-ga10x",
        measured_gemm_tflops=60.89,
        measured_source=_tptd("#97 (NVIDIA RTX A4000, PyTorch 2.8, 2025-12-18)"),
        measured_fp32_gemm_tflops=11.90,
        measured_fp32_source=_tptd("#97 (NVIDIA RTX A4000, PyTorch 2.8, 2025-12-18)", dtype="fp32"),
    ),
    (
        v100 := GpuSpec(
            key="V100-32GB",
            name="NVIDIA V100 SXM2 32GB",
            peak_tflops=125.0,
            fp32_tflops=15.7,
            memory_gb=32,
            bandwidth_gbps=900,
            tdp_w=300,
            interconnect="NVLink 2, 300 GB/s",
            source="NVIDIA V100 datasheet, SXM2 column, fp16 only (2018)",
            url=V100_DS,
            segment="datacenter",
            architecture="volta",
            measured_gemm_tflops=95.0,
            measured_bandwidth_gbps=784.0,
            measured_source=MLI,
            measured_fp32_gemm_tflops=14.38,
            measured_fp32_source=_tptd(
                "#140 (Tesla V100-SXM2-16GB, PyTorch 2.7, 2026-02-14; the 32 GB SXM2 is its chip, "
                "clocks and 300 W)",
                dtype="fp32",
            ),
        )
    ),
    replace(v100, key="V100-16GB", name="NVIDIA V100 SXM2 16GB", memory_gb=16),
    (
        v100_pcie := GpuSpec(
            key="V100PCIE-32GB",
            name="NVIDIA V100 PCIe 32GB",
            peak_tflops=112.0,
            fp32_tflops=14.0,
            memory_gb=32,
            bandwidth_gbps=900,
            tdp_w=250,
            interconnect="PCIe 3.0 x16, 32 GB/s",
            source="NVIDIA V100 datasheet, PCIe column, fp16 only (2018)",
            url=V100_DS,
            segment="datacenter",
            architecture="volta",
        )
    ),
    replace(v100_pcie, key="V100PCIE-16GB", name="NVIDIA V100 PCIe 16GB", memory_gb=16),
    GpuSpec(
        key="T4-16GB",
        name="NVIDIA T4",
        peak_tflops=65.0,
        fp32_tflops=8.1,
        memory_gb=16,
        bandwidth_gbps=320,
        tdp_w=70,
        interconnect="PCIe 3.0 x16, 32 GB/s",
        source="NVIDIA T4 datasheet, fp16 only (2019)",
        url="https://www.nvidia.com/en-us/data-center/tesla-t4/",
        segment="datacenter",
        architecture="turing",
        # 70 W card: its power cap holds the clock near base in a long GEMM.
        measured_gemm_tflops=24.0,
        measured_source="NVIDIA developer forums, 'About GPU peak performance' (2023): "
        "a 4096^3 cuBLAS fp16 GEMM: https://forums.developer.nvidia.com/t/264462",
    ),
    GpuSpec(
        key="RTX5090-32GB",
        name="NVIDIA GeForce RTX 5090",
        peak_tflops=209.5,
        fp32_tflops=104.8,
        memory_gb=32,
        bandwidth_gbps=1792,
        tdp_w=575,
        interconnect="PCIe 5.0 x16, 128 GB/s; no NVLink",
        source="NVIDIA RTX Blackwell GPU architecture whitepaper, fp16 tensor with fp32 "
        "accumulate (2025)",
        url="https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
        "nvidia-rtx-blackwell-gpu-architecture.pdf",
        segment="geforce",
        architecture="blackwell",
        measured_gemm_tflops=224.2,
        measured_source=_tptd(
            "four contributors, the median: PR #15 224.41, #124 223.98, "
            "#96 233.99, #200 172.79 (PyTorch 2.7-2.8)"
        ),
        measured_fp32_gemm_tflops=66.13,
        measured_fp32_source=_tptd(
            "four contributors, the median: PR #15 66.34, #124 66.91, #96 65.92, "
            "#200 56.06 (PyTorch 2.7-2.8)",
            dtype="fp32",
        ),
        fp16_accumulate_tflops=419.0,
    ),
    GpuSpec(
        key="RTX4090-24GB",
        name="NVIDIA GeForce RTX 4090",
        peak_tflops=165.2,
        fp32_tflops=82.6,
        memory_gb=24,
        bandwidth_gbps=1008,
        tdp_w=450,
        interconnect="PCIe 4.0 x16, 64 GB/s; no NVLink",
        source="NVIDIA Ada Lovelace whitepaper, fp16 tensor with fp32 accumulate (2022)",
        url=ADA,
        segment="geforce",
        architecture="ada",
        fp16_accumulate_tflops=330.3,
        measured_gemm_tflops=172.0,
        measured_bandwidth_gbps=936.0,
        measured_source=MLI,
        measured_fp32_gemm_tflops=53.41,
        measured_fp32_source=_tptd(
            "#78 (NVIDIA GeForce RTX 4090, PyTorch 2.7, 2025-10-17; #41 and #50 give "
            "only the summary)",
            dtype="fp32",
        ),
    ),
    GpuSpec(
        key="RTX3090TI-24GB",
        name="NVIDIA GeForce RTX 3090 Ti",
        peak_tflops=80.0,
        fp32_tflops=40.0,
        memory_gb=24,
        bandwidth_gbps=1008,
        tdp_w=450,
        interconnect="NVLink bridge, 112.5 GB/s; PCIe 4.0 x16",
        source="NVIDIA RTX 3090 Ti specifications; fp16 tensor with fp32 accumulate at half "
        "the fp16-accumulate rate, as the GA102 whitepaper gives for GeForce",
        url="https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3090-3090ti/",
        segment="geforce",
        architecture="ampere-ga10x",
        fp16_accumulate_tflops=160.0,
        measured_gemm_tflops=81.0,
        measured_bandwidth_gbps=856.0,
        measured_source=MLI,
    ),
    GpuSpec(
        key="RTX3090-24GB",
        name="NVIDIA GeForce RTX 3090",
        peak_tflops=71.0,
        fp32_tflops=35.6,
        memory_gb=24,
        bandwidth_gbps=936,
        tdp_w=350,
        interconnect="NVLink bridge, 112.5 GB/s; PCIe 4.0 x16",
        source="NVIDIA Ampere GA102 whitepaper, fp16 tensor with fp32 accumulate (2020)",
        url=GA102,
        segment="geforce",
        architecture="ampere-ga10x",
        fp16_accumulate_tflops=142.0,
    ),
    # Older and consumer GPUs of public cluster-scheduler studies: Gavel (Narayanan
    # et al., OSDI'20) uses K80, P100 and V100; Sia (Jayaram Subramanya et al.,
    # SOSP'23) and Pollux use RTX 2080 Ti and T4 nodes; Cephalo's cluster has a P40.
    GpuSpec(
        key="RTX2080TI-11GB",
        name="NVIDIA GeForce RTX 2080 Ti",
        peak_tflops=53.8,
        fp32_tflops=13.4,
        memory_gb=11,
        bandwidth_gbps=616,
        tdp_w=250,
        interconnect="NVLink bridge, 100 GB/s; PCIe 3.0 x16",
        source="NVIDIA Turing whitepaper, fp16 tensor with fp32 accumulate (2018)",
        url="https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/"
        "technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf",
        segment="geforce",
        architecture="turing",
        measured_gemm_tflops=49.61,
        measured_source=_tptd(
            "#181 (GeForce RTX 2080 Ti, PyTorch 2.7.1, 2026-06-27; not #115's 22 GB modified board)"
        ),
        measured_fp32_gemm_tflops=11.52,
        measured_fp32_source=_tptd(
            "#181 (GeForce RTX 2080 Ti, PyTorch 2.7.1, 2026-06-27)", dtype="fp32"
        ),
        fp16_accumulate_tflops=107.6,
    ),
    GpuSpec(
        key="P100-16GB",
        name="NVIDIA Tesla P100 SXM2",
        peak_tflops=10.6,
        fp32_tflops=10.6,
        memory_gb=16,
        bandwidth_gbps=732,
        tdp_w=300,
        interconnect="NVLink 1, 160 GB/s",
        source="NVIDIA Tesla P100 datasheet, SXM2 column (2016): no tensor cores, so fp16 "
        "products with fp32 accumulate run at the fp32 10.6 (its 21.2 fp16 needs fp16 "
        "accumulation)",
        url="https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-datasheet.pdf",
        segment="datacenter",
        architecture="pascal",
        measured_gemm_tflops=7.29,
        measured_source=_tptd("#180 (Tesla P100-SXM2-16GB, PyTorch 2.7, 2026-06-08)"),
        measured_fp32_gemm_tflops=9.50,
        measured_fp32_source=_tptd(
            "#180 (Tesla P100-SXM2-16GB, PyTorch 2.7, 2026-06-08)", dtype="fp32"
        ),
    ),
    GpuSpec(
        key="P100PCIE-12GB",
        name="NVIDIA Tesla P100 PCIe 12GB",
        peak_tflops=9.3,
        fp32_tflops=9.3,
        memory_gb=12,
        bandwidth_gbps=549,
        tdp_w=250,
        interconnect="PCIe 3.0 x16, 32 GB/s",
        source="NVIDIA Tesla P100 datasheet, PCIe column, 12 GB CoWoS HBM2 (2016): fp16 with "
        "fp32 accumulate at the fp32 9.3, as on the SXM2 (its 18.7 fp16 needs fp16 "
        "accumulation); Cephalo's and Zorse's profiles name it 'p100' with 12 GB",
        url="https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-datasheet.pdf",
        segment="datacenter",
        architecture="pascal",
        measured_gemm_tflops=7.46,
        measured_source=_tptd(
            "the P100-PCIE-16GB (same GP100, clocks and 250 W; a fourth "
            "HBM2 stack): the median of two contributors' first runs, #164 7.20 and #174 7.72 "
            "(PyTorch 2.7; #175-#177 repeat #174's)"
        ),
        measured_fp32_gemm_tflops=8.38,
        measured_fp32_source=_tptd(
            "the P100-PCIE-16GB (same GP100, clocks and 250 W): the median of two "
            "contributors' first runs, #164 8.12 and #174 8.63 (PyTorch 2.7)",
            dtype="fp32",
        ),
    ),
    GpuSpec(
        key="P40-24GB",
        name="NVIDIA Tesla P40",
        peak_tflops=11.76,
        fp32_tflops=11.76,
        memory_gb=24,
        bandwidth_gbps=346,
        tdp_w=250,
        interconnect="PCIe 3.0 x16, 32 GB/s",
        source="NVIDIA Tesla P40 datasheet: fp32 only, its fp16 runs at 1/64 of that (2016)",
        url="https://images.nvidia.com/content/pdf/tesla/"
        "184427-Tesla-P40-Datasheet-NV-Final-Letter-Web.pdf",
        segment="datacenter",
        architecture="pascal",
    ),
    GpuSpec(
        key="K80-12GB",
        name="NVIDIA Tesla K80 (one of the board's two GPUs)",
        peak_tflops=4.37,
        fp32_tflops=4.37,
        memory_gb=12,
        bandwidth_gbps=240,
        tdp_w=150,
        interconnect="PCIe 3.0 x16 for the board of two",
        source="NVIDIA Tesla K80 datasheet, fp32 boost halved per GPU; no fp16 speed-up (2014)",
        url="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-product-literature/Tesla-K80-BoardSpec-07317-001-v05.pdf",
        segment="datacenter",
        architecture="kepler",
        gpus_per_board=2,
    ),
    GpuSpec(
        key="MI300X-192GB",
        name="AMD Instinct MI300X",
        peak_tflops=1307.4,
        fp32_tflops=163.4,
        memory_gb=192,
        bandwidth_gbps=5300,
        tdp_w=750,
        interconnect="AMD Infinity Fabric, 7 links, 896 GB/s; PCIe 5.0 x16",
        source="AMD Instinct MI300X datasheet (2023)",
        url="https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
        segment="datacenter",
        architecture="cdna3",
        measured_gemm_tflops=_mamf(668.4),
        measured_source=_mamf_source(
            "AMD MI300X 668.4 (torch 2.5.1, ROCm 6.3, PYTORCH_TUNABLEOP_ENABLED=1)"
        ),
    ),
    GpuSpec(
        key="MI250X-64GB",
        name="AMD Instinct MI250X (one of the module's two GCDs)",
        peak_tflops=191.5,
        fp32_tflops=47.85,
        memory_gb=64,
        bandwidth_gbps=1638.4,
        tdp_w=280,
        interconnect="AMD Infinity Fabric, 8 links, 800 GB/s, and PCIe 4.0 x16 for the "
        "module of two",
        source="AMD Instinct MI250X datasheet (2021), per GCD (module: 383 fp16/bf16 matrix, "
        "95.7 fp32 matrix, 128 GB HBM2e at 3.2768 TB/s, 560 W); ROCm and PyTorch show each GCD "
        "as its own device",
        url="https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html",
        segment="datacenter",
        architecture="cdna2",
        gpus_per_board=2,
        measured_gemm_tflops=_mamf(147.0, h100=MAMF_V1_H100_SXM),
        measured_source=_mamf_source(
            "AMD MI250X 147.0 (ROCm 6.2, one GCD)",
            h100=MAMF_V1_H100_SXM,
            table=", the older v1 table",
        ),
    ),
    GpuSpec(
        key="MI210-64GB",
        name="AMD Instinct MI210",
        peak_tflops=181.0,
        fp32_tflops=45.3,
        memory_gb=64,
        bandwidth_gbps=1638,
        tdp_w=300,
        interconnect="AMD Infinity Fabric bridge, 3 links, 300 GB/s; PCIe 4.0 x16",
        source="AMD Instinct MI210 datasheet (2022): fp16/bf16 matrix 181; fp32 matrix 45.3 (its "
        "fp32 products run on the matrix cores; fp32 vector 22.6)",
        url="https://www.amd.com/en/products/accelerators/instinct/mi200/mi210.html",
        segment="datacenter",
        architecture="cdna2",
        measured_gemm_tflops=120.18,
        measured_source=_tptd("#195 (AMD Instinct MI210, PyTorch 2.13 on ROCm 7.2, 2026-08-07)"),
        measured_fp32_gemm_tflops=33.02,
        measured_fp32_source=_tptd(
            "#195 (AMD Instinct MI210, PyTorch 2.13 on ROCm 7.2, 2026-08-07)", dtype="fp32"
        ),
    ),
    GpuSpec(
        key="GAUDI2-96GB",
        name="Intel Gaudi 2",
        peak_tflops=432.0,
        fp32_tflops=None,
        memory_gb=96,
        bandwidth_gbps=2460,
        tdp_w=600,
        interconnect="24x 100 GbE RoCE on chip (4.8 Tb/s bidirectional); PCIe 4.0 x16",
        source="R. Kaplan, 'Intel Gaudi 3 AI Accelerator', Hot Chips 2024, Gaudi product "
        "generations table (bf16 matrix 432 TFLOP/s); memory and links: the Gaudi 2 "
        "whitepaper (2022), which gives no fp32 rate",
        url="https://habana.ai/wp-content/uploads/2022/05/gaudi2-whitepaper.pdf",
        segment="datacenter",
        architecture="gaudi2",
        measured_gemm_tflops=_mamf(418.7),
        measured_source=_mamf_source(
            "Intel Gaudi 2 418.7 (torch 2.6.0+hpu_1.21.2, PT_HPU_LAZY_MODE=1)"
        ),
    ),
]

CATALOGUE: dict[str, GpuSpec] = {gpu.key: gpu for gpu in _GPUS}

CROSS_CHECKED: dict[str, str] = {
    "A100-80GB": "312 dense bf16/fp16, 19.5 fp32, 2,039 GB/s, 400 W: glennklockwood.com/"
    "garden/processors/A100 (from the datasheet) and thundercompute.com's A100 table",
    "A100-40GB": "1,555 GB/s, 400 W, 312/19.5 TFLOP/s: the same two pages and Paderborn PC2's "
    "A100 node page",
    "H100-80GB": "1,979 sparse (989 dense) bf16, 67 fp32, 3,350 GB/s, 700 W: NVIDIA's H100 "
    "table as mirrored by HPC Tech (archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html)",
    "H100PCIE-80GB": "1,513 sparse (756 dense) bf16, 51 fp32, 2,000 GB/s, 300-350 W: the same",
    "L4-24GB": "242 sparse (121 dense) fp16, 300 GB/s, 72 W: the datasheet's figures as quoted "
    "in grokipedia.com's L4 vs L40S page; 30.3 fp32: fpsbench.com",
    "T4-16GB": "65 fp16 mixed precision, 8.1 fp32, 320 GB/s, 70 W: sysrqmts.com's T4 page and "
    "NVIDIA's launch figures (tomshardware.co.uk, 2018)",
    "L40-48GB": "362.1 sparse (181 dense) fp16 with fp32 accumulate, 90.5 fp32, 300 W: "
    "hmc-tech.com's L4 vs L40 page",
    "A2-16GB": "18.13 dense (36.25 sparse) fp16 tensor with fp32 accumulate, 4.53 fp32, 1,770 "
    "MHz, 60 W: hmc-tech.com's A2 vs A40 page (the catalogue had the sparse 36 as dense)",
    "A16-16GB": "69.43 dense fp16 tensor with fp32 accumulate for the board of four (17.36 per "
    "GPU at 1,695 MHz), 4x 4.3 fp32: hmc-tech.com's L4 vs A16 page (the catalogue had the "
    "sparse 35.9 per GPU as dense)",
}
"""Entries whose figures were compared with a second public copy of the vendor's numbers
(issue 20: many citations were unchecked); the others cite the vendor document only."""
_BY_LOWER_KEY = {key.lower(): gpu for key, gpu in CATALOGUE.items()}


def known_types() -> list[str]:
    return list(CATALOGUE)


def lookup(gpu_type: str) -> GpuSpec:
    """Return the catalogue entry for ``gpu_type``, matched case-insensitively.

    >>> lookup("a100-40gb").peak_tflops
    312.0
    """
    gpu = _BY_LOWER_KEY.get(gpu_type.strip().lower())
    if gpu is None:
        raise KeyError(gpu_type)
    return gpu
