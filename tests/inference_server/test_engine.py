"""The engine in-process on the tiny model and codec: continuous batching, padding, limits, slots."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.engine import Engine, EngineConfig, EngineOverloaded, GenerationRequest, PromptTooLong
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.sampling import SamplingParams
from ttsfleet.inference.tokenizer import load_tokenizer

from ttsfleet.metrics import make_collectors, spec


def _run(parts, cfg: EngineConfig, seeds: list[int], max_new: int | list[int] = 16):
    """One request per seed at once (``max_new``: every request's frame limit, or one per seed)."""
    model, codec, tok = parts
    limits = dict(zip(seeds, max_new if isinstance(max_new, list) else [max_new] * len(seeds), strict=True))
    prompt = build_prompt(tok, model.config, "Engine test sentence.")
    metrics = make_collectors("inference")
    eng = Engine(model, codec, cfg, metrics, "tiny")
    eng.start()

    async def main():
        loop = asyncio.get_running_loop()

        async def one(seed):
            req = GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=seed),
                                    max_new_tokens=limits[seed], first_chunk_frames=1, chunk_frames=4)
            h = eng.submit(req, loop)
            codes, audio = [], []
            while True:
                ev = await h.next()
                if ev.kind == "audio":
                    codes.append(ev.codes)
                    audio.append(ev.audio)
                elif ev.kind == "done":
                    c = np.concatenate(codes, axis=1) if codes else np.zeros((10, 0), np.int64)
                    return c, np.concatenate(audio) if audio else np.zeros(0, np.float32), ev.reason
                else:
                    raise AssertionError(ev.reason)

        return await asyncio.gather(*(one(s) for s in seeds))

    try:
        out = asyncio.run(main())
    finally:
        eng.stop()
    return eng, out, metrics


def test_continuous_batching_is_batch_invariant_and_padding_neutral(parts):
    seeds = [11, 12, 13, 14, 15]
    cfg = EngineConfig(max_running_requests=4, max_queue=8, cuda_graph_max_bs=4)
    eng, batched, metrics = _run(parts, cfg, seeds)
    # more requests than slots: they queued, joined the batch as slots freed, and all finished
    total = sum(c.shape[1] for c, _, _ in batched)
    assert eng.stats.frames == total
    assert eng.stats.steps < total  # several rows per decode step
    assert len(eng.free_slots) == 4 and not eng.running and not eng.waiting
    assert eng.window_buf.dtype == torch.int32 and tuple(eng.window_buf.shape[1:]) == (16, 10)
    # the waiting prompts were prefilled together: fewer batched calls than prompts
    assert eng.stats.prefill_chunks == len(seeds) and eng.stats.prefill_calls < len(seeds)
    # one batched codec call decoded several streams at once
    assert eng.stats.codec_frames == total and eng.stats.codec_calls < total
    # ... and /metrics says the same (the codec thread's counts, exported as they grew)
    got = {n: metrics.registry.get_sample_value(spec(n).exposed_names[0], {"model": "tiny"})
           for n in ("inference_codec_pushes", "inference_codec_frames", "inference_codec_busy_seconds",
                     "inference_codec_rounds")}
    assert got["inference_codec_frames"] == total
    assert got["inference_codec_pushes"] == eng.stats.codec_calls
    assert got["inference_codec_rounds"] == eng.stats.codec_rounds
    assert 0 < eng.stats.codec_rounds <= eng.stats.codec_calls
    assert got["inference_codec_busy_seconds"] == pytest.approx(eng.stats.codec_s) and eng.stats.codec_s > 0
    codec = parts[1]
    for codes, audio, reason in batched:
        assert reason in ("stop", "length")
        assert codes.shape[1] <= 16 and (reason == "stop" or codes.shape[1] == 16)
        assert audio.size == codes.shape[1] * codec.frame_length  # every frame became one frame of audio
        # the batched streaming codec gives each request the audio its own one-shot decode gives
        np.testing.assert_allclose(audio, codec.decode(torch.from_numpy(codes)), atol=1e-4, rtol=0)
    rows = metrics.registry.get_sample_value(spec("inference_batch_size").name + "_sum", {"model": "tiny"})
    # EOS rows also took a step, and with the pipeline on each request may decode one spare row
    assert 0 < eng.stats.spare_rows <= len(seeds) * cfg.pipeline_depth
    assert rows == total + sum(1 for _, _, r in batched if r == "stop") + eng.stats.spare_rows

    single = EngineConfig(max_running_requests=1, max_queue=8, cuda_graph_max_bs=1)
    _, alone, _ = _run(parts, single, seeds[:2])
    _, padded, _ = _run(parts, EngineConfig(max_running_requests=3, max_queue=8, cuda_graph_max_bs=3,
                                            pad_to_buckets=True), seeds)
    for (a, _, _), (b, _, _) in zip(batched[:2], alone, strict=True):
        assert np.array_equal(a, b)
    for (a, _, _), (b, _, _) in zip(batched, padded, strict=True):
        assert np.array_equal(a, b)


