"""Chunked prefill in the engine: a long prompt is prefilled over several loop iterations while the running
batch keeps decoding, gives the same frames as an unchunked prefill, and can be cancelled mid-prefill."""

from __future__ import annotations

import asyncio
import math
import threading

import numpy as np
import pytest
import torch
from ttsfleet.inference.engine import Engine, EngineConfig, GenerationRequest
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.sampling import SamplingParams


class Recorder:
    """Wraps the model and logs, in the engine thread, every prefill / decode call with the engine's state."""

    def __init__(self, model):
        self._model = model
        self.engine: Engine | None = None
        self.log: list[tuple] = []
        self.batches: list[list[int]] = []  # slots of each batched prefill call
        self.on_prefill = None  # optional hook (slot, start) run after each prefill call

    def __getattr__(self, name):
        return getattr(self._model, name)

    def prefill_batch(self, cache, pieces, graphs=None):
        self._model.prefill_batch(cache, pieces, graphs=graphs)
        self.batches.append([p.slot for p in pieces])
        for p in pieces:
            self.log.append(("prefill", p.slot, p.start, int(p.tokens.shape[1])))
            if self.on_prefill is not None:
                self.on_prefill(p.slot, p.start)

    def decode_step(self, cache, slots, sampling, window=None):
        generated = {st.slot: st.generated for st in self.engine.running}  # before this step
        prefilling = [st.slot for st in self.engine.prefilling]
        self.log.append(("decode", slots.tolist(), generated, prefilling))
        return self._model.decode_step(cache, slots, sampling, window)


def _prompts(tok, cfg):
    gen = torch.Generator().manual_seed(0)
    ref = torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, 120), generator=gen)
    long = build_prompt(tok, cfg, "A voice-cloning request with a long reference.",
                        references=[(ref, "the words spoken in the long reference clip")])
    short = build_prompt(tok, cfg, "Short.")
    return short, long


async def _collect(h):
    codes = []
    while True:
        ev = await h.next()
        if ev.kind == "audio":
            codes.append(ev.codes)
        elif ev.kind == "done":
            return (np.concatenate(codes, axis=1) if codes else np.zeros((10, 0), np.int64)), ev.reason
        else:
            raise AssertionError(ev.reason)


def _run_pair(parts, cfg: EngineConfig):
    """A short request starts decoding; then a long one arrives. Returns engine, recorder, outputs."""
    model, codec, tok = parts
    short, long = _prompts(tok, model.config)
    rec = Recorder(model)
    eng = rec.engine = Engine(rec, codec, cfg)
    eng.start()

    async def main():
        loop = asyncio.get_running_loop()
        req = GenerationRequest(prompt=short, sampling=SamplingParams(seed=5), max_new_tokens=64,
                                first_chunk_frames=1, chunk_frames=4)
        h_short = eng.submit(req, loop)
        first = await h_short.next()  # its first frame was decoded: it is in the running batch
        assert first.kind == "audio" and first.frames >= 1
        h_long = eng.submit(GenerationRequest(prompt=long, sampling=SamplingParams(seed=9), max_new_tokens=12,
                                              first_chunk_frames=1, chunk_frames=4), loop)
        (s_codes, s_reason), (l_codes, l_reason) = await asyncio.gather(_collect(h_short), _collect(h_long))
        return np.concatenate([first.codes, s_codes], axis=1), l_codes, s_reason, l_reason

    try:
        out = asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        eng.stop()
    return eng, rec, int(long.shape[1]), out


