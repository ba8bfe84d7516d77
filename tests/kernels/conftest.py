"""Fixtures for the kernel tests: fresh random inputs every run (seed printed for replay)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def gen() -> torch.Generator:
    """A freshly seeded generator; set TTSFLEET_TEST_SEED to replay a failure."""
    seed = int(os.environ.get("TTSFLEET_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def kernels_on():  # noqa: ANN201
    """The Triton kernels for the test's device (Triton's interpreter on CPU; ``tests/conftest.py``
    sets ``TRITON_INTERPRET`` first), and after it the dispatch and every decode switch a test may
    have set back to what the environment says."""
    pytest.importorskip("triton")
    from ttsfleet.kernels import decode, dispatch, triton_gemm

    if not torch.cuda.is_available() and not triton_gemm.INTERPRETING:
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    if torch.cuda.is_available() and not dispatch.plan("cuda").fused:
        pytest.skip("the catalog does not run the Triton kernels on this GPU")
    dispatch.configure("auto" if torch.cuda.is_available() else "interpret")
    yield
    dispatch.configure()
    for switch in (decode.ATTN_SPLITS_SWITCH, decode.ATTN_TILE_SWITCH, decode.ROPE_ATTENTION_SWITCH,
                   decode.GEMM_PREFETCH_SWITCH, decode.ATTN_PREFETCH_SWITCH, decode.TOPK_SELECT_SWITCH,
                   decode.MLP_LAUNCH_SWITCH, decode.FAST_ATTN_LAUNCH_SWITCH, decode.DECODE_GEMM_SWITCH,
                   decode.CUBLAS_SCALES_SWITCH,
                   decode.DEEPGEMM_ROWS_SWITCH, decode.DEEPGEMM_SHAPES_SWITCH,
                   decode.DEEPGEMM_SMS_SWITCH):
        switch.reset()
