"""Helpers shared by the tests and ``ttsfleet kernels check``: random inputs and error metrics.

Why in the package: the CLI's ``check`` runs the same correctness checks on whatever device it is
on, so the helpers cannot live only under tests/.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
from torch import Tensor

from .workspaces import new_owner, workspace_scope

# ||out - ref|| / ||ref|| bounds. FP8 e4m3 keeps 3 mantissa bits: quantizing both operands costs
# about 3-4 % relative error against unquantized float64; against float64 math on the *same* FP8
# codes only accumulation order and the bf16 output rounding (2^-9) remain.
TOL_SAME_CODES_BF16 = 1.2e-2
TOL_SAME_CODES_F32 = 2e-3
TOL_VS_UNQUANTIZED = 7e-2
# SwiGLU quantizes twice in sequence (x, then h) and mxfp8's power-of-two scales use about half a
# bit less of the FP8 range: the median is ~4.5 %, the worst of 150 small random draws 6.1 %.
TOL_MLP_VS_UNQUANTIZED = 9e-2


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0, device: str | torch.device = "cpu",
          dtype: torch.dtype = torch.float32) -> Tensor:
    """Random normal data (never zeros), drawn on the CPU so every device sees the same values."""
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def rel_err(out: Tensor, ref: Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; a non-finite output (e.g. unwritten poison) fails."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(o).all():
        raise AssertionError(f"{int((~torch.isfinite(o)).sum())} non-finite output elements")
    return float((o - r).norm() / r.norm())


def poison_(t: Tensor) -> Tensor:
    """Fill with NaN (floats) or a sentinel so unwritten elements are caught."""
    if t.is_floating_point():
        return t.fill_(float("nan"))
    return t.fill_(-123456)


def graph_replays_equal(launch: Callable[[], Tensor], replays: int = 3,
                        owner: Hashable | None = None) -> bool:
    """Whether a CUDA graph holding two calls of ``launch`` gives the eager call's bits at each of
    ``replays`` replays (outputs zeroed before each, so a replay that skips work shows). Why two
    calls: a kernel that leaves state set (a work counter, a ticket) breaks the call after it; the
    eager call and both captured ones share one workspace (``owner``'s: default a new one; pass one
    to read its tickets afterwards)."""
    with workspace_scope(new_owner("graph-test") if owner is None else owner):
        eager = launch()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            first, second = launch(), launch()
    for _ in range(replays):
        first.zero_()
        second.zero_()
        graph.replay()
        torch.cuda.synchronize()
        if not (torch.equal(first, eager) and torch.equal(second, eager)):
            return False
    return True
