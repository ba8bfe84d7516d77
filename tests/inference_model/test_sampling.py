"""Per-request sampling: greedy, reproducible per seed whatever the batch, correct distribution, RAS."""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference.sampling import (
    SamplingBatch,
    SamplingParams,
    apply_repetition_penalty,
    sample,
    sample_main,
)


def _batch(*params: SamplingParams) -> SamplingBatch:
    return SamplingBatch.from_params(list(params))


def test_greedy_rows_take_argmax() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    b = _batch(SamplingParams(temperature=0.0), SamplingParams(top_k=1, temperature=1.5),
               SamplingParams(temperature=0.0, seed=9))
    for step in range(5):
        out = sample(logits, b, torch.full((3,), step), draw=0)
        assert out.tolist() == logits.argmax(-1).tolist()


def test_same_seed_same_tokens_whatever_the_batch() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 100, generator=gen)
    p = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=1234)
    others = [SamplingParams(temperature=0.7, seed=s) for s in (1, 2)]
    alone = [int(sample(logits, _batch(p), torch.tensor([s]), 0)[0]) for s in range(30)]
    mixed = [int(sample(torch.cat([torch.randn(1, 100, generator=gen), logits, logits]),
                        _batch(others[0], p, others[1]), torch.tensor([7, s, 3]), 0)[1]) for s in range(30)]
    assert alone == mixed
    other_seed = [int(sample(logits, _batch(SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=99)),
                             torch.tensor([s]), 0)[0]) for s in range(30)]
    assert other_seed != alone


def test_samples_follow_the_softmax() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    n = 4000
    b = SamplingBatch.from_params([SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=5)] * n)
    got = sample(logits.expand(n, -1), b, torch.arange(n), draw=0)
    freq = torch.bincount(got, minlength=5).float() / n
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.03)


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.tensor([[3.0, 2.9, 2.8, 0.0, -1.0, -2.0]])
    n = 600
    topk = sample(logits.expand(n, -1), SamplingBatch.from_params(
        [SamplingParams(temperature=2.0, top_p=1.0, top_k=2, seed=3)] * n), torch.arange(n), 0)
    assert set(topk.tolist()) == {0, 1}
    # Reference rule: drop a token once the cumulative probability *including* it exceeds top_p.
    probs = torch.softmax(logits[0], -1)
    top_p = float(probs[0] + probs[1] + probs[2]) + 1e-3
    topp = sample(logits.expand(n, -1), SamplingBatch.from_params(
        [SamplingParams(temperature=3.0, top_p=top_p, top_k=0, seed=3)] * n), torch.arange(n), 0)
    assert set(topp.tolist()) == {0, 1, 2}


def test_repetition_penalty_over_the_window() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    window = torch.tensor([[0, 1, -1, -1]])
    out = apply_repetition_penalty(logits, window, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]
    assert apply_repetition_penalty(logits, window, torch.tensor([1.0])).tolist() == logits.tolist()


def _ras_run(ras: bool, window_pos: int, end_index: int = 99) -> list[int]:
    logits = torch.tensor([[4.0, 2.5, 2.5, 2.5, 2.5]])
    n = 300
    b = SamplingBatch.from_params([SamplingParams(temperature=0.1, top_p=1.0, top_k=0, seed=11, ras=ras)] * n)
    window = torch.full((n, 16), -1)
    window[:, window_pos] = 0
    return sample_main(logits.expand(n, -1), b, torch.arange(n), window, end_index=end_index).tolist()


def test_repetition_aware_sampling() -> None:
    # Without RAS the cold sample is always token 0.
    assert set(_ras_run(False, window_pos=15)) == {0}
    # Token 0 repeats within the last 10 main tokens: a warm (T=1, top-p 0.9) draw replaces it.
    assert len(set(_ras_run(True, window_pos=15))) > 1
    # Older than the RAS window (positions < W - 10): no resampling.
    assert set(_ras_run(True, window_pos=2)) == {0}
    # The end token is never resampled.
    assert set(_ras_run(True, window_pos=15, end_index=0)) == {0}


def test_params_validate_and_pad() -> None:
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    b = SamplingBatch.from_params([SamplingParams(temperature=0.9)], pad_to=4)
    assert len(b) == 4 and b.greedy.tolist() == [False, True, True, True]
    assert SamplingParams().seed != SamplingParams().seed or SamplingParams().seed != SamplingParams().seed


def test_copy_refreshes_static_batch_in_place() -> None:
    static = SamplingBatch.from_params([SamplingParams(seed=1)] * 2)
    ptr = static.seed.data_ptr()
    static.copy_(SamplingBatch.from_params([SamplingParams(temperature=0.0, seed=5), SamplingParams(seed=6)]))
    assert static.seed.data_ptr() == ptr and static.seed.tolist() == [5, 6]
    assert static.greedy.tolist() == [True, False]
