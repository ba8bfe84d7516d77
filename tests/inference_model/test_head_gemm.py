"""The sampling heads' GEMM (``TTSFLEET_HEAD_GEMM``): float32 copies through ``F.linear`` or the
checkpoint's bf16 rows through cuBLAS's bf16 GEMM with float32 output (the default since 2026-12-05).

What each test pins down, and how it can fail:
* a bf16 model keeps its heads' own bf16 rows beside the float32 copies, equal to them exactly (the
  claim that the bf16 GEMM computes the same products); a float32 model keeps none (its rows would
  be rounded);
* off CUDA, or for a float32 model, ``bf16`` falls back to the float32 GEMM (torch's ``mm.dtype`` has
  no CPU kernel): the same logits bit for bit, so the switch can never break a CPU server;
* the switch parses its two choices and names them on a bad value;
* on a GPU (skipped without CUDA): both heads' bf16 logits equal the float32 ones up to the order of
  float32 sums, at S2 Pro's head shapes and batch 1 / 64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from ttsfleet.inference import model_layers
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.model_layers import head_logits, parse_head_gemm


@pytest.fixture
def head_switch():  # noqa: ANN201
    yield model_layers.HEAD_GEMM_SWITCH
    model_layers.HEAD_GEMM_SWITCH.reset()


def test_a_bf16_model_keeps_its_heads_bf16_rows_exactly() -> None:
    model = load_model("tiny", device="cpu", dtype=torch.bfloat16)
    assert model.main_head_bf16.dtype == torch.bfloat16
    assert torch.equal(model.main_head_bf16.float(), model.main_head)
    assert torch.equal(model.fast_head_bf16.float(), model.fast_head)
    model32 = load_model("tiny", device="cpu", dtype=torch.float32)
    assert model32.main_head_bf16 is None and model32.fast_head_bf16 is None


def test_bf16_falls_back_to_float32_off_cuda(head_switch) -> None:  # noqa: ANN001
    model = load_model("tiny", device="cpu", dtype=torch.bfloat16)
    x = torch.randn(3, model.config.dim).to(torch.bfloat16)
    head_switch.set("bf16")
    got = model.main_logits(x)
    assert got.dtype == torch.float32 and torch.equal(got, F.linear(x.float(), model.main_head))


def test_the_switch_parses_and_names_its_choices() -> None:
    assert parse_head_gemm("") == "bf16" and parse_head_gemm(" Float32 ") == "float32"
    with pytest.raises(ValueError, match="^TTSFLEET_HEAD_GEMM='fp8': expected one of float32, bf16$"):
        parse_head_gemm("fp8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's mm.dtype (bf16 in, f32 out) is CUDA-only")
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("vocab", [4097, 4096])  # the main head's rows (odd), a codebook's
def test_bf16_logits_equal_float32_up_to_the_sum_order(rows: int, vocab: int, head_switch) -> None:  # noqa: ANN001
    gen = torch.Generator(device="cuda").manual_seed(0)
    head_bf16 = (torch.randn(vocab, 2560, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    x = torch.randn(rows, 2560, device="cuda", generator=gen).to(torch.bfloat16)
    head_switch.set("float32")
    ref = head_logits(x, head_bf16.float(), head_bf16)
    head_switch.set("bf16")
    got = head_logits(x, head_bf16.float(), head_bf16)
    assert got.dtype == torch.float32 and got.shape == (rows, vocab)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
