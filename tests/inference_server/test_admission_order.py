"""Clocked-first admission: the pure order rule, the engine planning requests ahead of background
prefix-only jobs (and an urgent job ahead of the other jobs), and the live session marking its voice
head's job urgent once its first text waits for it."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest
import torch
from ttsfleet.inference.admission_order import Entry, admission_order, passed_over
from ttsfleet.inference.engine import Engine, EngineConfig, Event, GenerationRequest, RequestHandle
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt, prompt_head
from ttsfleet.inference.routes_live import LiveSession
from ttsfleet.inference.sampling import SamplingParams
from ttsfleet.inference.synthesis import Generation
from ttsfleet.inference.tokenizer import load_tokenizer

BOUND = 1.0
REQUEST = Entry(clocked=True, waited_s=0.0)
JOB = Entry(clocked=False, waited_s=0.0)  # a background prefix-only job
CLOCKED_CONT = Entry(clocked=True, waited_s=0.0, continuing=True)
JOB_CONT = Entry(clocked=False, waited_s=0.0, continuing=True)


# ----------------------------------------------------------------------------- the pure rule
def test_only_clocked_entries_keep_fifo_with_continuations_first() -> None:
    entries = [CLOCKED_CONT, CLOCKED_CONT, REQUEST, REQUEST]
    assert admission_order(entries, BOUND) == [0, 1, 2, 3]


def test_clocked_entries_go_first_then_background_ones_each_fifo() -> None:
    entries = [JOB_CONT, CLOCKED_CONT, JOB, REQUEST, JOB, REQUEST]
    assert admission_order(entries, BOUND) == [1, 3, 5, 0, 2, 4]


def test_a_background_job_that_waited_the_bound_counts_as_clocked_in_its_fifo_place() -> None:
    starved = Entry(clocked=False, waited_s=BOUND)
    assert admission_order([starved, REQUEST], BOUND) == [0, 1]
    assert admission_order([Entry(clocked=False, waited_s=BOUND - 0.01), REQUEST], BOUND) == [1, 0]
    starved_cont = Entry(clocked=False, waited_s=BOUND, continuing=True)
    assert admission_order([starved_cont, REQUEST], BOUND) == [0, 1]


def test_a_zero_bound_is_plain_fifo_and_a_negative_one_is_refused() -> None:
    entries = [JOB_CONT, CLOCKED_CONT, JOB, REQUEST]
    assert admission_order(entries, 0.0) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        admission_order(entries, -1.0)


@pytest.mark.parametrize(("entries", "planned", "want", "why"), [
    ([JOB, REQUEST], {1}, True, "a later request took the budget the job would have had"),
    ([REQUEST, JOB], {0}, False, "the job was behind it in FIFO order anyway"),
    ([JOB, REQUEST, REQUEST], {1}, False, "a clocked request waits too: the budget held it"),
    ([JOB, REQUEST], {0, 1}, False, "nobody waits"),
    ([JOB_CONT, JOB], {0}, False, "only background work was planned"),
    ([Entry(clocked=False, waited_s=BOUND), REQUEST], {1}, False, "a starved job counts as clocked"),
])
def test_what_counts_as_passed_over(entries: list[Entry], planned: set[int], want: bool, why: str) -> None:
    assert passed_over(entries, planned, BOUND) is want, why


# ----------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def parts():
    torch.set_num_threads(1)
    return load_model("tiny"), load_tokenizer("tiny")


class PausingModel:
    """The model, its prefill calls numbered; at the numbers in ``pauses`` the engine thread waits
    for the test (``reached[n]`` set, then ``resume[n]`` awaited), so the test decides what is
    queued, and what is marked, at a known iteration."""

    def __init__(self, model, pauses: tuple[int, ...]):
        self._model = model
        self.calls = 0
        self.reached = {n: threading.Event() for n in pauses}
        self.resume = {n: threading.Event() for n in pauses}

    def __getattr__(self, name):
        return getattr(self._model, name)

    def prefill_batch(self, cache, pieces, graphs=None):
        self.calls += 1
        if self.calls in self.reached:
            self.reached[self.calls].set()
            assert self.resume[self.calls].wait(30), "the test never released the engine"
        self._model.prefill_batch(cache, pieces, graphs=graphs)


def _head(parts) -> torch.Tensor:
    """A cloned voice's prompt head (233 tokens: 8 chunks of 32)."""
    model, tok = parts
    c = model.config
    gen = torch.Generator().manual_seed(3)
    grid = torch.randint(0, c.codebook_size, (c.num_codebooks, 120), generator=gen)
    grid[0] %= c.num_semantic
    return prompt_head(tok, c, [(grid, "A reference transcript.")])


