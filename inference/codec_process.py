"""The codec in a process of its own: the engine's codes go out over a pipe, audio comes back.

Why: the codec thread shares the engine thread's interpreter, so its Python work (grouping streams,
numpy, graph launches, building events) competes with the decode loop for one GIL. Measured on an
H200 (2026-12-03, ``benchmarks/inference_h200/2026-12-03c/``): ``bench engine`` at c=64 gives 4,494
frames/s codes only and 2,818 with the codec thread in the loop, and the engine thread's step
launches grew from 7 % to 30 % of its time (about 1 ms to 7 ms a step). In a child process the
codec's own work runs on another interpreter; the parent keeps two light threads — one forwards the
engine's codes (one pickle per batch of messages), one posts the returned audio to the requests.
The price: the child is a second CUDA context on the same GPU, whose kernels the GPU time-slices
with the engine's instead of overlapping them (without MPS); the side-by-side run says which wins.

Wire (one ``send`` per batch): to the child, the engine's own codec messages (``CodesChunk``,
``DropStream``, ``StopCodec``) with each request's handle replaced by a :class:`StreamRef`; back,
lists of tuples ``("ready", note)``, ``("event", rid, Event)``, ``("cancel", rid)`` (a failed decode:
stop decoding that request), ``("stats", calls, frames, codec_s)`` (the child's running totals, first
in their batch) and ``("dead", reason)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ttsfleet.inference.engine_messages import CodesChunk, DropStream, Event, StopCodec

log = logging.getLogger("ttsfleet.inference.codec_process")

#: How long :meth:`CodecProcess.stop` waits for the child to exit before killing it.
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CodecSource:
    """Where the child loads its codec from: what :func:`~ttsfleet.inference.codec.load_codec` takes
    (a preset name or a checkpoint path; random presets are seeded, so both processes hold the same
    weights)."""

    name_or_path: str
    device: str = "cpu"
    fast: bool = False
    seed: int = 0


@dataclass(frozen=True)
class StreamRef:
    """A request's handle as it crosses to the child: its id (the handle itself holds an event loop)."""

    rid: int


@dataclass(frozen=True)
class DecoderPlan:
    """The slot decoder the child builds: the same as the in-process codec thread's."""

    slots: int
    max_seq_len: int
    graphs: bool
    graph_max_batch: int
    compile_mode: str | None
    max_frames: int
    cpu_threads: int = 0
    gather_s: float = 0.0  # :mod:`ttsfleet.inference.codec_gather`'s window
    #: The decoder's conv layout (:class:`~ttsfleet.inference.codec.Decoder`): None follows the
    #: codec's (:func:`~ttsfleet.inference.codec.default_channels_last`); the server passes its own.
    channels_last: bool | None = None


class CodecProcess:
    """The parent's side: starts the child, forwards the engine's codec queue to it and posts what
    comes back to the requests' handles.

    ``cancel(handle)`` is the engine's cancel; ``on_dead(reason)`` marks the engine not alive."""

    def __init__(self, source: CodecSource, plan: DecoderPlan, codec_q: queue.SimpleQueue, counters: Any,
                 cancel: Callable[[Any], None], on_dead: Callable[[str], None]) -> None:
        self.source, self.plan = source, plan
        self.codec_q, self.counters = codec_q, counters
        self.cancel, self.on_dead = cancel, on_dead
        self.handles: dict[int, Any] = {}  # rid -> RequestHandle, from its first message to its end
        self.ready = threading.Event()
        self._stopping = threading.Event()
        self._proc: Any = None
        self._conn: Any = None
        self.threads = [threading.Thread(target=self._forward_main, name="ttsfleet-codec-send", daemon=True),
                        threading.Thread(target=self._receive_main, name="ttsfleet-codec-recv", daemon=True)]

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        self._conn, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=worker_main, args=(child, self.source, self.plan),
                                 name="ttsfleet-codec", daemon=True)
        self._proc.start()
        child.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """After the forwarder sent ``stop``: wait for the child, kill it if it hangs."""
        self._stopping.set()
        if self._proc is None:
            return
        self._proc.join(timeout)
        if self._proc.is_alive():
            log.warning("codec process did not exit in %.0f s; killing it", timeout)
            self._proc.kill()
            self._proc.join(timeout)

    # ---------------------------------------------------------------- parent threads
    def _forward_main(self) -> None:
        """Engine codec queue -> child: block for one message, take whatever else is queued, send."""
        while True:
            msgs = [self.codec_q.get()]
            while True:
                try:
                    msgs.append(self.codec_q.get_nowait())
                except queue.Empty:
                    break
            wire = []
            for msg in msgs:
                if isinstance(msg, CodesChunk | DropStream):  # the handle stays here, its id travels
                    self.handles[msg.handle.rid] = msg.handle
                    msg = dataclasses.replace(msg, handle=StreamRef(msg.handle.rid))
                wire.append(msg)
            stop = any(isinstance(msg, StopCodec) for msg in wire)
            if stop:  # before the child can exit on it: its end of the pipe is then no surprise
                self._stopping.set()
            try:
                self._conn.send(wire)
            except (OSError, ValueError):  # the child is gone: the receiver reports it
                return
            if stop:
                return

    def _receive_main(self) -> None:
        """Child -> requests: post each event to its handle; a lost child fails every open stream."""
        reason = "codec process exited"
        try:
            while True:
                for msg in self._conn.recv():
                    if msg[0] == "dead":
                        raise _ChildDied(msg[1])
                    self._handle(msg)
        except _ChildDied as exc:
            reason = str(exc)
        except (EOFError, OSError):
            if self._stopping.is_set():
                return
        log.error("%s", reason)
        self.on_dead(reason)
        for handle in list(self.handles.values()):
            handle.post(Event("error", reason=reason))
        self.handles.clear()

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "event":
            _, rid, ev = msg
            handle = self.handles.get(rid)
            if handle is None:
                return
            if ev.kind in ("done", "error"):
                self.handles.pop(rid, None)
            handle.post(ev)
        elif kind == "stats":  # the child's running totals (the engine's CodecMeter exports the growth)
            (_, self.counters.codec_calls, self.counters.codec_frames, self.counters.codec_s,
             self.counters.codec_rounds) = msg
        elif kind == "cancel":
            handle = self.handles.get(msg[1])
            if handle is not None:
                self.cancel(handle)
        elif kind == "ready":
            log.info("codec process ready: %s", msg[1])
            self.ready.set()


