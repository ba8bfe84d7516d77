"""The codec's Snake activation: one Triton pass against the released codec's expression."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.kernels.snake import snake, snake_ref  # noqa: E402
from ttsfleet.kernels.testing import randn, rel_err  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _triton_runs() -> bool:
    from ttsfleet.kernels import triton_gemm

    return DEV == "cuda" or triton_gemm.INTERPRETING


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 1030)])
def test_snake_kernel_matches_the_expression(gen, dtype, tol, shape):
    if not _triton_runs():
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    from ttsfleet.kernels.triton_snake import snake_triton

    x = randn(gen, *shape, scale=3.0, device=DEV, dtype=dtype)
    alpha = (randn(gen, shape[1], device=DEV).abs() + 0.2)
    view = x[:, :, :]  # a strided input (every other step) is read through its strides too
    y = snake_triton(view, alpha)
    ref = snake_ref(view.double(), alpha.double().view(1, -1, 1))
    assert y.dtype == dtype and y.shape == x.shape
    assert rel_err(y, ref) < tol
    strided = torch.cat([x, x], dim=-1)[..., ::2]
    want = snake_ref(strided.double(), alpha.double().view(1, -1, 1))
    assert rel_err(snake_triton(strided, alpha), want) < tol


def test_snake_rejects_mismatched_alphas():
    with pytest.raises(ValueError, match="C alphas"):
        snake(torch.zeros(1, 3, 4), torch.ones(4))


def test_snake_on_the_reference_backend_is_the_expression(gen):
    x = randn(gen, 2, 3, 7)
    alpha = randn(gen, 1, 3, 1).abs() + 0.1
    assert torch.equal(snake(x, alpha), snake_ref(x, alpha))


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("layout", ["ncl", "channels_last"])
@pytest.mark.parametrize("into_out", [False, True])
def test_snake_kernel_adds_the_conv_bias(gen, dtype, tol, layout, into_out):
    """``bias``: Snake of ``x + bias`` (the producing conv's bias folded in, issue #25), in both
    kernels (channels-first and channels-last rows), into a fresh tensor or a strided ``out``."""
    if not _triton_runs():
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    from ttsfleet.kernels.triton_snake import snake_triton

    b, c, t = 2, 5, 37
    x = randn(gen, b, c, t, scale=3.0, device=DEV, dtype=dtype)
    if layout == "channels_last":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)  # strides (T*C, 1, C)
    alpha = randn(gen, c, device=DEV).abs() + 0.2
    bias = randn(gen, c, scale=2.0, device=DEV, dtype=dtype)
    want = snake_ref(x.double(), alpha.double().view(1, -1, 1), bias=bias.double().view(1, -1, 1))
    out = None
    if into_out:  # the tail of a [history | new] buffer, in x's layout
        buf = torch.zeros(b, t + 4, c, device=DEV, dtype=dtype).transpose(1, 2) if layout == "channels_last" \
            else torch.zeros(b, c, t + 4, device=DEV, dtype=dtype)
        out = buf[..., 4:]
    y = snake_triton(x, alpha, out, bias)
    assert y.shape == x.shape and (out is None or y is out)
    assert rel_err(y, want) < tol
    assert rel_err(snake_triton(x, alpha), want) > 10 * tol  # the bias matters at this size
    if into_out:
        assert torch.all(buf[..., :4] == 0)


@pytest.mark.parametrize("four_d", [False, True])
def test_snake_reference_adds_the_bias(gen, four_d):
    x = randn(gen, 2, 3, 7)
    alpha, bias = randn(gen, 3).abs() + 0.1, randn(gen, 3)
    want = snake_ref(x + bias.view(1, -1, 1), alpha.view(1, -1, 1))
    x_in = x.unsqueeze(2) if four_d else x
    got = snake(x_in, alpha, bias=bias)
    torch.testing.assert_close(got.squeeze(2) if four_d else got, want, atol=0, rtol=0)
    with pytest.raises(ValueError, match="C biases"):
        snake(x, alpha, bias=torch.ones(4))
