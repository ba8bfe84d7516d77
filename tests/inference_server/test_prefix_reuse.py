"""Prefilled prompt heads reused (real-time mode): the voice head's K/V copied into a request's slot
leave it as a prefill of the whole prompt would, in process on the tiny model, and the live route
prefills the head when a session opens (the official fish-audio-sdk, a cloned voice)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from ttsfleet.inference.engine import Engine, EngineConfig, GenerationRequest
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prefix import restore_prefix, snapshot_prefix
from ttsfleet.inference.prompt import build_prompt, prompt_head
from ttsfleet.inference.sampling import SamplingParams
from ttsfleet.inference.tokenizer import load_tokenizer

from ttsfleet.metrics import spec

from .conftest import API_KEY, metric_value, speech_wav


@pytest.fixture(scope="module")
def parts():
    torch.set_num_threads(1)
    return load_model("tiny"), load_tokenizer("tiny")


def voice_prompt(parts, text: str = "Say this in the voice.", frames: int = 40, previous: bool = False):
    """(prompt, head) for ``text`` in a random reference voice (and a previous segment's codes)."""
    model, tok = parts
    c = model.config
    gen = torch.Generator().manual_seed(3)

    def codes(t: int) -> torch.Tensor:
        grid = torch.randint(0, c.codebook_size, (c.num_codebooks, t), generator=gen)
        grid[0] %= c.num_semantic
        return grid

    refs = [(codes(frames), "A reference transcript.")]
    head = prompt_head(tok, c, refs)
    prompt = build_prompt(tok, c, text, refs + ([(codes(12), "The last segment.")] if previous else []))
    return prompt, head


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_a_restored_head_leaves_the_slot_as_a_whole_prefill_does(parts, kv_dtype):
    """Slot 2 (head restored, tail prefilled) holds bit for bit what slot 0 (head, then tail, both
    prefilled) holds, and the logits of slot 3 (the whole prompt in one prefill) up to rounding."""
    model, _ = parts
    prompt, head = voice_prompt(parts, previous=True)
    p, n = head.shape[-1], prompt.shape[-1]
    assert torch.equal(prompt[:, :p], head) and n > p + 10  # build_prompt starts with the head
    cache = model.new_cache(4, 256, kv_dtype=kv_dtype)
    model.prefill(cache, 0, head)
    model.prefill(cache, 0, prompt[:, p:], start=p)
    model.prefill(cache, 1, head)
    prefix = snapshot_prefix(cache, 1, head)
    assert prefix.length == p and prefix.starts(prompt) and not prefix.starts(head)
    restore_prefix(cache, 2, prefix)
    model.prefill(cache, 2, prompt[:, p:], start=p)
    model.prefill(cache, 3, prompt)
    assert cache.length(2) == cache.length(0) == cache.length(3) == n
    for name in ("k", "v", "k_scale", "v_scale", "pending_logits", "pending_hidden"):
        t = getattr(cache, name)
        if t is not None:
            a, b = (t[:, 2, :n], t[:, 0, :n]) if t.dim() > 2 else (t[2], t[0])
            assert torch.equal(a, b), name
    torch.testing.assert_close(cache.pending_logits[2], cache.pending_logits[3], atol=1e-4, rtol=1e-4)
    other = model.new_cache(1, 256, kv_dtype="fp8" if kv_dtype == "auto" else "auto")
    with pytest.raises(ValueError, match="KV dtype"):
        restore_prefix(other, 0, prefix)


def _engine_codes(parts, cfg: EngineConfig, prompt: torch.Tensor, head: torch.Tensor | None,
                  keep: int = 0) -> tuple[Engine, np.ndarray, list]:
    """One seeded request through an engine; with ``head`` its K/V are prefilled first and reused."""
    model, _ = parts
    eng = Engine(model, None, cfg)
    eng.start()

    async def main():
        loop = asyncio.get_running_loop()
        prefix = None
        if head is not None:
            ev = await eng.prefill_prefix(head, loop).next()
            assert ev.kind == "done" and ev.reason == "prefix", ev
            prefix = ev.prefix
        req = GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=5), max_new_tokens=12,
                                ignore_eos=True, prefix=prefix, keep_prefix=keep)
        h = eng.submit(req, loop)
        codes, kept = [], []
        while (ev := await h.next()).kind != "done":
            assert ev.kind in ("audio", "prefix"), ev
            if ev.kind == "prefix":
                kept.append(ev.prefix)
            else:
                codes.append(ev.codes)
        return np.concatenate(codes, axis=1), kept

    try:
        codes, kept = asyncio.run(main())
    finally:
        eng.stop()
    return eng, codes, kept


