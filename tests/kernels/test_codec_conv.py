"""The codec's fused causal convs (kernels/codec_conv.py) against torch's conv1d and Snake."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.kernels.codec_conv import conv_rows, conv_rows_ref, rows, weight_rows  # noqa: E402
from ttsfleet.kernels.snake import snake_ref  # noqa: E402
from ttsfleet.kernels.testing import randn, rel_err  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _torch_conv(x_rows, w, bias, dilation):
    """``F.conv1d`` over the rows (no padding: ``x`` holds the history), back as rows, float64."""
    y = F.conv1d(x_rows.double().transpose(1, 2), w.double(), bias.double(), dilation=dilation)
    return y.transpose(1, 2)


def _inputs(gen, b, t, c_in, c_out, k, dilation, dtype):
    x = randn(gen, b, t + (k - 1) * dilation, c_in, device=DEV, dtype=dtype)
    w = randn(gen, c_out, c_in, k, scale=(c_in * k) ** -0.5, device=DEV, dtype=dtype)
    bias = randn(gen, c_out, scale=0.1, device=DEV, dtype=dtype)
    return x, w, bias


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize(("c_in", "c_out", "k", "dilation", "t"),
                         [(24, 24, 7, 3, 37), (16, 48, 1, 1, 20), (96, 32, 7, 9, 5)])
@pytest.mark.parametrize("epilogue", ["none", "snake", "residual"])
def test_conv_rows_is_the_causal_conv_and_its_epilogue(kernels_on, gen, dtype, tol, c_in, c_out, k, dilation,
                                                       t, epilogue):
    """Widths that are not a power of two (24, 48, 96), taps reaching past the tile (dilation 9),
    pushes shorter than a tile: the kernel equals conv1d + Snake / + residual in float64."""
    x, w, bias = _inputs(gen, 2, t, c_in, c_out, k, dilation, dtype)
    alpha = randn(gen, c_out, device=DEV).abs() + 0.2 if epilogue == "snake" else None
    residual = randn(gen, 2, t, c_out, device=DEV, dtype=dtype) if epilogue == "residual" else None
    want = _torch_conv(x, w, bias, dilation)
    if alpha is not None:
        want = snake_ref(want, alpha.double())
    if residual is not None:
        want = want + residual.double()
    got = conv_rows(x, weight_rows(w), bias, dilation=dilation, alpha=alpha, residual=residual)
    assert got.dtype == dtype and got.shape == (2, t, c_out)
    assert rel_err(got, want) < tol
    ref = conv_rows_ref(x, weight_rows(w), bias, torch.empty_like(got), dilation, alpha, residual)
    assert rel_err(got, ref) < (1e-6 if dtype == torch.float32 else 8e-3)  # bf16: roundings one ulp apart


def test_conv_rows_reads_and_writes_channels_last_slices(kernels_on, gen):
    """The codec's use: input = a ``[history | new]`` buffer in channels-last memory, output = the
    tail of another such buffer (strided rows, untouched head)."""
    b, c, t, pad = 2, 16, 10, 6
    buf = torch.empty(b, c, 1, pad + t, device=DEV, memory_format=torch.channels_last)
    buf.copy_(randn(gen, b, c, 1, pad + t, device=DEV))
    nxt = torch.full((b, c, 1, 3 + t), 7.0, device=DEV).contiguous(memory_format=torch.channels_last)
    w, bias = randn(gen, c, c, 7, scale=0.1, device=DEV), randn(gen, c, device=DEV)
    out = rows(nxt[..., 3:])
    conv_rows(rows(buf), weight_rows(w), bias, out=out)
    want = _torch_conv(rows(buf), w, bias, 1)
    assert rel_err(rows(nxt[..., 3:]), want) < 1e-5
    assert torch.all(nxt[..., :3] == 7.0)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"out": torch.empty(1, 5, 4)}, "gives out"),
    ({"alpha": torch.ones(4), "residual": torch.zeros(1, 4, 4)}, "not both"),
    ({"alpha": torch.ones(3)}, "biases"),
])
def test_conv_rows_rejects_mismatched_arguments(kwargs, match):
    x, w, bias = torch.zeros(1, 10, 2), torch.zeros(7, 2, 4), torch.zeros(4)
    with pytest.raises(ValueError, match=match):
        conv_rows(x, w, bias, **kwargs)


def test_rows_refuses_a_channels_first_tensor():
    with pytest.raises(ValueError, match="channels-last"):
        rows(torch.zeros(1, 4, 1, 8))