def _engine(parts, pauses: tuple[int, ...], max_wait_s: float) -> tuple[Engine, PausingModel]:
    """Codes only, four slots, 32 prompt tokens per iteration: a head takes 8 iterations."""
    model = PausingModel(parts[0], pauses)
    cfg = EngineConfig(max_running_requests=4, max_queue=8, cuda_graph_max_bs=4, prefill_token_budget=32,
                       prefill_chunk_tokens=32, prefix_job_max_wait_s=max_wait_s)
    eng = Engine(model, None, cfg)
    eng.start()
    return eng, model


async def _until(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 30), "the engine did not get there"


async def _finish(handle: RequestHandle) -> str:
    """The request's end ("done" reason), within 30 s: a dead engine thread fails the test, not hangs it."""
    while (ev := await asyncio.wait_for(handle.next(), 30)).kind in ("audio", "prefix"):
        pass
    assert ev.kind == "done", ev.reason
    return ev.reason


@pytest.mark.parametrize("max_wait_s", [60.0, 0.0], ids=["clocked-first", "fifo"])
def test_a_request_is_admitted_before_background_prefix_jobs_finish(parts, max_wait_s: float) -> None:
    """Three voice-head jobs, then a request: clocked first, the request takes the next iteration's
    budget and is admitted while the first job is still mid-prefill; with a 0 s bound (plain FIFO)
    it waits until the jobs are through."""
    eng, model = _engine(parts, pauses=(1,), max_wait_s=max_wait_s)
    head = _head(parts)

    async def main() -> tuple[list[RequestHandle], RequestHandle]:
        loop = asyncio.get_running_loop()
        jobs = [eng.prefill_prefix(head, loop) for _ in range(3)]
        prompt = build_prompt(parts[1], parts[0].config, "A listener waits for this.")
        req = eng.submit(GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=1), max_new_tokens=3,
                                           ignore_eos=True), loop)
        await _until(model.reached[1])
        model.resume[1].set()
        assert [await _finish(j) for j in jobs] == ["prefix"] * 3 and await _finish(req) == "length"
        return jobs, req

    try:
        jobs, req = asyncio.run(main())
    finally:
        eng.stop()
    first_job_done = min(j.prefilled_at for j in jobs)
    deferred = eng.stats.admission_waits["deferred"]
    if max_wait_s:
        assert req.admitted_at < first_job_done and deferred > 0
    else:
        assert req.admitted_at > first_job_done and deferred == 0
    assert len(eng.free_slots) == 4 and eng.queue_depth == 0


@pytest.mark.parametrize("urgent", [None, 2])
def test_an_urgent_prefix_job_goes_ahead_of_the_other_background_jobs(parts, urgent: int | None) -> None:
    """Three head jobs queue (the first mid-prefill); one is marked urgent while the engine is two
    iterations in: it is prefilled before the others, the first one's next chunk included. Unmarked,
    the jobs finish in FIFO order."""
    eng, model = _engine(parts, pauses=(1, 3), max_wait_s=60.0)
    head = _head(parts)

    async def main() -> list[RequestHandle]:
        loop = asyncio.get_running_loop()
        jobs = [eng.prefill_prefix(head, loop) for _ in range(3)]
        await _until(model.reached[1])
        model.resume[1].set()
        await _until(model.reached[3])  # the first job mid-prefill, the others waiting
        assert [st.handle for st in eng.waiting] == jobs[1:]
        if urgent is not None:
            eng.make_urgent(jobs[urgent])
        model.resume[3].set()
        for j in jobs:
            await _finish(j)
        return jobs

    try:
        jobs = asyncio.run(main())
    finally:
        eng.stop()
    finished = sorted(range(3), key=lambda i: jobs[i].prefilled_at)
    assert finished == ([0, 1, 2] if urgent is None else [2, 0, 1])


