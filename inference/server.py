"""``ttsfleet serve``: the HTTP front of the engine — Fish Audio ``/v1/tts``, OpenAI ``/v1/audio/speech``,
reference voices, health/readiness, Prometheus metrics, overload shedding and SIGTERM drain.

Why it looks like this: the operator scales replicas on the metrics exported here and removes them
with SIGTERM, so the server must (a) say honestly how loaded it is (in-flight, queue depth, batch
size, time to first audio), (b) shed load with 429 + Retry-After instead of growing memory, and
(c) on SIGTERM turn unready, answer new requests with 503, finish every admitted request, and only
then exit — a scale-down drops nothing. The model loads in the background so probes answer at once.
"""


import asyncio
import base64
import hmac
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from ttsfleet.inference.api import (
    REFERENCE_ID_RE,
    AddReference,
    ApiError,
    SpeechRequest,
    TTSRequest,
    check_sample_rate,
    decode_body,
    normalize_text,
    parse_model,
    split_text,
)

from ttsfleet.errors import UserError

log = logging.getLogger("ttsfleet.inference.server")

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "mp3": "audio/mpeg", "opus": "audio/ogg",
               "flac": "audio/flac"}
#: Environment variables the server reads (flags override them). The operator sets these.
ENV = {
    "host": "TTSFLEET_HOST",
    "port": "TTSFLEET_PORT",
    "checkpoint": "TTSFLEET_CHECKPOINT",
    "model_name": "TTSFLEET_MODEL_NAME",
    "gpu_class": "TTSFLEET_GPU_CLASS",
    "quantization": "TTSFLEET_QUANTIZATION",
    "max_running_requests": "TTSFLEET_MAX_RUNNING_REQUESTS",
    "cuda_graph_max_bs": "TTSFLEET_CUDA_GRAPH_MAX_BS",
    "max_queue": "TTSFLEET_MAX_QUEUE",
    "device": "TTSFLEET_DEVICE",
    "api_keys": "TTSFLEET_API_KEYS",
    "references_dir": "TTSFLEET_REFERENCES_DIR",
    "max_text_chars": "TTSFLEET_MAX_TEXT_CHARS",
    "max_new_tokens": "TTSFLEET_MAX_NEW_TOKENS",
    "drain_grace_s": "TTSFLEET_DRAIN_GRACE_S",
    "drain_timeout_s": "TTSFLEET_DRAIN_TIMEOUT_S",
    "seed": "TTSFLEET_SEED",
    "cpu_threads": "TTSFLEET_CPU_THREADS",
    "cuda_graphs": "TTSFLEET_CUDA_GRAPHS",
    "prefill_chunk_tokens": "TTSFLEET_PREFILL_CHUNK_TOKENS",
}