class _ChildDied(Exception):
    pass


# ---------------------------------------------------------------------- the child
def cuda_index(device: str) -> int:
    """The CUDA ordinal of ``cuda`` / ``cuda:N`` (``torch.cuda.set_device`` refuses a device without
    one: the first H200 run of the codec process failed to start on plain ``cuda``)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"{device!r} is not a CUDA device")
    return 0 if dev.index is None else dev.index


class _RemoteHandle:
    """Stands in for a request's handle in the child: its events go to the outbox."""

    def __init__(self, rid: int, outbox: list[tuple]) -> None:
        self.rid = rid
        self.outbox = outbox

    def post(self, ev: Any) -> None:
        self.outbox.append(("event", self.rid, ev))


class _Counters:
    def __init__(self) -> None:
        self.codec_calls = 0
        self.codec_frames = 0
        self.codec_s = 0.0
        self.codec_rounds = 0


def worker_main(conn: Any, source: CodecSource, plan: DecoderPlan) -> None:
    """The child: load the codec, build the decoder (graphs captured here), then serve rounds until
    told to stop or the parent goes away."""
    import torch
    from ttsfleet.inference.codec import load_codec
    from ttsfleet.inference.codec_batch import build_slot_decoder, use_conv_autotuner
    from ttsfleet.inference.mps import codec_client_note

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s (codec process): %(message)s")
    client_note = codec_client_note(source.device)  # MPS settings: before this process's CUDA context
    torch.set_grad_enabled(False)
    if plan.cpu_threads:
        torch.set_num_threads(plan.cpu_threads)
    t0 = time.perf_counter()
    try:
        if source.device.startswith("cuda"):
            torch.cuda.set_device(cuda_index(source.device))
            torch.cuda.set_stream(torch.cuda.Stream())  # as the codec thread: off the legacy default stream
            use_conv_autotuner()  # the fastest conv algorithm per shape, picked once
        codec = load_codec(source.name_or_path, device=source.device, fast=source.fast, seed=source.seed)
        decoder = build_slot_decoder(codec, plan)
    except Exception as exc:
        logging.getLogger(__name__).exception("codec process failed to start")
        conn.send([("dead", f"codec process failed to start: {type(exc).__name__}: {exc}")])
        return
    took = time.perf_counter() - t0
    conn.send([("ready", f"{source.name_or_path} on {source.device} in {took:.1f} s{client_note}")])
    with contextlib.suppress(EOFError, BrokenPipeError):  # the parent went away: nothing left to serve
        _serve(conn, decoder, plan.max_frames, plan.gather_s)


def _serve(conn: Any, decoder: Any, max_frames: int, gather_s: float = 0.0) -> None:
    from ttsfleet.inference.codec_batch import BatchedCodec

    outbox: list[tuple] = []
    counters = _Counters()
    handles: dict[int, _RemoteHandle] = {}
    batched = BatchedCodec(decoder, max_frames, counters, cancel=lambda h: outbox.append(("cancel", h.rid)),
                           gather_s=gather_s)

    def handle_of(ref: StreamRef) -> _RemoteHandle:
        return handles.setdefault(ref.rid, _RemoteHandle(ref.rid, outbox))

    while True:
        msgs = [] if batched.has_work() else _wait_for_codes(conn, batched.wake_in())  # block when idle
        while conn.poll():
            msgs.extend(conn.recv())
        if not batched.apply(msgs, handle_of):
            return
        try:
            batched.round()
        except Exception as exc:  # a bug: fail the streams, tell the parent, exit
            logging.getLogger(__name__).exception("codec loop died")
            reason = f"codec failed: {type(exc).__name__}: {exc}"
            batched.fail_all(reason)
            conn.send([*outbox, ("dead", reason)])
            return
        for rid in [r for r in handles if r not in batched.jobs]:  # streams that ended
            del handles[rid]
        if outbox:  # the counts first: the parent has them before it posts a request's end
            conn.send([("stats", counters.codec_calls, counters.codec_frames, counters.codec_s,
                        counters.codec_rounds), *outbox])
            outbox.clear()


def _wait_for_codes(conn: Any, timeout: float | None) -> list:
    """The next batch from the parent, or none once ``timeout`` seconds pass (None: wait for it)."""
    return list(conn.recv()) if timeout is None or conn.poll(timeout) else []
