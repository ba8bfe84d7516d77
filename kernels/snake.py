"""The codec's Snake activation ``x + sin(alpha x)^2 / alpha`` in one pass over the tensor.

Why a kernel: eagerly the expression is five elementwise passes (mul, sin, pow, mul, add) over the
codec decoder's largest tensors; on the H200 the S2-size decoder spent more than half of a batched
streaming push (64 streams x 4 frames, bf16) in such passes, next to 31 % in its convolutions
(benchmarks/inference_h200/probe, 2026-12-01). One Triton launch reads ``x`` once and writes once,
computing in float32 (the eager bf16 expression rounds after every step; this rounds once).
Which path runs is :mod:`.dispatch`'s decision, as for every kernel here.

Layouts: channels-first ``[B, C, T]`` or the codec's channels-last form ``[B, C, 1, T]`` (NHWC
memory, :mod:`ttsfleet.inference.codec_layers`); ``out`` (same shape, any strides) lets the caller
write the result straight into a larger buffer, e.g. a causal conv's ``[history | new]`` input.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import dispatch


def snake_ref(x: Tensor, alpha: Tensor, out: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """The reference expression (as the released codec computes it), in ``x``'s dtype; of
    ``x + bias`` when ``bias`` (shaped like ``alpha``) is given."""
    if bias is not None:
        x = x + bias
    return torch.add(x, (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2), out=out)


def _as_3d(t: Tensor) -> Tensor:
    """``[B, C, 1, T]`` -> the ``[B, C, T]`` view of the same memory (3-D passes through)."""
    return t.squeeze(2) if t.dim() == 4 else t


def snake(x: Tensor, alpha: Tensor, out: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """Snake of ``x [B, C, T]`` or ``[B, C, 1, T]`` with per-channel ``alpha`` (``[1, C, 1]`` or
    ``[C]``); into ``out`` (returned) when given. ``bias`` (``C`` values, any shape): Snake of
    ``x + bias``, the bias of the conv that produced ``x`` added in the same pass (issue #25)."""
    ok_dims = x.dim() == 3 or (x.dim() == 4 and x.shape[2] == 1)
    if not ok_dims or alpha.numel() != x.shape[1]:
        raise ValueError(f"snake wants x [B, C, T] or [B, C, 1, T] and C alphas, got {list(x.shape)} "
                         f"and {alpha.numel()}")
    if bias is not None and bias.numel() != x.shape[1]:
        raise ValueError(f"snake wants C biases, got {bias.numel()} for {list(x.shape)}")
    if out is not None and out.shape != x.shape:
        raise ValueError(f"snake out {list(out.shape)} is not x's shape {list(x.shape)}")
    if x.numel() == 0 or not dispatch.use_triton(x):
        shape = (1, -1, *[1] * (x.dim() - 2))
        return snake_ref(x, alpha.view(shape), out=out, bias=None if bias is None else bias.view(shape))
    from .triton_snake import snake_triton

    y = snake_triton(_as_3d(x), alpha.reshape(-1), None if out is None else _as_3d(out),
                     None if bias is None else bias.reshape(-1))
    if out is not None:
        return out
    return y.unsqueeze(2) if x.dim() == 4 else y