# ----------------------------------------------------------------------------- the live session
class _Jobs:
    """An engine as the live session's Generation sees it: prefix jobs and urgency marks, recorded."""

    def __init__(self) -> None:
        self.jobs: list[RequestHandle] = []
        self.urgent: list[RequestHandle] = []

    def prefill_prefix(self, tokens, loop):
        self.jobs.append(RequestHandle(len(self.jobs), loop))
        return self.jobs[-1]

    def make_urgent(self, handle: RequestHandle) -> None:
        self.urgent.append(handle)


def _generation(monkeypatch) -> tuple[Generation, _Jobs]:
    engine = _Jobs()
    state = types.SimpleNamespace(engine=engine, codec=types.SimpleNamespace(sample_rate=44100))
    monkeypatch.setattr(Generation, "_head", lambda self: torch.zeros((11, 64), dtype=torch.long))
    return Generation(state, None, [], 0.0), engine


def test_the_voice_head_job_is_marked_urgent_once_a_text_needs_it(monkeypatch) -> None:
    """Needed after the job was submitted, or before (the text came first): marked either way, once
    the job exists; needed after the head is in: not marked."""

    async def main() -> None:
        for text_first in (False, True):
            gen, engine = _generation(monkeypatch)
            opening = asyncio.ensure_future(gen.open_prefix())
            if text_first:
                gen.need_prefix()
            await asyncio.sleep(0)  # open_prefix submits its job
            assert engine.urgent == (engine.jobs if text_first else [])
            gen.need_prefix()
            assert engine.urgent[-1:] == engine.jobs
            engine.jobs[0].events.put_nowait(Event("done", reason="prefix", prefix="the head's K/V"))
            await opening
            marks = len(engine.urgent)
            gen.need_prefix()
            assert gen.prefix == "the head's K/V" and len(engine.urgent) == marks
            assert set(engine.urgent) == set(engine.jobs) and len(engine.jobs) == 1

    asyncio.run(main())


def test_the_live_session_marks_its_head_urgent_when_its_first_segment_waits_for_it() -> None:
    """The first segment finds the head's prefill not done: the job is marked, then awaited; a head
    already in is not marked."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for done in (False, True):
            marks: list[str] = []
            session = object.__new__(LiveSession)  # only what _prefix_ready reads
            session.gen = types.SimpleNamespace(need_prefix=lambda marks=marks: marks.append("urgent"))
            session.prefix = loop.create_future()
            session._prefix_awaited = False
            if done:
                session.prefix.set_result(None)
            else:
                loop.call_soon(session.prefix.set_result, None)
            await session._prefix_ready()
            assert session.prefix.done() and marks == ([] if done else ["urgent"])

    asyncio.run(main())


def test_the_engine_marks_a_handle_urgent_once_and_wakes_its_thread(parts) -> None:
    model, _ = parts
    eng = Engine(model, None, EngineConfig(max_running_requests=1))  # not started: the inbox is read here
    handle = RequestHandle(1, asyncio.new_event_loop())
    assert not handle.urgent
    eng.make_urgent(handle)
    eng.make_urgent(handle)
    assert handle.urgent and eng._inbox.qsize() == 1
    with pytest.raises(ValueError, match="prefix_job_max_wait_s"):
        Engine(model, None, EngineConfig(max_running_requests=1, prefix_job_max_wait_s=-1.0))

