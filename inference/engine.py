"""The continuous-batching engine: one thread owns the model, one owns the codec, queues connect them.

Why this shape (sglang's scheduler style): all batch state — ``waiting`` (admitted, no KV slot yet),
``running`` (holding a slot, decoding one frame per step) and finished — lives in the engine
thread and is mutated only there. HTTP handlers talk to it through a thread-safe inbox and get
results back on their own asyncio queue, so no lock guards model state. A request moves
``waiting`` → ``prefilling`` (holds a KV slot, prompt partly prefilled) → ``running`` → finished.
Every loop iteration:

1. ingest new requests and cancellations from the inbox; free the slots of cancelled requests
   (waiting, mid-prefill or running);
2. chunked prefill, separately from decode: continue the requests already prefilling (in
   turn), then move waiting requests into free KV slots, spending at most
   ``prefill_token_budget`` prompt tokens between two decode steps. A prompt is fed to
   ``model.prefill`` in chunks of at most ``prefill_chunk_tokens`` that continue its slot where the
   previous chunk stopped; each request advances by at most one chunk per iteration, and the last
   chunk of the iteration may be cut short by the budget. So a long prompt (a voice-cloning reference
   of hundreds of frames) is spread over several iterations and delays each decode step of the
   running batch by a bounded amount. ``prefill_chunk_tokens = 0`` turns chunking off: whole
   prompts, always at least one per iteration, more while they fit the budget;
3. a request whose last chunk ran joins the running batch, and one decode step runs over the whole
   running batch — new requests join as soon as a slot frees and their prompt is in;
4. shift each row's ``previous_tokens`` window (int32 ``[bs, W, cw]``, contract enforced by
   :func:`ttsfleet.kernels.prev_tokens_shift_`), retire rows on EOS or ``max_new_tokens``.

The decode batch lives in static buffers (slots, window; one row per KV slot); each step uses
the leading ``bs`` rows, kept dense by swap-removal. On CUDA a step is padded up to the next
bucket size (1, 2, 4, 8, 16, 24, … ``cuda_graph_max_bs``; padded rows write into a scratch slot)
and replays the CUDA graph captured for that size on the same storage. Decoded frames go in
chunks to the codec thread, which turns codes into audio with one streaming decoder per request
and hands chunks to the HTTP side: audio leaves while later frames are still decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger("ttsfleet.inference.engine")

#: Main-token history the sampler looks at (fish-speech: repetition-aware sampling window).
DEFAULT_WINDOW = 16


class EngineOverloaded(Exception):
    """The waiting queue is full (HTTP 429)."""


class EngineStopped(Exception):
    """The engine is shutting down or died (HTTP 503)."""


class PromptTooLong(ValueError):
    """The prompt does not fit the model's context (HTTP 400)."""


@dataclass
class Event:
    """What a request's handler receives: audio chunks, then one ``done`` or ``error``."""

    kind: str  # "audio" | "done" | "error"
    audio: np.ndarray | None = None
    codes: np.ndarray | None = None  # [num_codebooks, frames] behind this audio chunk
    frames: int = 0
    reason: str = ""


class RequestHandle:
    """The HTTP side of one request: an asyncio queue the engine threads post events to."""

    def __init__(self, rid: int, loop: asyncio.AbstractEventLoop):
        self.rid = rid
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.submitted_at = time.perf_counter()
        self.first_frame_at: float | None = None

    def post(self, ev: Event) -> None:
        """Thread-safe: called from the engine or codec thread."""
        with contextlib.suppress(RuntimeError):  # loop closed: the client is gone
            self.loop.call_soon_threadsafe(self.events.put_nowait, ev)

    async def next(self) -> Event:
        return await self.events.get()


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


@dataclass
class _Running:
    """Engine-thread state of one admitted request."""

    req: GenerationRequest
    handle: RequestHandle
    slot: int = -1
    prefilled: int = 0  # prompt tokens already in the slot (chunked prefill)
    generated: int = 0
    pending: list[np.ndarray] = field(default_factory=list)  # codes not yet sent to the codec
    chunks_sent: int = 0