@pytest.mark.parametrize("chunk, budget", [(16, 1024), (64, 10)])
def test_long_prompt_is_prefilled_in_chunks_between_decode_steps(parts, separate_prefill_calls, chunk,
                                                                   budget):
    """Chunks as prefill calls between decode steps (mixed steps off; with them on, the chunks ride in
    the steps: ``test_mixed_steps_engine.py``'s chunks-of-8 cases)."""
    cfg = EngineConfig(max_running_requests=2, max_queue=4, cuda_graph_max_bs=2,
                       prefill_chunk_tokens=chunk, prefill_token_budget=budget)
    eng, rec, long_len, (s_codes, l_codes, s_reason, l_reason) = _run_pair(parts, cfg)
    step = min(chunk, budget)
    n_chunks = math.ceil(long_len / step)
    assert n_chunks >= 5
    short_slot, long_slot = 0, 1  # slots are handed out in order
    log = rec.log
    long_idx = [i for i, e in enumerate(log) if e[0] == "prefill" and e[1] == long_slot]
    # the long prompt went in as consecutive chunks of at most `step` tokens, continuing the slot
    assert len(long_idx) == n_chunks
    starts = [log[i][2] for i in long_idx]
    sizes = [log[i][3] for i in long_idx]
    assert starts == list(range(0, long_len, step)) and sum(sizes) == long_len and max(sizes) == step
    # ... one chunk per engine iteration: exactly one decode step of the running request between two
    # chunks, and the running request got a frame out of each of them
    gens = []
    for a, b in zip(long_idx, long_idx[1:], strict=False):
        between = [e for e in log[a + 1:b] if e[0] == "decode"]
        assert len(between) == 1, between
        _, slots, generated, prefilling = between[0]
        assert slots == [short_slot] and prefilling == [long_slot]
        gens.append(generated[short_slot])
    assert gens == sorted(gens) and len(set(gens)) == len(gens) and gens[0] >= 1
    # the long request joins the decode batch only after its last chunk
    first_long_decode = next(i for i, e in enumerate(log) if e[0] == "decode" and long_slot in e[1])
    assert first_long_decode > long_idx[-1]
    assert eng.stats.prefill_chunks == sum(1 for e in log if e[0] == "prefill")
    assert eng.stats.prefill_tokens == sum(e[3] for e in log if e[0] == "prefill")
    assert not eng.prefilling and not eng.running and len(eng.free_slots) == 2 and eng.queue_depth == 0

    # same seeds without chunking: the long prompt is one prefill call, and every frame is the same
    whole = EngineConfig(max_running_requests=2, max_queue=4, cuda_graph_max_bs=2, prefill_chunk_tokens=0)
    _, rec0, _, (s0, l0, s0_reason, l0_reason) = _run_pair(parts, whole)
    assert [e for e in rec0.log if e[0] == "prefill" and e[1] == long_slot] == [("prefill", 1, 0, long_len)]
    assert l_codes.shape[1] >= 1 and s_codes.shape[1] >= 1
    assert (l_reason, s_reason) == (l0_reason, s0_reason)
    assert np.array_equal(l_codes, l0) and np.array_equal(s_codes, s0)


@pytest.mark.parametrize("prefill_stream", [False, True])
def test_cancel_mid_prefill_frees_the_slot(parts, prefill_stream: bool):
    """Inline, and with the prefill's side-stream landing (the cancelled request is dropped as its
    chunk lands, before another chunk is planned)."""
    model, codec, tok = parts
    short, long = _prompts(tok, model.config)
    rec = Recorder(model)
    cfg = EngineConfig(max_running_requests=1, max_queue=4, cuda_graph_max_bs=1, prefill_chunk_tokens=16,
                       prefill_stream=prefill_stream)
    eng = rec.engine = Engine(rec, codec, cfg)
    submitted = threading.Event()
    handles = {}

    def cancel_after_second_chunk(slot, start):
        if start == 16:  # in the engine thread, between two chunks of the long prompt
            assert submitted.wait(10)
            eng.cancel(handles["long"])

    rec.on_prefill = cancel_after_second_chunk
    eng.start()

    async def main():
        loop = asyncio.get_running_loop()
        handles["long"] = eng.submit(GenerationRequest(prompt=long, sampling=SamplingParams(seed=9),
                                                       max_new_tokens=8), loop)
        submitted.set()
        ev = await handles["long"].next()
        assert (ev.kind, ev.reason, ev.frames) == ("done", "cancelled", 0)
        # the only slot is free again: the next request gets it and finishes
        req = GenerationRequest(prompt=short, sampling=SamplingParams(seed=5), max_new_tokens=6)
        h = eng.submit(req, loop)
        return await _collect(h)

    try:
        codes, reason = asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        eng.stop()
    assert reason in ("stop", "length") and codes.shape[1] >= 1
    starts = [e[2] for e in rec.log if e[0] == "prefill"]
    second = starts.index(0, 1)  # where the next request's prefill began
    assert starts[:second] == [0, 16] and long.shape[1] > 48  # stopped after the chunk that saw the cancel
    assert not any(e[0] == "decode" for e in rec.log[:second])  # the cancelled request never decoded
    assert not eng.prefilling and not eng.running and not eng.waiting
    assert list(eng.free_slots) == [0] and eng.queue_depth == 0 and eng.cache.length(0) == 0
