"""Slot-based decoding on the tiny model: batching, slot reuse, end token, window, prompt, pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams
from ttsfleet.kernels import prev_tokens_shift_


def _prompt(tok, cfg, text: str, seed: int = 0, ref_frames: int = 5) -> torch.Tensor:
    codes = torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, ref_frames),
                          generator=torch.Generator().manual_seed(seed))
    return build_prompt(tok, cfg, text, references=[(codes, "reference words")])


def _run(model, cache, slots, params, steps, window=None):
    batch = SamplingBatch.from_params(params)
    out = []
    for _ in range(steps):
        f = model.decode_step(cache, torch.tensor(slots), batch, window)
        if window is not None:
            prev_tokens_shift_(window, f[:, 1:].to(torch.int32).contiguous())
        out.append(f)
    return torch.stack(out, 1)  # [bs, steps, 1 + ncb]


def test_batched_decode_equals_single_requests(tiny_model, tiny_tok) -> None:
    m, cfg = tiny_model, tiny_model.config
    texts = ["one two", "three four five six"]
    prompts = [_prompt(tok=tiny_tok, cfg=cfg, text=t, seed=i) for i, t in enumerate(texts)]
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=7), SamplingParams(seed=8)]
    single = []
    for p, sp in zip(prompts, params, strict=True):
        cache = m.new_cache(1, 256)
        m.prefill(cache, 0, p)
        single.append(_run(m, cache, [0], [sp], 6, torch.full((1, 8, 10), -1, dtype=torch.int32))[0])
    cache = m.new_cache(5, 256)
    m.prefill(cache, 4, prompts[0])
    m.prefill(cache, 1, prompts[1])
    both = _run(m, cache, [1, 4], params[::-1], 6, torch.full((2, 8, 10), -1, dtype=torch.int32))
    assert torch.equal(both[1], single[0]) and torch.equal(both[0], single[1])


def test_frames_are_well_formed(tiny_model, tiny_tok) -> None:
    m, cfg = tiny_model, tiny_model.config
    cache = m.new_cache(2, 256)
    m.prefill(cache, 0, _prompt(tiny_tok, cfg, "hello"))
    f = _run(m, cache, [0], [SamplingParams(seed=1)], 4)[0]
    assert f.dtype == torch.long and f.shape == (4, 1 + cfg.num_codebooks)
    main, codes = f[:, 0], f[:, 1:]
    sem = main != cfg.im_end_id
    assert ((main[sem] >= cfg.semantic_begin_id) & (main[sem] <= cfg.semantic_end_id)).all()
    assert torch.equal(codes[sem, 0], main[sem] - cfg.semantic_begin_id)
    assert ((codes >= 0) & (codes < cfg.codebook_size)).all()


def test_end_token_and_slot_length(tiny_model, tiny_tok) -> None:
    m, cfg = tiny_model, tiny_model.config
    cache = m.new_cache(1, 256)
    p = _prompt(tiny_tok, cfg, "end me")
    m.prefill(cache, 0, p)
    assert cache.length(0) == p.shape[1]
    cache.pending_logits[0, -1] = 1e4  # force <|im_end|>
    f = m.decode_step(cache, torch.tensor([0]), SamplingBatch.from_params([SamplingParams(seed=3)]))
    assert int(f[0, 0]) == cfg.im_end_id and int(f[0, 1]) == 0
    assert cache.length(0) == p.shape[1] + 1


def test_released_slot_does_not_leak_into_the_next_request(tiny_model, tiny_tok) -> None:
    m, cfg = tiny_model, tiny_model.config
    greedy = [SamplingParams(temperature=0.0)]
    short = _prompt(tiny_tok, cfg, "short", seed=3, ref_frames=2)
    fresh = m.new_cache(1, 256)
    m.prefill(fresh, 0, short)
    expected = _run(m, fresh, [0], greedy, 4)
    reused = m.new_cache(1, 256)
    m.prefill(reused, 0, _prompt(tiny_tok, cfg, "a much longer first request " * 3, seed=4))
    _run(m, reused, [0], greedy, 3)
    m.release(reused, 0)
    m.prefill(reused, 0, short)
    assert torch.equal(_run(m, reused, [0], greedy, 4), expected)


def test_prefill_rejects_bad_prompts(tiny_model) -> None:
    cache = tiny_model.new_cache(1, 32)
    with pytest.raises(ValueError):
        tiny_model.prefill(cache, 0, torch.zeros(5, 4, dtype=torch.long))
    with pytest.raises(ValueError):
        tiny_model.prefill(cache, 0, torch.zeros(11, 40, dtype=torch.long))
    with pytest.raises(ValueError):
        tiny_model.new_cache(1, tiny_model.config.max_seq_len + 1)


def test_build_prompt_layout(tiny_tok, tiny_model) -> None:
    cfg = tiny_model.config
    codes = torch.arange(30).view(10, 3) % cfg.codebook_size
    p = build_prompt(tiny_tok, cfg, "hi", references=[(codes, "ref")])
    assert p.dtype == torch.long and p.shape[0] == 1 + cfg.num_codebooks
    audio = (p[0] >= cfg.semantic_begin_id) & (p[0] <= cfg.semantic_end_id)
    assert int(audio.sum()) == 3
    assert torch.equal(p[1:, audio], codes) and torch.equal(p[0, audio], codes[0] + cfg.semantic_begin_id)
    assert int(p[1:, ~audio].abs().sum()) == 0
    assert int(p[0, 0]) == tiny_tok.im_start_id and int(p[0, -1]) == tiny_tok.voice_id
    text = tiny_tok.decode(p[0, ~audio].tolist())
    assert "Text:\n<|speaker:0|>ref\n\nSpeech:\n" in text and "<|im_start|>user\nhi<|im_end|>" in text
    plain = build_prompt(tiny_tok, cfg, "hi")
    assert "convert the provided text to speech<|im_end|>" in tiny_tok.decode(plain[0].tolist())
    with pytest.raises(ValueError):
        build_prompt(tiny_tok, cfg, "hi", references=[(torch.zeros(9, 2, dtype=torch.long), "x")])
    with pytest.raises(ValueError):
        build_prompt(tiny_tok, cfg, "hi", references=[(torch.full((10, 2), 64), "x")])


def test_text_to_audio_pipeline(tiny_model, tiny_tok) -> None:
    """Reference audio → codes → prompt → frames → streamed audio, all on the tiny stack."""
    m, cfg = tiny_model, tiny_model.config
    codec = load_codec("tiny")
    ref_wave = np.sin(np.arange(3 * 2048) * 0.05).astype(np.float32) * 0.3
    ref_codes = codec.encode(ref_wave, 44100)
    prompt = build_prompt(tiny_tok, cfg, "Say this.", references=[(ref_codes, "a tone")])
    cache = m.new_cache(1, 256)
    m.prefill(cache, 0, prompt)
    frames = _run(m, cache, [0], [SamplingParams(seed=5)], 3)[0]
    stream = codec.stream_decoder()
    audio = np.concatenate([stream.push(frames[i:i + 1, 1:].T) for i in range(3)] + [stream.flush()])
    assert audio.shape == (3 * codec.frame_length,) and np.isfinite(audio).all()
    np.testing.assert_allclose(audio, codec.decode(frames[:, 1:].T), atol=5e-5, rtol=1e-4)