@dataclass
class EngineConfig:
    max_running_requests: int = 16
    max_queue: int = 64
    cuda_graph_max_bs: int = 16
    max_seq_len: int | None = None
    prefill_token_budget: int = 1024  # prompt tokens prefilled per loop iteration (>= 1)
    #: Largest prompt piece one ``model.prefill`` call runs; a longer prompt is prefilled over several
    #: loop iterations, one chunk per iteration, with decode steps in between. 0 = whole prompts.
    prefill_chunk_tokens: int = 256
    window: int = DEFAULT_WINDOW
    device: str = "cpu"
    #: Pad each decode batch up to the next captured size (CUDA graphs); padded rows use a scratch slot.
    pad_to_buckets: bool = False
    #: torch intra-op threads for the engine and codec threads (0 = leave torch's default). On a
    #: shared CPU, more threads than free cores make OpenMP spin: 1 is much faster there.
    cpu_threads: int = 0
    #: Capture one CUDA graph of ``model.decode_step`` per batch bucket at start (CUDA only; needs
    #: ``pad_to_buckets``). A capture failure logs and falls back to eager decoding.
    cuda_graphs: bool = False


def batch_buckets(max_bs: int) -> list[int]:
    """Decode batch sizes a CUDA graph is captured for: 1, 2, 4, 8, then steps of 8 up to ``max_bs``."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_bs]
    sizes += list(range(16, max_bs, 8))
    return sorted(set(sizes + [max_bs]))


class _Stats:
    """Counters the engine thread writes and anyone may read (plain ints; reads may be a step old)."""

    def __init__(self) -> None:
        self.waiting = 0
        self.running = 0
        self.frames = 0
        self.steps = 0
        self.prefill_chunks = 0  # model.prefill calls
        self.prefill_tokens = 0


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
        mc = model.config
        self.num_codebooks = int(mc.num_codebooks)
        self.im_end_id = int(mc.im_end_id)
        self.max_seq_len = int(min(config.max_seq_len or mc.max_seq_len, mc.max_seq_len))
        self.max_slots = config.max_running_requests
        # One extra scratch slot receives the padded rows' writes when batches are padded.
        self.pad_slot = self.max_slots
        self.cache = model.new_cache(self.max_slots + (1 if config.pad_to_buckets else 0), self.max_seq_len)
        self.free_slots: deque[int] = deque(range(self.max_slots))
        self.device = torch.device(config.device)
        # Static decode buffers (row i = running[i]); a graph for bs uses rows [:bs].
        self.static_bs = max(config.cuda_graph_max_bs, self.max_slots)
        self.window_buf = torch.full((self.static_bs, config.window, self.num_codebooks), -1,
                                     dtype=torch.int32, device=self.device)
        self.slots_buf = torch.zeros(self.static_bs, dtype=torch.long, device=self.device)
        self.buckets = batch_buckets(config.cuda_graph_max_bs)
        self.graphs: _DecodeGraphs | None = None
        self._sampling_key: tuple[int, ...] = ()
        self._sampling: Any = None
        if config.prefill_token_budget < 1 or config.prefill_chunk_tokens < 0:
            raise ValueError("prefill_token_budget must be >= 1 and prefill_chunk_tokens >= 0")
        self.waiting: deque[_Running] = deque()
        self.prefilling: deque[_Running] = deque()  # hold a slot, prompt not fully prefilled yet
        self.running: list[_Running] = []
        self.stats = _Stats()
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._codec_q: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._admit_lock = threading.Lock()
        self._queued = 0  # submitted and not yet holding a slot (guarded by _admit_lock)
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._dead: str | None = None
        self.metrics = collectors
        self.label = model_label
        self._threads = [threading.Thread(target=self._engine_main, name="ttsfleet-engine", daemon=True),
                         threading.Thread(target=self._codec_main, name="ttsfleet-codec", daemon=True)]
        if collectors is not None:
            self.attach_metrics(collectors, model_label)

    def attach_metrics(self, collectors: Any, label: str) -> None:
        """Start exporting (after a warm-up, so it does not show up as traffic)."""
        collectors["inference_kv_slots_total"].labels(label).set(self.max_slots)
        collectors["inference_kv_slots_used"].labels(label).set(self.max_slots - len(self.free_slots))
        collectors["inference_queue_depth"].labels(label).set(0)
        collectors["inference_running_batch_size"].labels(label).set(0)
        self.label = label
        self.metrics = collectors

    # ------------------------------------------------------------------ HTTP-side API (event loop)
    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        self._codec_q.put(("stop", None))
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)

    @property
    def alive(self) -> bool:
        return self._dead is None and all(t.is_alive() for t in self._threads)

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
        with self._admit_lock:
            free_now = self.max_slots - self.stats.running
            if not admitted and self._queued - free_now >= self.cfg.max_queue:
                raise EngineOverloaded(f"queue full ({self.cfg.max_queue} waiting)")
            self._queued += 1
        handle = RequestHandle(next(self._ids), loop)
        self._inbox.put(("submit", _Running(req=req, handle=handle)))
        return handle

    def cancel(self, handle: RequestHandle) -> None:
        """The client went away: free its slot at the next step (idempotent)."""
        if not handle.cancelled.is_set():
            handle.cancelled.set()
            self._inbox.put(("wake", None))

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
                self.graphs = _DecodeGraphs.capture(self)
            while not self._stop.is_set():
                idle = not self.running and not self.waiting and not self.prefilling
                self._ingest(block=idle)
                self._drop_cancelled()
                self._admit()
                if self.running:
                    self._decode_step()
                self._publish()
        except Exception as exc:  # a bug, not bad input: fail everyone loudly, mark not alive
            log.exception("engine loop died")
            self._dead = f"engine failed: {type(exc).__name__}: {exc}"
            for st in list(self.running) + list(self.prefilling) + list(self.waiting):
                st.handle.post(Event("error", reason=self._dead))
        finally:
            self._drain_inbox_on_exit()

    def _drain_inbox_on_exit(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                item.handle.post(Event("error", reason="engine stopped"))

    def _ingest(self, block: bool) -> None:
        try:
            kind, item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if kind == "submit":
                self.waiting.append(item)
            try:
                kind, item = self._inbox.get_nowait()
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

    def _admit(self) -> None:
        """Chunked prefill within the token budget: continue prefilling requests, then start waiting ones.

        Each request advances by at most one chunk per call; one whose whole prompt is in joins the
        running batch (and so the decode step that follows).
        """
        budget = self.cfg.prefill_token_budget
        chunk = self.cfg.prefill_chunk_tokens
        if chunk <= 0:  # chunking off: whole prompts, at least one per iteration
            admitted = 0
            while self.waiting and self.free_slots and len(self.running) < self.static_bs:
                plen = int(self.waiting[0].req.prompt.shape[-1])
                if admitted and plen > budget:
                    break  # the rest waits for the next iteration; decode keeps going meanwhile
                st = self.waiting.popleft()
                st.slot = self.free_slots.popleft()
                if self._prefill_chunk(st, plen):
                    self._join(st)
                    budget -= plen
                    admitted += 1
            return
        for _ in range(len(self.prefilling)):  # in turn; each one advances by one chunk at most
            if budget <= 0:
                return
            st = self.prefilling.popleft()
            n = min(chunk, budget, int(st.req.prompt.shape[-1]) - st.prefilled)
            budget -= n
            self._advance(st, n)
        while (budget > 0 and self.waiting and self.free_slots
               and len(self.running) + len(self.prefilling) < self.static_bs):
            st = self.waiting.popleft()
            st.slot = self.free_slots.popleft()
            n = min(chunk, budget, int(st.req.prompt.shape[-1]))
            budget -= n
            self._advance(st, n)

    def _advance(self, st: _Running, n: int) -> None:
        """Prefill ``st``'s next ``n`` prompt tokens; then it joins the batch or waits for its next chunk."""
        if not self._prefill_chunk(st, n):
            return
        if self._prefill_done(st):
            self._join(st)
        else:
            self.prefilling.append(st)

    @staticmethod
    def _prefill_done(st: _Running) -> bool:
        return st.prefilled >= int(st.req.prompt.shape[-1])

    def _prefill_chunk(self, st: _Running, n: int) -> bool:
        """Prefill the next ``n`` prompt tokens of ``st`` into its slot; on failure end it with an error."""
        start = st.prefilled
        try:
            piece = st.req.prompt[:, start:start + n].to(self.device)
            self.model.prefill(self.cache, st.slot, piece, start=start)
        except Exception as exc:
            log.exception("prefill failed")
            self._free_slot(st.slot)
            self._dequeued()
            st.handle.post(Event("error", reason=f"prefill failed: {type(exc).__name__}: {exc}"))
            return False
        st.prefilled = start + n
        self.stats.prefill_chunks += 1
        self.stats.prefill_tokens += n
        return True

    def _join(self, st: _Running) -> None:
        """A fully prefilled request takes the next decode batch row."""
        row = len(self.running)
        self.running.append(st)
        self.window_buf[row].fill_(-1)
        self.slots_buf[row] = st.slot
        with self._admit_lock:
            self._queued -= 1
            self.stats.running = len(self.running)

    def padded_size(self, bs: int) -> int:
        """The static batch size a step of ``bs`` rows runs at (itself beyond the largest bucket)."""
        if not self.cfg.pad_to_buckets:
            return bs
        return next((b for b in self.buckets if b >= bs), bs)

    def _decode_step(self) -> None:
        from ttsfleet.kernels import prev_tokens_shift_

        bs = len(self.running)
        pbs = self.padded_size(bs)
        if pbs > bs:
            self.slots_buf[bs:pbs] = self.pad_slot
        sampling = self._sampling_batch(pbs)
        window = self.window_buf[:pbs]
        if self.graphs is not None and pbs in self.graphs.graphs and sampling.fusable:
            frames = self.graphs.replay(pbs, sampling)
        else:
            frames = self.model.decode_step(self.cache, self.slots_buf[:pbs], sampling, window)
        codes = frames[:, 1:].to(torch_int32()).contiguous()
        prev_tokens_shift_(window, codes)
        if pbs > bs:
            self.model.release(self.cache, self.pad_slot)
        host = frames[:bs].cpu().numpy()
        now = time.perf_counter()
        self.stats.steps += 1
        if self.metrics is not None:
            self.metrics["inference_batch_size"].labels(self.label).observe(bs)
        done: list[tuple[int, str]] = []
        for i, st in enumerate(self.running):
            if int(host[i, 0]) == self.im_end_id and not st.req.ignore_eos:
                done.append((i, "stop"))
                continue
            if st.handle.first_frame_at is None:
                st.handle.first_frame_at = now
            st.generated += 1
            st.pending.append(host[i, 1:].copy())
            if st.generated >= st.req.max_new_tokens:
                done.append((i, "length"))
            else:
                want = st.req.first_chunk_frames if st.chunks_sent == 0 else st.req.chunk_frames
                if len(st.pending) >= want:
                    self._send_codes(st, final=False)
        new_frames = bs - sum(1 for _, r in done if r == "stop")
        self.stats.frames += new_frames
        if self.metrics is not None and new_frames:
            self.metrics["inference_frames"].labels(self.label).inc(new_frames)
        for i, reason in sorted(done, reverse=True):
            self._retire(i, reason)

    def _sampling_batch(self, pbs: int) -> Any:
        """The running rows' sampling tensors, rebuilt only when the batch's requests change.

        Building them costs ~10 host->device copies; in steady decoding the batch is the same for
        many steps, so one build serves them all.
        """
        key = (pbs, *(st.handle.rid for st in self.running))
        if self._sampling_key != key:
            params = [st.req.sampling for st in self.running]
            pad = pbs if pbs > len(params) else None
            self._sampling = self._SamplingBatch.from_params(params, self.device, pad_to=pad)
            self._sampling_key = key
        return self._sampling

    def _send_codes(self, st: _Running, final: bool, reason: str = "") -> None:
        codes = np.stack(st.pending, axis=1) if st.pending else np.zeros((self.num_codebooks, 0), np.int64)
        st.pending = []
        st.chunks_sent += 1
        self._codec_q.put(("codes", (st.handle, codes, final, reason, st.generated)))

    def _retire(self, row: int, reason: str) -> None:
        """Finish running[row]: flush its audio, free its slot, keep the batch rows dense."""
        st = self.running[row]
        if reason == "cancelled":
            self._codec_q.put(("drop", st.handle))
        else:
            self._send_codes(st, final=True, reason=reason)
        self._free_slot(st.slot)
        last = len(self.running) - 1
        if row != last:  # swap-remove: move the last row into the hole
            self.running[row] = self.running[last]
            self.window_buf[row].copy_(self.window_buf[last])
            self.slots_buf[row] = self.slots_buf[last]
        self.running.pop()
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
        """Decode codes to audio. Under backlog, chunks of one request merge into one push (the codec's
        per-call cost dominates small pushes) and requests without audio yet go first (time to first
        audio does not queue behind long streams)."""
        import torch

        torch.set_grad_enabled(False)
        if self.cfg.cpu_threads:
            torch.set_num_threads(self.cfg.cpu_threads)
        if self.device.type == "cuda":  # its own stream: codec kernels overlap the decode graphs
            # (a high-priority stream was measured: the same time to first audio, lower throughput)
            torch.cuda.set_stream(torch.cuda.Stream(self.device))
        decoders: dict[int, Any] = {}
        pending: dict[int, _CodecJob] = {}  # insertion order = arrival order
        while True:
            items = [] if pending else [self._codec_q.get()]  # block only when idle
            while True:
                try:
                    items.append(self._codec_q.get_nowait())
                except queue.Empty:
                    break
            for kind, item in items:
                if kind == "stop":
                    return
                if kind == "drop":
                    pending.pop(item.rid, None)
                    decoders.pop(item.rid, None)
                    item.post(Event("done", reason="cancelled"))
                    continue
                handle, codes, final, reason, generated = item
                job = pending.get(handle.rid)
                if job is None:
                    pending[handle.rid] = _CodecJob(handle, [codes], final, reason, generated)
                else:
                    job.codes.append(codes)
                    job.final, job.reason, job.generated = final, reason, generated
            if not pending:
                continue
            rid = next((r for r in pending if r not in decoders), next(iter(pending)))
            self._codec_run(pending.pop(rid), decoders)

    def _codec_run(self, job: _CodecJob, decoders: dict[int, Any]) -> None:
        import torch

        handle = job.handle
        codes = np.concatenate(job.codes, axis=1)
        if self.codec is None:  # codes-only engine: no waveform, the codes are the result
            if codes.shape[1]:
                handle.post(Event("audio", audio=np.zeros(0, np.float32), codes=codes, frames=codes.shape[1]))
            if job.final:
                handle.post(Event("done", frames=job.generated, reason=job.reason))
            return
        try:
            dec = decoders.get(handle.rid)
            if dec is None:
                dec = decoders[handle.rid] = self.codec.stream_decoder()
            parts = []
            if codes.shape[1]:
                parts.append(np.asarray(dec.push(torch.from_numpy(codes).long()), dtype=np.float32))
            if job.final:
                parts.append(np.asarray(dec.flush(), dtype=np.float32))
                decoders.pop(handle.rid, None)
            audio = np.concatenate([p.reshape(-1) for p in parts]) if parts else np.zeros(0, np.float32)
            if audio.size or codes.shape[1]:
                handle.post(Event("audio", audio=audio, codes=codes, frames=codes.shape[1]))
            if job.final:
                handle.post(Event("done", frames=job.generated, reason=job.reason))
        except Exception as exc:
            log.exception("codec decode failed")
            decoders.pop(handle.rid, None)
            self.cancel(handle)  # stop decoding frames nobody can hear
            handle.post(Event("error", reason=f"codec failed: {type(exc).__name__}: {exc}"))


