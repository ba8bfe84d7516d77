"""Prompt attention picks its SDPA backends itself, cuDNN's left out (its host cost per call was
1.3 ms at S2 Pro's shape on an H200, 58 % of a prefill call: benchmarks/inference_h200/2026-12-02-ab)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from ttsfleet.inference.model_layers import PROMPT_ATTENTION, attend


def test_cudnn_is_not_among_the_prompt_attention_backends() -> None:
    assert SDPBackend.CUDNN_ATTENTION not in PROMPT_ATTENTION
    assert SDPBackend.MATH in PROMPT_ATTENTION  # any shape still has a kernel


def test_attend_overrides_a_callers_backend_choice_and_matches_plain_sdpa() -> None:
    """Under a caller's cuDNN-only choice (no such kernel on a CPU) attend still runs: its own
    choice is the one in force; and it is plain causal GQA attention."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, h, 16, generator=g) for h in (4, 2, 2))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        y = attend(q, k, v, None, causal=True)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.repeat_interleave(2, 2).transpose(1, 2),
                                         v.repeat_interleave(2, 2).transpose(1, 2), is_causal=True)
    torch.testing.assert_close(y, ref.transpose(1, 2).reshape(2, 9, 64))