@dataclass
class ServeConfig:
    """Serving configuration: defaults < environment (``TTSFLEET_*``) < CLI flags."""

    host: str = "0.0.0.0"
    port: int = 8000
    checkpoint: str = "tiny"  # "tiny" = embedded deterministic random weights (noise-like audio)
    model_name: str = ""
    gpu_class: str = ""
    quantization: str = "auto"
    max_running_requests: int = 0  # 0 = the GPU class default (or 16 on CPU)
    max_queue: int = 0  # 0 = 4 x max_running_requests
    device: str = "auto"
    api_keys: tuple[str, ...] = ()
    references_dir: str = ""
    max_text_chars: int = 2000
    max_new_tokens: int = 2048
    max_body_bytes: int = 32 * 1024 * 1024
    drain_grace_s: float = 0.0
    drain_timeout_s: float = 600.0
    seed: int = 0
    cpu_threads: int = 1  # torch threads when serving on CPU (1 avoids OpenMP oversubscription)
    cuda_graph_max_bs: int = 0  # 0 = ttsfleet.catalog.cuda_graph_max_bs(max_running_requests)
    cuda_graphs: bool = True  # capture decode graphs when serving on CUDA
    prefill_chunk_tokens: int = 256  # prompt tokens per prefill chunk (0 = whole prompts, no chunking)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **flags: Any) -> "ServeConfig":
        """Build from the environment, then apply non-None ``flags``; validate into one config."""
        env = dict(os.environ if env is None else env)
        raw: dict[str, Any] = {}
        for key, var in ENV.items():
            if env.get(var, "").strip() != "":
                raw[key] = env[var].strip()
        raw.update({k: v for k, v in flags.items() if v is not None})
        cfg = cls()
        for key, value in raw.items():
            default = getattr(cfg, key)
            try:
                if key == "api_keys":
                    value = tuple(k.strip() for k in (value.split(",") if isinstance(value, str) else value)
                                  if k.strip())
                elif isinstance(default, bool):
                    value = str(value).lower() in ("1", "true", "yes")
                elif isinstance(default, int):
                    value = int(value)
                elif isinstance(default, float):
                    value = float(value)
            except ValueError:
                kind = type(default).__name__
                raise UserError(f"{ENV.get(key, key)}: {value!r} is not a valid {kind}") from None
            setattr(cfg, key, value)
        cfg.resolve()
        return cfg

    def resolve(self) -> None:
        """Fill derived values from the GPU catalog and check ranges."""
        from ttsfleet.catalog import GpuCatalog, UnknownGpuClass, cuda_graph_max_bs

        gpu = None
        if self.gpu_class:
            try:
                gpu = GpuCatalog.default().get(self.gpu_class)
            except UnknownGpuClass as exc:
                raise UserError(str(exc)) from None
        if self.max_running_requests == 0:
            self.max_running_requests = gpu.serving.max_running_requests if gpu else 16
        if self.max_running_requests < 1:
            raise UserError("max_running_requests must be >= 1")
        if self.max_queue == 0:
            self.max_queue = 4 * self.max_running_requests
        if self.max_queue < 1:
            raise UserError("max_queue must be >= 1")
        if self.cuda_graph_max_bs == 0:
            self.cuda_graph_max_bs = cuda_graph_max_bs(self.max_running_requests)
        if not 1 <= self.cuda_graph_max_bs <= self.max_running_requests:
            raise UserError(f"cuda_graph_max_bs {self.cuda_graph_max_bs} must be in [1, max_running_requests="
                            f"{self.max_running_requests}]")
        if self.quantization not in ("auto", "none", "bsgemm_fp8", "mxfp8"):
            raise UserError(f"quantization {self.quantization!r} is not one of auto, none, bsgemm_fp8, mxfp8")
        if self.quantization == "auto" and gpu is not None:
            self.quantization = "none" if gpu.quantization == "bf16" else gpu.quantization
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise UserError(f"device {self.device!r} is not auto, cpu or cuda[:N]")
        if not 1 <= self.port <= 65535:
            raise UserError(f"port {self.port} is out of range")
        if self.cpu_threads < 0:
            raise UserError("cpu_threads must be >= 0")
        if self.prefill_chunk_tokens < 0:
            raise UserError("prefill_chunk_tokens must be >= 0 (0 = no chunking)")
        if self.max_text_chars < 1 or self.max_new_tokens < 1:
            raise UserError("max_text_chars and max_new_tokens must be >= 1")
        from ttsfleet.inference.model_config import PRESETS  # random-weight presets (tiny, s2-pro, ...)

        if self.checkpoint not in PRESETS and not Path(self.checkpoint).is_dir():
            raise UserError(f"checkpoint {self.checkpoint!r} is not a directory or a preset "
                            f"({', '.join(PRESETS)})")
        if not self.model_name:
            self.model_name = "tiny" if self.checkpoint == "tiny" else Path(self.checkpoint).name
        if self.references_dir:
            Path(self.references_dir).mkdir(parents=True, exist_ok=True)


