"""What crosses the engine's threads: a request, its handle, the events it receives, the errors
:meth:`~ttsfleet.inference.engine.Engine.submit` raises, and the typed messages of the codec queue.

Why a module apart from the engine: the codec thread and the codec process
(:mod:`ttsfleet.inference.codec_batch`, :mod:`ttsfleet.inference.codec_process`) and the HTTP side
(:mod:`ttsfleet.inference.synthesis`) speak these types without importing the engine itself; the
messages are typed so a handler is chosen by type and a misspelt kind cannot pass silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ttsfleet.switches import ProcessSwitch, one_of


class EngineOverloaded(Exception):
    """The waiting queue is full (HTTP 429)."""


class EngineStopped(Exception):
    """The engine is shutting down or died (HTTP 503)."""


class PromptTooLong(ValueError):
    """The prompt does not fit the model's context (HTTP 400)."""


@dataclass
class Event:
    """What a request's handler receives: audio chunks, then one ``done`` or ``error``."""

    kind: str  # "audio" | "prefix" | "done" | "error"
    audio: np.ndarray | None = None
    codes: np.ndarray | None = None  # [num_codebooks, frames] behind this audio chunk
    frames: int = 0
    reason: str = ""
    #: "prefix" (and the "done" of :meth:`Engine.prefill_prefix`): the prompt head's K/V
    #: (:class:`~ttsfleet.inference.prefix.PrefixKV`), for later requests that start with it.
    prefix: Any = None


class RequestHandle:
    """The HTTP side of one request: an asyncio queue the engine threads post events to."""

    def __init__(self, rid: int, loop: asyncio.AbstractEventLoop):
        self.rid = rid
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.submitted_at = time.perf_counter()
        # When the engine thread reached each step on the way to the first audio (perf_counter; set
        # once each): what ``inference_ttfa_stage_seconds`` splits time to first audio by.
        self.ingested_at: float | None = None  # the engine thread took it (between two iterations)
        self.admitted_at: float | None = None  # a slot taken (its prefill starts)
        self.prefilled_at: float | None = None  # the whole prompt in the cache
        self.first_frame_at: float | None = None
        self.first_codes_at: float | None = None  # the first chunk of codes handed to the codec
        #: A prefix-only job that a waiting text now needs (:meth:`Engine.make_urgent`): the engine
        #: plans it with the requests whose first-audio clock runs. Written once (False -> True) by
        #: the event loop's thread, read by the engine thread at each iteration: a plain bool
        #: attribute, whose write and read are atomic in CPython, so no lock.
        self.urgent = False

    def post(self, ev: Event) -> None:
        """Thread-safe: called from the engine or codec thread."""
        with contextlib.suppress(RuntimeError):  # loop closed: the client is gone
            self.loop.call_soon_threadsafe(self.events.put_nowait, ev)

    async def next(self) -> Event:
        return await self.events.get()


#: Whether chunks ramp from the first chunk's size to the full one (``on``, the default since
#: 2026-12-05d) or jump (``off``, the engine before): :meth:`GenerationRequest.chunk_frames_after`.
#: A switch so that a served A/B can count the listener's underruns both ways (``bench serve``).
#: Measured on an H100 (2026-12-06, benchmarks/inference_h200/2026-12-06/call1-h100-chunk-ramp-gather100):
#: requests with an underrun at c=64 86.6 % (off) -> 42.4 % (on), c=128 100 -> 93.9 %, frames/s equal.
#: ``repeat-first``: the first size twice, then doubling (1, 1, 2, 4, 4, ...). Measured beside ``on`` on
#: an H100 (2026-12-06b, call11-h100-chunk-ramp-repeat-first, c=64, one round): requests with an underrun
#: 46.5 -> 24.0 %, the first gap after 46 -> 93 ms of audio (p50), but frames/s 3,383 -> 3,189 (-5.7 %;
#: two runs of ``on`` that hour: 3,419 and 3,383) and NVML busy 91 -> 86 %. The second round (2026-12-06c,
#: call11-h100-repeat-first-round2): underruns 40.8 -> 11.5 % at c=64, frames/s -3.8 % at c=64 and -1.7 %
#: at c=128 (the hour's ``on`` runs 2.2 % apart): the cost is real, so not the default; for deployments
#: that value gap-free playback over throughput.
CHUNK_RAMP_ENV = "TTSFLEET_CHUNK_RAMP"
CHUNK_RAMPS = ("on", "off", "repeat-first")
CHUNK_RAMP_SWITCH: ProcessSwitch[str] = ProcessSwitch(CHUNK_RAMP_ENV, "on",
                                                      one_of(CHUNK_RAMP_ENV, CHUNK_RAMPS, "on"))


