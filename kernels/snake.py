"""The codec's Snake activation ``x + sin(alpha x)^2 / alpha`` in one pass over the tensor.

Why a kernel: eagerly the expression is five elementwise passes (mul, sin, pow, mul, add) over the
codec decoder's largest tensors; on the H200 the S2-size decoder spent more than half of a batched
streaming push (64 streams x 4 frames, bf16) in such passes, next to 31 % in its convolutions
(benchmarks/inference_h200/probe, 2026-12-01). One Triton launch reads ``x`` once and writes once,
computing in float32 (the eager bf16 expression rounds after every step; this rounds once).
Which path runs is :mod:`.dispatch`'s decision, as for every kernel here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import dispatch


def snake_ref(x: Tensor, alpha: Tensor) -> Tensor:
    """The reference expression (as the released codec computes it), in ``x``'s dtype."""
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


def snake(x: Tensor, alpha: Tensor) -> Tensor:
    """Snake of channels-first ``x [B, C, T]`` with per-channel ``alpha`` (``[1, C, 1]`` or ``[C]``)."""
    if x.dim() != 3 or alpha.numel() != x.shape[1]:
        raise ValueError(f"snake wants x [B, C, T] and C alphas, got {list(x.shape)} and {alpha.numel()}")
    if x.numel() == 0 or not dispatch.use_triton(x):
        return snake_ref(x, alpha.view(1, -1, 1))
    from .triton_snake import snake_triton

    return snake_triton(x, alpha.reshape(-1))