def test_the_engine_decodes_the_same_frames_from_a_reused_head(parts):
    """A request whose head is restored decodes exactly what one prefilled in two chunks (head, then
    tail) does, prefilling only its tail; the head's job leaves no slot taken."""
    prompt, head = voice_prompt(parts)
    p, n = head.shape[-1], prompt.shape[-1]
    two_chunks = EngineConfig(max_running_requests=2, prefill_chunk_tokens=p, prefill_token_budget=p)
    base, want, _ = _engine_codes(parts, two_chunks, prompt, None)
    assert base.stats.prefill_tokens == n and base.stats.prefill_chunks == 2
    eng, got, _ = _engine_codes(parts, EngineConfig(max_running_requests=2), prompt, head)
    assert np.array_equal(got, want)
    assert eng.stats.prefix_tokens_reused == p and eng.stats.prefixes_kept == 1
    assert eng.stats.prefill_tokens == p + (n - p)  # the head once (its own job), then the tail only
    assert len(eng.free_slots) == 2 and eng.stats.running == 0 and eng.queue_depth == 0


def test_a_request_hands_its_head_back_and_a_wrong_head_is_ignored(parts):
    prompt, head = voice_prompt(parts)
    p = head.shape[-1]
    cfg = EngineConfig(max_running_requests=2)
    eng, first, kept = _engine_codes(parts, cfg, prompt, None, keep=p)
    assert len(kept) == 1 and kept[0].length == p and torch.equal(kept[0].tokens, head)
    assert eng.stats.prefixes_kept == 1 and eng.stats.prefix_tokens_reused == 0
    other, _ = voice_prompt(parts, text="Another text entirely, longer than the first one.")
    model, _ = parts
    eng = Engine(model, None, cfg)  # a head that does not start the prompt: prefilled whole instead
    eng.start()
    try:
        req = GenerationRequest(prompt=other[:, 3:], sampling=SamplingParams(seed=5), max_new_tokens=2,
                                prefix=kept[0])
        eng.submit(req, asyncio.new_event_loop())
        assert req.prefix is None
        with pytest.raises(ValueError, match="keep_prefix"):
            eng.submit(GenerationRequest(prompt=head, sampling=SamplingParams(), max_new_tokens=2,
                                         keep_prefix=p), asyncio.new_event_loop())
    finally:
        eng.stop()


def test_the_live_route_prefills_the_voice_head_when_the_session_opens(sdk_server, parts):
    """A live session in a cloned voice (inline reference, official SDK) of two segments: the head
    is prefilled once, at open, and both segments' prompts reuse it (reused tokens = 2 x the head's
    length; were the head only kept from the first segment's prefill, it would be 1 x); the audio is
    real audio."""
    import io
    import threading

    import soundfile as sf
    from ttsfleet.inference.codec import load_codec
    from ttsfleet.inference.references import encode_reference

    fishaudio = pytest.importorskip("fishaudio")
    voice = speech_wav()
    codes = encode_reference(load_codec("tiny"), threading.Lock(), voice)  # as the server encodes it
    transcript = "This is a reference voice."
    head = prompt_head(parts[1], parts[0].config, [(codes, transcript)])
    name = spec("inference_prefill_tokens_reused").exposed_names[0]
    with sdk_server.client() as c:
        before = metric_value(c, name)
    text = ["The first sentence of this live session is long enough to be cut. ",
            "And a second sentence follows it, just as long as the first one."]
    with fishaudio.FishAudio(api_key=API_KEY, base_url=sdk_server.url) as fish:
        data = b"".join(fish.tts.stream_websocket(
            iter(text), format="wav", references=[fishaudio.ReferenceAudio(audio=voice, text=transcript)],
            config=fishaudio.TTSConfig(temperature=0.0)))
    audio, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == 44100 and audio.size > 0 and np.isfinite(audio).all()
    with sdk_server.client() as c:
        assert metric_value(c, name) - before == 2 * head.shape[-1]
