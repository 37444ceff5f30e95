"""A device's usable memory: the one place that says how much of a GPU a plan may fill.

Every room asks this module, so a dry-run plan, a simulated device, the
profiler, the dashboard and ``/metrics`` agree on one number per device.

- A simulated device (DESIGN.md, "Simulated devices") has exactly
  ``memory_gb × memory_scale``: it counts tensors, it has no CUDA context,
  no allocator and no fragmentation.
- A real GPU's budget starts from what the driver reports free once the
  actor's CUDA context exists (``torch.cuda.mem_get_info()``), less a reserve
  for NCCL's communicator buffers and less a fragmentation margin for the
  caching allocator (PyTorch's allocator rounds blocks and splits segments;
  at the largest micro-batch a few per cent of reserved memory is typically
  unusable, "Understanding CUDA Memory Usage", PyTorch docs).
- Without a GPU to ask (a what-if plan from the catalogue), the free memory
  is the catalogue's size less a typical CUDA context.
"""

from __future__ import annotations

MIB = 2**20
GIB = 2**30
CUDA_CONTEXT_BYTES = 768 * MIB
"""Driver context plus cuBLAS/cuDNN workspaces; 300–900 MB on recent drivers and cards."""
NCCL_RESERVE_BYTES = 512 * MIB
"""NCCL communicator buffers (``NCCL_BUFFSIZE`` 4 MB × channels × peers, plus its streams)."""
FRAGMENTATION_MARGIN = 0.05
"""Share of the remaining memory the caching allocator may leave unusable."""


def gpu_budget_bytes(free_bytes: int) -> int:
    """The usable budget of a real GPU whose driver reports ``free_bytes`` free.

    >>> gpu_budget_bytes(10 * GIB) == int((10 * GIB - 512 * MIB) * 0.95)
    True
    """
    return max(0, int((free_bytes - NCCL_RESERVE_BYTES) * (1 - FRAGMENTATION_MARGIN)))


def catalogue_budget_bytes(memory_bytes: int) -> int:
    """The usable budget of a GPU known only by its catalogue size (analytic plans)."""
    return gpu_budget_bytes(memory_bytes - CUDA_CONTEXT_BYTES)


def simulated_budget_bytes(memory_bytes: int, memory_scale: float) -> int:
    """A simulated device's capacity: ``memory × memory_scale``, all of it usable."""
    return int(memory_bytes * memory_scale)


def usable_capacity_bytes(memory_bytes: int, *, simulated: bool, memory_scale: float) -> int:
    """The budget a plan may fill on a device of ``memory_bytes`` (no GPU asked).

    ``memory_scale`` is read only for simulated devices.

    >>> usable_capacity_bytes(GIB, simulated=True, memory_scale=0.5) == GIB // 2
    True
    """
    if simulated:
        return simulated_budget_bytes(memory_bytes, memory_scale)
    return catalogue_budget_bytes(memory_bytes)