class ReferenceStore:
    """Named reference voices (codec codes + transcript), in memory and optionally on disk as ``<id>.npz``."""

    def __init__(self, directory: str = ""):
        self.dir = Path(directory) if directory else None
        self._items: dict[str, tuple[np.ndarray, str]] = {}
        if self.dir is not None:
            for f in sorted(self.dir.glob("*.npz")):
                try:
                    with np.load(f, allow_pickle=False) as z:
                        self._items[f.stem] = (z["codes"], str(z["text"]))
                except Exception:  # a broken file must not stop the server
                    log.warning("skipping unreadable reference %s", f)

    def ids(self) -> list[str]:
        return sorted(self._items)

    def get(self, rid: str) -> tuple[np.ndarray, str]:
        try:
            return self._items[rid]
        except KeyError:
            raise ApiError(404, f"reference_id {rid!r} not found", "reference_not_found") from None

    def add(self, rid: str, codes: np.ndarray, text: str) -> None:
        if rid in self._items:
            raise ApiError(409, f"reference_id {rid!r} already exists", "reference_exists")
        self._items[rid] = (codes, text)
        if self.dir is not None:
            np.savez(self.dir / f"{rid}.npz", codes=codes, text=np.array(text))

    def delete(self, rid: str) -> None:
        self.get(rid)
        del self._items[rid]
        if self.dir is not None:
            (self.dir / f"{rid}.npz").unlink(missing_ok=True)

    def rename(self, old: str, new: str) -> None:
        codes, text = self.get(old)
        if not REFERENCE_ID_RE.match(new):
            raise ApiError(400, "new_reference_id must be 1-64 letters, digits, '_', '-' or '.'",
                           "invalid_request")
        self.add(new, codes, text)
        self.delete(old)


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
        self.in_flight = 0
        self.encode_lock = threading.Lock()
        self.m("inference_ready").set(0)
        self.m("inference_requests_in_flight").set(0)

    def m(self, name: str) -> Any:
        return self.metrics[name].labels(self.label)

    @property
    def ready(self) -> bool:
        return self.loaded.is_set() and not self.draining and self.engine is not None and self.engine.alive

    def load(self) -> None:
        """Load model, codec and tokenizer and start the engine (runs in a worker thread)."""
        import torch
        from ttsfleet.inference import loader
        from ttsfleet.inference.engine import Engine, EngineConfig

        cfg = self.cfg
        try:
            device = cfg.device
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
            threads = 0 if device.startswith("cuda") else cfg.cpu_threads
            if threads:
                torch.set_num_threads(threads)
            quant = cfg.quantization if device.startswith("cuda") or cfg.quantization != "auto" else "none"
            self.model = loader.load_model(cfg.checkpoint, device=device, dtype=dtype, quantize=quant,
                                           seed=cfg.seed)
            self.codec = _load_codec(cfg.checkpoint, device)
            self.tokenizer = _load_tokenizer(cfg.checkpoint)
            self.engine = Engine(self.model, self.codec, EngineConfig(
                max_running_requests=cfg.max_running_requests, max_queue=cfg.max_queue,
                cuda_graph_max_bs=cfg.cuda_graph_max_bs, device=device,
                pad_to_buckets=device.startswith("cuda"), cpu_threads=threads,
                cuda_graphs=device.startswith("cuda") and cfg.cuda_graphs,
                prefill_chunk_tokens=cfg.prefill_chunk_tokens))
            self.engine.start()
            self._warm_up()  # first kernels, allocator and codec state: not on a user's request
            self.engine.attach_metrics(self.metrics, self.label)
            if quant == "auto" and hasattr(loader, "resolve_quantization"):
                quant = loader.resolve_quantization(quant, torch.device(device))
            gpu_class = cfg.gpu_class or ("cpu" if device == "cpu" else "unset")
            self.metrics["inference_build"].info({
                "model": cfg.model_name, "gpu_class": gpu_class, "quantization": quant,
                "cuda_graph_max_bs": str(cfg.cuda_graph_max_bs), "device": device,
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

    def enter(self) -> None:
        """A TTS request passed the gates: from now on a drain waits for it."""
        self.in_flight += 1
        self.m("inference_requests_in_flight").set(self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1
        self.m("inference_requests_in_flight").set(self.in_flight)

    def begin_drain(self) -> None:
        if not self.draining:
            self.draining = True
            self.drain_started = time.monotonic()
            self.m("inference_ready").set(0)
            log.info("draining: readiness false, refusing new requests, %d in flight", self.in_flight)


def _load_codec(checkpoint: str, device: str) -> Any:
    from ttsfleet.inference import loader

    if hasattr(loader, "load_codec"):
        return loader.load_codec(checkpoint, device=device)
    from ttsfleet.inference.codec import load_codec

    return load_codec(checkpoint, device=device)


def _load_tokenizer(checkpoint: str) -> Any:
    from ttsfleet.inference import loader

    if hasattr(loader, "load_tokenizer"):
        return loader.load_tokenizer(checkpoint)
    from ttsfleet.inference.tokenizer import load_tokenizer

    return load_tokenizer(checkpoint)


# ---------------------------------------------------------------------- request pipeline
@dataclass
class Job:
    """A validated TTS request, ready for the engine."""

    req: TTSRequest
    fmt: str
    sample_rate: int
    segments: list[str]
    references: list[tuple[Any, str]]
    arrived: float


def _error_response(err: ApiError) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _resolve_references(state: ServerState, req: TTSRequest) -> list[tuple[Any, str]]:
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
        codes = await asyncio.to_thread(_encode_reference, state, ref.audio)
        refs.append((codes, ref.text))
    return refs


def _encode_reference(state: ServerState, audio: bytes) -> Any:
    import torch
    from ttsfleet.inference.audio_io import decode_audio

    try:
        wave, sr = decode_audio(audio)
    except ValueError as exc:
        raise ApiError(400, f"reference audio: {exc}", "bad_reference_audio") from None
    if wave.size < sr // 10:
        raise ApiError(400, "reference audio is shorter than 0.1 s", "bad_reference_audio")
    if wave.size > sr * 120:
        raise ApiError(400, "reference audio is longer than 120 s", "bad_reference_audio")
    with state.encode_lock, torch.no_grad():
        codes = state.codec.encode(wave, sr)
    return torch.as_tensor(codes).long()


async def validate(state: ServerState, req: TTSRequest) -> Job:
    """Turn a parsed request into a Job or raise the right 4xx."""
    text = normalize_text(req.text) if req.normalize else req.text.strip()
    if not text:
        raise ApiError(400, "text is empty", "empty_text")
    if len(text) > state.cfg.max_text_chars:
        raise ApiError(400, f"text is {len(text)} characters; the limit is {state.cfg.max_text_chars}",
                       "text_too_long")
    sr = check_sample_rate(req.format, req.sample_rate)
    refs = await _resolve_references(state, req)
    segments = split_text(text, req.chunk_length, req.min_chunk_length)
    return Job(req=req, fmt=req.format, sample_rate=sr, segments=segments, references=refs,
               arrived=time.perf_counter())


def _sampling(req: TTSRequest, segment: int) -> Any:
    from ttsfleet.inference.sampling import SamplingParams

    kw: dict[str, Any] = {}
    if req.seed is not None:
        kw["seed"] = (req.seed + segment) & 0x7FFFFFFF
    return SamplingParams(temperature=req.temperature, top_p=max(req.top_p, 1e-3), top_k=req.top_k,
                          repetition_penalty=req.repetition_penalty, **kw)


_CHUNKING = {"low": (1, 4), "balanced": (2, 8), "normal": (4, 16)}


def _submit_segment(state: ServerState, job: Job, index: int, previous: list[tuple[Any, str]]) -> Any:
    """Build the prompt of one text segment and hand it to the engine."""
    from ttsfleet.inference.engine import EngineOverloaded, EngineStopped, GenerationRequest, PromptTooLong
    from ttsfleet.inference.prompt import build_prompt

    refs = job.references + previous
    prompt = build_prompt(state.tokenizer, state.model.config, job.segments[index], references=refs)
    if previous and prompt.shape[-1] + 16 > state.engine.max_seq_len:  # drop conditioning, not the request
        prompt = build_prompt(state.tokenizer, state.model.config, job.segments[index],
                              references=job.references)
    first, chunk = _CHUNKING[job.req.latency]
    gen = GenerationRequest(prompt=prompt, sampling=_sampling(job.req, index),
                            max_new_tokens=min(job.req.max_new_tokens, state.cfg.max_new_tokens),
                            first_chunk_frames=first, chunk_frames=chunk)
    try:
        return state.engine.submit(gen, asyncio.get_running_loop(), admitted=index > 0)
    except PromptTooLong as exc:
        raise ApiError(400, f"{exc} (shorten the text or the references)", "prompt_too_long") from None
    except EngineOverloaded as exc:
        raise ApiError(429, f"server overloaded: {exc}", "overloaded", {"Retry-After": "1"}) from None
    except EngineStopped as exc:
        raise ApiError(503, f"engine unavailable: {exc}", "unavailable") from None


class Generation:
    """Streams the audio of one Job across its text segments, recording the request's metrics."""

    def __init__(self, state: ServerState, job: Job):
        self.state = state
        self.job = job
        self.handle: Any = None
        self.frames = 0
        self.samples = 0
        self.first_audio: float | None = None
        self.codec_rate = int(state.codec.sample_rate)
        self._finished = False
        self._segment_done = True

    def start(self) -> None:
        """Submit the first segment now, so overload becomes a 429 before any byte is sent."""
        self.handle = _submit_segment(self.state, self.job, 0, [])

    async def audio(self):
        """Yield float32 audio chunks at the codec's rate as they decode, segment after segment."""
        import torch
        from ttsfleet.inference.engine import Event

        previous: list[tuple[Any, str]] = []
        try:
            for index in range(len(self.job.segments)):
                if index > 0:
                    self.handle = _submit_segment(self.state, self.job, index, previous)
                self._segment_done = False
                codes: list[np.ndarray] = []
                while True:
                    ev: Event = await self.handle.next()
                    if ev.kind == "audio":
                        if ev.codes is not None and ev.codes.shape[1]:
                            codes.append(ev.codes)
                        if ev.audio is not None and ev.audio.size:
                            self.samples += ev.audio.size
                            yield ev.audio
                    elif ev.kind == "error":
                        self._segment_done = True
                        raise RuntimeError(ev.reason)
                    else:
                        self._segment_done = True
                        self.frames += ev.frames
                        break
                if self.job.req.condition_on_previous_chunks and codes:
                    previous = [(torch.from_numpy(np.concatenate(codes, axis=1)).long(),
                                 self.job.segments[index])]
        finally:
            if self.handle is not None and not self._segment_done:
                self.state.engine.cancel(self.handle)

    def mark_first_audio(self) -> None:
        if self.first_audio is None:
            self.first_audio = time.perf_counter()
            self.state.m("inference_ttfa_seconds").observe(self.first_audio - self.job.arrived)

    def finish(self, status: int, reason: str = "") -> None:
        if self._finished:
            return
        self._finished = True
        st = self.state
        st.metrics["inference_requests"].labels(st.label, str(status)).inc()
        if reason:
            st.metrics["inference_errors"].labels(st.label, reason).inc()
        if status == 200:
            wall = time.perf_counter() - self.job.arrived
            st.m("inference_request_duration_seconds").observe(wall)
            audio_s = self.samples / self.codec_rate
            if audio_s > 0:
                st.m("inference_realtime_factor").observe(wall / audio_s)


def _record_rejection(state: ServerState, err: ApiError) -> None:
    if getattr(err, "counted", False):
        return
    state.metrics["inference_requests"].labels(state.label, str(err.status)).inc()
    state.metrics["inference_errors"].labels(state.label, err.reason).inc()


# ---------------------------------------------------------------------- the app
def create_app(state: ServerState, load_in_background: bool = True) -> Any:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # A daemon thread, so a SIGTERM during a long load exits at once instead of waiting for it.
        loader = threading.Thread(target=state.load, name="ttsfleet-load", daemon=True)
        loader.start()
        if not load_in_background:
            await asyncio.to_thread(loader.join)
        try:
            yield
        finally:
            if state.engine is not None and state.loaded.is_set():
                await asyncio.to_thread(state.engine.stop)

    app = FastAPI(title="ttsfleet TTS server", version="0.1.0", lifespan=lifespan)
    app.state.tts = state

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"status": exc.status_code, "message": str(exc.detail), "reason": reason},
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        msg = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        return JSONResponse({"status": 400, "message": msg, "reason": "invalid_request"}, status_code=400)

    def authorize(request: Request) -> None:
        keys = state.cfg.api_keys
        if not keys:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip().encode()
        if scheme.lower() != "bearer" or not any(hmac.compare_digest(token, k.encode()) for k in keys):
            raise ApiError(401, "missing or invalid API key (Authorization: Bearer <key>)", "unauthorized",
                           {"WWW-Authenticate": "Bearer"})

    async def read_body(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > state.cfg.max_body_bytes:
            raise ApiError(413, f"body is larger than {state.cfg.max_body_bytes} bytes", "body_too_large")
        raw = bytearray()
        async for part in request.stream():
            raw.extend(part)
            if len(raw) > state.cfg.max_body_bytes:
                raise ApiError(413, f"body is larger than {state.cfg.max_body_bytes} bytes", "body_too_large")
        return decode_body(bytes(raw), request.headers.get("content-type"))

    def check_serving() -> None:
        if state.draining:
            raise ApiError(503, "server is draining (shutting down); retry on another replica", "draining",
                           {"Retry-After": "1", "Connection": "close"})
        if state.load_error:
            raise ApiError(503, f"model failed to load: {state.load_error}", "load_failed")
        if not state.loaded.is_set():
            raise ApiError(503, "model is still loading", "loading", {"Retry-After": "5"})
        if not state.engine.alive:
            raise ApiError(503, "engine is not running", "unavailable")

    class ClosingStreamingResponse(StreamingResponse):
        """Runs ``on_close`` however the response ends, even if the body was never started."""

        def __init__(self, content: Any, on_close: Any, **kw: Any):
            super().__init__(content, **kw)
            self._on_close = on_close

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                self._on_close()

    async def synthesize(request: Request, tts: TTSRequest, sse: bool = False):
        job = await validate(state, tts)
        gen = Generation(state, job)
        gen.start()
        encoder_args = dict(fmt=job.fmt, sample_rate=job.sample_rate, src_rate=gen.codec_rate,
                            mp3_bitrate=tts.mp3_bitrate, opus_bitrate=tts.opus_bitrate,
                            volume_db=tts.prosody.volume if tts.prosody else 0.0,
                            speed=tts.prosody.speed if tts.prosody else 1.0)
        from ttsfleet.inference.audio_io import AudioEncoder

        enc = AudioEncoder(**encoder_args)
        headers = {"X-Sample-Rate": str(job.sample_rate), "X-Model": state.cfg.model_name,
                   "X-Frames-Per-Second": f"{gen.codec_rate / state.codec.frame_length:.4f}"}
        if not tts.streaming:
            parts = []
            try:
                async for chunk in gen.audio():
                    parts.append(chunk)
            except Exception as exc:
                gen.finish(500, "generation_failed")
                log.error("generation failed: %s", exc)
                err = ApiError(500, f"generation failed: {exc}", "generation_failed")
                err.counted = True
                raise err from None
            audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            body = await asyncio.to_thread(enc.encode_all, audio)
            gen.mark_first_audio()
            gen.finish(200)
            return Response(body, media_type=MEDIA_TYPES[job.fmt], headers=headers)

        async def stream():
            status, reason = 200, ""
            try:
                async for chunk in gen.audio():
                    data = enc.push(chunk)
                    if data:
                        gen.mark_first_audio()
                        yield _sse(data) if sse else data
                tail = enc.finish()
                if tail:
                    gen.mark_first_audio()
                    yield _sse(tail) if sse else tail
                if sse:
                    yield b'data: {"type": "speech.audio.done"}\n\n'
            except asyncio.CancelledError:
                status, reason = 499, "client_disconnected"
                raise
            except Exception as exc:  # headers are gone: end the stream early and count it
                log.error("streaming generation failed: %s", exc)
                status, reason = 500, "generation_failed"
            finally:
                gen.finish(status, reason)

        def closed() -> None:
            if not gen._finished:  # the body never ran to its end (client gone before or during it)
                state.engine.cancel(gen.handle)
                gen.finish(499, "client_disconnected")
            state.leave()

        media = "text/event-stream" if sse else MEDIA_TYPES[job.fmt]
        return ClosingStreamingResponse(stream(), closed, media_type=media, headers=headers)

    async def admit(request: Request, parse: Any) -> Any:
        """Gate (auth, draining, loading), count the request in flight, then synthesize."""
        try:
            authorize(request)
            check_serving()
        except ApiError as err:
            _record_rejection(state, err)
            raise
        state.enter()
        handed_off = False
        try:
            tts_req, sse = parse(await read_body(request))
            resp = await synthesize(request, tts_req, sse)
            handed_off = isinstance(resp, ClosingStreamingResponse)  # it calls leave() when done
            return resp
        except ApiError as err:
            _record_rejection(state, err)
            raise
        finally:
            if not handed_off:
                state.leave()

    def parse_tts(body: Any) -> tuple[TTSRequest, bool]:
        return parse_model(TTSRequest, body), False

    def parse_speech(body: Any) -> tuple[TTSRequest, bool]:
        sreq = parse_model(SpeechRequest, body)
        return sreq.to_tts(), sreq.stream and sreq.stream_format == "sse"

    @app.post("/v1/tts")
    async def tts(request: Request):
        return await admit(request, parse_tts)

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        return await admit(request, parse_speech)

    @app.post("/v1/references/add")
    async def add_reference(request: Request):
        authorize(request)
        if not state.loaded.is_set():
            raise ApiError(503, "model is still loading", "loading", {"Retry-After": "5"})
        ref = parse_model(AddReference, await read_body(request))
        codes = await asyncio.to_thread(_encode_reference, state, ref.audio)
        state.references.add(ref.id, codes.cpu().numpy().astype(np.int64), ref.text)
        return {"success": True, "message": f"reference {ref.id!r} added", "reference_id": ref.id}

    @app.get("/v1/references/list")
    async def list_references(request: Request):
        authorize(request)
        return {"success": True, "reference_ids": state.references.ids(), "message": "ok"}

    @app.api_route("/v1/references/delete", methods=["DELETE", "POST"])
    async def delete_reference(request: Request):
        authorize(request)
        body = await read_body(request)
        rid = body.get("reference_id") if isinstance(body, dict) else None
        if not isinstance(rid, str) or not rid:
            raise ApiError(400, "reference_id is required", "invalid_request")
        state.references.delete(rid)
        return {"success": True, "message": f"reference {rid!r} deleted", "reference_id": rid}

    @app.post("/v1/references/update")
    async def update_reference(request: Request):
        authorize(request)
        body = await read_body(request)
        old = body.get("old_reference_id") if isinstance(body, dict) else None
        new = body.get("new_reference_id") if isinstance(body, dict) else None
        if not isinstance(old, str) or not isinstance(new, str) or not old or not new:
            raise ApiError(400, "old_reference_id and new_reference_id are required", "invalid_request")
        state.references.rename(old, new)
        return {"success": True, "message": f"reference {old!r} renamed to {new!r}", "reference_id": new}

    @app.get("/healthz")
    @app.get("/v1/health")
    async def healthz():
        if state.load_error or (state.loaded.is_set() and not state.engine.alive):
            return JSONResponse({"status": "unhealthy", "error": state.load_error or "engine stopped"}, 503)
        return {"status": "ok", "loaded": state.loaded.is_set(), "draining": state.draining}

    @app.get("/readyz")
    async def readyz():
        body = {"ready": state.ready, "loaded": state.loaded.is_set(), "draining": state.draining,
                "in_flight": state.in_flight}
        return JSONResponse(body, status_code=200 if state.ready else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _sse(data: bytes) -> bytes:
    payload = json.dumps({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    return f"data: {payload}\n\n".encode()


# ---------------------------------------------------------------------- process: uvicorn + drain
def run(cfg: ServeConfig, log_level: str = "info") -> int:
    """Serve until SIGTERM/SIGINT, then drain: unready, 503 for new requests, finish in-flight, exit 0."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state = ServerState(cfg)
    app = create_app(state)

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # runs in the main thread
            if state.draining:
                if sig == signal.SIGINT:  # second Ctrl-C: stop now
                    self.should_exit = True
                    self.force_exit = True
                return
            state.begin_drain()

    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level, access_log=False,
                            # the drain already waited for requests; this only lets the last bytes go out
                            timeout_graceful_shutdown=5, lifespan="on")
    server = DrainingServer(config)

    async def watch_drain() -> None:
        while not server.should_exit:
            await asyncio.sleep(0.05)
            if state.drain_started is None:
                continue
            waited = time.monotonic() - state.drain_started
            idle = state.in_flight == 0
            if (idle and waited >= cfg.drain_grace_s) or waited >= cfg.drain_timeout_s:
                if not idle:
                    log.warning("drain timeout: %d requests still in flight", state.in_flight)
                log.info("drained; exiting")
                server.should_exit = True

    async def main() -> None:
        watcher = asyncio.create_task(watch_drain())
        try:
            await server.serve()
        finally:
            watcher.cancel()

    asyncio.run(main())
    return 0 if state.load_error is None else 1