def test_iterations_that_leave_requests_waiting_are_counted_by_what_held_them(parts):
    """Five requests on two slots wait for slots; with an 8-token prefill budget per iteration they
    also wait for the budget (the prompt prefills 8 tokens an iteration): both reasons counted, in
    the engine's stats and the contract's counter."""
    cfg = EngineConfig(max_running_requests=2, max_queue=8, cuda_graph_max_bs=2, prefill_token_budget=8,
                       prefill_chunk_tokens=8)
    eng, out, metrics = _run(parts, cfg, [1, 2, 3, 4, 5], max_new=6)
    assert len(out) == 5
    waits = eng.stats.admission_waits
    assert waits["slots"] > 0 and waits["budget"] > 0 and waits["hold"] == 0  # coalescing is off
    name = spec("inference_admission_waits").exposed_names[0]
    for reason in ("slots", "budget"):
        assert metrics.registry.get_sample_value(name, {"model": "tiny", "reason": reason}) == waits[reason]


def test_limits(parts):
    model, codec, tok = parts
    eng = Engine(model, codec, EngineConfig(max_running_requests=2, max_queue=1, cuda_graph_max_bs=2))
    assert eng.check_prompt(100, 10_000) == model.config.max_seq_len - 100
    with pytest.raises(PromptTooLong):
        eng.check_prompt(model.config.max_seq_len, 1)
    assert eng.padded_size(3) == 3  # padding off on CPU
    eng.cfg.pad_to_buckets = True
    assert [eng.padded_size(b) for b in (1, 2)] == [1, 2]
    from ttsfleet.inference.engine import batch_buckets

    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    # submissions microseconds apart: no request can finish in between, so the bound is exact
    prompt = build_prompt(tok, model.config, "x")

    async def fill():
        loop = asyncio.get_running_loop()
        req = lambda: GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=1), max_new_tokens=50)  # noqa: E731
        eng.start()
        for _ in range(3):  # 2 slots + 1 queued
            eng.submit(req(), loop)
        with pytest.raises(EngineOverloaded):
            eng.submit(req(), loop)

    try:
        asyncio.run(fill())
    finally:
        eng.stop()


def test_graphs_cover_every_batch_the_pool_admits(parts):
    """No cliff past 64: a pool of 128 slots captures buckets up to 128 (c=128 ran eager above 64 on
    the H200, 674 frames/s against 1,486 at c=64, 2026-12-01), and every batch pads to one."""
    from ttsfleet.inference.engine import batch_buckets

    from ttsfleet.catalog import cuda_graph_max_bs

    model, codec, _ = parts
    bs = cuda_graph_max_bs(128)
    cfg = EngineConfig(max_running_requests=128, cuda_graph_max_bs=bs, pad_to_buckets=True, max_seq_len=64)
    eng = Engine(model, codec, cfg)
    assert eng.buckets == batch_buckets(128) and eng.buckets[-1] == 128
    assert [eng.padded_size(b) for b in (65, 100, 121, 128)] == [72, 104, 128, 128]
    assert all(eng.padded_size(b) in eng.buckets for b in range(1, 129))


