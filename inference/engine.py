"""The continuous-batching engine: one thread owns the model, one owns the codec, queues connect them.

Why this shape (sglang's scheduler style): all batch state — ``waiting`` (admitted, no KV slot yet),
``running`` (holding a slot, decoding one frame per step) and finished — lives in the engine
thread and is mutated only there. HTTP handlers talk to it through a thread-safe inbox of typed
messages (:class:`Submit`, :class:`Wake`) and get results back on their own asyncio queue, so no
lock guards model state. A request moves ``waiting`` → ``prefilling`` (holds a KV slot, prompt
partly prefilled) → ``running`` → finished. Every loop iteration:

1. ingest new requests and cancellations from the inbox; free the slots of cancelled requests
   (waiting, mid-prefill or running);
2. batched, chunked prefill: plan this iteration's prompt pieces within ``prefill_token_budget`` —
   first the requests already prefilling (one chunk of at most ``prefill_chunk_tokens`` each), then
   waiting requests into free KV slots — and run them all in **one** variable-length
   ``model.prefill_batch`` call. A long prompt is spread over several iterations, each bounded, so
   admission never stalls the running batch for long, and every waiting prompt of an iteration gets
   its first frame at the same step (time to first audio does not grow with queue position within
   the budget). ``prefill_chunk_tokens = 0``: whole prompts, at least one per iteration. The order
   is "clocked first" (:mod:`ttsfleet.inference.admission_order`): requests whose first-audio clock
   runs — every request, and a live session's voice-head prefix job once its first text waits for
   it (:meth:`Engine.make_urgent`) — before background prefix jobs, which no text waits for yet
   (a background job that waited ``prefix_job_max_wait_s`` counts as clocked). With mixed steps (on
   by default, :mod:`ttsfleet.inference.mixed_step`) and something decoding, the pieces instead ride in
   this iteration's decode step: one pass of the slow model for the step's frames and the pieces;
3. a request whose last chunk ran joins the running batch, and one decode step is *launched* over
   the whole running batch; its frames are copied to a pinned host buffer behind a CUDA event;
4. the frames of the previous step (``pipeline_depth`` = 1) are read back — by then the GPU is
   already running the next step, so there is no per-step host barrier — their codes go to the
   codec thread, and rows that hit EOS or ``max_new_tokens`` retire (a retired row's frame in the
   step already in flight is dropped: ``stats.spare_rows``).

The decode batch lives in static buffers (slots, window; one row per KV slot); each step uses
the leading ``bs`` rows, kept dense by swap-removal. On CUDA a step is padded up to the next
bucket size (1, 2, 4, 8, 16, 24, … ``cuda_graph_max_bs``; padded rows write into a scratch slot)
and replays the CUDA graph captured for that size on the same storage.

The codec thread (:class:`CodesChunk` / :class:`DropStream` / :class:`StopCodec` messages) decodes
the frames of **every** stream with pending codes in one batched streaming call per frame count
(:class:`~ttsfleet.inference.codec.SlotCodecStream`: stream state in slots like the KV cache, on its
own CUDA stream, replayed from CUDA graphs), then hands float32 audio chunks to the HTTP side,
which encodes them (wav/pcm/mp3/opus) on its own event loop, never on the engine thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ttsfleet.inference.admission_order import Entry, admission_order, passed_over
from ttsfleet.inference.codec_batch import BatchedCodec, CodecMeter, build_slot_decoder, use_conv_autotuner
from ttsfleet.inference.codec_process import CodecProcess, DecoderPlan
from ttsfleet.inference.engine_checks import (
    ENGINE_CHECKS_ENV,
    ENGINE_CHECKS_SWITCH,
    StepRows,
    check_prefill,
    check_step,
)
from ttsfleet.inference.engine_config import DEFAULT_WINDOW, EngineConfig, batch_buckets
from ttsfleet.inference.engine_messages import (
    CHUNK_RAMP_SWITCH,
    CodecMessage,
    CodesChunk,
    DropStream,
    EngineOverloaded,
    EngineStopped,
    Event,
    GenerationRequest,
    PromptTooLong,
    RequestHandle,
    StopCodec,
)
from ttsfleet.inference.engine_phases import ENGINE_PHASES, GPU_WORK, GilProbe, GpuSpans, PhaseClock
from ttsfleet.inference.graph_capture import CAPTURE_LOCK, capture_after_warmup
from ttsfleet.inference.mixed_step import MIXED_STEPS_SWITCH
from ttsfleet.inference.prefill_coalesce import Arrivals, CoalesceRule, hold_arrivals
from ttsfleet.inference.prefill_stream import SidePrefill, side_stream_wanted

from ttsfleet.contracts.serving import CODEC_COMPILE_MODES

log = logging.getLogger("ttsfleet.inference.engine")

#: The engine's public names that live in its two companion modules (imported from here too).
__all__ = ["DEFAULT_WINDOW", "CodesChunk", "DropStream", "Engine", "EngineConfig", "EngineOverloaded",
           "EngineStopped", "Event", "GenerationRequest", "PromptTooLong", "RequestHandle", "StopCodec",
           "batch_buckets"]

#: Padded decode steps between two resets of the pad slot (each step adds one position to it).
PAD_RESET_STEPS = 32
#: What can hold a waiting request back at an iteration: no free KV slot, the iteration's prefill
#: token budget spent, the decode batch full, prefill coalescing waiting for company, or (deferred)
#: only background prefix-only jobs left, passed over by later requests whose first-audio clock runs
#: (:mod:`ttsfleet.inference.admission_order`).
ADMISSION_WAIT_REASONS = ("slots", "budget", "batch", "hold", "deferred")


@dataclass(eq=False)  # compared by identity: two requests are never "equal"
class _Running:
    """Engine-thread state of one admitted request."""

    req: GenerationRequest
    handle: RequestHandle
    slot: int = -1
    prefilled: int = 0  # prompt tokens already in the slot (chunked prefill)
    generated: int = 0
    pending: list[np.ndarray] = field(default_factory=list)  # codes not yet sent to the codec
    chunks_sent: int = 0
    retired: bool = False  # left the batch (a decode step in flight may still hold its row)
    prefix_only: bool = False  # :meth:`Engine.prefill_prefix`: prefill, hand the K/V back, free the slot

    @property
    def prompt_len(self) -> int:
        return int(self.req.prompt.shape[-1])

    @property
    def clocked(self) -> bool:
        """Someone's time to first audio runs on it: every request, and a prefix-only job once a
        text waits for it (its handle marked urgent)."""
        return not self.prefix_only or self.handle.urgent

    @property
    def restored(self) -> int:
        """Prompt tokens that come from a prefilled head instead of a prefill."""
        return 0 if self.req.prefix is None else int(self.req.prefix.length)


# ----------------------------------------------------------------------------- the inbox
# The HTTP side -> the engine thread (the codec queue's messages: :mod:`.engine_messages`); typed, so
# a handler is chosen by type and a misspelt kind cannot pass silently.
@dataclass(frozen=True)
class Submit:
    """A new request for the waiting queue."""

    state: _Running


@dataclass(frozen=True)
class Wake:
    """Nothing to carry: look at cancellations / the stop flag now."""


InboxMessage = Submit | Wake


class _Stats:
    """Counters the engine threads write and anyone may read (plain numbers; reads may be a step old).

    The ``*_s`` fields are host wall seconds spent launching + waiting in each phase: with the
    pipeline on, ``wait_s`` is where the engine thread waits for the GPU."""

    def __init__(self) -> None:
        self.waiting = 0
        self.running = 0
        self.frames = 0
        self.steps = 0
        self.prefill_chunks = 0  # prompt pieces prefilled
        self.prefill_calls = 0  # batched model.prefill_batch calls
        self.mixed_steps = 0  # decode steps that carried prefill pieces (:mod:`.mixed_step`)
        self.prefill_tokens = 0
        self.prefill_holds = 0  # iterations that held new prompts back for a fuller call (coalescing)
        self.prefix_tokens_reused = 0  # prompt tokens restored from a prefilled head, not prefilled
        self.prefixes_kept = 0  # prompt heads handed back for reuse
        self.spare_rows = 0  # rows decoded for requests that had already ended (pipeline lag)
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.wait_s = 0.0
        self.busy_s = 0.0  # wall seconds of the engine thread's busy iterations (:mod:`.engine_phases`)
        self.codec_calls = 0
        self.codec_frames = 0
        self.codec_s = 0.0
        self.codec_rounds = 0
        #: iterations that ended with requests waiting, by what held the oldest back
        self.admission_waits: dict[str, int] = dict.fromkeys(ADMISSION_WAIT_REASONS, 0)

    def snapshot(self) -> dict[str, Any]:
        """A copy (the per-reason counts too: a later snapshot must not share them)."""
        return {k: dict(v) if isinstance(v, dict) else v for k, v in vars(self).items()}


class Engine:
    """Owns the model, its KV cache and the codec; serves :class:`GenerationRequest` s.

    ``codec`` None makes a codes-only engine: "audio" events carry the frames' codes and no samples."""

    def __init__(self, model: Any, codec: Any, config: EngineConfig, collectors: Any = None,
                 model_label: str = "tiny"):
        import torch
        from ttsfleet.inference.sampling import SamplingBatch

        self.model = model
        self.codec = codec
        self.cfg = config
        self._SamplingBatch = SamplingBatch
        self._chunk_ramp = CHUNK_RAMP_SWITCH.get()  # :meth:`GenerationRequest.chunk_frames_after`
        mc = model.config
        self.num_codebooks = int(mc.num_codebooks)
        self.im_end_id = int(mc.im_end_id)
        self.max_slots = config.max_running_requests
        context = int(min(config.max_seq_len or mc.max_seq_len, mc.max_seq_len))
        self.max_seq_len = self._fit_seq_len(model, context)
        # One extra scratch slot receives the padded rows' writes when batches are padded.
        self.pad_slot = self.max_slots
        self.cache = model.new_cache(self.max_slots + (1 if config.pad_to_buckets else 0), self.max_seq_len,
                                     kv_dtype=config.kv_dtype)
        self.free_slots: deque[int] = deque(range(self.max_slots))
        self.device = torch.device(config.device)
        # Static decode buffers (row i = running[i]); a graph for bs uses rows [:bs].
        self.static_bs = max(config.cuda_graph_max_bs, self.max_slots)
        self.window_buf = torch.full((self.static_bs, config.window, self.num_codebooks), -1,
                                     dtype=torch.int32, device=self.device)
        self.slots_buf = torch.zeros(self.static_bs, dtype=torch.long, device=self.device)
        self.buckets = batch_buckets(config.cuda_graph_max_bs)
        self.graphs: _DecodeGraphs | None = None
        self.prefill_graphs: Any = None  # PrefillGraphs, captured by the engine thread
        self._sampling_key: tuple[int, ...] = ()
        self._sampling: Any = None
        if config.prefill_token_budget < 1 or config.prefill_chunk_tokens < 0:
            raise ValueError("prefill_token_budget must be >= 1 and prefill_chunk_tokens >= 0")
        if config.pipeline_depth < 0 or config.codec_max_frames < 1 or config.codec_gather_ms < 0:
            raise ValueError("pipeline_depth and codec_gather_ms must be >= 0 and codec_max_frames >= 1")
        if config.prefix_job_max_wait_s < 0:
            raise ValueError("prefix_job_max_wait_s must be >= 0")
        if config.codec_compile is not None and config.codec_compile not in CODEC_COMPILE_MODES:
            raise ValueError(f"codec_compile {config.codec_compile!r} is not None or one of "
                             f"{', '.join(CODEC_COMPILE_MODES)}")
        self._coalesce = CoalesceRule(config.prefill_coalesce_s, config.prefill_coalesce_prompts,
                                      config.prefill_token_budget)
        self.waiting: deque[_Running] = deque()
        self.prefilling: deque[_Running] = deque()  # hold a slot, prompt not fully prefilled yet
        self.running: list[_Running] = []
        self.stats = _Stats()
        self._inbox: queue.SimpleQueue[InboxMessage] = queue.SimpleQueue()
        self._codec_q: queue.SimpleQueue[CodecMessage] = queue.SimpleQueue()
        self._in_flight: deque[_StepInFlight] = deque()  # launched decode steps not yet read back
        self._host_bufs: list[Any] = []  # pinned frame buffers, one per in-flight step
        # (bs, padded bs) the pad rows of slots_buf were set for; a join or retire forgets it (both
        # change what rows past the batch hold)
        self._pad_rows: tuple[int, int] = (0, 0)
        self._pad_growth = 0  # padded steps since the pad slot was last emptied
        self.codec_slots = 2 * self.max_slots  # audio streams may outlive their KV slot
        self._admit_lock = threading.Lock()
        self._queued = 0  # submitted and not yet holding a slot (guarded by _admit_lock)
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._dead: str | None = None
        self.metrics = collectors
        self.label = model_label
        #: the codec's counts, in ``stats`` and on /metrics: both codec modes write through it
        self.codec_meter = CodecMeter(self.stats, self._export_codec)
        self._phases = PhaseClock(self.stats)  # each busy iteration's time by phase
        self._gpu_spans = GpuSpans() if self.device.type == "cuda" else None  # its GPU work in situ
        side = config.prefill_stream
        side = side_stream_wanted(self.device.type) if side is None else side
        #: prefill calls on a stream of their own (:mod:`.prefill_stream`), each landed once done
        self._side_prefill = SidePrefill(self.device, self._gpu_spans) if side else None
        if side:
            log.info("prefill calls on a stream of their own (%s)", "CUDA" if self.device.type == "cuda"
                     else "the CPU: deferred landing only")
        self._prefills: deque[_PrefillInFlight] = deque()  # side-stream prefill calls not yet landed
        #: prefill pieces inside the decode step where something decodes (:mod:`.mixed_step`)
        self._mixed = MIXED_STEPS_SWITCH.get()
        self._riders: list[tuple[_Running, int]] = []  # this iteration's pieces for the next step
        #: every call and step checked before the next reads it (:mod:`.engine_checks`; a diagnostic)
        self._checks = ENGINE_CHECKS_SWITCH.get()
        if self._checks:
            log.warning("engine checks on (%s): a host sync after every prefill call and decode step",
                        ENGINE_CHECKS_ENV)
        self._gil_probe = GilProbe()  # how long it waits for the interpreter back, sampled
        self._threads = [threading.Thread(target=self._engine_main, name="ttsfleet-engine", daemon=True)]
        self._codec_proc: CodecProcess | None = None
        if config.codec_process is not None and codec is not None:
            self._codec_proc = CodecProcess(config.codec_process, self._decoder_plan(), self._codec_q,
                                            self.codec_meter, self.cancel, self._codec_died)
            self._threads += self._codec_proc.threads
        else:
            codec_thread = threading.Thread(target=self._codec_main, name="ttsfleet-codec", daemon=True)
            self._threads.append(codec_thread)
        if collectors is not None:
            self.attach_metrics(collectors, model_label)

    def _fit_seq_len(self, model: Any, want: int) -> int:
        """``want``, or less where a KV cache of ``want`` positions per slot would not fit the GPU.

        Why: a model's own context (S2 Pro: 32,768) times 64 slots is ~300 GB of bf16 K/V; the cache
        takes at most ``kv_cache_memory_fraction`` of the free device memory instead (like sglang's
        static memory fraction), and prompts beyond that context get the usual 400.
        """
        import torch

        dev = torch.device(self.cfg.device)
        if dev.type != "cuda":
            return want
        slots = self.max_slots + 1
        per_pos = model.kv_bytes_per_position(self.cfg.kv_dtype) * slots
        free, _ = torch.cuda.mem_get_info(dev)
        fit = int(free * self.cfg.kv_cache_memory_fraction // per_pos)
        if fit >= want:
            return want
        if fit < 64:
            raise ValueError(f"no room for a KV cache of {self.max_slots} slots "
                             f"({free / 2**30:.1f} GiB free)")
        log.warning("KV cache: %d positions per slot fit (model context %d); longer prompts: 400", fit, want)
        return fit

    def attach_metrics(self, collectors: Any, label: str) -> None:
        """Start exporting (after a warm-up, so it does not show up as traffic)."""
        collectors["inference_kv_slots_total"].labels(label).set(self.max_slots)
        collectors["inference_kv_slots_used"].labels(label).set(self.max_slots - len(self.free_slots))
        collectors["inference_queue_depth"].labels(label).set(0)
        collectors["inference_running_batch_size"].labels(label).set(0)
        self._phases.export_to({phase: collectors["inference_engine_seconds"].labels(label, phase)
                                for phase in ENGINE_PHASES})
        self._gil_probe.export_to(collectors["inference_engine_gil_wait_seconds"].labels(label))
        if self._gpu_spans is not None:
            self._gpu_spans.export_to({work: collectors["inference_engine_gpu_seconds"].labels(label, work)
                                       for work in GPU_WORK})
        self.label = label
        self.metrics = collectors

    def _export_codec(self, metric: str, amount: float) -> None:
        """One increase of the codec's counts onto its contract counter (:class:`CodecMeter`); none
        before :meth:`attach_metrics`, so the warm-up's pushes are not counted as traffic."""
        metrics = self.metrics
        if metrics is not None:
            metrics[metric].labels(self.label).inc(amount)

    # ------------------------------------------------------------------ HTTP-side API (event loop)
    def start(self) -> None:
        if self._codec_proc is not None:
            self._codec_proc.start()
        for t in self._threads:
            t.start()

    def _codec_died(self, reason: str) -> None:
        self._dead = reason
        self._inbox.put(Wake())

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(Wake())
        self._codec_q.put(StopCodec())
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)
        if self._codec_proc is not None:
            self._codec_proc.stop(timeout)

    @property
    def alive(self) -> bool:
        proc_ok = self._codec_proc is None or self._codec_proc.alive
        return self._dead is None and proc_ok and all(t.is_alive() for t in self._threads)

    def check_prompt(self, prompt_len: int, max_new_tokens: int) -> int:
        """Raise :class:`PromptTooLong` if the prompt leaves no room; return the usable max_new_tokens."""
        room = self.max_seq_len - prompt_len
        if room < 1:
            raise PromptTooLong(f"prompt is {prompt_len} tokens; the model context is {self.max_seq_len}")
        return min(max_new_tokens, room)

    def submit(self, req: GenerationRequest, loop: asyncio.AbstractEventLoop,
               admitted: bool = False) -> RequestHandle:
        """Queue a request (called on the event loop). Raises EngineOverloaded / EngineStopped.

        ``admitted``: a later text segment of a request already accepted; it is never shed.
        """
        if not self.alive or self._stop.is_set():
            raise EngineStopped(self._dead or "engine is stopping")
        req.max_new_tokens = self.check_prompt(int(req.prompt.shape[-1]), req.max_new_tokens)
        if req.prefix is not None and not req.prefix.starts(req.prompt):
            log.warning("a prefix that does not start the prompt was ignored (the prompt is prefilled whole)")
            req.prefix = None
        if not 0 <= req.keep_prefix < int(req.prompt.shape[-1]):
            raise ValueError(f"keep_prefix {req.keep_prefix} must be in [0, prompt length)")
        return self._enqueue(_Running(req=req, handle=RequestHandle(next(self._ids), loop)), admitted)

    def prefill_prefix(self, tokens: Any, loop: asyncio.AbstractEventLoop,
                       admitted: bool = False) -> RequestHandle:
        """Prefill a prompt head ``tokens [1 + ncb, P]`` now, for requests that will start with it.

        Real-time mode: the live route calls this when a session opens, before any text exists, so
        its first segment prefills only its own tokens. The handle gets one Event("done") carrying
        the :class:`~ttsfleet.inference.prefix.PrefixKV` (or "error"); no decode slot stays taken.
        Raises EngineOverloaded / EngineStopped / PromptTooLong like :meth:`submit`.
        """
        if not self.alive or self._stop.is_set():
            raise EngineStopped(self._dead or "engine is stopping")
        p = int(tokens.shape[-1])
        self.check_prompt(p + 1, 1)  # room for at least one token after the head
        req = GenerationRequest(prompt=tokens, sampling=None, max_new_tokens=0, keep_prefix=p)
        st = _Running(req=req, handle=RequestHandle(next(self._ids), loop), prefix_only=True)
        return self._enqueue(st, admitted)

    def _enqueue(self, st: _Running, admitted: bool) -> RequestHandle:
        with self._admit_lock:
            free_now = self.max_slots - self.stats.running
            if not admitted and self._queued - free_now >= self.cfg.max_queue:
                raise EngineOverloaded(f"queue full ({self.cfg.max_queue} waiting)")
            self._queued += 1
        self._inbox.put(Submit(st))
        return st.handle

    def make_urgent(self, handle: RequestHandle) -> None:
        """A text now waits for this prefix-only job (called on the event loop): from the engine's
        next iteration on it is planned with the requests whose first-audio clock runs, ahead of
        background prefix jobs (:mod:`ttsfleet.inference.admission_order`). Idempotent.

        The engine re-reads the flag every iteration and never blocks in its inbox while a job is
        waiting or prefilling; the :class:`Wake` only makes sure it looks at once either way."""
        if not handle.urgent:
            handle.urgent = True
            self._inbox.put(Wake())

    def cancel(self, handle: RequestHandle) -> None:
        """The client went away: free its slot at the next step (idempotent)."""
        if not handle.cancelled.is_set():
            handle.cancelled.set()
            self._inbox.put(Wake())

    @property
    def queue_depth(self) -> int:
        with self._admit_lock:
            return max(self._queued, 0)

    # ------------------------------------------------------------------ engine thread
    def _engine_main(self) -> None:
        import torch

        torch.set_grad_enabled(False)
        if self.cfg.cpu_threads:
            torch.set_num_threads(self.cfg.cpu_threads)
        try:
            if self.cfg.cuda_graphs:
                with CAPTURE_LOCK:
                    self.graphs = _DecodeGraphs.capture(self)
            if self.cfg.prefill_graphs:
                with CAPTURE_LOCK:
                    self.prefill_graphs = self._capture_prefill_graphs()
            while not self._stop.is_set() and self._dead is None:
                idle = not (self.running or self.waiting or self.prefilling or self._in_flight
                            or self._prefills)
                if not idle:
                    self._phases.start()
                self._ingest(block=idle)
                if idle:  # the clock starts once work came, not while waiting for it
                    self._phases.start()
                self._land_prefills()  # first: a request cancelled in a side call is dropped as it lands
                self._drop_cancelled()
                self._admit()
                if self.running:
                    self._launch_step()
                # read back the oldest step once enough are queued behind it (or nothing new ran)
                depth = self.cfg.pipeline_depth if self.running else 0
                while len(self._in_flight) > depth:
                    self._finish_step(self._in_flight.popleft())
                self._publish()
                self._phases.stop()
                if not idle:
                    self._gil_probe.tick()  # outside the phases: the probe's own wait is not the loop's
        except Exception as exc:  # a bug, not bad input: fail everyone loudly, mark not alive
            log.exception("engine loop died")
            self._dead = f"engine failed: {type(exc).__name__}: {exc}"
        finally:
            if self._dead is not None:  # this loop or the codec process died
                landing = [st for call in self._prefills for st, _ in call.plan]
                landing += [st for st, _ in self._riders]
                for st in list(self.running) + list(self.prefilling) + list(self.waiting) + landing:
                    st.handle.post(Event("error", reason=self._dead))
            self._drain_inbox_on_exit()

    def _capture_prefill_graphs(self) -> Any:
        """The prefill's graphs for row buckets up to the token budget, or None (logged) where they
        cannot be had: then every prefill runs eagerly, as without the option."""
        from ttsfleet.inference.prefill_graphs import WHOLE_MAX_ROWS, PrefillGraphs, row_buckets

        if self.device.type != "cuda" or not self.cfg.pad_to_buckets:
            log.warning("prefill_graphs needs a CUDA device and pad_to_buckets; prefilling eagerly")
            return None
        try:
            graphs = PrefillGraphs(self.model, self.cache, self.pad_slot,
                                   row_buckets(self.cfg.prefill_token_budget),
                                   whole_max_rows=self.cfg.prefill_chunk_tokens or WHOLE_MAX_ROWS,
                                   attending=self._mixed)
            graphs.capture()
        except Exception:
            log.exception("prefill graph capture failed; prefilling eagerly")
            return None
        return graphs

    def _drain_inbox_on_exit(self) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, Submit):
                msg.state.handle.post(Event("error", reason="engine stopped"))

    def _ingest(self, block: bool) -> None:
        try:
            msg = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            match msg:
                case Submit(state=st):
                    st.handle.ingested_at = time.perf_counter()
                    self.waiting.append(st)
                case Wake():
                    pass
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _drop_cancelled(self) -> None:
        if any(st.handle.cancelled.is_set() for st in self.waiting):
            keep = deque()
            for st in self.waiting:
                if st.handle.cancelled.is_set():
                    self._dequeued()
                    st.handle.post(Event("done", reason="cancelled"))
                else:
                    keep.append(st)
            self.waiting = keep
        if any(st.handle.cancelled.is_set() for st in self.prefilling):
            keep = deque()
            for st in self.prefilling:
                if st.handle.cancelled.is_set():
                    self._free_slot(st.slot)
                    self._dequeued()
                    st.handle.post(Event("done", reason="cancelled"))
                else:
                    keep.append(st)
            self.prefilling = keep
        for i in reversed(range(len(self.running))):
            st = self.running[i]
            if st.handle.cancelled.is_set():
                self._retire(i, "cancelled")

    def _dequeued(self) -> None:
        with self._admit_lock:
            self._queued -= 1

    def _free_slot(self, slot: int) -> None:
        self.model.release(self.cache, slot)
        self.free_slots.append(slot)

    # ------------------------------------------------------------------ batched, chunked prefill
    def _admit(self) -> None:
        """Plan this iteration's prefill within the token budget, then run it as one batched call.

        Who goes first is :func:`~ttsfleet.inference.admission_order.admission_order`: requests
        whose first-audio clock runs (every request; a prefix-only job once a text waits for it)
        before background prefix-only jobs, and within each, requests already prefilling (one chunk
        each, in turn) before waiting ones taking free KV slots; FIFO otherwise, while the budget
        lasts. Every piece of the plan goes into a single ``model.prefill_batch``; a request whose
        whole prompt is in joins the running batch (and so the decode step that follows). With
        chunking off, whole prompts: at least one per iteration, more while they fit the budget.
        """
        if not (self.prefilling or self.waiting):
            return
        prefilling, waiting = list(self.prefilling), list(self.waiting)
        entries = self._order_entries(prefilling, waiting)
        order = admission_order(entries, self.cfg.prefix_job_max_wait_s)
        if self._hold_arrivals([waiting[i - len(prefilling)] for i in order if i >= len(prefilling)],
                               continuing=bool(prefilling)):
            self.stats.prefill_holds += 1
            self._admission_wait("hold")
            return
        plan, planned, blocker = self._plan(order, prefilling, waiting)
        self.prefilling = deque(st for i, st in enumerate(prefilling) if i not in planned)
        self.waiting = deque(st for i, st in enumerate(waiting, len(prefilling)) if i not in planned)
        if self.waiting and blocker is not None:  # always set when requests are left waiting
            deferred = passed_over(entries, planned, self.cfg.prefix_job_max_wait_s)
            self._admission_wait("deferred" if deferred else blocker)
        if plan and self._can_ride(plan):
            self._riders = plan
        elif plan:
            self._prefill(plan)

    def _can_ride(self, plan: list[tuple[_Running, int]]) -> bool:
        """Whether the planned pieces go into this iteration's decode step (mixed steps on, something
        decoding, and with prefill graphs, the step's rows and the pieces' within their largest bucket)."""
        if not (self._mixed and self.running):
            return False
        graphs = self.prefill_graphs
        rows = len(self.running) + sum(n for _, n in plan)
        return graphs is None or graphs.bucket(rows) is not None

    def _plan(self, order: list[int], prefilling: list[_Running],
              waiting: list[_Running]) -> tuple[list[tuple[_Running, int]], set[int], str | None]:
        """This iteration's prefill pieces in admission ``order`` (indices into ``prefilling`` then
        ``waiting``) within the token budget: (the pieces, the indices planned, what held back the
        first waiting request left waiting, or None). A continuation takes its next chunk while
        budget is left; the first waiting request held back holds the later ones too (FIFO)."""
        budget = self.cfg.prefill_token_budget
        plan: list[tuple[_Running, int]] = []
        planned: set[int] = set()
        admitted = 0
        blocker = None
        for i in order:
            if i < len(prefilling):
                if budget <= 0:
                    continue
                st = prefilling[i]
                n = min(self.cfg.prefill_chunk_tokens, budget, st.prompt_len - st.prefilled)
            else:
                st = waiting[i - len(prefilling)]
                if blocker is not None:
                    continue
                blocker = self._admission_blocker(budget, admitted)
                blocker = blocker or self._whole_prompt_blocker(st, budget, planning=bool(plan))
                if blocker is not None:
                    continue
                n = self._admit_one(st, budget)
                admitted += 1
            plan.append((st, n))
            planned.add(i)
            budget -= n
        return plan, planned, blocker

    @staticmethod
    def _order_entries(prefilling: list[_Running], waiting: list[_Running]) -> list[Entry]:
        """What the admission order looks at, continuations first, each list in its FIFO order."""
        now = time.perf_counter()
        return [Entry(clocked=st.clocked, waited_s=now - st.handle.submitted_at, continuing=continuing)
                for continuing, group in ((True, prefilling), (False, waiting)) for st in group]

    def _whole_prompt_blocker(self, st: _Running, budget: int, planning: bool) -> str | None:
        """With chunking off, "budget" when the request's whole prompt does not fit what is left of
        the budget and something is planned already (``planning``): it waits for the next iteration,
        decode keeps going meanwhile."""
        if self.cfg.prefill_chunk_tokens <= 0 and planning and st.prompt_len - st.restored > budget:
            return "budget"
        return None

    def _admit_one(self, st: _Running, budget: int) -> int:
        """Give a waiting request a KV slot (its head restored, if it brings one); returns the prompt
        tokens it prefills this iteration."""
        left = st.prompt_len - st.restored
        chunk = self.cfg.prefill_chunk_tokens
        n = left if chunk <= 0 else min(chunk, budget, left)
        st.slot = self.free_slots.popleft()
        st.handle.admitted_at = time.perf_counter()
        if st.restored:
            self._restore_prefix(st)
        return n

    def _admission_blocker(self, budget: int, planned: int) -> str | None:
        """What stops the next waiting request's admission now (one of ADMISSION_WAIT_REASONS), or
        None: the admission loop's condition and the reason it counts, in one place."""
        if not self.free_slots:
            return "slots"
        if budget <= 0:
            return "budget"
        if self._holding_rows() + planned >= self.static_bs:
            return "batch"
        return None

    def _admission_wait(self, reason: str) -> None:
        """Count an iteration that ended with requests waiting, by what held the oldest back: what
        splits the "queue" stage of time to first audio (on the H200 the live route's requests
        waited 218 ms there with 64 or 128 slots alike, 2026-12-03c)."""
        self.stats.admission_waits[reason] += 1
        if self.metrics is not None:
            self.metrics["inference_admission_waits"].labels(self.label, reason).inc()

    def _restore_prefix(self, st: _Running) -> None:
        """Copy the request's prefilled head into its new slot; its prefill starts after the head."""
        from ttsfleet.inference.prefix import restore_prefix

        restore_prefix(self.cache, st.slot, st.req.prefix)
        st.prefilled = st.restored
        self.stats.prefix_tokens_reused += st.restored
        if self.metrics is not None:
            self.metrics["inference_prefill_tokens_reused"].labels(self.label).inc(st.restored)

    def _hold_arrivals(self, ordered: list[_Running], continuing: bool) -> bool:
        """Whether this iteration leaves the waiting prompts for a fuller prefill call: what the
        engine sees, handed to the pure rule. ``ordered``: the waiting requests in admission order
        (the tokens counted are those of the prompts that would go first); ``continuing``: a prompt
        is mid-prefill, so a call runs anyway. The wait is the oldest request's, whatever its place:
        no hold makes anyone wait longer than the window."""
        if not ordered:
            return False
        room = self.static_bs - self._holding_rows()
        head = ordered[:self._coalesce.enough_prompts]
        seen = Arrivals(waiting_prompts=len(ordered), waiting_tokens=sum(st.prompt_len for st in head),
                        oldest_wait_s=time.perf_counter() - self.waiting[0].handle.submitted_at,
                        admissible=min(len(self.free_slots), room), decoding=bool(self.running),
                        continuing=continuing)
        return hold_arrivals(self._coalesce, seen)

    def _prefill(self, plan: list[tuple[_Running, int]]) -> None:
        """One ``model.prefill_batch`` over every planned piece; on failure each of them ends in an error.
        On the side stream (:mod:`.prefill_stream`) the pieces land once the call is done."""
        t0 = time.perf_counter()
        done = None
        try:
            pieces = self._pieces(plan)
            def call() -> None:
                self.model.prefill_batch(self.cache, pieces, graphs=self.prefill_graphs)

            if self._side_prefill is not None:
                done = self._side_prefill.run(call)
            elif self._gpu_spans is not None:
                self._gpu_spans.time("prefill", call)
            else:
                call()
        except Exception as exc:
            log.exception("prefill failed")
            for st, _ in plan:
                self._free_slot(st.slot)
                self._dequeued()
                st.handle.post(Event("error", reason=f"prefill failed: {type(exc).__name__}: {exc}"))
            return
        finally:
            self.stats.prefill_s += time.perf_counter() - t0
        self.stats.prefill_calls += 1
        if self._checks and done is not None:
            done.synchronize()
        self._count_pieces(plan, f"prefill call {self.stats.prefill_calls}")
        if done is not None:
            self._prefills.append(_PrefillInFlight(plan, done))
        else:
            self._prefilled(plan)

    @staticmethod
    def _pieces(plan: list[tuple[_Running, int]]) -> list[Any]:
        """The planned pieces as the model takes them: each request's next ``n`` prompt tokens."""
        from ttsfleet.inference.model import PrefillPiece

        return [PrefillPiece(st.slot, st.req.prompt[:, st.prefilled:st.prefilled + n], st.prefilled)
                for st, n in plan]

    def _count_pieces(self, plan: list[tuple[_Running, int]], what: str) -> None:
        """A prefill call's or mixed step's pieces onto /metrics, and checked (with the engine's checks
        on: the cache must be done with them) before anything reads them."""
        tokens = sum(n for _, n in plan)
        if self._checks:
            check_prefill(self.cache, [(st.slot, st.prefilled + n) for st, n in plan],
                          f"{what} ({tokens} rows)")
        if self.metrics is not None:
            self.metrics["inference_prefill_tokens"].labels(self.label).inc(tokens)

    def _land_prefills(self) -> None:
        """Land the side-stream prefill calls that are done, oldest first (one stream: in order). With
        nothing decoding the loop would only spin on them, so it waits for the oldest instead. Joining
        at the next step (``TTSFLEET_PREFILL_JOIN=next-step``) lands every call now and orders the
        engine's stream after it on the GPU instead."""
        side = self._side_prefill
        while self._prefills:
            call = self._prefills[0]
            if not call.done.query():
                if side is not None and side.joins_next_step:
                    side.order_after(call.done)
                elif self.running or self._in_flight:
                    return
                else:
                    call.done.synchronize()
            self._prefills.popleft()
            self._prefilled(call.plan)

    def _holding_rows(self) -> int:
        """Requests holding a slot toward the decode batch: running, mid-prompt, or in a prefill call
        not yet landed."""
        return (len(self.running) + len(self.prefilling) + len(self._riders)
                + sum(len(call.plan) for call in self._prefills))

    def _prefilled(self, plan: list[tuple[_Running, int]]) -> None:
        """The planned pieces are in the cache: each request goes on prefilling, or joins the batch."""
        for st, n in plan:
            st.prefilled += n
            self.stats.prefill_chunks += 1
            self.stats.prefill_tokens += n
            if st.prefilled < st.prompt_len:
                self.prefilling.append(st)
                continue
            st.handle.prefilled_at = time.perf_counter()
            if st.req.keep_prefix:
                self._keep_prefix(st)
            if not st.prefix_only:
                self._join(st)

    def _keep_prefix(self, st: _Running) -> None:
        """Hand the prompt's head back (Event "prefix"; for a prefix-only job its "done", and its slot
        is freed: nothing of it decodes)."""
        from ttsfleet.inference.prefix import snapshot_prefix

        prefix = snapshot_prefix(self.cache, st.slot, st.req.prompt[:, :st.req.keep_prefix])
        self.stats.prefixes_kept += 1
        if not st.prefix_only:
            st.handle.post(Event("prefix", prefix=prefix))
            return
        self._free_slot(st.slot)
        self._dequeued()
        st.handle.post(Event("done", reason="prefix", prefix=prefix))

    def _join(self, st: _Running) -> None:
        """A fully prefilled request takes the next decode batch row."""
        row = len(self.running)
        self.running.append(st)
        self.window_buf[row].fill_(-1)
        self.slots_buf[row].fill_(st.slot)  # not ``[row] = slot``: that copies from the host and syncs
        self._pad_rows = (0, 0)  # row may have been a pad row: the next padded step sets them again
        with self._admit_lock:
            self._queued -= 1
            self.stats.running = len(self.running)

    # ------------------------------------------------------------------ decode, pipelined
    def padded_size(self, bs: int) -> int:
        """The static batch size a step of ``bs`` rows runs at (itself beyond the largest bucket)."""
        if not self.cfg.pad_to_buckets:
            return bs
        return next((b for b in self.buckets if b >= bs), bs)

    def _launch_step(self) -> None:
        """Queue one decode step over the running batch and its frames' copy to the host (no wait)."""
        import torch
        from ttsfleet.kernels import prev_tokens_shift_

        t0 = time.perf_counter()
        bs = len(self.running)
        pbs = self.padded_size(bs)
        if pbs > bs and self._pad_rows != (bs, pbs):  # rows past bs point at the pad slot already
            self.slots_buf[bs:pbs] = self.pad_slot
            self._pad_rows = (bs, pbs)
        sampling = self._sampling_batch(pbs)
        window = self.window_buf[:pbs]
        start = GpuSpans.mark() if self._gpu_spans is not None else None
        riders = self._riders  # cleared once landed: if the step fails, the loop's exit tells them
        if riders:
            frames = self._mixed_step(riders, bs, pbs, sampling, window)
        elif self.graphs is not None and pbs in self.graphs.graphs and sampling.fusable:
            frames = self.graphs.replay(pbs, sampling)
        else:
            frames = self.model.decode_step(self.cache, self.slots_buf[:pbs], sampling, window)
        prev_tokens_shift_(window, frames[:, 1:].to(torch.int32).contiguous())
        if pbs > bs:
            self._reset_pad_slot()
        if self._checks:
            mc = self.model.config
            check_step(self.cache, self.slots_buf, frames,
                       StepRows([st.slot for st in self.running], pbs, self.pad_slot, self.stats.steps),
                       (int(mc.vocab_size), int(mc.codebook_size)), self.model)
        step = _StepInFlight(rows=list(self.running))
        if self.device.type == "cuda":
            buf = self._host_buf(len(self._in_flight), frames.shape)
            buf[:bs].copy_(frames[:bs], non_blocking=True)
            step.host, step.done = buf, GpuSpans.mark()
            self._gpu_spans.add("decode", start, step.done)
        else:
            step.host = frames[:bs].clone()
        self._in_flight.append(step)
        self.stats.decode_s += time.perf_counter() - t0
        if riders:  # in the cache as far as the stream goes: they join the next step
            self._riders = []
            self._rode(riders)

    def _mixed_step(self, riders: list[tuple[_Running, int]], bs: int, pbs: int, sampling: Any,
                    window: Any) -> Any:
        """The step's frames (its first half from a graph where one is captured), then their slow
        half and the riders' pieces in one pass (:meth:`DualARModel.decode_with_prefill`)."""
        graphs = self.graphs
        if graphs is not None and pbs in graphs.fronts and sampling.fusable:
            frames = graphs.replay(pbs, sampling, front=True)
        else:
            frames = self.model.decode_front(self.cache, self.slots_buf[:pbs], sampling, window)
        pieces = self._pieces(riders)
        for call in self._prefills:  # a side call in flight uses the same prefill graphs' buffers
            SidePrefill.order_after(call.done)
        self.model.decode_with_prefill(self.cache, self.slots_buf[:bs], frames[:bs], pieces,
                                       graphs=self.prefill_graphs)
        return frames

    def _rode(self, riders: list[tuple[_Running, int]]) -> None:
        """Count a mixed step's pieces (as a prefill call's) and land them."""
        self.stats.mixed_steps += 1
        self._count_pieces(riders, f"mixed step {self.stats.mixed_steps}")
        self._prefilled(riders)

    def _reset_pad_slot(self) -> None:
        """Empty the pad slot every :data:`PAD_RESET_STEPS` padded steps (each adds one position).

        Why not after every step: py-spy at c=64 on the H200 (2026-12-02) found the engine thread
        inside this release in 25 % of its samples. Read then as GIL hand-offs; it was the release's
        one-element assignments from the host, each a wait for the stream to drain (found at c=128
        on 2026-12-07; :meth:`DualARModel.release` uses ``fill_`` since). Padded rows only ever attend
        to the pad slot's few positions, so letting it grow a little costs nothing measurable."""
        self._pad_growth += 1
        if self._pad_growth >= min(PAD_RESET_STEPS, self.max_seq_len // 2):
            self.model.release(self.cache, self.pad_slot)
            self._pad_growth = 0

    def _host_buf(self, i: int, shape: Any) -> Any:
        """Pinned host buffer ``i`` for a step's frames (one per in-flight step, reused)."""
        import torch

        while len(self._host_bufs) <= self.cfg.pipeline_depth:
            self._host_bufs.append(torch.empty((self.static_bs, *shape[1:]), dtype=torch.int64,
                                               pin_memory=True))
        return self._host_bufs[(self.stats.steps + i) % len(self._host_bufs)]

    def _finish_step(self, step: _StepInFlight) -> None:
        """Read one step's frames (waiting for it if needed); hand codes on, retire finished rows."""
        t0 = time.perf_counter()
        if step.done is not None:
            step.done.synchronize()
        host = step.host.numpy()
        self.stats.wait_s += time.perf_counter() - t0
        if self._gpu_spans is not None:
            self._gpu_spans.harvest()  # this step's span and every span before it are done
        now = time.perf_counter()
        self.stats.steps += 1
        bs = len(step.rows)
        if self.metrics is not None:
            self.metrics["inference_batch_size"].labels(self.label).observe(bs)
        new_frames = 0
        finished: list[tuple[_Running, str]] = []
        for i, st in enumerate(step.rows):
            if st.retired:  # ended at an earlier step; this row's frame is the pipeline's spare
                self.stats.spare_rows += 1
                continue
            if int(host[i, 0]) == self.im_end_id and not st.req.ignore_eos:
                finished.append((st, "stop"))
                continue
            if st.handle.first_frame_at is None:
                st.handle.first_frame_at = now
            st.generated += 1
            new_frames += 1
            st.pending.append(host[i, 1:].copy())
            if st.generated >= st.req.max_new_tokens:
                finished.append((st, "length"))
            else:
                if len(st.pending) >= st.req.chunk_frames_after(st.chunks_sent, self._chunk_ramp):
                    self._send_codes(st, final=False)
        self.stats.frames += new_frames
        if self.metrics is not None and new_frames:
            self.metrics["inference_frames"].labels(self.label).inc(new_frames)
        for st, reason in finished:
            self._retire(self.running.index(st), reason)

    def _sampling_batch(self, pbs: int) -> Any:
        """The running rows' sampling tensors, rebuilt only when the batch's requests change.

        Building them costs ~10 host->device copies; in steady decoding the batch is the same for
        many steps, so one build serves them all.
        """
        key = (pbs, *(st.handle.rid for st in self.running))
        if self._sampling_key != key:
            params = [st.req.sampling for st in self.running]
            pad = pbs if pbs > len(params) else None
            host = self._SamplingBatch.from_params(params, "cpu", pad_to=pad)
            moved = {k: v.to(self.device, non_blocking=True) for k, v in host.tensors().items()}  # no sync
            self._sampling = self._SamplingBatch(**moved, fusable=host.fusable)
            self._sampling_key = key
        return self._sampling

    def _send_codes(self, st: _Running, final: bool, reason: str = "") -> None:
        codes = np.stack(st.pending, axis=1) if st.pending else np.zeros((self.num_codebooks, 0), np.int64)
        st.pending = []
        if st.chunks_sent == 0:
            st.handle.first_codes_at = time.perf_counter()
        st.chunks_sent += 1
        self._codec_q.put(CodesChunk(st.handle, codes, final, reason, st.generated))

    def _retire(self, row: int, reason: str) -> None:
        """Finish running[row]: flush its audio, free its slot, keep the batch rows dense."""
        st = self.running[row]
        st.retired = True
        if reason == "cancelled":
            self._codec_q.put(DropStream(st.handle))
        else:
            self._send_codes(st, final=True, reason=reason)
        self._free_slot(st.slot)
        last = len(self.running) - 1
        if row != last:  # swap-remove: move the last row into the hole
            self.running[row] = self.running[last]
            self.window_buf[row].copy_(self.window_buf[last])
            self.slots_buf[row] = self.slots_buf[last]
        self.running.pop()
        self._pad_rows = (0, 0)  # row ``last`` still names a request's slot: no longer a pad row
        with self._admit_lock:
            self.stats.running = len(self.running)

    def _publish(self) -> None:
        if self.metrics is None:
            return
        m, lab = self.metrics, self.label
        m["inference_running_batch_size"].labels(lab).set(len(self.running))
        m["inference_kv_slots_used"].labels(lab).set(self.max_slots - len(self.free_slots))
        m["inference_queue_depth"].labels(lab).set(self.queue_depth)

    # ------------------------------------------------------------------ codec thread
    def _codec_main(self) -> None:
        """Turn codes into audio: one batched streaming decode per round for every request with frames.

        Each request owns a slot of the batched decoder's stream state (like a KV slot; it is kept
        until its last chunk is decoded, which may be after its KV slot is freed). A round groups
        the requests by how many frames they decode now (the largest power of two of their backlog,
        at most ``codec_max_frames``) and runs one call per group, so 64 streams cost a few calls,
        not 64. A request's remaining frames wait for the next round, which follows at once.
        """
        import torch

        torch.set_grad_enabled(False)
        if self.cfg.cpu_threads:
            torch.set_num_threads(self.cfg.cpu_threads)
        if self.device.type == "cuda":  # its own stream: codec kernels overlap the decode graphs
            torch.cuda.set_stream(torch.cuda.Stream(self.device))
            use_conv_autotuner()  # the fastest conv algorithm per shape, picked once
        decoder = None
        if self.codec is not None:
            with CAPTURE_LOCK:
                decoder = self._codec_decoder()
        codec = BatchedCodec(decoder, self.cfg.codec_max_frames, self.codec_meter, self.cancel,
                             gather_s=self.cfg.codec_gather_ms / 1000)
        try:
            while self._codec_pass(codec):
                pass
        except Exception as exc:  # a bug: fail the streams in the codec and mark the engine not alive
            log.exception("codec loop died")
            self._dead = f"codec failed: {type(exc).__name__}: {exc}"
            codec.fail_all(self._dead)

    def _codec_decoder(self) -> Any:
        """The batched slot decoder, its graphs captured for every stream bucket x frame count."""
        return build_slot_decoder(self.codec, self._decoder_plan())

    def _decoder_plan(self) -> DecoderPlan:
        return DecoderPlan(slots=self.codec_slots, max_seq_len=self.max_seq_len,
                           graphs=self.device.type == "cuda" and self.cfg.codec_graphs,
                           graph_max_batch=self.max_slots, compile_mode=self.cfg.codec_compile,
                           max_frames=self.cfg.codec_max_frames, cpu_threads=self.cfg.cpu_threads,
                           gather_s=self.cfg.codec_gather_ms / 1000,
                           channels_last=self.cfg.codec_channels_last)

    def _codec_pass(self, codec: BatchedCodec) -> bool:
        """Take the queued messages, then one decode round; False once told to stop."""
        if codec.has_work():
            msgs = []
        else:  # block while idle: until codes come, or until codes already here fall due
            try:
                msgs = [self._codec_q.get(timeout=codec.wake_in())]
            except queue.Empty:
                msgs = []
        while True:
            try:
                msgs.append(self._codec_q.get_nowait())
            except queue.Empty:
                break
        if not codec.apply(msgs):
            return False
        codec.round()
        return True


@dataclass
class _PrefillInFlight:
    """A prefill call on the side stream: its plan (request, tokens) and its completion (query())."""

    plan: list[tuple[_Running, int]]
    done: Any


@dataclass
class _StepInFlight:
    """A launched decode step: its rows' requests at launch, the host copy of its frames, and when
    that copy is complete (a CUDA event; None on CPU, where the copy is done at launch)."""

    rows: list[_Running]
    host: Any = None
    done: Any = None


class _DecodeGraphs:
    """One captured CUDA graph of ``model.decode_step`` per padded batch size.

    Graphs replay on fixed storage: the engine's ``slots_buf`` / ``window_buf`` rows, the model's
    static cache, and one static :class:`SamplingBatch` per size whose tensors are refilled before
    each replay. Warm-up and capture run on the scratch pad slot (released afterwards), so no
    request's KV is touched.
    """

    def __init__(self) -> None:
        self.graphs: dict[int, tuple[Any, Any, Any]] = {}
        #: ``model.decode_front`` per size, for mixed steps (:mod:`.mixed_step`; captured when on)
        self.fronts: dict[int, tuple[Any, Any, Any]] = {}
        self._filled: dict[tuple[int, bool], Any] = {}  # (size, front) -> the SamplingBatch copied in last

    @classmethod
    def capture(cls, eng: Engine) -> _DecodeGraphs | None:
        import torch

        if eng.device.type != "cuda" or not eng.cfg.pad_to_buckets:
            log.warning("cuda_graphs needs a CUDA device and pad_to_buckets; decoding eagerly")
            return None
        from ttsfleet.inference.sampling import SamplingParams
        from ttsfleet.kernels.workspaces import new_owner, workspace_scope

        self = cls()
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        try:
            # the kernels' workspaces these graphs bake: made by the warm-ups, shared by no eager launch
            with workspace_scope(new_owner("decode-graphs")):
                for bs in reversed(eng.buckets):  # largest first: later graphs reuse its memory
                    eng.slots_buf[:bs] = eng.pad_slot
                    sampling = eng._SamplingBatch.from_params([SamplingParams(seed=0)] * bs, eng.device)
                    slots, window = eng.slots_buf[:bs], eng.window_buf[:bs]
                    self.graphs[bs] = _capture_step(eng.model.decode_step, eng, slots, sampling, window, pool)
                    if eng._mixed:
                        front = eng._SamplingBatch.from_params([SamplingParams(seed=0)] * bs, eng.device)
                        self.fronts[bs] = _capture_step(eng.model.decode_front, eng, slots, front, window,
                                                        pool)
                    eng.model.release(eng.cache, eng.pad_slot)
            torch.cuda.synchronize()
        except Exception:
            log.exception("CUDA graph capture failed; decoding eagerly")
            eng.model.release(eng.cache, eng.pad_slot)
            return None
        finally:
            eng.window_buf.fill_(-1)
        log.info("captured %d decode graphs (batch sizes %s)%s in %.1f s", len(self.graphs),
                 sorted(self.graphs), f" and {len(self.fronts)} of their first halves" if self.fronts else "",
                 time.perf_counter() - t0)
        return self

    def replay(self, bs: int, sampling: Any, front: bool = False) -> Any:
        """Replay size ``bs`` on ``sampling``'s rows, copied into the graph's static inputs only when
        it is not the batch copied there last (the graph only reads them). Why: the engine hands the
        same batch object for every step until the running requests change, and the nine small
        copies per step were 12 % of the engine thread's samples on the H200 (2026-12-03d).
        ``front``: the step's first half (a mixed step's)."""
        graph, static, out = (self.fronts if front else self.graphs)[bs]
        if self._filled.get((bs, front)) is not sampling:
            for name, value in sampling.tensors().items():
                getattr(static, name).copy_(value, non_blocking=True)
            self._filled[(bs, front)] = sampling
        graph.replay()
        return out


def _capture_step(fn: Any, eng: Engine, slots: Any, sampling: Any, window: Any,
                  pool: Any) -> tuple[Any, Any, Any]:
    """``fn(cache, slots, sampling, window)`` (a decode step or its first half) captured after its
    warm-ups: (the graph, its static sampling batch, its output)."""
    graph, out = capture_after_warmup(lambda: fn(eng.cache, slots, sampling, window), pool)
    return graph, sampling, out