@dataclass
class GenerationRequest:
    """One generation: a prompt ``[1 + num_codebooks, T]`` and how to sample it."""

    prompt: Any  # torch.LongTensor
    sampling: Any  # ttsfleet.inference.sampling.SamplingParams
    max_new_tokens: int
    first_chunk_frames: int = 2
    chunk_frames: int = 8
    #: Decode exactly ``max_new_tokens`` frames, through ``<|im_end|>`` (benchmarks with random weights).
    ignore_eos: bool = False
    #: A prefilled head of ``prompt`` (:class:`~ttsfleet.inference.prefix.PrefixKV`): its K/V are copied
    #: into the request's slot and only the rest of the prompt is prefilled (real-time mode).
    prefix: Any = None
    #: After the prompt's prefill, hand its first ``keep_prefix`` positions back as an Event("prefix")
    #: (a request whose later segments start with the same head). 0 = none.
    keep_prefix: int = 0

    def chunk_frames_after(self, chunks_sent: int, ramp: str = "on") -> int:
        """The frames of the chunk after ``chunks_sent`` chunks, by ``ramp`` (:data:`CHUNK_RAMPS`, the
        engine's :data:`CHUNK_RAMP_SWITCH`): ``on``, ``first_chunk_frames`` then doubling up to
        ``chunk_frames`` — 1, 2, 4, 4, ...; ``repeat-first``, the first size twice, then doubling —
        1, 1, 2, 4, 4, ...; ``off``, ``chunk_frames`` right after the first.

        Why a ramp: a jump from the first chunk straight to the full one leaves the listener dry
        whenever decoding is less than full/first times faster than real time — at c=64 (58 frames/s
        a stream, H100, 2026-12-05d) the benchmark's 4 frames after its first 1 took ~69 ms to
        decode, against 46 ms of audio sent. Why repeat the first: with one frame decoded every
        ~17.5 ms (c=64) the chunk after chunk ``j`` comes ``17.5 * (next - 1)`` ms after the audio
        sent so far would have played ``46 * sent`` ms, so the slack is smallest right after the
        first chunk — 11 ms for 1, 2, 4 (a prefill between two steps or a busy codec round
        eats it), 28.5 ms for 1, 1, 2, 4 — at no cost in first audio (a ``2, ...`` start buys 22 ms
        of slack for 17.5 ms more of it)."""
        if ramp == "off":
            return self.first_chunk_frames if chunks_sent == 0 else self.chunk_frames
        doublings = max(chunks_sent - 1, 0) if ramp == "repeat-first" else chunks_sent
        return min(self.chunk_frames, max(1, self.first_chunk_frames) << min(doublings, 16))


# ----------------------------------------------------------------------------- codec queue
# The engine thread -> the codec thread, or the codec process (the handle there replaced by a
# :class:`~ttsfleet.inference.codec_process.StreamRef`).
@dataclass(frozen=True)
class CodesChunk:
    """Decoded frames of one request for the codec; ``final`` = the request's last chunk."""

    handle: RequestHandle  # on the way to the codec process, a StreamRef of its id
    codes: np.ndarray  # int64 [num_codebooks, frames]
    final: bool
    reason: str
    generated: int


@dataclass(frozen=True)
class DropStream:
    """The request was cancelled: forget its audio stream."""

    handle: RequestHandle  # as in CodesChunk


@dataclass(frozen=True)
class StopCodec:
    """End the codec thread."""


CodecMessage = CodesChunk | DropStream | StopCodec
