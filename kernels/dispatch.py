"""Choose Triton or the torch reference for a tensor's device.

Triton runs on CUDA devices of compute capability 9.x (H100/H200) when triton imports; everything
else (CPU, CI, other GPUs) takes the reference path, which has the same numerics. Set
``TTSFLEET_KERNELS=reference`` to force the reference (debugging, A/B numerics).
"""

from __future__ import annotations

import functools
import os

from torch import Tensor


@functools.cache
def _triton_ok() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(index)


def use_triton(t: Tensor) -> bool:
    """True when ``t`` lives on a compute-capability-9.x GPU and Triton is importable."""
    if not t.is_cuda or os.environ.get("TTSFLEET_KERNELS", "") == "reference":
        return False
    return _capability(t.device.index or 0)[0] == 9 and _triton_ok()


def backend_name(t: Tensor) -> str:
    return "triton" if use_triton(t) else "reference"