class _DecodeGraphs:
    """One captured CUDA graph of ``model.decode_step`` per padded batch size.

    Graphs replay on fixed storage: the engine's ``slots_buf`` / ``window_buf`` rows, the model's
    static cache, and one static :class:`SamplingBatch` per size whose tensors are refilled before
    each replay. Warm-up and capture run on the scratch pad slot (released afterwards), so no
    request's KV is touched.
    """

    def __init__(self) -> None:
        self.graphs: dict[int, tuple[Any, Any, Any]] = {}

    @classmethod
    def capture(cls, eng: Engine) -> _DecodeGraphs | None:
        import torch

        if eng.device.type != "cuda" or not eng.cfg.pad_to_buckets:
            log.warning("cuda_graphs needs a CUDA device and pad_to_buckets; decoding eagerly")
            return None
        from ttsfleet.inference.sampling import SamplingParams

        self = cls()
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        try:
            for bs in reversed(eng.buckets):  # largest first: later graphs reuse its memory
                eng.slots_buf[:bs] = eng.pad_slot
                sampling = eng._SamplingBatch.from_params([SamplingParams(seed=0)] * bs, eng.device)
                slots, window = eng.slots_buf[:bs], eng.window_buf[:bs]
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        eng.model.decode_step(eng.cache, slots, sampling, window)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = eng.model.decode_step(eng.cache, slots, sampling, window)
                self.graphs[bs] = (graph, sampling, out)
                eng.model.release(eng.cache, eng.pad_slot)
            torch.cuda.synchronize()
        except Exception:
            log.exception("CUDA graph capture failed; decoding eagerly")
            eng.model.release(eng.cache, eng.pad_slot)
            return None
        finally:
            eng.window_buf.fill_(-1)
        log.info("captured %d decode graphs (batch sizes %s) in %.1f s", len(self.graphs),
                 sorted(self.graphs), time.perf_counter() - t0)
        return self

    def replay(self, bs: int, sampling: Any) -> Any:
        graph, static, out = self.graphs[bs]
        for name, value in sampling.tensors().items():
            getattr(static, name).copy_(value, non_blocking=True)
        graph.replay()
        return out


@dataclass
class _CodecJob:
    handle: RequestHandle
    codes: list[np.ndarray]
    final: bool
    reason: str
    generated: int


def torch_int32() -> Any:
    import torch

    return torch.int32