def test_the_pad_slot_is_emptied_every_few_padded_steps(parts):
    """Padded rows add a position to the pad slot each step; it is emptied every PAD_RESET_STEPS
    steps (not after each: three launches per step), and never lets it near the context's end."""
    from ttsfleet.inference.engine import PAD_RESET_STEPS

    model, codec, _ = parts
    for seq_len, every in ((256, PAD_RESET_STEPS), (40, 20)):
        cfg = EngineConfig(max_running_requests=4, cuda_graph_max_bs=4, pad_to_buckets=True,
                           max_seq_len=seq_len)
        eng = Engine(model, codec, cfg)
        for step in range(1, 2 * every + 5):
            eng.cache.lengths[eng.pad_slot] += 1  # what a padded decode step does to it
            eng._reset_pad_slot()
            assert eng.cache.length(eng.pad_slot) == step % every


def test_every_padded_step_points_its_pad_rows_at_the_pad_slot(parts, monkeypatch):
    """Rows past the batch in a padded step write the pad slot and nothing else: a row left pointing
    at a request's slot (running, freed, or given to a new prompt) decodes into it. The batch here
    is padded at 3 of 4, fills to 4 (a join writes row 3), and shrinks back to 3 (a retire): the
    padded size is the same as before, and row 3 must point at the pad slot again, not at a request's
    slot (on an H100 a c=128 run of short prompts died of an index out of bounds: 2026-12-06,
    ``next_calls.sh 4``)."""
    from types import SimpleNamespace

    model, codec, _ = parts
    seen = []
    real_step = model.decode_step

    def decode_step(cache, slots, sampling, window=None):  # noqa: ANN001, ANN202
        seen.append((len(eng.running), slots.tolist()))
        return real_step(cache, slots, sampling, window)

    monkeypatch.setattr(model, "decode_step", decode_step)
    eng = Engine(model, codec, EngineConfig(max_running_requests=4, cuda_graph_max_bs=4, pad_to_buckets=True))

    def request(rid: int) -> SimpleNamespace:
        slot = eng.free_slots.popleft()
        return SimpleNamespace(slot=slot, req=SimpleNamespace(sampling=SamplingParams(seed=rid)),
                               handle=SimpleNamespace(rid=rid), retired=False)

    for rid in range(3):
        eng._join(request(rid))
    eng._launch_step()  # 3 rows padded to 4
    eng._join(request(3))  # row 3 now the fourth request's
    eng._launch_step()
    eng._retire(1, "cancelled")  # the last row moves into row 1; row 3 is past the batch again
    eng._launch_step()  # 3 rows padded to 4, as in the first step
    assert [len(slots) for _, slots in seen] == [4, 4, 4]
    for bs, slots in seen:
        assert len(set(slots[:bs])) == bs, slots  # one row per running request
        assert slots[bs:] == [eng.pad_slot] * (len(slots) - bs), (bs, slots)


@pytest.mark.gpu
def test_cuda_graph_replay_matches_eager_decoding():
    """On a GPU: captured decode graphs give the same frames as eager decoding, request by request."""
    model = load_model("tiny", device="cuda", dtype=torch.bfloat16)
    parts = (model, load_codec("tiny", device="cuda"), load_tokenizer("tiny"))
    seeds = [21, 22, 23, 24, 25, 26]
    results = {}
    for graphs in (False, True):
        cfg = EngineConfig(max_running_requests=4, max_queue=8, cuda_graph_max_bs=4, device="cuda",
                           pad_to_buckets=True, cuda_graphs=graphs)
        eng, out, _ = _run(parts, cfg, seeds)
        assert (eng.graphs is not None) == graphs
        if graphs:
            assert sorted(eng.graphs.graphs) == [1, 2, 4]
        results[graphs] = out
    for (a, _, ra), (b, _, rb) in zip(results[False], results[True], strict=True):
        assert ra == rb and np.array_equal(a, b)


