"""Prefill coalescing: the pure hold rule, and the engine holding a lone arrival while a batch decodes
(mixed steps off: coalescing gathers prefill calls, which riders in the decode step replace)."""

from __future__ import annotations

import asyncio
import time

import pytest
from ttsfleet.inference.engine import Engine, EngineConfig, GenerationRequest
from ttsfleet.inference.prefill_coalesce import Arrivals, CoalesceRule, hold_arrivals
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.sampling import SamplingParams
from ttsfleet.inference.serve_config import ServeConfig

from ttsfleet.errors import UserError

RULE = CoalesceRule(window_s=0.05, enough_prompts=4, token_budget=2048)
LONE = Arrivals(waiting_prompts=1, waiting_tokens=350, oldest_wait_s=0.01, admissible=64, decoding=True,
                continuing=False)


def test_a_lone_arrival_is_held_while_a_batch_decodes() -> None:
    assert hold_arrivals(RULE, LONE)


@pytest.mark.parametrize(("change", "why"), [
    ({"oldest_wait_s": 0.05}, "the window has passed"),
    ({"decoding": False}, "nothing decodes: the GPU would idle"),
    ({"continuing": True}, "a prefill call runs this iteration anyway"),
    ({"waiting_prompts": 4}, "enough prompts for one call"),
    ({"waiting_prompts": 2, "admissible": 2}, "every prompt that fits is waiting"),
    ({"admissible": 0}, "no slot: nothing to plan"),
    ({"waiting_tokens": 2048}, "the token budget is full"),
    ({"waiting_prompts": 0}, "nobody waits"),
])
def test_no_hold(change: dict, why: str) -> None:
    seen = Arrivals(**{**LONE.__dict__, **change})
    assert not hold_arrivals(RULE, seen), why


def test_off_never_holds_and_bad_rules_are_refused() -> None:
    assert not hold_arrivals(CoalesceRule(), LONE)
    for bad in ({"window_s": -1.0}, {"enough_prompts": 0}, {"token_budget": 0}):
        with pytest.raises(ValueError):
            CoalesceRule(**bad)


@pytest.mark.parametrize("var,field", [("TTSFLEET_PREFILL_COALESCE_MS", "prefill_coalesce_ms"),
                                       ("TTSFLEET_PREFIX_JOB_WAIT_MS", "prefix_job_wait_ms")])
def test_serve_config_takes_milliseconds_and_refuses_nonsense(var: str, field: str) -> None:
    cfg = ServeConfig.from_env({var: "20"}, checkpoint="tiny")
    assert getattr(cfg, field) == 20.0
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(UserError, match=field):
            ServeConfig.from_env({var: bad}, checkpoint="tiny")


def _request(parts, max_new: int) -> GenerationRequest:
    model, _, tok = parts
    prompt = build_prompt(tok, model.config, "Coalescing test sentence.")
    return GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=1, temperature=0.0),
                             max_new_tokens=max_new, first_chunk_frames=1, chunk_frames=4, ignore_eos=True)


async def _wait_for(cond, timeout_s: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "engine did not get there"
        await asyncio.sleep(0.005)


async def _drain(handle) -> str:  # noqa: ANN001
    while (ev := await handle.next()).kind == "audio":
        pass
    return ev.kind


def test_the_engine_holds_a_lone_arrival_then_prefills_arrivals_in_one_call(parts,
                                                                           separate_prefill_calls) -> None:
    """A long request decodes; one arrival waits (held: the window is long), a second makes the
    call worth it (enough_prompts=2) and both are prefilled by one call."""
    model, codec, _ = parts
    cfg = EngineConfig(max_running_requests=4, max_queue=8, cuda_graph_max_bs=4, prefill_coalesce_s=30.0,
                       prefill_coalesce_prompts=2)
    eng = Engine(model, codec, cfg)
    eng.start()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        long = eng.submit(_request(parts, 400), loop)
        await _wait_for(lambda: eng.stats.steps > 0)  # decoding: nothing else waits, no hold yet
        assert eng.stats.prefill_calls == 1
        first = eng.submit(_request(parts, 4), loop)
        await _wait_for(lambda: eng.stats.prefill_holds >= 3)
        assert eng.stats.prefill_calls == 1, "the lone arrival was prefilled alone"
        second = eng.submit(_request(parts, 4), loop)
        assert await _drain(first) == "done" and await _drain(second) == "done"
        assert eng.stats.prefill_calls == 2 and eng.stats.prefill_chunks == 3
        eng.cancel(long)

    try:
        asyncio.run(main())
    finally:
        eng.stop()


def test_a_held_arrival_is_prefilled_once_its_window_passes(parts, separate_prefill_calls) -> None:
    model, codec, _ = parts
    window = 0.3
    cfg = EngineConfig(max_running_requests=4, max_queue=8, cuda_graph_max_bs=4, prefill_coalesce_s=window)
    eng = Engine(model, codec, cfg)
    eng.start()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        long = eng.submit(_request(parts, 400), loop)
        await _wait_for(lambda: eng.stats.steps > 0)
        lone = eng.submit(_request(parts, 4), loop)
        first_audio = (await lone.next()).kind
        waited = time.perf_counter() - lone.submitted_at
        assert first_audio == "audio" and eng.stats.prefill_holds > 0
        assert waited >= window, f"first audio {waited:.3f} s after submit: it was not held for {window} s"
        assert await _drain(lone) == "done"
        eng.cancel(long)

    try:
        asyncio.run(main())
    finally:
        eng.stop()
