"""The DualAR token window shift: ``prev [bs, W, cw]`` loses its oldest step and gains ``next``.

Why strict checks: this runs inside a captured CUDA graph every decode step; a wrong dtype or a
non-contiguous view would be silently mis-indexed by the kernel and corrupt every later step, so
anything but the exact contract raises ``ValueError`` before any byte is written.
"""

from __future__ import annotations

from torch import Tensor

from . import dispatch
from .reference import prev_tokens_shift_ref


def check_window_args(prev: Tensor, next_tokens: Tensor) -> None:
    """Raise ValueError unless prev is contiguous int32 [bs, W, cw] and next is int32 [bs, cw]."""
    import torch

    if not isinstance(prev, torch.Tensor) or not isinstance(next_tokens, torch.Tensor):
        raise ValueError("prev_tokens_shift_: prev and next_tokens must be tensors")
    if prev.dtype != torch.int32 or next_tokens.dtype != torch.int32:
        raise ValueError(f"prev_tokens_shift_: both must be int32, got {prev.dtype} and {next_tokens.dtype}")
    if prev.dim() != 3:
        raise ValueError(f"prev_tokens_shift_: prev must be [bs, W, cw], got shape {tuple(prev.shape)}")
    bs, w, cw = prev.shape
    if w < 1 or cw < 1:
        raise ValueError(f"prev_tokens_shift_: empty window {tuple(prev.shape)}")
    if tuple(next_tokens.shape) != (bs, cw):
        raise ValueError(
            f"prev_tokens_shift_: next_tokens must be [bs, cw] = {[bs, cw]}, got {list(next_tokens.shape)}")
    if not prev.is_contiguous():
        raise ValueError(f"prev_tokens_shift_: prev must be contiguous, got strides {prev.stride()}")
    if cw > 1 and next_tokens.stride(1) != 1:
        raise ValueError(
            f"prev_tokens_shift_: next_tokens rows must be contiguous, strides {next_tokens.stride()}")
    if prev.device != next_tokens.device:
        raise ValueError(f"prev_tokens_shift_: devices differ ({prev.device} vs {next_tokens.device})")
    if prev.data_ptr() <= next_tokens.data_ptr() < prev.data_ptr() + prev.numel() * 4:
        raise ValueError("prev_tokens_shift_: next_tokens must not alias prev")


def prev_tokens_shift_(prev: Tensor, next_tokens: Tensor) -> None:
    """In place, graph-capture safe (no allocation on the Triton path, no host sync)."""
    check_window_args(prev, next_tokens)
    if dispatch.use_triton(prev):
        from .triton_window import prev_tokens_shift_triton

        prev_tokens_shift_triton(prev, next_tokens)
    else:
        prev_tokens_shift_ref(prev, next_tokens)
