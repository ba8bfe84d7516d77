"""The codec's causal convs with their epilogue (bias, then Snake or the residual add) in one pass.

Why: see :mod:`.triton_codec_conv` (issue #25: the residual units' elementwise passes cost the codec
more than their convolutions). This module is the checked entry point with the torch reference of
the same numerics (float32 accumulation, the epilogue on the float32 result, one rounding), which
runs where the dispatch does not run Triton (:mod:`.dispatch`).

Tensors are time rows ``[B, T, C]`` with channels contiguous: :func:`rows` views the codec's
channels-last ``[B, C, 1, T]`` tensors that way without a copy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import dispatch
from .snake import snake_ref


def rows(t: Tensor) -> Tensor:
    """A channels-last ``[B, C, 1, T]`` tensor (or a slice of one along T) as ``[B, T, C]`` rows."""
    if t.dim() != 4 or t.shape[2] != 1 or (t.stride(1) != 1 and t.shape[1] > 1):
        raise ValueError(f"rows wants a channels-last [B, C, 1, T] tensor, got {list(t.shape)} "
                         f"strides {t.stride()}")
    return t.squeeze(2).transpose(1, 2)


def weight_rows(weight: Tensor) -> Tensor:
    """A ``Conv1d`` weight ``[Co, Ci, K]`` as ``[K, Ci, Co]`` contiguous: tap-major GEMM operands."""
    return weight.detach().permute(2, 1, 0).contiguous()


def conv_rows_ref(x: Tensor, weight: Tensor, bias: Tensor, out: Tensor, dilation: int = 1,
                  alpha: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
    """The same numbers as the kernel, in torch: float32 taps summed, bias, epilogue, one rounding."""
    t = out.shape[1]
    acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    for k in range(weight.shape[0]):
        acc += x[:, k * dilation: k * dilation + t].float() @ weight[k].float()
    acc += bias.float()
    if alpha is not None:
        acc = snake_ref(acc, alpha.float().reshape(-1))  # per channel: the rows' last axis
    if residual is not None:
        acc += residual.float()
    return out.copy_(acc)


def _check(x: Tensor, weight: Tensor, bias: Tensor, out: Tensor, dilation: int,
           alpha: Tensor | None, residual: Tensor | None) -> None:
    if x.dim() != 3 or weight.dim() != 3 or out.dim() != 3:
        raise ValueError(f"conv_rows wants x [B, L, Ci], weight [K, Ci, Co], out [B, T, Co]; got "
                         f"{list(x.shape)}, {list(weight.shape)}, {list(out.shape)}")
    k, c_in, c_out = weight.shape
    want = (x.shape[0], x.shape[1] - (k - 1) * dilation, c_out)
    if x.shape[2] != c_in or tuple(out.shape) != want:
        raise ValueError(f"conv_rows: x {list(x.shape)} with weight {list(weight.shape)} and dilation "
                         f"{dilation} gives out {list(want)}, got {list(out.shape)}")
    if bias.numel() != c_out or (alpha is not None and alpha.numel() != c_out):
        raise ValueError(f"conv_rows wants {c_out} biases (and alphas)")
    if residual is not None and residual.shape != out.shape:
        raise ValueError(f"conv_rows residual {list(residual.shape)} is not out's {list(out.shape)}")
    for name, t in (("x", x), ("out", out), ("residual", residual)):
        if t is not None and t.shape[2] > 1 and t.stride(2) != 1:
            raise ValueError(f"conv_rows wants {name}'s channels contiguous, got strides {t.stride()}")
    if not weight.is_contiguous():
        raise ValueError("conv_rows wants a contiguous [K, Ci, Co] weight (weight_rows)")


def conv_rows(x: Tensor, weight: Tensor, bias: Tensor, out: Tensor | None = None, dilation: int = 1,
              alpha: Tensor | None = None, residual: Tensor | None = None, tile: object = None) -> Tensor:
    """``out[b, t] = epi(sum_k x[b, t + k*dilation] @ weight[k] + bias)``; ``epi`` is Snake with
    ``alpha`` (per output channel) or ``+ residual[b, t]`` or nothing (not both: the codec's units
    need one or the other after each conv). ``x`` is a causal conv's padded input (history first),
    ``out`` (returned; allocated when None) may be a strided slice, e.g. of the next conv's buffer.
    ``tile`` (:class:`~.codec_conv_tiles.ConvTile`): a launch config instead of
    :func:`~.codec_conv_tiles.tile_for`'s."""
    if alpha is not None and residual is not None:
        raise ValueError("conv_rows applies Snake or the residual add, not both")
    if out is None:
        k = weight.shape[0] if weight.dim() == 3 else 1
        out = x.new_empty(x.shape[0], x.shape[1] - (k - 1) * dilation, weight.shape[-1])
    _check(x, weight, bias, out, dilation, alpha, residual)
    if out.numel() == 0:
        return out
    if not dispatch.use_triton(x):
        return conv_rows_ref(x, weight, bias, out, dilation, alpha, residual)
    from .triton_codec_conv import conv_rows_triton

    return conv_rows_triton(x, weight, bias, out, dilation, alpha, residual, tile)