def test_the_engine_serves_from_an_fp8_kv_cache_when_asked(parts):
    """EngineConfig.kv_dtype="fp8" (off by default) gives the engine an FP8 cache; requests finish."""
    cfg = EngineConfig(max_running_requests=2, max_queue=4, cuda_graph_max_bs=2, kv_dtype="fp8")
    eng, out, _ = _run(parts, cfg, [21, 22], max_new=6)
    assert eng.cache.fp8 and eng.cache.k.dtype == torch.float8_e4m3fn
    assert all(reason in ("stop", "length") and codes.shape[1] >= 1 for codes, _, reason in out)
    assert EngineConfig().kv_dtype == "auto"  # the default stays the model's dtype


def test_decode_and_codec_graph_captures_take_turns(parts, monkeypatch):
    """The engine thread's decode capture and the codec thread's set-up + capture never overlap:
    on the H200 (2026-12-02) overlapping captures invalidated the decode graphs and the server
    decoded eagerly at a third of its speed. Each phase is timed inside the real methods."""
    import threading
    import time

    from ttsfleet.inference import engine as engine_mod
    from ttsfleet.inference.graph_capture import CAPTURE_LOCK

    model, codec, _ = parts
    spans: dict[str, tuple[float, float, bool]] = {}
    both = threading.Event()

    def timed(name, fn):
        def run(*args, **kwargs):
            t0, held = time.perf_counter(), CAPTURE_LOCK.locked()
            time.sleep(0.2)  # long enough that unserialised phases would overlap
            try:
                return fn(*args, **kwargs)
            finally:
                spans[name] = (t0, time.perf_counter(), held)
                if len(spans) == 2:
                    both.set()
        return run

    decode_capture = engine_mod._DecodeGraphs.capture.__func__
    monkeypatch.setattr(engine_mod._DecodeGraphs, "capture",
                        classmethod(timed("decode", decode_capture)))
    monkeypatch.setattr(Engine, "_codec_decoder", timed("codec", Engine._codec_decoder))
    eng = Engine(model, codec, EngineConfig(max_running_requests=2, cuda_graphs=True))
    eng.start()
    try:
        assert both.wait(30), f"only {sorted(spans)} ran"
    finally:
        eng.stop()
    (a0, a1, a_held), (b0, b1, b_held) = spans["decode"], spans["codec"]
    assert a_held and b_held, spans
    assert a1 <= b0 or b1 <= a0, f"captures overlapped: {spans}"


def test_the_engine_serves_audio_from_a_compiled_codec(parts, monkeypatch):
    """``EngineConfig.codec_compile``: the codec thread compiles its batched decoder when it starts
    (here with Dynamo's ``eager`` backend: tracing, not Inductor's minutes of CPU code generation),
    before any request, and the requests' audio is their codes' one-shot decode. A mode that is not
    one of the codec's is refused when the engine is built, not in its codec thread."""
    from torch._dynamo.testing import CompileCounterWithBackend

    model, codec, _ = parts
    counter = CompileCounterWithBackend("eager")
    made = []
    slot_decoder = codec.slot_decoder

    def with_test_backend(*args, **kwargs):
        made.append(slot_decoder(*args, compile_backend=counter, **kwargs))
        return made[-1]

    monkeypatch.setattr(codec, "slot_decoder", with_test_backend)
    torch._dynamo.reset()
    try:
        cfg = EngineConfig(max_running_requests=2, max_queue=8, codec_max_frames=1, codec_compile="default")
        eng, out, _ = _run(parts, cfg, [21, 22, 23], max_new=8)
    finally:
        torch._dynamo.reset()
    (dec,) = made
    assert dec.compile_mode == "default" and dec.compiled is not None, dec.compile_error
    # one frame, compiled once at start (one stream runs padded to two rows); the requests' pushes,
    # one stream or several, compiled nothing
    assert counter.frame_count == 1 and eng.stats.codec_calls > 0
    for codes, audio, reason in out:
        assert reason in ("stop", "length") and audio.size == codes.shape[1] * codec.frame_length
        np.testing.assert_allclose(audio, codec.decode(torch.from_numpy(codes)), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="codec_compile"):
        Engine(model, codec, EngineConfig(max_running_requests=1, codec_compile="max-autotune"))
