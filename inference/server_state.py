"""``ServerState``: what every route shares — config, model parts once loaded, metrics, load accounting
and drain state.

Load is counted in two places on purpose: ``pending`` holds requests that passed the gates and are
being parsed or validated (a drain must wait for them), ``in_flight`` only those the engine accepted.
``inference_requests_in_flight`` exports the second, so a burst that is about to be refused with 429
never shows up as load the autoscaler would scale on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from ttsfleet.inference.api import ApiError
from ttsfleet.inference.references import ReferenceStore
from ttsfleet.inference.serve_config import ServeConfig

log = logging.getLogger("ttsfleet.inference.server")


class ServerState:
    """Everything the handlers share: config, model parts once loaded, metrics, drain state."""

    def __init__(self, cfg: ServeConfig):
        from ttsfleet.metrics import make_collectors

        self.cfg = cfg
        self.metrics = make_collectors("inference")
        self.label = cfg.model_name
        self.engine: Any = None
        self.model: Any = None
        self.codec: Any = None
        self.tokenizer: Any = None
        self.references = ReferenceStore(cfg.references_dir)
        self.load_error: str | None = None
        self.loaded = threading.Event()
        self.draining = False
        self.drain_started: float | None = None
        self.drained = False  # nothing left to serve: requests still sending their body get a 503
        self._body_reads: set[asyncio.Timeout] = set()  # requests whose body (or first event) is arriving
        self.pending = 0  # past the gates, not yet handed to the engine
        self.in_flight = 0  # accepted by the engine, response not finished
        self.encode_lock = threading.Lock()
        self.m("inference_ready").set(0)
        self.m("inference_requests_in_flight").set(0)

    def m(self, name: str) -> Any:
        return self.metrics[name].labels(self.label)

    @property
    def ready(self) -> bool:
        return self.loaded.is_set() and not self.draining and self.engine is not None and self.engine.alive

    @property
    def busy(self) -> int:
        """Requests a drain waits for (not those still sending their body: see :meth:`reading_body`)."""
        return self.pending + self.in_flight

    @property
    def reading(self) -> int:
        """Requests whose body (or live session whose ``start`` event) is still arriving."""
        return len(self._body_reads)

    # ------------------------------------------------------------------ request accounting
    def check_serving(self) -> None:
        """Raise the 503 that says why this replica takes no request now (draining, loading, failed)."""
        if self.draining:
            raise ApiError(503, "server is draining (shutting down); retry on another replica", "draining",
                           {"Retry-After": "1", "Connection": "close"})
        if self.load_error:
            raise ApiError(503, f"model failed to load: {self.load_error}", "load_failed")
        if not self.loaded.is_set():
            raise ApiError(503, "model is still loading", "loading", {"Retry-After": "5"})
        if not self.engine.alive:
            raise ApiError(503, "engine is not running", "unavailable")

    @contextmanager
    def admitting(self) -> Iterator[None]:
        """Hold a request as ``pending`` while it is parsed and validated."""
        self.pending += 1
        try:
            yield
        finally:
            self.pending -= 1

    @asynccontextmanager
    async def reading_body(self, what: str) -> AsyncIterator[None]:
        """Bound the arrival of ``what`` (a body, a first event) by ``body_timeout_s``: a 408 after it.

        Such a request is not yet being served, so a drain does not wait for it; when the drain is
        done (:meth:`end_body_reads`) every read still open ends at once with a 503."""
        limit = self.cfg.body_timeout_s
        try:
            async with asyncio.timeout(limit if limit > 0 else None) as deadline:
                self._body_reads.add(deadline)
                try:
                    yield
                finally:
                    self._body_reads.discard(deadline)
        except TimeoutError:
            if self.drained:
                raise ApiError(503, "server is draining (shutting down); retry on another replica",
                               "draining", {"Retry-After": "1", "Connection": "close"}) from None
            raise ApiError(408, f"{what} did not arrive within {limit:g} s", "body_timeout",
                           {"Connection": "close"}) from None

    def end_body_reads(self) -> None:
        """The drain is done: requests still sending their body are answered 503 now (event loop only)."""
        self.drained = True
        now = asyncio.get_running_loop().time()
        for deadline in list(self._body_reads):
            deadline.reschedule(now)

    def enter(self) -> None:
        """The engine accepted a request: from now on it is load."""
        self.in_flight += 1
        self.m("inference_requests_in_flight").set(self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1
        self.m("inference_requests_in_flight").set(self.in_flight)

    def count(self, status: int, reason: str = "") -> None:
        """One finished synthesis request (any status) in ``inference_requests``/``inference_errors``."""
        self.metrics["inference_requests"].labels(self.label, str(status)).inc()
        if reason:
            self.metrics["inference_errors"].labels(self.label, reason).inc()

    def begin_drain(self) -> None:
        if not self.draining:
            self.draining = True
            self.drain_started = time.monotonic()
            self.m("inference_ready").set(0)
            log.info("draining: readiness false, refusing new requests, %d in flight", self.busy)

    # ------------------------------------------------------------------ model load
    def load(self) -> None:
        """Load model, codec and tokenizer and start the engine (runs in a worker thread)."""
        import torch
        from ttsfleet.inference import loader
        from ttsfleet.inference.codec import load_codec
        from ttsfleet.inference.codec_process import CodecSource
        from ttsfleet.inference.engine import Engine, EngineConfig
        from ttsfleet.inference.tokenizer import load_tokenizer

        cfg = self.cfg
        try:
            device = cfg.device
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            on_cuda = device.startswith("cuda")
            threads = 0 if on_cuda else cfg.cpu_threads
            if threads:
                torch.set_num_threads(threads)
            # auto: the run's catalog's scheme; the same catalog drives the kernel dispatch
            quant = loader.resolve_quantization(cfg.quantization, torch.device(device), cfg.gpu_catalog)
            self.model = loader.load_model(cfg.checkpoint, device=device,
                                           dtype=torch.bfloat16 if on_cuda else torch.float32,
                                           quantize=quant, seed=cfg.seed, catalog=cfg.gpu_catalog)
            fast_codec = on_cuda and cfg.codec_fast
            self.codec = load_codec(cfg.checkpoint, device=device, fast=fast_codec)
            self.tokenizer = load_tokenizer(cfg.checkpoint, cfg.preset_text)
            self.engine = Engine(self.model, self.codec, EngineConfig(
                max_running_requests=cfg.max_running_requests, max_queue=cfg.max_queue,
                cuda_graph_max_bs=cfg.cuda_graph_max_bs, device=device, pad_to_buckets=on_cuda,
                cpu_threads=threads, cuda_graphs=on_cuda and cfg.cuda_graphs,
                codec_graphs=fast_codec and cfg.cuda_graphs,
                codec_compile=None if cfg.codec_compile == "off" else cfg.codec_compile,
                prefill_graphs=on_cuda and cfg.cuda_graphs and cfg.prefill_graphs,
                prefill_chunk_tokens=cfg.prefill_chunk_tokens,
                prefill_coalesce_s=cfg.prefill_coalesce_ms / 1000, codec_gather_ms=cfg.codec_gather_ms,
                prefix_job_max_wait_s=cfg.prefix_job_wait_ms / 1000,
                codec_channels_last=cfg.codec_layout == "channels-last",
                codec_process=CodecSource(cfg.checkpoint, device, fast_codec) if cfg.codec_process
                else None))
            self.engine.start()
            self._warm_up()  # first kernels, allocator and codec state: not on a user's request
            self.engine.attach_metrics(self.metrics, self.label)
            if cfg.gc_freeze:  # start-up's objects out of every later collection (inference/gc_pauses.py)
                from ttsfleet.inference.gc_pauses import freeze_heap

                frozen, ms = freeze_heap()
                log.info("froze %d objects in %.0f ms (gc.freeze after the warm-up; --no-gc-freeze keeps "
                         "them in every full collection)", frozen, ms)
            self.metrics["inference_build"].info({
                "model": cfg.model_name,
                "gpu_class": cfg.gpu_class or ("cpu" if device == "cpu" else "unset"),
                "quantization": quant, "cuda_graph_max_bs": str(cfg.cuda_graph_max_bs), "device": device,
                "max_running_requests": str(cfg.max_running_requests)})
            self.loaded.set()
            self.m("inference_ready").set(0 if self.draining else 1)
            log.info("model %s loaded on %s (quantization %s, max_running_requests %d)", cfg.model_name,
                     device, quant, cfg.max_running_requests)
        except Exception as exc:
            log.exception("model load failed")
            self.load_error = f"{type(exc).__name__}: {exc}"

    def _warm_up(self) -> None:
        from ttsfleet.inference.engine import GenerationRequest
        from ttsfleet.inference.prompt import build_prompt
        from ttsfleet.inference.sampling import SamplingParams

        async def run() -> None:
            prompt = build_prompt(self.tokenizer, self.model.config, "Warm up.")
            req = GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=0), max_new_tokens=8,
                                    first_chunk_frames=1, chunk_frames=4)
            handle = self.engine.submit(req, asyncio.get_running_loop())
            while (await handle.next()).kind == "audio":
                pass

        t0 = time.perf_counter()
        asyncio.run(run())
        log.info("warm-up generation took %.2f s", time.perf_counter() - t0)
