"""FP8 correctness gate: FP8 (via ttsfleet.kernels) decodes the same greedy frames as bf16.

Two checks, each able to fail:
- the gate itself: greedy decode of a fixed prompt, first 5 frames token-exact, FP8 vs bf16, on
  ``tiny-fp8`` (128-multiple dims; random weights arranged to decide with trained-model-like margins,
  see loader._make_confident_ — on plain random weights exact matching is a coin toss, even between
  two bf16 CPU builds). It catches FP8 output that is badly wrong, not subtle layout bugs;
- logit fidelity on full-strength ``tiny``: FP8 logits within 15% relative error of bf16 (measured
  ~6%); a swapped gate/up FP8 layout (a real class of bug) lands at ~50% and is caught.
"""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference import model_layers
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams

SCHEMES = ["bsgemm_fp8", "mxfp8"]


def _gate_prompt(tok, cfg) -> torch.Tensor:
    gen = torch.Generator().manual_seed(42)
    ref = torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, 6), generator=gen)
    return build_prompt(tok, cfg, "The quick brown fox.", references=[(ref, "a reference")])


def _greedy_frames(model, prompt: torch.Tensor, n: int = 5) -> list[list[int]]:
    cache = model.new_cache(1, 256)
    model.prefill(cache, 0, prompt.to(model.device))
    batch = SamplingBatch.from_params([SamplingParams(temperature=0.0)], model.device)
    slots = torch.tensor([0], device=model.device)
    return [model.decode_step(cache, slots, batch)[0].tolist() for _ in range(n)]


def _gate(device: str, scheme: str, tok) -> None:
    ref = load_model("tiny-fp8", device=device, dtype=torch.bfloat16)
    fp8 = load_model("tiny-fp8", device=device, dtype=torch.bfloat16, quantize=scheme)
    assert fp8.quantization == scheme and fp8.layers[0].feed_forward.gate_up_q is not None
    assert ref.quantization == "bf16"  # the canonical name, never the input alias "none"
    prompt = _gate_prompt(tok, ref.config)
    assert _greedy_frames(fp8, prompt) == _greedy_frames(ref, prompt)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_fp8_greedy_gate_cpu(scheme: str, tiny_tok) -> None:
    _gate("cpu", scheme, tiny_tok)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
def test_fp8_greedy_gate_gpu(scheme: str, tiny_tok) -> None:
    _gate("cuda", scheme, tiny_tok)


def _rel_logit_error(model, ref, prompt: torch.Tensor) -> float:
    logits, hidden = model.forward_slow(prompt[None])
    logits0, hidden0 = ref.forward_slow(prompt[None])
    codes = prompt[1:, -1][None]
    fast = model.fast_logits(hidden0[:, -1], codes)
    fast0 = ref.fast_logits(hidden0[:, -1], codes)
    slow_err = float((logits - logits0).norm() / logits0.norm())
    fast_err = float((fast - fast0).norm() / fast0.norm())
    return max(slow_err, fast_err)


def _swapped_gate_up(self, scheme: str) -> None:  # the bug the fidelity check must catch
    from ttsfleet.kernels import quantize_weight

    self.gate_up_q = quantize_weight(torch.cat([self.w3.weight.data, self.w1.weight.data], 0), scheme)
    self.down_q = quantize_weight(self.w2.weight.data, scheme)
    self.w1.weight = self.w3.weight = self.w2.weight = None


@pytest.mark.parametrize("scheme", SCHEMES)
def test_fp8_logit_fidelity_and_a_broken_layout_is_caught(scheme: str, tiny_tok, monkeypatch) -> None:
    ref = load_model("tiny", dtype=torch.bfloat16)
    prompt = _gate_prompt(tiny_tok, ref.config)
    assert _rel_logit_error(load_model("tiny", dtype=torch.bfloat16, quantize=scheme), ref, prompt) < 0.15
    monkeypatch.setattr(model_layers.FeedForward, "quantize_", _swapped_gate_up)
    broken = load_model("tiny", dtype=torch.bfloat16, quantize=scheme)
    assert _rel_logit_error(broken, ref, prompt) > 0.15
