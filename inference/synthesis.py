"""The request pipeline between a parsed request and the engine: validate it into a :class:`Job`, then
stream its audio segment after segment with :class:`Generation`.

HTTP routes and the live WebSocket both drive a ``Generation``: the HTTP routes know every text
segment up front, the live session submits segments as text arrives. Each segment is one engine
request whose prompt is conditioned on the previous segment's codes (Fish's
``condition_on_previous_chunks``); overload on the first segment is a 429 before any byte is sent,
later segments of an accepted request are never shed.

In a cloned voice every segment's prompt starts with the same head (system text + references,
:func:`~ttsfleet.inference.prompt.prompt_head`). Its K/V are prefilled once and reused
(:mod:`ttsfleet.inference.prefix`): the live route prefills the head when the session opens
(:meth:`Generation.open_prefix`, the write-up's real-time mode: first audio then waits only for the
text's own tokens), and a request of several segments keeps its first segment's head for the rest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from ttsfleet.inference.api import ApiError, TTSRequest, check_sample_rate, normalize_text, split_text
from ttsfleet.inference.audio_io import can_encode
from ttsfleet.inference.references import encode_reference
from ttsfleet.inference.server_state import ServerState

#: (first chunk, later chunks) in frames per latency mode: smaller chunks = earlier first audio.
_CHUNKING = {"low": (1, 4), "balanced": (2, 8), "normal": (4, 16)}
#: Shortest prompt head worth keeping: below this a prefill costs about what the K/V copy does.
MIN_PREFIX_TOKENS = 32


class GenerationFailed(RuntimeError):
    """The engine reported an error for a segment (a server fault, not the client's)."""


@dataclass
class Job:
    """A validated TTS request, ready for the engine."""

    req: TTSRequest
    fmt: str
    sample_rate: int
    segments: list[str]
    references: list[tuple[Any, str]]
    arrived: float


def clean_text(state: ServerState, req: TTSRequest, text: str) -> str:
    """The text as it will be spoken (normalized if asked), or the 400 that says why it cannot be."""
    text = normalize_text(text) if req.normalize else text.strip()
    if len(text) > state.cfg.max_text_chars:
        raise ApiError(400, f"text is {len(text)} characters; the limit is {state.cfg.max_text_chars}",
                       "text_too_long")
    return text


def check_output(req: TTSRequest) -> int:
    """The output sample rate, once the format is known to be writable here."""
    if not can_encode(req.format):
        raise ApiError(400, f"format {req.format!r} needs ffmpeg, which this server does not have",
                       "unsupported_format")
    return check_sample_rate(req.format, req.sample_rate)


async def resolve_references(state: ServerState, req: TTSRequest) -> list[tuple[Any, str]]:
    """Stored (``reference_id``) and inline (``references``) voices as (codes, transcript) pairs."""
    import torch

    refs: list[tuple[Any, str]] = []
    ids = req.reference_id
    if isinstance(ids, list):
        if len(ids) > 1:
            raise ApiError(400, "multi-speaker reference_id lists are not supported by this server",
                           "multi_speaker_unsupported")
        ids = ids[0] if ids else None
    if ids:
        codes, text = state.references.get(ids)
        refs.append((torch.from_numpy(np.asarray(codes)).long(), text))
    for ref in req.references or []:
        codes = await asyncio.to_thread(encode_reference, state.codec, state.encode_lock, ref.audio)
        refs.append((codes, ref.text))
    return refs


async def validate(state: ServerState, req: TTSRequest) -> Job:
    """Turn a parsed request into a Job or raise the right 4xx."""
    text = clean_text(state, req, req.text)
    if not text:
        raise ApiError(400, "text is empty", "empty_text")
    sr = check_output(req)
    refs = await resolve_references(state, req)
    return Job(req=req, fmt=req.format, sample_rate=sr, segments=split_text(text, req.chunk_length,
                                                                             req.min_chunk_length),
               references=refs, arrived=time.perf_counter())


def _sampling(req: TTSRequest, segment: int) -> Any:
    from ttsfleet.inference.sampling import SamplingParams

    kw: dict[str, Any] = {}
    if req.seed is not None:
        kw["seed"] = (req.seed + segment) & 0x7FFFFFFF
    return SamplingParams(temperature=req.temperature, top_p=max(req.top_p, 1e-3), top_k=req.top_k,
                          repetition_penalty=req.repetition_penalty, **kw)


#: The stages of time to first audio, in order, each ending where the next begins.
TTFA_STAGES = ("intake", "arrival", "inbox", "queue", "prefill", "decode", "audio")


def ttfa_stages(arrived: float, handle: Any, first_audio: float, received: float | None = None
                ) -> dict[str, float]:
    """Time to first audio (``received`` -> ``first_audio``) split at the handler's and the engine's marks:
    the app's intake (``received`` -> ``arrived``: dependencies, the body read and parsed, the request
    validated; only where the app stamped ``received``), then, at the marks on the segment's ``handle``
    (:class:`~ttsfleet.inference.engine_messages.RequestHandle`), to the engine's queue, until the engine
    thread takes it (its iteration's length: the live route's 212 ms "queue" on the H200 came with only
    60 admission waits in 320 sessions, 2026-12-03d), waiting for admission, prefill, decode to the first
    chunk of codes, then codec + encoding + send.

    Why: one TTFA figure cannot say which part misses a target (the live route at c=64 on an H200:
    400 ms where HTTP streaming takes ~100 ms). A mark the engine never set (a path that skips a
    stage) leaves that stage out and its time counted in the next one, so the stages always add up
    to the whole.
    """
    if handle is None:
        return {}
    marks = (arrived, handle.submitted_at, handle.ingested_at, handle.admitted_at, handle.prefilled_at,
             handle.first_codes_at, first_audio)
    out: dict[str, float] = {}
    start = arrived if received is None else min(received, arrived)
    for stage, end in zip(TTFA_STAGES, marks, strict=True):
        if end is None or (stage == "intake" and received is None):
            continue
        out[stage] = max(0.0, min(end, first_audio) - start)
        start = max(start, min(end, first_audio))
    return out


class Generation:
    """Streams the audio of one request across its text segments, recording the request's metrics."""

    def __init__(self, state: ServerState, req: TTSRequest, references: list[tuple[Any, str]],
                 arrived: float, received: float | None = None):
        self.state = state
        self.req = req
        self.references = references
        self.arrived = arrived  # the handler's mark (the live route moves it to the first text flush)
        self.received = received  # when the app got the request, where its timings start (None: arrived)
        self.handle: Any = None
        self.index = 0  # segments submitted so far
        self.prompt_tokens = 0
        self.frames = 0
        self.samples = 0
        self.first_audio: float | None = None
        self.codec_rate = int(state.codec.sample_rate)
        self.status: int | None = None  # set once by finish()
        self._text = ""
        self._previous: list[tuple[Any, str]] = []  # the last segment's codes, to condition the next
        self._active = False  # a segment is in the engine and not done
        self.prefix: Any = None  # the voice head's K/V (PrefixKV), once prefilled
        self.prefix_tokens_reused = 0
        self._prefix_job: Any = None  # the voice head's prefill job's RequestHandle (open_prefix)
        self._prefix_needed = False  # a text waits for the voice head (need_prefix)

    def _head(self) -> Any:
        """The voice head's tokens when there is one worth keeping (and reuse is on), else None."""
        from ttsfleet.inference.prompt import prompt_head

        if not self.state.cfg.prefix_reuse:
            return None
        head = prompt_head(self.state.tokenizer, self.state.model.config, self.references)
        return head if head is not None and head.shape[-1] >= MIN_PREFIX_TOKENS else None

    async def open_prefix(self) -> None:
        """Real-time mode: prefill the voice head now, before any text, so that the first segment
        prefills only its own tokens. Best effort: an overloaded engine or a head too long for the
        context leaves no prefix (the segments then prefill whole, as without it)."""
        from ttsfleet.inference.engine_messages import EngineOverloaded, EngineStopped, PromptTooLong

        head = self._head()
        if head is None or self.prefix is not None:
            return
        try:
            handle = self.state.engine.prefill_prefix(head, asyncio.get_running_loop())
        except (EngineOverloaded, EngineStopped, PromptTooLong):
            return
        self._prefix_job = handle
        if self._prefix_needed:  # the text came before the job was submitted
            self.state.engine.make_urgent(handle)
        ev = await handle.next()
        if ev.kind == "done" and ev.prefix is not None:
            self.prefix = ev.prefix

    def need_prefix(self) -> None:
        """The first text is cut and waits for the voice head: from now on its prefill job has a
        first-audio clock running, so the engine plans it with the requests ahead of other sessions'
        head jobs, which nobody waits for yet (:mod:`ttsfleet.inference.admission_order`). Also
        before :meth:`open_prefix` has submitted the job: it is then marked as it is submitted."""
        self._prefix_needed = True
        if self._prefix_job is not None and self.prefix is None:
            self.state.engine.make_urgent(self._prefix_job)

    @property
    def frames_per_second(self) -> float:
        return self.codec_rate / self.state.codec.frame_length

    def submit(self, text: str, more_may_follow: bool = True) -> None:
        """Hand the next segment to the engine; the first one may be refused (429), later ones never.
        ``more_may_follow``: keep the voice head's K/V from this segment's prefill for the next ones."""
        from ttsfleet.inference.engine_messages import (
            EngineOverloaded,
            EngineStopped,
            GenerationRequest,
            PromptTooLong,
        )
        from ttsfleet.inference.prompt import build_prompt

        st = self.state
        refs = self.references + self._previous
        prompt = build_prompt(st.tokenizer, st.model.config, text, references=refs)
        if self._previous and prompt.shape[-1] + 16 > st.engine.max_seq_len:  # drop conditioning, not text
            prompt = build_prompt(st.tokenizer, st.model.config, text, references=self.references)
        first, chunk = _CHUNKING[self.req.latency]
        cap = st.cfg.max_new_tokens
        prefix = self.prefix if self.prefix is not None and self.prefix.starts(prompt) else None
        head = self._head() if prefix is None and more_may_follow else None
        gen = GenerationRequest(prompt=prompt, sampling=_sampling(self.req, self.index),
                                max_new_tokens=min(self.req.max_new_tokens or cap, cap),
                                first_chunk_frames=first, chunk_frames=chunk, prefix=prefix,
                                keep_prefix=0 if head is None else int(head.shape[-1]))
        try:
            self.handle = st.engine.submit(gen, asyncio.get_running_loop(), admitted=self.index > 0)
        except PromptTooLong as exc:
            raise ApiError(400, f"{exc} (shorten the text or the references)", "prompt_too_long") from None
        except EngineOverloaded as exc:
            raise ApiError(429, f"server overloaded: {exc}", "overloaded", {"Retry-After": "1"}) from None
        except EngineStopped as exc:
            raise ApiError(503, f"engine unavailable: {exc}", "unavailable") from None
        self.index += 1
        self.prompt_tokens += int(prompt.shape[-1])
        self.prefix_tokens_reused += 0 if prefix is None else prefix.length
        self._text = text
        self._active = True

    async def segment_audio(self) -> AsyncIterator[np.ndarray]:
        """Float32 audio of the submitted segment at the codec's rate, as it decodes."""
        import torch

        codes: list[np.ndarray] = []
        while True:
            ev = await self.handle.next()
            if ev.kind == "prefix":
                self.prefix = ev.prefix
            elif ev.kind == "audio":
                if ev.codes is not None and ev.codes.shape[1]:
                    codes.append(ev.codes)
                if ev.audio is not None and ev.audio.size:
                    self.samples += ev.audio.size
                    yield ev.audio
            elif ev.kind == "error":
                self._active = False
                raise GenerationFailed(ev.reason)
            else:
                self._active = False
                self.frames += ev.frames
                break
        if self.req.condition_on_previous_chunks and codes:
            self._previous = [(torch.from_numpy(np.concatenate(codes, axis=1)).long(), self._text)]

    async def audio(self, segments: list[str]) -> AsyncIterator[np.ndarray]:
        """All segments in turn; the first must already be submitted (so a 429 precedes the headers)."""
        try:
            for i, text in enumerate(segments):
                if i > 0:
                    self.submit(text, more_may_follow=i + 1 < len(segments))
                async for chunk in self.segment_audio():
                    yield chunk
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Free the engine slot of a segment still decoding (the client went away); idempotent."""
        if self._active and self.handle is not None:
            self.state.engine.cancel(self.handle)
        self._active = False

    @property
    def started(self) -> float:
        """Where the request's time to first audio and wall time start: the app's stamp, else the
        handler's mark."""
        return self.arrived if self.received is None else min(self.received, self.arrived)

    @property
    def finished(self) -> bool:
        return self.status is not None

    def mark_first_audio(self) -> None:
        if self.first_audio is None:
            self.first_audio = time.perf_counter()
            self.state.m("inference_ttfa_seconds").observe(self.first_audio - self.started)
            stages = ttfa_stages(self.arrived, self.handle, self.first_audio, self.received)
            hist = self.state.metrics["inference_ttfa_stage_seconds"]
            for stage, seconds in stages.items():
                hist.labels(self.state.label, stage).observe(seconds)

    def finish(self, status: int, reason: str = "", realtime: bool = True) -> None:
        """Record the request's outcome once; ``realtime=False`` for sessions paced by their client."""
        if self.finished:
            return
        self.status = status
        st = self.state
        st.count(status, reason)
        if status == 200:
            wall = time.perf_counter() - self.started
            st.m("inference_request_duration_seconds").observe(wall)
            audio_s = self.samples / self.codec_rate
            if realtime and audio_s > 0:
                st.m("inference_realtime_factor").observe(wall / audio_s)
