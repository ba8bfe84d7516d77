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
