"""``TTSFLEET_DECODE_GEMM=a16``: the fused decode path with the W8A16 GEMM prototype (issue #26).

Why: the switch changes what every decode linear computes (bf16 activations, no per-block rescale),
so the step must still be the model — its logits near the unquantized model's, nearer than the FP8
path's (the activation rounding is what W8A16 drops) — and the prototype must be what runs: every
decode linear through it, no FP8-codes GEMM left in a decode step. Runs the Triton kernels in the
interpreter on CPU (compiled on a GPU), like ``test_fused_decode.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.inference import fused  # noqa: E402
from ttsfleet.inference.loader import load_model  # noqa: E402
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams  # noqa: E402
from ttsfleet.kernels import decode as kd  # noqa: E402
from ttsfleet.kernels import dispatch  # noqa: E402
from ttsfleet.kernels.testing import rel_err  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CODEBOOKS = 4  # as test_fused_decode: the interpreter runs every fast-model launch in Python


@pytest.fixture(autouse=True)
def _switches():  # noqa: ANN202
    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    yield
    dispatch.configure()
    kd.DECODE_GEMM_SWITCH.reset()


def _step(quantize: str, mode: str, gemm: str) -> tuple[list[list[int]], torch.Tensor]:
    """One greedy decode step: its frames and the next step's main-head logits. Greedy, because
    those logits are computed from the frame just picked: a sampled frame that differs between two
    paths (the GPU's noise is not the interpreter's) would make them incomparable (2026-12-07c: rel.
    error 0.5 for both paths on an H100 with top-k sampling)."""
    dispatch.configure(mode)
    kd.set_decode_gemm(gemm)
    model = load_model("tiny", device=DEV, dtype=torch.float32, quantize=quantize,
                       config_overrides={"num_codebooks": CODEBOOKS})
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 500, (1 + CODEBOOKS, 9), generator=g)
    cache = model.new_cache(3, 64)
    for slot in range(2):
        model.prefill(cache, slot, prompt.to(DEV))
    batch = SamplingBatch.from_params([SamplingParams(seed=7 + i, temperature=0.0, ras=False)
                                       for i in range(2)], DEV)
    window = torch.full((2, 16, CODEBOOKS), -1, dtype=torch.int32, device=DEV)
    frames = model.decode_step(cache, torch.tensor([1, 0], device=DEV), batch, window)
    return frames.tolist(), cache.pending_logits[:2].float().clone()


def test_a16_logits_are_nearer_the_unquantized_model_than_fp8s(monkeypatch):
    from ttsfleet.kernels import triton_gemm

    calls = {"a16": 0, "fp8_codes": 0}
    for name, key in (("linear_w8a16_triton", "a16"), ("linear_fp8_codes_triton", "fp8_codes")):
        real = getattr(triton_gemm, name)

        def counted(*args, _real=real, _key=key, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            calls[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(triton_gemm, name, counted)
    exact_frames, exact = _step("bf16", "reference", "fp8")
    fused_mode = "interpret" if DEV == "cpu" else "auto"
    fp8_frames, fp8 = _step("bsgemm_fp8", fused_mode, "fp8")
    assert calls["fp8_codes"] > 0 and calls["a16"] == 0
    calls.update(a16=0, fp8_codes=0)
    a16_frames, a16 = _step("bsgemm_fp8", fused_mode, "a16")
    assert calls["fp8_codes"] == 0 and calls["a16"] > 0, calls
    assert fused.fused_enabled(a16)
    assert a16_frames == fp8_frames == exact_frames  # greedy picks agree, so the logits compare
    # both carry the FP8 weights' rounding; the FP8 path adds its activations' (greedy frames, the
    # interpreter's tiny model: 0.045 vs 0.036, 2026-12-07)
    assert rel_err(a16, exact) < 0.9 * rel_err(fp8, exact)


def test_prefill_pieces_past_the_decode_rows_keep_the_fp8_path():
    """Past the decode rows the norms still emit the FP8 GEMM's codes (group 128) and the GEMM reads
    them; up to them, bf16 (group 0) for the prototype."""
    from ttsfleet.kernels.ops import quantize_weight

    qw = quantize_weight(torch.randn(128, 128), "bsgemm_fp8")
    kd.set_decode_gemm("a16")
    a = torch.zeros(kd.DECODE_GEMM_MAX_ROWS + 1, 8)
    assert not fused._w8a16(qw, a) and fused._group(qw, a.shape[0]) == 128
    assert fused._w8a16(qw, a[: kd.DECODE_GEMM_MAX_ROWS]) and fused._group(qw, kd.DECODE_GEMM_MAX_ROWS) == 0
    assert not fused._w8a16(None, a[:4]) and fused._group(None, 4) == 0  # a dense layer
    kd.set_decode_gemm("fp8")
    assert not fused._w8a16(qw, a[:4]) and fused._group(qw, 4) == 128
